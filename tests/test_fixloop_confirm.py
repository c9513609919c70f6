"""The session fix-loop's cost: localization within a cap, the judged run as the confirm run.

Fast tests of the parts (the cap, the peer sample, which tests the clean-room run
covers after each kind of change); the end-to-end runs of a loop are in
test_fixloop_e2e.py.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.localization.impact import ImpactMap
from pytest_loops.localization.localize import (
    IMPACT_MAP,
    cap_seconds,
    estimate_cost,
    parse_cap,
    sample_peers,
)
from pytest_loops.localization.spectra import collect_spectra
from pytest_loops.pytest_plugin.fixloop import SessionFixCheck

# -- the cap -------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "parsed"), [
    ("0.2", ("fraction", 0.2)), (0.5, ("fraction", 0.5)), ("20%", ("fraction", 0.2)),
    ("30s", ("seconds", 30.0)), ("1.5S", ("seconds", 1.5)), ("0", ("off", 0.0)), ("0s", ("off", 0.0)),
    ("0%", ("off", 0.0)),
])
def test_parse_cap(raw, parsed) -> None:
    kind, value = parse_cap(raw)
    assert kind == parsed[0] and value == pytest.approx(parsed[1])


@pytest.mark.parametrize("raw", ["", "abc", "-1", "20 percent", "nan", "inf", "5m"])
def test_parse_cap_refuses(raw) -> None:
    with pytest.raises(LoopUsageError, match="suspects_cap"):
        parse_cap(raw, "--loop-suspects-cap")


def test_cap_seconds() -> None:
    assert cap_seconds(("fraction", 0.2), 100.0) == pytest.approx(20.0)
    assert cap_seconds(("fraction", 0.2), 1.0) == pytest.approx(2.0)  # never under 2 s
    assert cap_seconds(("seconds", 30.0), 10.0) == 30.0
    assert cap_seconds(("off", 0.0), 10.0) is None


def test_sample_peers_takes_the_failing_file_first_then_an_even_sample() -> None:
    failing = ["t/test_a.py::test_bad"]
    near = [f"t/test_a.py::test_{i}" for i in range(5)]
    far = [f"t/test_{f}.py::test_{i}" for f in "bcdefghij" for i in range(20)]
    peers = sample_peers(failing, [*failing, *near, *far], limit=20)
    assert len(peers) == 20 and peers[:5] == near
    assert len({p.split("::")[0] for p in peers[5:]}) > 5  # spread over the other files
    assert sample_peers(failing, near, limit=20) == near  # few enough: all of them



def test_sample_peers_takes_the_quickest_of_a_big_failing_file() -> None:
    failing = ["t/test_a.py::test_bad"]
    near = [f"t/test_a.py::test_{i}" for i in range(30)]
    durations = {t: (3.0 if i % 2 else 0.001) for i, t in enumerate(near)}
    peers = sample_peers(failing, [*failing, *near], limit=15, durations=durations)
    assert peers == near[::2]  # the quick ones, in their order


def test_estimate_counts_start_up_only_for_a_process_of_its_own() -> None:
    durations = {"a": 0.1, "b": 0.2, "bad": 0.05}
    alone = estimate_cost(durations, ["bad"], ["a", "b"], start_s=0.5, alone=True)
    in_rerun = estimate_cost(durations, ["bad"], ["a", "b"])
    assert alone == pytest.approx(in_rerun + 0.5 + 0.05)  # the failing test runs once more, whole
    assert in_rerun > 2 * 0.3  # the peers under coverage


# -- what the judged run covers ----------------------------------------------------------------

FILES = {
    "pytest.ini": "[pytest]\n",
    "calc.py": """\
        def add(a, b):
            return a - b  # BUG


        def sub(a, b):
            return a - b
        """,
    "other.py": """\
        import pathlib

        FACTOR = 2
        DATA = pathlib.Path(__file__).with_name("data.txt").read_text().strip()


        def double(x):
            return x * FACTOR
        """,
    "data.txt": "ok\n",
    "conftest.py": """\
        import pytest


        @pytest.fixture
        def base():
            return 1
        """,
    "test_calc.py": """\
        import calc


        def test_add():
            assert calc.add(2, 3) == 5


        def test_sub():
            assert calc.sub(3, 2) == 1
        """,
    "test_other.py": """\
        import other


        def test_double(base):
            assert other.double(base) == 2


        def test_data():
            assert other.DATA == "ok"
        """,
}
ALL = ["test_calc.py::test_add", "test_calc.py::test_sub", "test_other.py::test_double",
       "test_other.py::test_data"]
FIX = ("return a - b  # BUG", "return a + b")


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project and the impact map of a run of every test under coverage (made once)."""
    root = tmp_path_factory.mktemp("mapped") / "proj"
    root.mkdir()
    for name, text in FILES.items():
        (root / name).write_text(textwrap.dedent(text))
    spectra = collect_spectra(root, ALL, data_file=root.parent / "spectra.json")
    assert spectra.failed == ["test_calc.py::test_add"]
    ImpactMap.from_spectra(spectra, root).save(root.parent / IMPACT_MAP)
    return root


@pytest.fixture
def project(mapped: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the mapped project, with the map pointed at it."""
    root = tmp_path / "proj"
    shutil.copytree(mapped, root, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    impact = ImpactMap.load(mapped.parent / IMPACT_MAP)
    assert impact is not None
    impact.root = str(root.resolve())
    impact.save(run_dir / IMPACT_MAP)
    return root, run_dir


def edit(root: Path, name: str, old: str, new: str) -> None:
    path = root / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def fixer(root: Path, run_dir: Path, confirm: str = "affected") -> SessionFixCheck:
    """The check as iteration 1 left it: holding the map it made (here: the saved one)."""
    check = SessionFixCheck(["test_calc.py::test_add"], ALL[1:], "", [], rootdir=root.resolve(),
                            confirm=confirm)
    check.impact = ImpactMap.load(run_dir / IMPACT_MAP)
    return check


def test_a_fix_inside_one_function_judges_the_tests_that_ran_it(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ["test_calc.py::test_add"], why
    assert why.startswith("affected: ")


def test_a_change_to_a_function_others_ran_judges_them_too(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    edit(root, "other.py", "return x * FACTOR", "return x * FACTOR + 0")
    ids, _ = fixer(root, run_dir).confirm_selection()
    assert ids == ["test_calc.py::test_add", "test_other.py::test_double"]


def test_confirm_full_judges_everything(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    ids, why = fixer(root, run_dir, "full").confirm_selection()
    assert ids == ALL and why == "full (confirm=full)"


def test_no_map_judges_everything(project) -> None:
    root, run_dir = project
    (run_dir / IMPACT_MAP).unlink()
    assert fixer(root, run_dir).confirm_selection() == (ALL, "full (no impact map)")


def test_attack_a_forged_map_in_the_artifacts_is_never_read(project) -> None:
    # a revise step can write the run directory: it empties every test's dependencies
    # there, so that no change would reach any test; the judged run must not listen
    root, run_dir = project
    check = fixer(root, run_dir)
    edit(root, "calc.py", *FIX)
    edit(root, "other.py", "return x * FACTOR", "return x * FACTOR + 1")
    forged = ImpactMap.load(run_dir / IMPACT_MAP)
    for record in forged.tests.values():
        record.deps = {}
    forged.save(run_dir / IMPACT_MAP)
    ids, _ = check.confirm_selection()
    assert "test_other.py::test_double" in ids


def test_a_map_that_does_not_know_every_test_judges_everything(project) -> None:
    root, run_dir = project
    check = SessionFixCheck(["test_calc.py::test_add"], [*ALL[1:], "test_new.py::test_x"], "", [],
                            rootdir=root.resolve(), confirm="affected")
    check.impact = ImpactMap.load(run_dir / IMPACT_MAP)
    ids, why = check.confirm_selection()
    assert len(ids) == 5 and "unknown to the impact map" in why


# Attacks: a revise step that fixes add() and breaks another test in a way no
# function block the map tracks shows. Each must force the full judged run.

def test_attack_module_level_code_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    edit(root, "other.py", "FACTOR = 2", "FACTOR = 3")
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "module-level code in other.py changed" in why


def test_attack_conftest_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    edit(root, "conftest.py", "return 1", "return 2")
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "conftest.py changed" in why


def test_attack_a_test_file_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    edit(root, "test_other.py", '== "ok"', '== "ok" or True')
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "test_other.py changed" in why


def test_attack_a_data_file_read_at_import_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    (root / "data.txt").write_text("broken\n")
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "non-Python file data.txt changed" in why


def test_attack_a_pytest_config_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:doctest\n")
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "pytest.ini" in why


def test_attack_a_new_module_forces_full(project) -> None:
    root, run_dir = project
    edit(root, "calc.py", *FIX)
    (root / "sitecustomize.py").write_text("import other\nother.FACTOR = 5\n")
    ids, why = fixer(root, run_dir).confirm_selection()
    assert ids == ALL and "sitecustomize.py added" in why

"""Coverage intelligence: per-test spectra (localization/spectra.py), Ochiai suspects
(suspects.py), the impact map (impact.py), narrowing a pytest command (narrow.py).

One real pytest run under per-test coverage (a module fixture) feeds the
end-to-end tests; the ranking and most impact-map rules are also tested on
hand-made spectra over files in tmp_path, without a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_helpers import SUITE_SETTINGS

from pytest_loops.core.checks import CHILD_ENV
from pytest_loops.localization import covctx as _covctx
from pytest_loops.localization.impact import ImpactMap, peer_tests
from pytest_loops.localization.localize import IMPACT_MAP, affected_tests
from pytest_loops.localization.narrow import PytestCommand, narrow_pytest_command
from pytest_loops.localization.spectra import (
    Spectra,
    SpectraError,
    collect_spectra,
    read_spectra,
    spectra_command,
)
from pytest_loops.localization.suspects import (
    Suspect,
    format_suspects,
    ochiai,
    rank_suspects,
    write_suspects,
)

CALC = """\
RATE = 3


def add(a, b):
    return a + b


def sub(a, b):
    result = a + b
    return result


def scale(x):
    return x * RATE


def offset():
    return 100


def unused():
    return 42
"""
BUG_LINE = 9  # result = a + b

CONFTEST = """\
import pytest

import calc


@pytest.fixture(scope="session")
def base():
    return calc.offset()
"""

TESTS = """\
import calc


def test_add():
    assert calc.add(1, 2) == 3


def test_scale():
    assert calc.scale(2) == 6


def test_sub():
    assert calc.sub(3, 1) == 2


def test_sub_negative():
    assert calc.sub(0, 5) == -5


def test_sub_zero():
    assert calc.sub(3, 0) == 3


def test_offset(base):
    assert base == 100
"""

T = "tests/test_calc.py::"
ADD, SCALE, SUB, SUB_NEG, SUB_ZERO, OFFSET = (T + n for n in (
    "test_add", "test_scale", "test_sub", "test_sub_negative", "test_sub_zero", "test_offset"))
ALL = [ADD, SCALE, SUB, SUB_NEG, SUB_ZERO, OFFSET]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_LOOPS_", "LOOP_", "COVERAGE_")) and k != "PYTEST_ADDOPTS"
            or k.startswith(SUITE_SETTINGS)}


def make_project(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Spectra]:
    """The calc project and one real run of all its tests under per-test coverage.

    ``-n 2`` is passed on purpose: the plugin must turn xdist off, or no test
    would be measured in the main process.
    """
    root = make_project(tmp_path_factory.mktemp("calc"))
    spectra = collect_spectra(root, [], pytest_args=["-q", "-p", "no:cacheprovider", "-n", "2"],
                              data_file=root.parent / "run" / "spectra.json", env=clean_env())
    return root, spectra


@pytest.fixture
def project(measured: tuple[Path, Spectra], tmp_path: Path) -> Path:
    """A private copy of the measured project, free to edit."""
    root, _ = measured
    copy = tmp_path / "calc"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture
def impact(measured: tuple[Path, Spectra], project: Path) -> ImpactMap:
    return ImpactMap.from_spectra(measured[1], project)


# ------------------------------------------------------------- real spectra


def test_spectra_has_each_test_outcome_and_lines(measured: tuple[Path, Spectra]) -> None:
    root, spectra = measured
    assert dict(spectra.outcomes) == {ADD: "passed", SCALE: "passed", SUB: "failed",
                                      SUB_NEG: "failed", SUB_ZERO: "passed", OFFSET: "passed"}
    assert spectra.failed == [SUB, SUB_NEG]
    assert spectra.root == os.path.realpath(root)
    assert spectra.lines[SUB]["calc.py"] == {9, 10}
    assert spectra.lines[ADD]["calc.py"] == {5}
    assert spectra.test_files == {"tests/test_calc.py"}
    assert spectra.exit_code == 1
    assert spectra.collected == 6
    assert "2 failed, 4 passed" in spectra.output
    # the session fixture ran outside any one test: shared, not test_offset's
    assert 18 in spectra.shared["calc.py"]
    assert 18 not in spectra.lines[OFFSET].get("calc.py", set())
    # module-level code ran at import, in no test's context
    assert 1 in spectra.shared["calc.py"]


def test_bug_line_ranks_first(measured: tuple[Path, Spectra]) -> None:
    suspects = rank_suspects(measured[1])
    assert (suspects[0].file, suspects[0].line) == ("calc.py", BUG_LINE)
    assert suspects[0].source == "result = a + b"
    assert suspects[0].score == pytest.approx(2 / math.sqrt(2 * 3))
    # test files and conftest are never suspects
    assert {s.file for s in suspects} == {"calc.py"}


def test_suspects_json_shape_and_order(measured: tuple[Path, Spectra], tmp_path: Path) -> None:
    out = tmp_path / "iter-001" / "suspects.json"
    write_suspects(out, rank_suspects(measured[1]))
    data = json.loads(out.read_text())
    assert isinstance(data, list) and data
    for item in data:
        assert set(item) == {"file", "line", "score", "source", "scope"}
        assert isinstance(item["line"], int) and isinstance(item["score"], float)
    scores = [item["score"] for item in data]
    assert scores == sorted(scores, reverse=True)
    assert data[0] == {"file": "calc.py", "line": BUG_LINE, "score": 0.8165, "source": "result = a + b",
                       "scope": "sub()"}


def test_format_suspects_for_the_prompt(measured: tuple[Path, Spectra]) -> None:
    lines = format_suspects(rank_suspects(measured[1]), limit=1)
    assert lines == ["calc.py:9 in sub() (0.82): result = a + b"]
    assert format_suspects(rank_suspects(measured[1]), limit=0) == []


def test_full_harness_flow_reruns_only_what_changed(measured: tuple[Path, Spectra],
                                                    project: Path, tmp_path: Path) -> None:
    """Map from a full run; fix the bug; the subset run; the map says nothing is left."""
    impact = ImpactMap.from_spectra(measured[1], project)
    impact.save(tmp_path / "impact.json")
    edit(project / "calc.py", "result = a + b", "result = a - b")
    loaded = ImpactMap.load(tmp_path / "impact.json")
    assert loaded is not None
    selection = loaded.affected(project, ALL)
    assert not selection.run_all
    assert selection.tests == [SUB, SUB_NEG, SUB_ZERO]
    assert "calc.py::sub" in selection.reason
    rerun = collect_spectra(project, selection.tests, pytest_args=["-q", "-p", "no:cacheprovider"],
                            env=clean_env())
    assert rerun.failed == [] and set(rerun.passed) == set(selection.tests)
    after = loaded.update(rerun, project)
    again = after.affected(project, ALL)
    assert again.tests == [] and not again.run_all
    assert "no code change" not in again.reason  # the file still differs from the baseline
    # reverting the fix must select the re-measured tests again
    edit(project / "calc.py", "result = a - b", "result = a + b")
    assert after.affected(project, ALL).tests == [SUB, SUB_NEG, SUB_ZERO]


def test_collection_error_is_recorded_and_the_map_is_incomplete(tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("import no_such_module\n")
    spectra = collect_spectra(tmp_path, ["--continue-on-collection-errors", "-p", "no:cacheprovider"],
                              env=clean_env())
    assert spectra.collect_errors == ("test_bad.py",)
    assert dict(spectra.outcomes) == {"test_ok.py::test_ok": "passed"}
    selection = ImpactMap.from_spectra(spectra, tmp_path).affected(tmp_path)
    assert selection.run_all and "collection error in test_bad.py" in selection.reason


def test_timeout_is_a_spectra_error(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    t0 = time.monotonic()
    with pytest.raises(SpectraError, match="timed out after 1s"):
        collect_spectra(tmp_path, ["test_slow.py"], timeout=1, env=clean_env())
    assert time.monotonic() - t0 < 30


def test_a_python_that_cannot_start_is_a_spectra_error(tmp_path: Path) -> None:
    with pytest.raises(SpectraError, match="could not start"):
        collect_spectra(tmp_path, [], python=str(tmp_path / "no-such-python"))


# ------------------------------------------------------------ read_spectra / plugin


def test_read_spectra_errors(tmp_path: Path) -> None:
    with pytest.raises(SpectraError, match="no coverage data.*ImportError: boom"):
        read_spectra(tmp_path / "missing.json", output="...\nImportError: boom\n")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpectraError, match="unreadable"):
        read_spectra(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(SpectraError, match="not a pytest-loops.spectra/1 file"):
        read_spectra(bad)
    bad.write_text(json.dumps({"format": _covctx.FORMAT, "root": "/x"}))
    with pytest.raises(SpectraError, match="malformed"):
        read_spectra(bad)


def test_plugin_reports_why_coverage_could_not_start(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "spectra.json"
    monkeypatch.setenv(_covctx.ENV, json.dumps({"out": str(out)}))  # no "root"
    assert _covctx._start() is None
    with pytest.raises(SpectraError, match="coverage could not start.*KeyError.*root"):
        read_spectra(out)


def test_plugin_is_inert_without_its_variable(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_covctx.ENV, raising=False)
    before = _covctx._recorder  # not None only if this suite itself is being measured
    pytester.makepyfile("def test_ok():\n    assert True\n")
    result = pytester.runpytest_inprocess("-p", "pytest_loops.localization.covctx")
    result.assert_outcomes(passed=1)
    assert _covctx._recorder is before
    assert not list(pytester.path.rglob("*.json"))


def test_spectra_command_environment(tmp_path: Path) -> None:
    argv, env = spectra_command(tmp_path, ["tests/test_x.py::test_a"], data_file=tmp_path / "s.json",
                                pytest_args=["-q"], base_env={"PYTHONPATH": "/mine"})
    assert argv[:5] == [sys.executable, "-m", "pytest", "-p", "pytest_loops.localization.covctx"]
    assert argv[5:] == ["-q", "tests/test_x.py::test_a"]
    assert env[CHILD_ENV] == "1"
    settings_ = json.loads(env[_covctx.ENV])
    assert settings_["out"] == str(tmp_path / "s.json")
    assert settings_["root"] == os.path.realpath(tmp_path)
    if "PYTHONPATH" in env:  # a source checkout: appended, the project's entries first
        assert env["PYTHONPATH"].split(os.pathsep)[0] == "/mine"


# ------------------------------------------------------------------ Ochiai


def spectra_of(outcomes: dict[str, str], lines: dict[str, dict[str, set[int]]], root: str = "/nowhere",
               shared: dict[str, set[int]] | None = None,
               test_files: frozenset[str] = frozenset()) -> Spectra:
    return Spectra(root=root, outcomes=outcomes,
                   lines={t: {f: frozenset(ls) for f, ls in files.items()} for t, files in lines.items()},
                   shared={f: frozenset(ls) for f, ls in (shared or {}).items()}, test_files=test_files)


def test_ochiai_formula() -> None:
    assert ochiai(1, 0, 1) == 1.0
    assert ochiai(2, 1, 2) == pytest.approx(2 / math.sqrt(2 * 3))
    assert ochiai(1, 3, 2) == pytest.approx(1 / math.sqrt(2 * 4))
    assert ochiai(0, 5, 2) == 0.0
    assert ochiai(1, 1, 0) == 0.0


def test_rank_on_hand_made_spectra() -> None:
    s = spectra_of(
        {"t1": "failed", "t2": "passed", "t3": "passed", "t4": "skipped", "t5": "error"},
        {
            "t1": {"m.py": {1, 2, 3}, "test_m.py": {7}},
            "t2": {"m.py": {1, 2}},
            "t3": {"m.py": {1}},
            "t4": {"m.py": {3}},  # skipped: not part of the spectrum
            "t5": {"m.py": {1, 3}, "n.py": {4}},
        },
    )
    ranked = rank_suspects(s)
    assert [(r.file, r.line) for r in ranked] == [("m.py", 3), ("n.py", 4), ("m.py", 1), ("m.py", 2)]
    assert ranked[0].score == 1.0
    assert ranked[1].score == pytest.approx(1 / math.sqrt(2))
    assert ranked[2].score == pytest.approx(2 / math.sqrt(2 * 4))
    assert ranked[3].score == pytest.approx(1 / math.sqrt(2 * 2))
    assert ranked[0].source == ""  # no such file under root
    assert [r.line for r in rank_suspects(s, top=2)] == [3, 4]
    assert ("test_m.py", 7) in {(r.file, r.line) for r in rank_suspects(s, exclude_tests=False)}


def test_ties_prefer_fewer_passing_runs_then_file_then_line() -> None:
    s = spectra_of({"f1": "failed", "f2": "failed", "p1": "passed"},
                   {"f1": {"b.py": {5, 6}, "a.py": {9}}, "f2": {"b.py": {5, 6}, "a.py": {9}},
                    "p1": {"b.py": {5}}})
    # b.py:6 and a.py:9 tie at 1.0 (no passing run): file order; b.py:5 is lower
    assert [(r.file, r.line) for r in rank_suspects(s)] == [("a.py", 9), ("b.py", 6), ("b.py", 5)]


def test_no_failure_no_suspects() -> None:
    assert rank_suspects(spectra_of({"t": "passed"}, {"t": {"m.py": {1}}})) == []


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(
    st.sampled_from([f"t{i}" for i in range(6)]),
    st.tuples(st.sampled_from(["passed", "failed", "error", "skipped"]),
              st.dictionaries(st.sampled_from(["a.py", "b.py", "tests/test_a.py"]),
                              st.sets(st.integers(1, 8), max_size=5), max_size=3)),
    max_size=6))
def test_ranking_properties(tests: dict[str, tuple[str, dict[str, set[int]]]]) -> None:
    s = spectra_of({t: o for t, (o, _) in tests.items()}, {t: ls for t, (_, ls) in tests.items()})
    ranked = rank_suspects(s)
    assert ranked == rank_suspects(s)  # deterministic
    assert all(0 < r.score <= 1 for r in ranked)
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    assert all(not r.file.startswith("tests/") for r in ranked)
    if not s.failed:
        assert ranked == []


def test_write_suspects_sorts_by_score(tmp_path: Path) -> None:
    out = tmp_path / "suspects.json"
    write_suspects(out, [Suspect("a.py", 1, 0.2, "x"), Suspect("b.py", 2, 0.9, "y")])
    assert [d["file"] for d in json.loads(out.read_text())] == ["b.py", "a.py"]
    write_suspects(out, [])
    assert json.loads(out.read_text()) == []


# -------------------------------------------------------------- impact map


def test_unchanged_tree_selects_only_the_failing(impact: ImpactMap, project: Path) -> None:
    selection = impact.affected(project, ALL)
    assert selection.tests == [SUB, SUB_NEG] and not selection.run_all
    assert "no code change" in selection.reason


def test_function_used_by_one_test_selects_it_and_the_failing(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "return a + b\n", "return b + a\n")
    selection = impact.affected(project, ALL)
    assert not selection.run_all
    assert selection.tests == [ADD, SUB, SUB_NEG]  # in the caller's order; not scale, not sub_zero
    assert "calc.py::add" in selection.reason


def test_comments_and_blank_lines_change_nothing(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "    return x * RATE\n", "    # why: the rate\n\n    return x * RATE\n")
    assert impact.affected(project, ALL).tests == [SUB, SUB_NEG]


def test_module_level_constant_selects_its_users(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "RATE = 3", "RATE = 4")
    selection = impact.affected(project, ALL)
    assert SCALE in selection.tests
    # a module-level change can reach tests that run no line of the module: all of them
    assert selection.run_all and selection.tests == ALL
    assert "module-level code in calc.py" in selection.reason


def test_function_run_by_a_shared_fixture_selects_everything(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "return 100", "return 101")
    selection = impact.affected(project, ALL)
    assert selection.run_all and "calc.py::offset" in selection.reason


def test_function_no_test_ran_selects_everything(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "return 42", "return 43")
    selection = impact.affected(project, ALL)
    assert selection.run_all and "calc.py::unused changed and no test ran it" in selection.reason


def test_test_body_change_selects_that_test(impact: ImpactMap, project: Path) -> None:
    edit(project / "tests" / "test_calc.py", "calc.scale(2) == 6", "calc.scale(3) == 9")
    assert impact.affected(project, ALL).tests == [SCALE, SUB, SUB_NEG]


@pytest.mark.parametrize("change, why", [
    (lambda p: (p / "tests" / "data.txt").write_text("x"), "non-Python file tests/data.txt added"),
    (lambda p: (p / "pytest.ini").write_text("[pytest]\n"), "non-Python file pytest.ini changed"),
    (lambda p: (p / "pytest.ini").unlink(), "non-Python file pytest.ini removed"),
    (lambda p: (p / "helpers.py").write_text("X = 1\n"), "Python file helpers.py added"),
    (lambda p: (p / "tests" / "conftest.py").unlink(), "Python file tests/conftest.py removed"),
    (lambda p: edit(p / "calc.py", "def unused():", "def unused(:"), "calc.py does not parse"),
    (lambda p: (p / "linked").symlink_to(p / "tests"), "non-Python file linked added"),
], ids=["data-added", "data-changed", "data-removed", "py-added", "py-removed", "syntax-error",
        "dir-link-added"])
def test_fallbacks_to_everything(impact: ImpactMap, project: Path, change, why: str) -> None:
    change(project)
    selection = impact.affected(project, ALL)
    assert selection.run_all and selection.tests == ALL
    assert why in selection.reason


def test_excluded_files_do_not_count(measured: tuple[Path, Spectra], project: Path) -> None:
    impact = ImpactMap.from_spectra(measured[1], project, exclude=["*.log", "out/**"])
    (project / "run.log").write_text("noise")
    (project / "out").mkdir()
    (project / "out" / "result.txt").write_text("noise")
    (project / ".pytest-loops").mkdir()
    (project / ".pytest-loops" / "impact.json").write_text("{}")
    assert impact.affected(project, ALL).tests == [SUB, SUB_NEG]


def test_unknown_test_or_other_root_selects_everything(impact: ImpactMap, project: Path,
                                                       tmp_path: Path) -> None:
    new = T + "test_new"
    selection = impact.affected(project, [*ALL, new])
    assert selection.run_all and selection.tests == [*ALL, new] and "unknown" in selection.reason
    other = impact.affected(tmp_path, ALL)
    assert other.run_all and "made for" in other.reason


def test_default_test_list_is_the_maps(impact: ImpactMap, project: Path) -> None:
    assert impact.affected(project).tests == [SUB, SUB_NEG]
    assert set(impact.tests) == set(ALL)


def test_save_load_roundtrip(impact: ImpactMap, tmp_path: Path) -> None:
    path = tmp_path / "impact.json"
    impact.save(path)
    loaded = ImpactMap.load(path)
    assert loaded is not None and loaded.to_dict() == impact.to_dict()


@pytest.mark.parametrize("content", ["", "{broken", "[]", json.dumps({"format": "pytest-loops.impact/0"}),
                                     json.dumps({"format": "pytest-loops.impact/1", "root": "/x"})],
                         ids=["empty", "broken", "list", "old-format", "missing-keys"])
def test_corrupt_map_loads_as_none(tmp_path: Path, content: str) -> None:
    path = tmp_path / "impact.json"
    path.write_text(content)
    assert ImpactMap.load(path) is None


def test_a_map_of_the_previous_format_means_everything_never_a_subset(
        impact: ImpactMap, project: Path, tmp_path: Path) -> None:
    """A map saved before file digests were treehash's (format /1: blake2b, another stat
    layout) is not read: the loop runs everything rather than trust its digests."""
    run_dir = tmp_path / "run"
    edit(project / "calc.py", "result = a + b", "result = a - b")
    context = SimpleNamespace(run_dir=run_dir, workdir=project)
    impact.save(run_dir / IMPACT_MAP)
    assert affected_tests(context) == [SUB, SUB_NEG, SUB_ZERO]  # the current format: a subset
    old = impact.to_dict()
    old["format"] = "pytest-loops.impact/1"
    old["files"] = {}
    for rel in impact.files:
        st = (project / rel).stat()
        digest = hashlib.blake2b((project / rel).read_bytes(), digest_size=16).hexdigest()
        old["files"][rel] = [digest, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    (run_dir / IMPACT_MAP).write_text(json.dumps(old))
    assert ImpactMap.load(run_dir / IMPACT_MAP) is None
    assert affected_tests(context) == []  # no map: the narrowed run is the failing tests, then a full confirm


def test_missing_map_loads_as_none(tmp_path: Path) -> None:
    assert ImpactMap.load(tmp_path / "nope.json") is None


def test_a_test_that_did_not_rerun_stays_selected(impact: ImpactMap, project: Path) -> None:
    """After a partial run that stopped early (-x), the skipped test is still owed a run."""
    edit(project / "calc.py", "result = a + b", "result = a - b")
    assert impact.affected(project, ALL).tests == [SUB, SUB_NEG, SUB_ZERO]
    # only test_sub ran (and now passes)
    partial = spectra_of({SUB: "passed"}, {SUB: {"calc.py": {9, 10}}}, root=str(project))
    after = impact.update(partial, project)
    selection = after.affected(project, ALL)
    assert selection.tests == [SUB_NEG, SUB_ZERO]
    assert after.dirty == {"calc.py"}


def test_update_keeps_a_changed_shared_block_forcing_full_runs(impact: ImpactMap, project: Path) -> None:
    edit(project / "calc.py", "return 100", "return 101")
    partial = spectra_of({OFFSET: "passed"}, {OFFSET: {}}, root=str(project),
                         shared={"calc.py": {18}})
    assert impact.update(partial, project).affected(project, ALL).run_all


@pytest.mark.parametrize("spectra_kwargs, why", [
    ({"collect_errors": ("tests/test_broken.py",)}, "collection error in tests/test_broken.py"),
    ({"collect_errors": ("a.py", "b.py")}, "collection error in a.py and 1 more"),
    ({"collected": 9}, "8 collected test(s) did not run"),
    ({"exit_code": 2}, "pytest exited 2"),
], ids=["collect-error", "collect-errors", "stopped-early", "interrupted"])
def test_map_from_an_incomplete_run_selects_everything(project: Path, spectra_kwargs: dict,
                                                       why: str) -> None:
    spectra = Spectra(root=str(project), outcomes={ADD: "passed"},
                      lines={ADD: {"calc.py": frozenset({5})}}, **spectra_kwargs)
    impact = ImpactMap.from_spectra(spectra, project)
    selection = impact.affected(project, [ADD])
    assert selection.run_all and why in selection.reason
    # a partial run does not make it complete
    assert impact.update(spectra_of({ADD: "passed"}, {ADD: {}}, root=str(project)),
                         project).affected(project, [ADD]).run_all


def test_peer_tests(impact: ImpactMap) -> None:
    assert peer_tests([SUB]) == ["tests/test_calc.py"]
    assert peer_tests([SUB, "tests/test_b.py::test_x[1]"]) == ["tests/test_calc.py", "tests/test_b.py"]
    # with a map: the tests that ran a non-test file the failing test ran
    assert peer_tests([SUB], impact) == [SUB, ADD, SCALE, SUB_NEG, SUB_ZERO]
    assert peer_tests(["tests/test_new.py::test_y"], impact) == ["tests/test_new.py"]


# ------------------------------------------------------------ narrowing


@pytest.mark.parametrize("command, python, options, targets", [
    ("pytest", None, (), ()),
    ("pytest -q tests/", None, ("-q",), ("tests/",)),
    ("python -m pytest -x -k 'not slow' tests", "python", ("-x", "-k", "not slow"), ("tests",)),
    ("/usr/bin/python3.11 -m pytest tests/test_a.py::test_b", "/usr/bin/python3.11", (), ("tests/test_a.py::test_b",)),
    ("py.test -rA --tb=short -p no:cacheprovider a.py", None,
     ("-rA", "--tb=short", "-p", "no:cacheprovider"), ("a.py",)),
    ("pytest -xk slow t", None, ("-xk", "slow"), ("t",)),
    ("pytest --maxfail 2 --junitxml out.xml t", None, ("--maxfail", "2", "--junitxml", "out.xml"), ("t",)),
    ("pytest 'tests/test_a.py::test_b[1-2]'", None, (), ("tests/test_a.py::test_b[1-2]",)),
    ("pytest -n 4 --loop-max-iter 3 t", None, ("-n", "4", "--loop-max-iter", "3"), ("t",)),
])
def test_narrow_plain_pytest(command: str, python: str | None, options: tuple[str, ...],
                             targets: tuple[str, ...]) -> None:
    parsed = narrow_pytest_command(command)
    assert parsed == PytestCommand(python=python, options=options, targets=targets)


def test_narrowed_command_runs_other_targets() -> None:
    parsed = narrow_pytest_command("python -m pytest -q tests/")
    assert parsed is not None
    assert parsed.argv == ["python", "-m", "pytest", "-q", "tests/"]
    assert parsed.with_targets(["tests/t.py::a", "tests/t.py::b"]) == [
        "python", "-m", "pytest", "-q", "tests/t.py::a", "tests/t.py::b"]
    script = narrow_pytest_command("pytest t")
    assert script is not None and script.with_targets(["x"]) == ["pytest", "x"]


@pytest.mark.parametrize("command", [
    "", "   ", "make test", "tox -e py311", "python -m unittest", "python -c 'import pytest'",
    "pytest tests && echo ok", "pytest tests | tee log", "pytest tests > out.txt", "pytest $ARGS",
    'pytest "$DIR"', "pytest `ls`", "pytest tests/*.py", "FOO=1 pytest", "pytest --lf",
    "pytest --sw tests", "pytest -f", "pytest --collect-only", "pytest --unknown-flag tests",
    "pytest -Z", "pytest -k", "pytest --maxfail", "pytest 'unclosed", "pytest -- tests",
    "python -X dev -m pytest", "pytest --cov", "pytest tests; rm -rf x", "pytest tests # note",
])
def test_narrow_refuses_what_it_cannot_rerun_safely(command: str) -> None:
    assert narrow_pytest_command(command) is None

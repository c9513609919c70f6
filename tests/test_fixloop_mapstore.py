"""The impact map a green judged run stores for the next fix-loop: signed, kept outside
the tree, read before the first revise, and never used once it fails a check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_loops.core.context import LoopContext
from pytest_loops.localization.impact import ImpactMap
from pytest_loops.localization.localize import publish_blocks
from pytest_loops.localization.mapstore import MAP_DOMAIN, MapStore
from pytest_loops.localization.spectra import collect_spectra
from pytest_loops.pytest_plugin.fixloop import SessionFixCheck
from pytest_loops.runtime.trust import json_mac, runlog_key

CALC = """\
def add(a, b):
    return a + b


def sub(a, b):
    return a - b
"""
TESTS = """\
import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(3, 2) == 1


def test_both():
    assert calc.add(1, 1) == calc.sub(4, 2)
"""
ALL = ["test_calc.py::test_add", "test_calc.py::test_sub", "test_calc.py::test_both"]


@pytest.fixture(scope="module")
def green(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A green run of every test under coverage, as the judged run measures it (made once)."""
    root = tmp_path_factory.mktemp("green") / "proj"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    spectra = collect_spectra(root, ALL, data_file=root.parent / "spectra.json")
    assert sorted(spectra.passed) == sorted(ALL)
    return ImpactMap.from_spectra(spectra, root).to_dict()


@pytest.fixture
def project(green: dict, tmp_path: Path) -> tuple[Path, MapStore]:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    impact = ImpactMap.from_dict(json.loads(json.dumps(green)))
    assert impact is not None
    impact.root = os.path.realpath(root)
    # the copy's files: the same digests, its own stat signatures (re-hashed when read)
    store = MapStore(root, None, directory=tmp_path / "state")
    assert store.save(impact)
    assert store.settle() == "" and store.path.is_file()  # stored when the loop ends
    return root, store


def break_sub(root: Path) -> None:
    text = (root / "calc.py").read_text()
    (root / "calc.py").write_text(text.replace("return a - b", "return a - b + 1"))


def plant_bug(root: Path) -> None:
    text = (root / "calc.py").read_text()
    (root / "calc.py").write_text(text.replace("return a + b", "return a - b"))


def fixer(root: Path, store: MapStore) -> SessionFixCheck:
    return SessionFixCheck(["test_calc.py::test_add"], ALL[1:], "", [], rootdir=root, confirm="affected",
                           store=store)


def fresh(store: MapStore) -> MapStore:
    """The store as a new loop opens it."""
    return MapStore(store.root, None, directory=store.path.parent)


def resign(store: MapStore, raw: dict, root: str) -> None:
    key = runlog_key(create=False)
    assert key is not None
    raw["mac"] = json_mac(key, MAP_DOMAIN, [root, "", raw["map"]])
    store.path.write_text(json.dumps(raw))


def test_a_stored_map_is_read_back_and_judges_the_affected_tests(project) -> None:
    root, store = project
    break_sub(root)
    check = fixer(root, fresh(store))
    assert check.impact is not None and check.map_note.startswith("impact map from ")
    ids, why = check.confirm_selection()
    # sub() changed: the tests that ran it, and the failing one
    assert ids == ALL, why
    assert why.startswith("affected: ")


def test_a_change_no_test_ran_reaches_only_the_failing_tests(project) -> None:
    root, store = project
    plant_bug(root)
    ids, why = fixer(root, fresh(store)).confirm_selection()
    assert ids == ["test_calc.py::test_add", "test_calc.py::test_both"], why


def test_confirm_full_never_reads_the_store(project) -> None:
    root, store = project
    genuine = store.path.read_bytes()
    check = SessionFixCheck(["test_calc.py::test_add"], ALL[1:], "", [], rootdir=root, confirm="full",
                            store=fresh(store))
    assert check.impact is None
    assert check.confirm_selection() == (ALL, "full (confirm=full)")
    assert check.store.settle() == "" and store.path.read_bytes() == genuine  # left alone


def test_no_stored_map_judges_everything(project) -> None:
    root, store = project
    store.path.unlink()
    assert fixer(root, fresh(store)).confirm_selection() == (ALL, "full (no impact map)")


def _forged(raw: dict) -> dict:
    """sub() ran in test_add alone: a change to sub() would reach no other test."""
    tests = raw["map"]["tests"]
    sub = {b: fp for b, fp in tests["test_calc.py::test_sub"]["deps"].items() if b.startswith("calc.py::sub")}
    assert sub
    for name in ("test_calc.py::test_sub", "test_calc.py::test_both"):
        for block in sub:
            tests[name]["deps"].pop(block, None)
    tests["test_calc.py::test_add"]["deps"].update(sub)
    return raw


def test_the_forged_map_would_hide_the_broken_test(project) -> None:
    # what the attacks below aim at: read as if it were genuine, it judges test_add alone
    root, store = project
    forged = ImpactMap.from_dict(_forged(json.loads(store.path.read_text()))["map"])
    assert forged is not None
    break_sub(root)
    check = fixer(root, fresh(store))
    check.impact = forged
    assert check.confirm_selection()[0] == ["test_calc.py::test_add"]


def test_attack_a_map_edited_without_the_key_fails_its_signature(project) -> None:
    root, store = project
    store.path.write_text(json.dumps(_forged(json.loads(store.path.read_text()))))
    break_sub(root)
    check = fixer(root, fresh(store))
    ids, why = check.confirm_selection()
    assert ids == ALL
    assert why == f"full (no impact map: the stored impact map {store.path} failed its signature check: not used)"


def test_attack_a_map_of_another_tree_is_not_used(project, tmp_path: Path) -> None:
    root, store = project
    raw = json.loads(store.path.read_text())
    raw["map"]["root"] = str(tmp_path / "elsewhere")
    resign(store, raw, store.root)  # signed for this root, made for another
    check = fixer(root, fresh(store))
    assert check.impact is None
    assert check.map_note == f"the stored impact map was made for {tmp_path / 'elsewhere'}, not {store.root}: not used"
    resign(store, raw, str(tmp_path / "elsewhere"))  # signed for the other root, as its own store holds it
    assert "failed its signature check" in fixer(root, fresh(store)).map_note


@pytest.mark.parametrize("garbage", ["", "{", "[]", '{"map": {}, "mac": 3}'])
def test_an_unreadable_entry_is_not_used(project, garbage: str) -> None:
    root, store = project
    store.path.write_text(garbage)
    check = fixer(root, fresh(store))
    assert check.impact is None and check.map_note.endswith(": not used")


def test_the_entry_is_off_the_disk_while_a_loop_runs_and_back_after(project) -> None:
    _, store = project
    genuine = store.path.read_bytes()
    opened = fresh(store)
    assert opened.load() is not None
    assert not store.path.exists()  # nothing for a revise step to edit or delete
    assert opened.settle() == ""
    assert store.path.read_bytes() == genuine


def test_a_loop_killed_before_its_end_leaves_no_map(project) -> None:
    _, store = project
    assert fresh(store).load() is not None  # ... and never settled
    assert fresh(store).load() is None


def test_an_entry_written_during_the_loop_is_deleted_and_the_read_one_put_back(project) -> None:
    _, store = project
    genuine = store.path.read_bytes()
    raw = _forged(json.loads(genuine))
    opened = fresh(store)
    assert opened.load() is not None
    resign(store, raw, store.root)  # even validly signed: it was written behind the harness
    note = opened.settle()
    assert note == f"the stored impact map {store.path} was written during the loop, not by it: deleted"
    assert store.path.read_bytes() == genuine


def test_an_entry_written_during_a_loop_that_found_none_is_deleted(project) -> None:
    _, store = project
    data = store.path.read_bytes()
    store.path.unlink()
    opened = fresh(store)
    assert opened.load() is None and opened.note == ""
    store.path.write_bytes(data)  # planted by a revise step: the harness wrote nothing
    assert "written during the loop, not by it: deleted" in opened.settle()
    assert not store.path.exists()


def test_a_map_the_loop_saved_replaces_the_one_it_read(project, green: dict) -> None:
    root, store = project
    opened = fresh(store)
    assert opened.load() is not None
    newer = ImpactMap.from_dict(json.loads(json.dumps(green)))
    assert newer is not None
    newer.root = store.root
    newer.tests.pop("test_calc.py::test_both")
    assert opened.save(newer) and not store.path.exists()  # held until the loop ends
    assert opened.settle() == ""
    again = fresh(store).load()
    assert again is not None and "test_calc.py::test_both" not in again.tests


def test_an_unusable_entry_is_not_put_back(project) -> None:
    _, store = project
    store.path.write_text("{")
    opened = fresh(store)
    assert opened.load() is None and opened.note.endswith(": not used")
    assert opened.settle() == "" and not store.path.exists()


def test_the_entry_is_private_to_the_tree_and_its_config(project, tmp_path: Path) -> None:
    root, store = project
    other = MapStore(root, str(root / "pytest.ini"), directory=store.path.parent)
    assert other.path != store.path and other.load() is None
    assert MapStore(tmp_path / "proj2", None, directory=store.path.parent).path != store.path


# -- suspects without a run under coverage ---------------------------------------------------


def test_suspects_are_the_changed_functions_the_failing_tests_ran(project, tmp_path: Path) -> None:
    root, store = project
    plant_bug(root)
    impact = fresh(store).load()
    assert impact is not None
    ranked = impact.changed_suspects(root, ["test_calc.py::test_add", "test_calc.py::test_both"])
    assert [b for b, _ in ranked] == ["calc.py::add"]
    context = LoopContext(spec=None, iteration=1, workdir=root, run_dir=tmp_path / "run",  # type: ignore[arg-type]
                          runner=None, clock=lambda: 0.0, deadline=None, base_env={})  # type: ignore[arg-type]
    assert publish_blocks(context, ranked) == 1
    assert context.suspects == ["calc.py:1 in add() (1.00): def add(a, b):"]
    saved = json.loads((context.iteration_dir / "suspects.json").read_text())
    assert saved[0]["scope"] == "add()" and saved[0]["line"] == 1


def test_no_suspects_from_a_map_that_cannot_vouch(project) -> None:
    root, store = project
    plant_bug(root)
    (root / "calc.py").write_text("LIMIT = 3\n" + (root / "calc.py").read_text())  # module level
    impact = fresh(store).load()
    assert impact is not None and impact.changed_suspects(root, ["test_calc.py::test_add"]) == []


@pytest.mark.parametrize("name", ["venv", ".venv", "site-packages", "dist-packages", ".eggs", "calc.egg-info"])
def test_attack_code_in_a_directory_named_like_a_venv_is_still_in_the_map(tmp_path: Path, name: str) -> None:
    """A package directory named `venv` (no pyvenv.cfg) is code the guard judges: a change
    there must reach the map (it once skipped such names, so a change to the code in it
    read as "no code change since the last run"). A real virtual environment stays out."""
    from pytest_loops.localization.impact import snapshot

    root = tmp_path / "proj"
    (root / "calcimpl" / name).mkdir(parents=True)
    (root / "calcimpl" / name / "core.py").write_text("def sub(a, b):\n    return a - b\n")
    (root / "env" / "lib").mkdir(parents=True)
    (root / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "env" / "lib" / "site.py").write_text("x = 1\n")
    files, _ = snapshot(root)
    assert f"calcimpl/{name}/core.py" in files
    assert not any(path.startswith("env/") for path in files)


def test_attack_a_directory_named_pyvenv_cfg_makes_no_venv(tmp_path: Path) -> None:
    """Only a regular file named pyvenv.cfg makes a virtual environment: a package holding
    a directory of that name is still code, in the map and for the guard."""
    from pytest_loops.limits import is_venv
    from pytest_loops.localization.impact import snapshot

    root = tmp_path / "proj"
    (root / "calcutil" / "pyvenv.cfg").mkdir(parents=True)
    (root / "calcutil" / "arith.py").write_text("def minus(a, b):\n    return a - b\n")
    (root / "linked").mkdir()
    (root / "linked" / "pyvenv.cfg").symlink_to(root / "calcutil" / "arith.py")
    (root / "linked" / "mod.py").write_text("x = 1\n")
    assert not is_venv(root / "calcutil") and not is_venv(root / "linked")
    files, _ = snapshot(root)
    assert "calcutil/arith.py" in files and "linked/mod.py" in files


def test_attack_data_in_tool_directories_is_in_the_map(tmp_path: Path) -> None:
    """Data the code reads from `node_modules`, `.tox` or a `.coverage.*` file is an input
    the map tracks (a change there judges every test); pytest's and hypothesis's caches,
    which every run rewrites and the judged run never sees, are not (the audit flags code
    that names them)."""
    from pytest_loops.localization.impact import snapshot

    root = tmp_path / "proj"
    for rel in ("node_modules/calc/offset.txt", ".tox/log.txt", ".coverage.calc", ".mypy_cache/x.json",
                ".pytest_cache/v/x", ".hypothesis/examples/x", ".coverage", "pkg/__pycache__/m.pyc"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("1\n")
    files, _ = snapshot(root)
    assert {"node_modules/calc/offset.txt", ".tox/log.txt", ".coverage.calc", ".mypy_cache/x.json"} <= set(files)
    assert not {".pytest_cache/v/x", ".hypothesis/examples/x", ".coverage", "pkg/__pycache__/m.pyc"} & set(files)

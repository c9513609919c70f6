"""Localization on what decides a failure: lines run only to format the failure message
(``__repr__``, ``__eq__`` for a diff, pytest's assertion helpers, unittest's message makers)
are no suspects; lines changed since the last green run rank first; the suspects step's
map reads only the files the run covered."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from plugin_helpers import SUITE_SETTINGS

from pytest_loops.localization import impact as impact_module
from pytest_loops.localization.impact import STAT_ONLY, ImpactMap
from pytest_loops.localization.spectra import Spectra, collect_spectra, read_spectra
from pytest_loops.localization.suspects import group_suspects, rank_suspects

BOX = '''\
class Box:
    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v * 2

    def __repr__(self):
        parts = [str(self.v)]
        return "Box(" + ",".join(parts) + ")"

    def __eq__(self, other):
        return isinstance(other, Box) and self.v == other.v


def helper(v):
    return v + 1
'''
GET_LINE = 6
REPR_LINES = {9, 10}

TESTS = '''\
import unittest

from box import Box, helper


def test_get():
    assert Box(2).get() == 5


def test_get_ok():
    assert Box(0).get() == 0


def test_message_not_evaluated_when_passing():
    b = Box(1)
    assert helper(1) == 2, f"bad {b!r}"


class TestSub(unittest.TestCase):
    def test_sub(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertEqual(Box(i), Box(0))
                helper(i)
'''


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_LOOPS_", "LOOP_", "COVERAGE_")) and k != "PYTEST_ADDOPTS"
            or k.startswith(SUITE_SETTINGS)}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Spectra]:
    root = tmp_path_factory.mktemp("box")
    (root / "box.py").write_text(BOX)
    (root / "test_box.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    spectra = collect_spectra(root, [], pytest_args=["-q", "-p", "no:cacheprovider"],
                              data_file=root.parent / "run" / "spectra.json", env=clean_env())
    return root, spectra


def test_a_repr_run_for_the_failure_message_is_after_the_failure(measured: tuple[Path, Spectra]) -> None:
    _, spectra = measured
    get = "test_box.py::test_get"
    assert spectra.outcomes[get] == "failed"
    own = spectra.lines[get]["box.py"]
    assert GET_LINE in own and not own & REPR_LINES  # pytest's _saferepr ran Box.__repr__
    assert REPR_LINES <= spectra.after[get]["box.py"]
    assert REPR_LINES <= spectra.ran(get)["box.py"]  # still what a change can reach


def test_unittest_subtests_after_a_failing_one_are_measured_again(measured: tuple[Path, Spectra]) -> None:
    _, spectra = measured
    sub = "test_box.py::TestSub::test_sub"
    assert spectra.outcomes[sub] == "failed"
    own = spectra.lines[sub]["box.py"]
    assert not own & REPR_LINES  # unittest's message maker ran __repr__ after the failure
    assert 17 in own  # helper(): run after the failing subtest reported, in the next subtests
    assert REPR_LINES <= spectra.after[sub]["box.py"]


def test_a_passing_test_has_no_after_failure_lines(measured: tuple[Path, Spectra]) -> None:
    _, spectra = measured
    for nodeid in ("test_box.py::test_get_ok", "test_box.py::test_message_not_evaluated_when_passing"):
        assert spectra.outcomes[nodeid] == "passed"
        assert nodeid not in spectra.after


def test_no_formatting_line_is_a_suspect(measured: tuple[Path, Spectra]) -> None:
    _, spectra = measured
    ranked = rank_suspects(spectra, top=10)
    assert not {s.line for s in ranked if s.file == "box.py"} & REPR_LINES
    assert "Box.__repr__()" not in [g.scope for g in group_suspects(ranked)]


def test_the_impact_map_counts_the_after_failure_lines(measured: tuple[Path, Spectra]) -> None:
    root, spectra = measured
    impact = ImpactMap.from_spectra(spectra, root)
    assert "box.py::Box.__repr__" in impact.tests["test_box.py::test_get"].deps


def test_old_spectra_without_after_still_read(tmp_path: Path) -> None:
    data = tmp_path / "spectra.json"
    data.write_text('{"format": "pytest-loops.spectra/1", "root": "/r", "outcomes": {"t": "failed"},'
                    ' "contexts": {"t": {"m.py": [1]}}}')
    spectra = read_spectra(data)
    assert spectra.after == {} and spectra.ran("t") == {"m.py": frozenset({1})}


def _spectra(lines: dict[str, dict[str, set[int]]], outcomes: dict[str, str]) -> Spectra:
    return Spectra(root="/nowhere", outcomes=outcomes,
                   lines={t: {f: frozenset(ls) for f, ls in files.items()} for t, files in lines.items()})


def test_changed_lines_rank_first() -> None:
    spectra = _spectra({"f": {"m.py": {1, 2, 3}}, "p": {"m.py": {1, 2}}}, {"f": "failed", "p": "passed"})
    assert [s.line for s in rank_suspects(spectra)] == [3, 1, 2]
    ranked = rank_suspects(spectra, changed={"m.py": {2}})
    assert [s.line for s in ranked] == [2, 3, 1]
    assert ranked[0].score < ranked[1].score  # the score stays Ochiai's
    assert [s.line for s in rank_suspects(spectra, changed={"other.py": {2}})] == [3, 1, 2]
    assert [s.line for s in rank_suspects(spectra, changed={"m.py": {9}}, top=1)] == [3]  # not run: no suspect


# ------------------------------------------------------------ the suspects step's map


def _tree(root: Path, data_files: int) -> None:
    (root / "box.py").write_text(BOX)
    (root / "data").mkdir()
    for i in range(data_files):
        (root / "data" / f"d{i}.txt").write_text(f"{i}\n")
    old = 1_000_000_000_000_000_000  # long before the snapshot: not racy
    for path in root.rglob("*"):
        os.utime(path, ns=(old, old))


def _covering(root: Path) -> Spectra:
    return Spectra(root=str(root), outcomes={"t": "failed"}, lines={"t": {"box.py": frozenset({GET_LINE})}})


def test_covered_only_reads_the_covered_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, 20)
    read: list[str] = []
    real = impact_module._digest
    monkeypatch.setattr(impact_module, "_digest", lambda path: read.append(path) or real(path))
    impact = ImpactMap.from_spectra(_covering(tmp_path), tmp_path, covered_only=True)
    assert [os.path.basename(p) for p in read] == ["box.py"]
    assert impact.files["data/d3.txt"][0].startswith(STAT_ONLY)
    assert not impact.files["box.py"][0].startswith(STAT_ONLY)
    read.clear()
    again = ImpactMap.from_spectra(_covering(tmp_path), tmp_path, previous=impact, covered_only=True)
    assert read == []  # nothing changed: the previous map lends its digest
    assert again.files == impact.files
    full = ImpactMap.from_spectra(_covering(tmp_path), tmp_path)  # a map a verdict may rest on: every file read
    assert not any(entry[0].startswith(STAT_ONLY) for entry in full.files.values())


def test_a_change_to_a_file_the_map_did_not_read_means_every_test(tmp_path: Path) -> None:
    _tree(tmp_path, 3)
    impact = ImpactMap.from_spectra(_covering(tmp_path), tmp_path, covered_only=True)
    assert not impact.affected(tmp_path, ["t"]).run_all
    os.chmod(tmp_path / "data" / "d1.txt", 0o600)  # ctime only (the guard does this): still unchanged
    assert not impact.affected(tmp_path, ["t"]).run_all
    (tmp_path / "data" / "d1.txt").write_text("changed\n")
    selection = impact.affected(tmp_path, ["t"])
    assert selection.run_all and "data/d1.txt" in selection.reason


def test_changed_lines_come_from_the_map_of_the_last_green_run(measured: tuple[Path, Spectra],
                                                               tmp_path: Path) -> None:
    from pytest_loops.localization.localize import changed_lines

    root, spectra = measured
    copy = tmp_path / "box"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    impact = ImpactMap.from_spectra(spectra, copy)
    sub = "test_box.py::TestSub::test_sub"
    assert changed_lines(impact, copy, [sub]) == {}
    (copy / "box.py").write_text(BOX.replace("return v + 1", "return v + 2"))
    assert changed_lines(impact, copy, [sub]) == {"box.py": [16, 17]}  # helper(), which the failing test ran
    assert changed_lines(impact, copy, ["test_box.py::test_get"]) == {}  # it never ran helper()
    (copy / "box.py").write_text("X = 1\n" + BOX)  # module-level change: the map cannot say
    assert changed_lines(impact, copy, [sub]) == {}


def test_changed_lines_reach_the_ranking(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pytest_loops.localization.localize import CHANGED_FILE, _read_changed, write_changed

    context = SimpleNamespace(iteration_dir=tmp_path)
    assert _read_changed(context) is None  # type: ignore[arg-type]
    write_changed(context, {})  # type: ignore[arg-type]
    assert not (tmp_path / CHANGED_FILE).exists()
    write_changed(context, {"m.py": [2, 3]})  # type: ignore[arg-type]
    assert _read_changed(context) == {"m.py": {2, 3}}  # type: ignore[arg-type]
    (tmp_path / CHANGED_FILE).write_text("[not a map")
    assert _read_changed(context) is None  # type: ignore[arg-type]

"""The clean room's rule for a command check: a test the loop saw failing must be seen passing.

A check such as `python -m pytest -q` exits 0 when the failing test is skipped,
xfailed or deselected. The working tree's output names the failing tests; in the
clean room the witness must record each of them called and passed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pytest_loops.core.engine import Engine
from pytest_loops.results import CheckResult
from pytest_loops.runtime.cleanroom import JudgeChannel, JudgeRecord, failed_node_ids
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict


def record(**outcomes: set[str]) -> JudgeRecord:
    rec = JudgeRecord(starts=1, finishes=[0])
    for node, seen in outcomes.items():
        node = node.replace("__", "::")
        rec.outcomes[node] = set(seen)
        rec.called.add(node)
    return rec


def test_failed_lines_name_the_failing_tests_once_each() -> None:
    lines = ["tests/t.py::test_a FAILED\n", "FAILED tests/t.py::test_a - assert 1 == 2\n",
             "ERROR tests/t.py::test_b - fixture 'x' not found\n", "FAILED tests/t.py::test_a\n",
             "FAILED not-a-node-id\n", "  FAILED tests/t.py::indented\n"]
    assert failed_node_ids(lines) == ("tests/t.py::test_a", "tests/t.py::test_b")


def test_each_test_that_failed_must_be_witnessed_passing() -> None:
    assert record(t__a={"passed"}).unearned(["t::a"]) is None
    assert record(t__a={"passed"}).unearned([]) is None
    assert "is now skipped" in (record(t__a={"raised", "skipped"}).unearned(["t::a"]) or "")
    assert "is now xfail" in (record(t__a={"raised", "xfail"}).unearned(["t::a"]) or "")
    assert "not run in the clean room" in (record(t__b={"passed"}).unearned(["t::a"]) or "")
    assert "loaded the harness's witness" in (JudgeRecord().unearned(["t::a"]) or "")
    # a report rewritten to pass after the call raised is not a pass
    assert "yet its report says passed" in (record(t__a={"raised", "passed"}).unearned(["t::a"]) or "")


def test_a_parametrized_id_cut_at_a_space_matches_its_whole_id() -> None:
    rec = record(**{"t__a[x y]": {"passed"}})
    assert rec.unearned(["t::a[x"]) is None
    rec.outcomes["t::a[x z]"] = {"skipped"}
    rec.called.add("t::a[x z]")
    assert "t::a[x z]" in (rec.unearned(["t::a[x"]) or "")


def test_a_name_relative_to_where_pytest_started_matches_the_rootdir_id() -> None:
    rec = record(**{"tests/test_x.py__t": {"passed"}})
    assert rec.unearned(["test_x.py::t"]) is None  # cd tests && pytest
    assert rec.unearned(["../tests/test_x.py::t"]) is None  # started in a sibling directory
    assert rec.unearned(["proj/tests/test_x.py::t"]) is None  # started above the rootdir
    assert rec.unearned(["other_x.py::t"]) is not None


def test_the_witness_channel_reads_back_what_it_recorded(tmp_path: Path) -> None:
    channel = JudgeChannel(str(tmp_path))
    lines = [{"event": "start"}, {"event": "test", "nodeid": "t::a", "when": "call", "outcome": "skipped"},
             {"event": "finish", "exitstatus": 0}]
    Path(channel.path).write_text("".join(json.dumps({**x, "nonce": channel.nonce}) + "\n" for x in lines))
    assert "is now skipped" in (channel.read().unearned(["t::a"]) or "")


def _project(root: Path, calc: str) -> None:
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_other():\n    pass\n")
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\naddopts = -p no:cacheprovider\n")
    (root / "fix.py").write_text(f"import pathlib\npathlib.Path('calc.py').write_text({calc!r})\n")


def _run(root: Path) -> object:
    spec = LoopSpec(name="room", checks=(Check.command_passes("cd . && python -m pytest -q"),), revise="python fix.py",
                    cwd=str(root), guards=Guards(max_iter=2, budget_seconds=120, no_progress_k=0))
    return Engine(write_index=False, localize=False, audit="off").run(spec)


def test_a_failing_test_the_code_skips_is_not_a_success(tmp_path: Path) -> None:
    _project(tmp_path, "import unittest\n\n\ndef add(a, b):\n    raise unittest.SkipTest('later')\n")
    result = _run(tmp_path)
    assert result.verdict is Verdict.ESCALATE, result.reason
    assert "tests/test_calc.py::test_add failed earlier and is now skipped" in result.reason
    first: CheckResult = result.iterations[0].checks[0]
    assert not first.passed


def test_a_genuine_fix_of_a_command_check_succeeds(tmp_path: Path) -> None:
    _project(tmp_path, "def add(a, b):\n    return a + b\n")
    result = _run(tmp_path)
    assert result.verdict is Verdict.SUCCESS, result.reason
    assert [c.passed for c in result.iterations[-1].clean_room] == [True]

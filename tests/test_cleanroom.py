"""The clean room, the witness plugin, hidden checks, and what never reaches a child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.errors import LoopUsageError
from pytest_loops.runtime.cleanroom import CleanRoom, JudgeChannel, clean_environment
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

CLI = [sys.executable, "-m", "pytest_loops"]


def project(root: Path) -> Path:
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (root / "fix.py").write_text(
        "import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace('a - b', 'a + b'))\n")
    return root


def run(root: Path, revise: str, *checks: Check, **kw) -> object:
    spec = LoopSpec(name="room", checks=checks or (Check.test_passes("tests/test_calc.py::test_add"),),
                    revise=revise, cwd=str(root), guards=Guards(max_iter=3, budget_seconds=120, no_progress_k=0))
    return make_engine(write_index=False, localize=False, **kw).run(spec)


def test_a_fix_that_reads_the_harness_environment_fails_in_the_clean_room(tmp_path: Path) -> None:
    """The working tree runs the checks with LOOP_* set; the clean room without: code that
    is right only under the harness's variables passes once and is caught."""
    project(tmp_path)
    (tmp_path / "cheat.py").write_text(textwrap.dedent("""
        import pathlib
        pathlib.Path('calc.py').write_text(
            "import os\\n\\ndef add(a, b):\\n    return a + b if os.environ.get('LOOP_NAME') else a - b\\n")
    """))
    result = run(tmp_path, "python cheat.py", audit="off")
    assert result.verdict is Verdict.ESCALATE, result.reason
    assert "passed in the working tree but not in the clean room" in result.reason
    last = result.iterations[-1]
    assert last.guard == "clean_room" and last.clean_room_s is not None
    assert [c.passed for c in last.clean_room] == [False]


def test_the_audit_catches_the_same_fix_first(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "cheat.py").write_text(textwrap.dedent("""
        import pathlib
        pathlib.Path('calc.py').write_text(
            "import os\\n\\ndef add(a, b):\\n    return a + b if os.environ.get('LOOP_NAME') else a - b\\n")
    """))
    result = run(tmp_path, "python cheat.py")
    assert result.verdict is Verdict.ESCALATE
    assert result.iterations[-1].guard == "audit"
    assert "LOOP_NAME" in result.reason and "calc.py:4" in result.reason


def test_atexit_exit_zero_disagrees_with_the_witness(tmp_path: Path) -> None:
    """`atexit.register(os._exit, 0)` turns a failing pytest green by its exit code only."""
    project(tmp_path)
    (tmp_path / "cheat.py").write_text(textwrap.dedent("""
        import pathlib
        p = pathlib.Path('calc.py')
        p.write_text(p.read_text() + "\\nimport atexit, os\\natexit.register(os._exit, 0)\\n")
    """))
    result = run(tmp_path, "python cheat.py", Check.command_passes("python -m pytest -q"), audit="off")
    assert result.verdict is Verdict.ESCALATE, result.reason
    assert "witness disagrees with the exit code" in result.reason


@pytest.mark.slow
def test_a_genuine_fix_is_witnessed(tmp_path: Path) -> None:
    project(tmp_path)
    result = run(tmp_path, "python fix.py", Check.command_passes("python -m pytest -q"),
                 Check.test_passes("tests/test_calc.py::test_add"))
    assert result.verdict is Verdict.SUCCESS, result.reason
    reasons = [c.reason for c in result.iterations[-1].clean_room]
    assert reasons == ["passed", "1 test(s) passed (witnessed)"]


def test_no_clean_room_when_no_revise_step_ran(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    result = run(tmp_path, "python fix.py")
    assert result.verdict is Verdict.SUCCESS and result.iterations[-1].clean_room == []


def test_hidden_checks_run_only_in_the_clean_room_and_are_never_shown(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "hidden_check.py").write_text("import calc, sys\nsys.exit(0 if calc.add(-1, 1) == 0 else 1)\n")
    (tmp_path / "cheat.py").write_text(textwrap.dedent("""
        import os, pathlib, glob
        seen = pathlib.Path(os.environ['LOOP_PROMPT_FILE']).read_text()
        seen += ''.join(pathlib.Path(p).read_text() for p in glob.glob('.pytest-loops/runs/*.json'))
        pathlib.Path('seen.txt').write_text(seen)
        pathlib.Path('calc.py').write_text('def add(a, b):\\n    return 5\\n')
    """))
    visible = Check.test_passes("tests/test_calc.py::test_add")
    hidden = Check.command_passes("python hidden_check.py", hidden=True)
    result = run(tmp_path, "python cheat.py", visible, hidden)
    assert result.verdict is Verdict.ESCALATE, result.reason
    assert result.reason.startswith('the hidden check "python hidden_check.py" passes did not pass')
    assert len(result.iterations[0].checks) == 1  # the working tree never ran it
    seen = (tmp_path / "seen.txt").read_text()
    assert "hidden_check.py" not in seen and "(hidden)" in seen  # the run log shows only that it exists


@pytest.mark.slow
def test_a_genuine_fix_passes_hidden_checks(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "hidden_check.py").write_text("import calc, sys\nsys.exit(0 if calc.add(-1, 1) == 0 else 1)\n")
    result = run(tmp_path, "python fix.py", Check.test_passes("tests/test_calc.py::test_add"),
                 Check.command_passes("python hidden_check.py", hidden=True))
    assert result.verdict is Verdict.SUCCESS, result.reason
    assert [c.passed for c in result.iterations[-1].clean_room] == [True, True]


def test_a_loop_of_hidden_checks_only_is_bad_input() -> None:
    with pytest.raises(LoopUsageError, match="only hidden checks"):
        LoopSpec(name="x", checks=(Check.command_passes("true", hidden=True),))


@pytest.mark.slow
def test_hidden_verify_from_the_command_line(tmp_path: Path) -> None:
    project(tmp_path)
    (tmp_path / "hidden_check.py").write_text("import calc, sys\nsys.exit(0 if calc.add(-1, 1) == 0 else 1)\n")
    done = subprocess.run([*CLI, "run", "-q", "--verify", "python -m pytest -q", "--hidden-verify",
                           "python hidden_check.py", "--revise", "python fix.py", "--no-suspects"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    log = json.loads(sorted((tmp_path / ".pytest-loops" / "runs").glob("*.json"))[-1].read_text())
    assert [c["passed"] for c in log["iterations"][-1]["clean_room"]] == [True, True]


def test_the_signing_key_never_reaches_a_child(tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text("import os, json\nopen('env.json', 'w').write(json.dumps(dict(os.environ)))\n")
    env = {**os.environ, "SIGN_KEY": "k" * 32}
    done = subprocess.run([*CLI, "run", "-q", "--verify", "python env.py && false", "--max-iter", "1",
                           "--sign-key-env", "SIGN_KEY"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    seen = json.loads((tmp_path / "env.json").read_text())
    assert "SIGN_KEY" not in seen and "k" * 32 not in json.dumps(seen)
    assert list((tmp_path / ".pytest-loops" / "runs").glob("*.tine")), "the .tine is still signed and written"


def test_clean_environment_drops_the_harness_variables() -> None:
    env = {"PATH": "/bin", "LOOP_NAME": "x", "PYTEST_LOOPS_CHILD": "1", "PYTEST_XDIST_WORKER": "gw0",
           "PYTEST_CURRENT_TEST": "t", "KEEP": "1", "SIGN": "s"}
    assert clean_environment(env, drop=["SIGN"]) == {"PATH": "/bin", "KEEP": "1"}


def test_the_witness_record_refuses_lines_it_did_not_write(tmp_path: Path) -> None:
    channel = JudgeChannel(str(tmp_path))
    with open(channel.path, "a") as f:
        f.write(json.dumps({"nonce": channel.nonce, "event": "start"}) + "\n")
        f.write(json.dumps({"nonce": channel.nonce, "event": "test", "nodeid": "t::a", "when": "call",
                            "outcome": "passed"}) + "\n")
        f.write(json.dumps({"nonce": channel.nonce, "event": "finish", "exitstatus": 0}) + "\n")
    record = channel.read()
    assert record.passed == {"t::a"} and record.disagreement(0) is None
    with open(channel.path, "a") as f:
        f.write(json.dumps({"nonce": "guess", "event": "test", "nodeid": "t::b", "when": "call",
                            "outcome": "passed"}) + "\n")
    assert "did not write" in (channel.read().disagreement(0) or "")


@pytest.mark.parametrize(("lines", "exit_code", "expected"), [
    ([{"event": "start"}], 0, "without finishing its session"),
    ([{"event": "start"}, {"event": "finish", "exitstatus": 1}], 0, "exit status was 1"),
    ([{"event": "start"}, {"event": "test", "nodeid": "a", "when": "call", "outcome": "failed"},
      {"event": "finish", "exitstatus": 0}], 0, "the witness saw a fail"),
    ([{"event": "start"}, {"event": "finish", "exitstatus": 1}], 1, None),
    ([], 0, None),  # no pytest ran: the exit code decides
])
def test_disagreements(tmp_path: Path, lines, exit_code: int, expected: str | None) -> None:
    channel = JudgeChannel(str(tmp_path))
    with open(channel.path, "a") as f:
        for line in lines:
            f.write(json.dumps({"nonce": channel.nonce, **line}) + "\n")
    found = channel.read().disagreement(exit_code)
    if expected is None:
        assert found is None
    else:
        assert found is not None and expected in found


def test_paths_of_the_working_tree_move_into_the_room(tmp_path: Path) -> None:
    with CleanRoom(str(tmp_path), {"LOOP_NAME": "x"}) as room:
        assert room.map_path(f"--rootdir={tmp_path}") == f"--rootdir={room.root}"
        assert room.map_path(str(tmp_path / "pytest.ini")) == os.path.join(room.root, "pytest.ini")
        assert room.map_path("/elsewhere/x.ini") == "/elsewhere/x.ini"
        assert "LOOP_NAME" not in room.env
    assert not os.path.exists(room.parent)


def test_finds_nothing_judges_the_whole_output_not_its_tail(tmp_path: Path) -> None:
    """A finding followed by 3,000 blank characters is still a finding."""
    (tmp_path / "lint.py").write_text("print('calc.py:1: E999 found')\nprint(' ' * 3000)\n")
    spec = LoopSpec(name="lint", checks=(Check.finds_nothing("python lint.py"),), cwd=str(tmp_path),
                    guards=Guards(max_iter=1, no_progress_k=0))
    result = make_engine(write_index=False).run(spec)
    assert result.verdict is Verdict.MAX_ITER
    assert result.iterations[0].checks[0].reason == "found something (1 line(s) of output)"

"""Exact resume: `pytest-loops run` killed (SIGKILL) at chosen points, then `--resume`,
ends with the verdict and iteration count of an uninterrupted run. One writer per
run log; a log with duplicate iterations is not resumed.

Each kill point is reached by a step that signals readiness through a file and
then waits; the test kills the runner as soon as the file appears.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_helpers import clean_env

from pytest_loops.artifacts.runlog import load_runlog, sign_events
from pytest_loops.runtime.trust import runlog_key

pytestmark = pytest.mark.faults

CLI = [sys.executable, "-m", "pytest_loops", "run"]

# After the iteration line that decided SUCCESS, before the summary: the finish window.
HOLD_PLUGIN = """\
import os, pathlib, time
import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


@hookimpl
def pytest_loop_iteration_finished(spec, record):
    if record.passed:
        pathlib.Path("ready").write_text(str(os.getpid()))
        time.sleep(120)
"""

# One step per iteration (idempotent: re-running iteration N's step changes nothing);
# the check passes once two steps are in. The first revise of iteration 2 makes its
# change, then hangs until it is killed: a kill *during* the revise step.
REVISE = """\
import os, pathlib, time

n = os.environ["LOOP_ITERATION"]
pathlib.Path("steps").mkdir(exist_ok=True)
pathlib.Path("steps", n).write_text(n)
if n == "2" and not pathlib.Path("killed-once").exists():
    pathlib.Path("killed-once").write_text("")
    pathlib.Path("ready").write_text(str(os.getpid()))
    time.sleep(120)
"""
CHECK = "import pathlib, sys\nsys.exit(0 if len(list(pathlib.Path('steps').glob('*'))) >= 2 else 1)\n"


def _project(path: Path) -> Path:
    path.mkdir()
    (path / "rev.py").write_text(REVISE)
    (path / "check.py").write_text(CHECK)
    (path / "hold.py").write_text(HOLD_PLUGIN)
    return path


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=clean_env({"PYTHONPATH": str(cwd)}),
                          capture_output=True, text=True, timeout=120)


def _start_and_kill_when_ready(cwd: Path, *args: str, while_held=None) -> None:
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=clean_env({"PYTHONPATH": str(cwd)}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (cwd / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (cwd / "ready").exists(), proc.communicate(timeout=30)
        if while_held is not None:
            while_held(proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


LOOP = ["--verify", "python check.py", "--revise", "python rev.py", "--max-iter", "6",
        "--no-progress-k", "0", "--no-suspects"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The verdict line of the loop run without a kill: what every resume must reach."""
    whole = _project(tmp_path_factory.mktemp("resume") / "whole")
    (whole / "killed-once").write_text("")
    done = _run(whole, *LOOP, "-q")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("SUCCESS (exit 0) after 3 iteration(s)")
    return line.split(" in ")[0]


def test_kill_in_the_finish_window_resumes_to_the_same_verdict(tmp_path: Path, uninterrupted: str) -> None:
    cut = _project(tmp_path / "cut")
    (cut / "killed-once").write_text("")
    _start_and_kill_when_ready(cut, *LOOP, "--log", "run.json", "-p", "hold")
    assert load_runlog(cut / "run.json")["decided"]["verdict"] == "SUCCESS"
    resumed = _run(cut, "--resume", "run.json", "--log", "resumed.json")
    assert resumed.returncode == 0, resumed.stderr
    assert uninterrupted in resumed.stdout
    data = load_runlog(cut / "resumed.json")
    assert data["verified"] is True and data["iterations_run"] == 3
    assert [r["iter"] for r in data["iterations"]] == [1, 2, 3]


@pytest.mark.floor  # pids inside a PID namespace are not the host's: this tests the runner's own kill
def test_kill_during_revise_reruns_it_once_and_keeps_the_count(tmp_path: Path, uninterrupted: str) -> None:
    cut = _project(tmp_path / "cut")
    second: list[subprocess.CompletedProcess[str]] = []

    def same_log_while_held(proc: subprocess.Popen[str]) -> None:
        # one writer per run log: a second run given the same --log is refused, and so
        # is resuming a log that is still being written
        second.append(_run(cut, *LOOP, "--log", "run.json"))
        second.append(_run(cut, "--resume", "run.json", "--log", "early.json"))

    _start_and_kill_when_ready(cut, *LOOP, "--log", "run.json", while_held=same_log_while_held)
    refused, early = second
    assert refused.returncode == 64
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "another run is writing this run log" in lines[0], refused.stderr
    assert "held by pid " in lines[0] and " since " in lines[0]
    assert early.returncode == 64 and "the run log to resume is still being written" in early.stderr
    assert len(early.stderr.strip().splitlines()) == 1

    orphan = int((cut / "ready").read_text())
    try:
        killed = load_runlog(cut / "run.json")
        assert killed["revise_interrupted"]["iter"] == 2 and killed["iterations_run"] == 1

        resumed = _run(cut, "--resume", "run.json", "--log", "resumed.json")
        assert resumed.returncode == 0, resumed.stderr
        assert uninterrupted in resumed.stdout
        assert not _alive(orphan), "the killed run's revise step was left running"
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
    data = load_runlog(cut / "resumed.json")
    assert [r["iter"] for r in data["iterations"]] == [1, 2, 3]


def test_resume_refuses_duplicate_iterations(tmp_path: Path) -> None:
    """Two writers once left one log with an iteration twice; resume would count it twice."""
    cut = _project(tmp_path / "cut")
    _start_and_kill_when_ready(cut, *LOOP, "--log", "run.json")  # killed in iteration 2's revise
    lines = [json.loads(line) for line in (cut / "run.json").read_text().splitlines()]
    events = [e for e in lines if e["event"] in ("start", "iteration")]
    assert [e["event"] for e in events] == ["start", "iteration"]
    doubled = [*events, events[-1]]
    (cut / "dup.json").write_text("\n".join(sign_events(doubled, runlog_key(create=True))) + "\n")
    assert load_runlog(cut / "dup.json")["verified"] is True
    refused = _run(cut, "--resume", "dup.json")
    assert refused.returncode == 64
    out = refused.stderr.strip().splitlines()
    assert len(out) == 1 and "duplicate or missing iterations" in out[0], refused.stderr
    assert "Traceback" not in refused.stderr
    orphan = int((cut / "ready").read_text())
    if _alive(orphan):
        os.kill(orphan, signal.SIGKILL)


def test_resume_plan_keeps_a_decided_verdict_unless_its_limit_was_raised(tmp_path: Path) -> None:
    from pytest_loops import Check, Guards, LoopSpec
    from pytest_loops.core.state import resume_plan
    from pytest_loops.results import IterationRecord

    spec = LoopSpec(name="x", checks=(Check.command_passes("false"),), guards=Guards(max_iter=2),
                    cwd=str(tmp_path))
    prior = [IterationRecord(iter=1, started_at="t"), IterationRecord(iter=2, started_at="t")]
    logged = {"guards": spec.guards.to_dict(), "incomplete": True,
              "decided": {"iter": 2, "verdict": "MAX_ITER", "reason": "cap"}}
    assert resume_plan(logged, spec, prior).decided == ("MAX_ITER", "cap")
    raised = spec.replace(guards=Guards(max_iter=4))
    assert resume_plan(logged, raised, prior).decided is None  # the cap was raised: go on
    success = {**logged, "decided": {"iter": 2, "verdict": "SUCCESS", "reason": "passed"}}
    assert resume_plan(success, raised, prior).decided == ("SUCCESS", "passed")
    stale = {**logged, "decided": {"iter": 1, "verdict": "SUCCESS", "reason": "passed"}}
    assert resume_plan(stale, spec, prior).decided is None  # not the last iteration's
    pending = {"revise_interrupted": IterationRecord(iter=3, started_at="t").to_dict()}
    assert resume_plan(pending, spec, prior).revise.iter == 3
    broken = {"revise_interrupted": {"iter": 3, "no_such_field": 1}}
    assert resume_plan(broken, spec, prior) == resume_plan(None, spec, prior)  # verify afresh

"""`pytest-loops selftest`: the guard scenarios, checked on this machine.

No LLM, no network; everything is written under one temporary directory that is
removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_loops.errors import LoopUsageError
from pytest_loops.runtime.process import pid_alive
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.testing import LoopHarness
from pytest_loops.verdict import Verdict

TIMEOUT_SLACK_S = 0.5


def _expect(harness_result, verdict: str, iterations: int) -> str:
    harness_result.assert_verdict(verdict, iterations=iterations)
    return f"{verdict} after {iterations} iteration(s), exit {harness_result.exit_code}"


def _scenario_success(h: LoopHarness, base: Path) -> str:
    return _expect(h.run(verify=[1, 1, 0], revise=lambda ws, i: (ws / f"r{i}").write_text("x")),
                   "SUCCESS", 3)


def _scenario_max_iter(h: LoopHarness, base: Path) -> str:
    return _expect(h.run(verify=[1], revise=lambda ws, i: (ws / f"r{i}").write_text("x"), max_iter=3),
                   "MAX_ITER", 3)


def _scenario_max_iter_invalid(h: LoopHarness, base: Path) -> str:
    try:
        Guards(max_iter=0)
    except LoopUsageError as exc:
        return f"max_iter=0 rejected: {exc}"
    raise AssertionError("max_iter=0 was accepted")


def _scenario_no_progress(h: LoopHarness, base: Path) -> str:
    return _expect(h.run(verify=[1], revise=None, no_progress_k=2), "NO_PROGRESS", 3)


def _scenario_no_state(h: LoopHarness, base: Path) -> str:
    r = h.run(verify=[1], revise=None, no_progress_k=2, max_iter=4, state=[])
    r.assert_verdict("MAX_ITER", iterations=4)
    return "no-progress is off, MAX_ITER after 4 iteration(s)"


def _scenario_escalate(h: LoopHarness, base: Path) -> str:
    return _expect(h.run(verify=[1], revise=lambda ws, i: (ws / f"r{i}").write_text("x"), escalate_after=2),
                   "ESCALATE", 2)


def _scenario_budget(h: LoopHarness, base: Path) -> str:
    r = h.run(verify=[1], revise=lambda ws, i: (ws / f"r{i}").write_text("x"), budget_seconds=10,
              seconds_per_iteration=4)
    r.assert_verdict("TIMEOUT", iterations=3)
    return "TIMEOUT in iteration 3 (fake clock: 3 x 4s > 10s budget)"


def _scenario_hang(h: LoopHarness, base: Path, step: str = "verify") -> str:
    from pytest_loops.artifacts.finishers import make_engine
    from pytest_loops.runtime.process import ProcessRunner

    work = base / f"hang-{step}"
    work.mkdir()
    budget = 1.0
    command = "sleep 30 & echo $! > child.pid; sleep 30"
    verify, revise = (command, None) if step == "verify" else ("exit 1", command)
    spec = LoopSpec(name="hang", checks=(Check.command_passes(verify),), revise=revise, cwd=str(work),
                    guards=Guards(max_iter=3, budget_seconds=budget, no_progress_k=0))
    start = time.monotonic()
    # the runner's own kill of a process tree, seen by host pids: no PID namespace in front
    result = make_engine(runner=ProcessRunner(), write_index=False, sandbox="none").run(spec)
    took = time.monotonic() - start
    if result.verdict is not Verdict.TIMEOUT:
        raise AssertionError(f"expected TIMEOUT, got {result.verdict}: {result.reason}")
    if took > budget + TIMEOUT_SLACK_S:
        raise AssertionError(f"TIMEOUT came {took - budget:.2f}s after the budget (limit {TIMEOUT_SLACK_S}s)")
    child = int((work / "child.pid").read_text().strip())
    deadline = time.monotonic() + 2.0
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid_alive(child):
        raise AssertionError(f"orphan grandchild {child} survived the kill")
    return f"hanging {step} killed: TIMEOUT {took - budget:+.2f}s from the budget, no orphan left"


SCENARIOS: list[tuple[str, Callable[[LoopHarness, Path], str]]] = [
    ("verify passes on iteration 3", _scenario_success),
    ("never passes, max_iter=3", _scenario_max_iter),
    ("max_iter < 1", _scenario_max_iter_invalid),
    ("revise changes nothing, no_progress_k=2", _scenario_no_progress),
    ("no state paths", _scenario_no_state),
    ("escalate_after=2", _scenario_escalate),
    ("budget on a fake clock", _scenario_budget),
    ("a verify that hangs past the budget", _scenario_hang),
    ("a revise that hangs past the budget", lambda h, base: _scenario_hang(h, base, "revise")),
]


def run_selftest(quiet: bool = False) -> int:
    """Run every scenario; print one line each; 0 only if all hold."""
    base = Path(tempfile.mkdtemp(prefix="pytest-loops-selftest-"))
    failures = 0
    from pytest_loops.runtime.trust import STATE_DIR_ENV

    before = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(base / "state")  # its run-log key too stays in the temp dir
    try:
        harness = LoopHarness(base / "harness")
        for title, scenario in SCENARIOS:
            try:
                detail = scenario(harness, base)
                ok = True
            except AssertionError as exc:
                detail, ok = str(exc).splitlines()[0], False
            failures += not ok
            if not quiet or not ok:
                print(f"{'ok  ' if ok else 'FAIL'}  {title}: {detail}", flush=True)
    finally:
        if before is None:
            os.environ.pop(STATE_DIR_ENV, None)
        else:
            os.environ[STATE_DIR_ENV] = before
        shutil.rmtree(base, ignore_errors=True)
    total = len(SCENARIOS)
    print(f"selftest: {total - failures} of {total} scenarios hold", flush=True)
    return 0 if failures == 0 else 1

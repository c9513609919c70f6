"""Every wait is bounded and spoken: the working tree's lock and hashing under a budget.

A second ``pytest --loop`` on a tree whose lock is held says at once who holds it
(a stopped holder by name, with how to resume it), counts the wait against its
budget and ends TIMEOUT naming the holder; a dead holder's lock is taken over and
named. Fingerprinting the state and the tree guard's loop-start store stop on the
budget between files and between chunks of one big file (an injected clock, no
gigabytes, no timed assertions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pluggy
import pytest
from plugin_helpers import FIX_ADD, Project

from pytest_loops import Check, CheckKind, Guards, LoopSpec, Verdict
from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.core.engine import Engine
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.deadline import DeadlineReached
from pytest_loops.progress.fingerprint import StateFingerprint
from pytest_loops.results import CheckResult
from pytest_loops.runtime.treelock import TreeLock, holder_state, read_holder
from pytest_loops.testing import canned_result

pytestmark = pytest.mark.faults
pytest_plugins = ["pytester"]
hookimpl = pluggy.HookimplMarker("pytest")

# Holds the tree lock as a `pytest --loop` would (recording itself), says so, sleeps.
HOLDER = """\
import sys, time
from pytest_loops.runtime.treelock import TreeLock

lock = TreeLock(sys.argv[1], say=print)
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


# A loop that takes the lock and ends after its first verify (no process started): cheap.
ONE_ITERATION = ("--loop", "--loop-revise", FIX_ADD, "--loop-max-iter", "1", "--loop-exitcode", "verdict")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def start_holder(lock_path: Path) -> subprocess.Popen[str]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    script = lock_path.parent / "holder.py"
    script.write_text(HOLDER, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, script.name, lock_path.name], cwd=lock_path.parent,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"  # generous: blocks until the lock is taken
    return proc


def end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def wait_until(condition, timeout: float = 30.0) -> None:
    """Wait for a condition (a signal's delivery), generously; never a timed assertion."""
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "the condition never came true"
        time.sleep(0.01)


# -- the working tree's lock, end to end --------------------------------------------------


@pytest.mark.slow
def test_a_stopped_holder_is_named_and_the_budget_ends_the_wait_timeout(project):
    project.marked_test()
    holder = start_holder(project.artifacts / "tree.lock")
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-budget-seconds", "2",
                             "--loop-exitcode", "verdict", timeout=120)
    finally:
        end(holder)
    assert result.ret == 3  # TIMEOUT, never a hang
    out = result.stdout.str()
    assert f"held by pid {holder.pid}" in out
    assert f"pid {holder.pid} is stopped (SIGSTOP); resume it with kill -CONT {holder.pid} or end it" in out
    assert "holder.py tree.lock" in out  # the holder's command line
    result.stdout.fnmatch_lines([f"*TIMEOUT*budget of 2s ran out while waiting for the working tree's lock*"
                                 f"pid {holder.pid}*"])
    assert project.read("calc.py").count("a - b  # BUG") == 1  # nothing was revised
    [log] = project.run_logs()
    assert log["verdict"] == "TIMEOUT" and f"pid {holder.pid}" in log["reason"]


def test_a_dead_holders_lock_is_taken_over_and_named(project):
    project.marked_test()
    info = project.artifacts / "tree.lock.holder"
    info.parent.mkdir(parents=True)
    # this very process's pid, but another start time: the pid was reused, the holder is gone
    info.write_text(json.dumps({"pid": os.getpid(), "start": 1, "command": "pytest --loop (old)",
                                "since": "2026-01-01T00:00:00Z", "host": os.uname().nodename}))
    result = project.run(*ONE_ITERATION)
    assert result.ret == 2  # the loop ran (MAX_ITER), holding the lock
    out = result.stdout.str()
    assert f"pid {os.getpid()} (pytest --loop (old)), which held it since 2026-01-01T00:00:00Z, is gone" in out
    assert "took over" in out
    assert not info.exists()  # released after the loop


# -- the wait itself, in this process ---------------------------------------------------------


def test_a_free_lock_is_taken_in_silence_and_released_with_its_record(tmp_path):
    said: list[str] = []
    lock = TreeLock(tmp_path / "tree.lock", say=said.append)
    lock.acquire(lambda: True)  # free: taken at once, even with the budget gone
    assert read_holder(lock.info_path).pid == os.getpid()
    lock.release()
    assert said == [] and not lock.info_path.exists()


def test_the_budget_ends_the_wait_for_a_running_holder(tmp_path):
    lock_path = tmp_path / "tree.lock"
    holder = start_holder(lock_path)
    said: list[str] = []
    polls = []

    def should_stop() -> bool:
        polls.append(1)
        return len(polls) > 3

    try:
        with pytest.raises(DeadlineReached) as caught:
            TreeLock(lock_path, say=said.append).acquire(should_stop)
    finally:
        end(holder)
    assert f"pid {holder.pid}" in str(caught.value) and "holder.py tree.lock" in str(caught.value)
    assert len(said) == 1 and f"held by pid {holder.pid}" in said[0]  # said at once, once
    assert "stopped" not in said[0]


def test_a_holder_that_did_not_record_itself_is_still_spoken_of(tmp_path):
    # an older pytest-loops holds the lock with no record next to it
    lock_path = tmp_path / "tree.lock"
    script = tmp_path / "plain.py"
    script.write_text("import sys, time\nfrom filelock import FileLock\nlock = FileLock(sys.argv[1])\n"
                      "lock.acquire()\nprint('held', flush=True)\ntime.sleep(600)\n", encoding="utf-8")
    holder = subprocess.Popen([sys.executable, str(script), str(lock_path)], stdout=subprocess.PIPE, text=True)
    said: list[str] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DeadlineReached, match="did not record itself"):
            TreeLock(lock_path, say=said.append).acquire(lambda: True)
    finally:
        end(holder)
    assert len(said) == 1 and "did not record itself" in said[0]


def test_without_a_budget_the_wait_says_still_waiting_until_the_lock_is_free(tmp_path):
    lock_path = tmp_path / "tree.lock"
    holder = start_holder(lock_path)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if sum("still waiting" in s for s in said) == 2:
            end(holder)  # the holder goes away: the lock is free (once: end() reaps it)

    lock = TreeLock(lock_path, say=say, still_every=0.0)
    try:
        lock.acquire(None)
        assert read_holder(lock.info_path).pid == os.getpid()
    finally:
        lock.release()
        end(holder)
    assert f"held by pid {holder.pid}" in said[0]
    assert f"still waiting for pid {holder.pid}" in said[1]
    assert not lock.info_path.exists()


def test_holder_state_tells_running_stopped_and_gone_apart(tmp_path):
    holder = start_holder(tmp_path / "tree.lock")
    try:
        info = read_holder(tmp_path / "tree.lock.holder")
        assert info is not None and info.pid == holder.pid
        assert holder_state(info) == "running"
        os.kill(holder.pid, signal.SIGSTOP)
        wait_until(lambda: holder_state(info) == "stopped")
    finally:
        end(holder)
    assert holder_state(info) == "gone"
    assert holder_state(info._replace(pid=os.getpid(), start=1)) == "gone"  # a reused pid
    assert holder_state(info._replace(host="elsewhere.invalid")) == "elsewhere"


# -- hashing under the budget -------------------------------------------------------------------


class TickingClock:
    """Moves one second on every reading: any loop that keeps asking runs out of budget."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class Failing:
    @hookimpl
    def pytest_loop_run_check(self, check, context):
        return CheckResult(name=check.name, kind=check.kind.value, passed=False, exit_code=1,
                           duration_s=0.0, output_tail="no", reason="exit 1")


class Revise:
    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def pytest_loop_revise(self, spec, iteration, context):
        self.calls += 1
        return 0


class NoRunner:
    def run(self, command, *, cwd, env=None, timeout=None, output_path=None):
        return canned_result(command, 0, "", output_path)


def engine(clock, *plugins) -> Engine:
    return make_engine(runner=NoRunner(), clock=clock, write_index=False, localize=False,
                  plugin_manager=make_plugin_manager(plugins, entry_points=False))


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = os.open

    def counting(path, flags, *args, **kwargs):
        if isinstance(path, str) and path.endswith(".bin"):
            reads.append(path)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return reads


def test_fingerprinting_many_files_stops_on_the_budget_timeout(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    for i in range(300):
        (work / "data" / f"f{i:03d}.bin").write_bytes(b"x" * 100)
    reads = count_reads(monkeypatch)
    revise = Revise()
    spec = LoopSpec(name="big", checks=(Check(CheckKind.HOOK, "a"),), cwd=str(work), state_paths=("**",),
                    guards=Guards(max_iter=3, budget_seconds=60, no_progress_k=0, escalate_after=0))
    result = engine(TickingClock(), Failing(), revise).run(spec)
    assert result.verdict is Verdict.TIMEOUT
    assert "while fingerprinting the state" in result.reason
    assert 0 < len(reads) < 300  # hashing stopped early
    assert revise.calls == 0
    assert result.iterations_run == 1 and result.iterations[0].guard == "budget"


def test_one_big_file_is_hashed_in_chunks_that_stop_on_the_budget(tmp_path):
    (tmp_path / "big.bin").write_bytes(os.urandom(8 << 20))
    asked: list[int] = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    fp = StateFingerprint(tmp_path, ["**"], should_stop=should_stop)
    with pytest.raises(DeadlineReached, match="while fingerprinting the state"):
        fp.compute()
    assert len(asked) == 3  # stopped after two chunks, not at the end of the file
    fp.should_stop = None
    assert fp.compute().startswith("sha256:")  # and computes in full afterwards


def test_the_tree_guards_loop_start_store_stops_on_the_budget(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "tests").mkdir(parents=True)  # read-only: copied into the store at loop start
    for i in range(300):
        (work / "tests" / f"data{i:03d}.bin").write_bytes(b"y" * 100)
    reads = count_reads(monkeypatch)
    revise = Revise()
    spec = LoopSpec(name="guarded", checks=(Check(CheckKind.HOOK, "a"),), cwd=str(work),
                    guards=Guards(max_iter=3, budget_seconds=60, no_progress_k=0, escalate_after=0))
    result = engine(TickingClock(), Failing(), revise).run(spec)
    assert result.verdict is Verdict.TIMEOUT
    assert "while the tree guard" in result.reason
    assert 0 < len(reads) < 300
    assert revise.calls == 0  # no revise step runs without the guard's loop-start copies


def test_a_deadline_in_the_journal_drain_stops_it(tmp_path):
    from pytest_loops.progress import journal as fswatch

    if fswatch.unavailable_reason():
        pytest.skip(fswatch.unavailable_reason())
    journal = fswatch.DirectoryJournal(str(tmp_path))
    try:
        for i in range(50):
            (tmp_path / f"n{i}").write_text("x")
        with pytest.raises(DeadlineReached):
            journal.drain(should_stop=lambda: True)
    finally:
        journal.close()


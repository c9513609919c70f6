"""The run log's events file is opened once per run and written one line per write(2).

A run killed (SIGKILL) between iterations still leaves every event it wrote, each
line whole and verified, and resumes; the events are flushed to the disk only
where a verdict is at stake (the deciding iteration, an abort).
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

import pytest_loops.artifacts.runlog as runlog_module
from pytest_loops.artifacts import runlog
from pytest_loops.artifacts.runlog import SCHEMA, RunLogWriter, load_runlog

CLI = [sys.executable, "-m", "pytest_loops", "run"]

# Holds the runner after iteration 2 is logged, before iteration 3 starts.
HOLD_PLUGIN = """\
import os, pathlib, time
import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


@hookimpl
def pytest_loop_iteration_finished(spec, record):
    if record.iter == 2 and not pathlib.Path("held-once").exists():
        pathlib.Path("held-once").write_text("")
        pathlib.Path("ready").write_text(str(os.getpid()))
        time.sleep(120)
"""

LOOP = ["--verify", "false", "--revise", "true", "--max-iter", "4", "--no-progress-k", "0",
        "--no-suspects", "--no-tine", "--log", "run.json"]


def test_the_events_file_is_opened_once_for_a_whole_run(tmp_path, monkeypatch):
    log = tmp_path / "run.json"
    opened = []
    real_open = runlog_module.open_append  # appended through a descriptor, never through a link

    def counting(file, *args, **kwargs):
        if os.fspath(file) == str(log):
            opened.append("ab")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(runlog_module, "open_append", counting)
    writer = RunLogWriter(log, key=b"k" * 32)
    writer.start({"loop": "x", "guards": {}})
    for i in range(1, 6):
        writer.revise_start({"iter": i})
        writer.revise_end(i, 0)
        writer.iteration({"iter": i})
    writer.close()
    monkeypatch.undo()
    assert opened == ["ab"]
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events == ["start"] + ["revise_start", "revise_end", "iteration"] * 5
    data = load_runlog(log, key=b"k" * 32)
    assert data["verified"] is True and len(data["iterations"]) == 5


def test_fsync_only_where_a_verdict_is_at_stake(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(runlog.os, "fsync", lambda fd: synced.append(fd))
    writer = RunLogWriter(tmp_path / "run.json", key=None)
    writer.start({"loop": "x", "guards": {}})
    writer.iteration({"iter": 1})
    writer.revise_start({"iter": 1})
    writer.revise_end(1, 0)
    assert synced == []
    writer.iteration({"iter": 2}, verdict="MAX_ITER", reason="cap")
    assert len(synced) == 1
    writer.aborted("KeyboardInterrupt")
    assert len(synced) == 2
    writer.finish({"schema": SCHEMA, "iterations": [], "verdict": "MAX_ITER"})  # atomic write: its own fsync


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_error_on_the_open_events_file_is_reported_once(tmp_path, monkeypatch):
    seen = []
    log = tmp_path / "run.json"
    # the events file is on a full disk: every write fails with ENOSPC (a link to
    # /dev/full would be replaced, never written through)
    monkeypatch.setattr(runlog_module, "open_append", lambda path, *mode: os.open("/dev/full", os.O_WRONLY))
    writer = RunLogWriter(log, key=None, on_error=lambda path, exc: seen.append(exc.errno))
    writer.start({"loop": "x", "guards": {}})
    writer.iteration({"iter": 1})
    writer.iteration({"iter": 2})
    assert seen == [28] and writer.broken
    assert writer._events is None  # closed after the failure


def test_killed_between_iterations_the_events_stay_whole_and_resume(tmp_path: Path) -> None:
    cwd = tmp_path / "cut"
    cwd.mkdir()
    (cwd / "hold.py").write_text(HOLD_PLUGIN)
    env = clean_env({"PYTHONPATH": str(cwd)})
    proc = subprocess.Popen([*CLI, *LOOP, "-p", "hold"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (cwd / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (cwd / "ready").exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = (cwd / "run.json").read_text().splitlines()
    assert all(line.startswith("{") and line.endswith("}") for line in lines)
    events = [json.loads(line)["event"] for line in lines]
    assert events[0] == "start" and events.count("iteration") == 2
    killed = load_runlog(cwd / "run.json")
    assert killed["verified"] is True
    assert [r["iter"] for r in killed["iterations"]] == [1, 2]

    resumed = subprocess.run([*CLI, "--resume", "run.json", "--log", "resumed.json"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 2, resumed.stderr  # MAX_ITER, as an uninterrupted run
    data = load_runlog(cwd / "resumed.json")
    assert data["verified"] is True and data["verdict"] == "MAX_ITER"
    assert [r["iter"] for r in data["iterations"]] == [1, 2, 3, 4]

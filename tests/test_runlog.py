"""The run log: loop-runner keys plus ours, JSON lines while running, atomic summary."""

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

from pytest_loops import Check, Guards, LoopSpec, LoopUsageError, Verdict
from pytest_loops.artifacts import runlog
from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.artifacts.runlog import (
    INDEX_SCHEMA,
    SCHEMA,
    RunLogWriter,
    append_index,
    atomic_write_text,
    load_runlog,
)
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.runtime.process import ProcessRunner

hookimpl = pluggy.HookimplMarker("pytest")

LOOP_RUNNER_KEYS = {"verdict", "reason", "iterations_run", "guards", "state_paths", "started_at",
                    "ended_at", "elapsed_s", "iterations"}
ITERATION_KEYS = {"iter", "verify_exit", "duration_s", "output_tail", "state_hash",
                  "unchanged_streak", "revise_exit"}



def fixing_loop(tmp_path: Path, **kw) -> LoopSpec:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return LoopSpec(name="fixing", checks=(Check.command_passes("echo checking; test -f done"),
                                           Check.command_passes("true")),
                    revise="echo revising; touch done", state_paths=("*",), cwd=str(work),
                    guards=Guards(max_iter=4, no_progress_k=2), **kw)


def run_engine(spec: LoopSpec, log: Path, *plugins, **engine_kw):
    pm = make_plugin_manager(plugins, entry_points=False)
    engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False, **engine_kw)
    return engine.run(spec, log_path=log)


def test_summary_has_the_loop_runner_keys_and_ours(tmp_path):
    log = tmp_path / "logs" / "run.json"
    result = run_engine(fixing_loop(tmp_path), log)
    assert result.verdict is Verdict.SUCCESS and result.iterations_run == 2
    data = json.loads(log.read_text())  # one JSON document: the summary
    loaded = load_runlog(log)
    assert loaded.pop("log_path", str(log)) == str(log)
    assert (loaded.pop("verified"), loaded.pop("unverified_why")) == (True, None)
    assert data.pop("mac") and loaded == data  # the MAC is checked, not passed on
    assert data["schema"] == SCHEMA == "pytest-loops.runlog/1"
    assert LOOP_RUNNER_KEYS <= set(data)
    assert data["verdict"] == "SUCCESS" and data["exit_code"] == 0
    assert data["iterations_run"] == 2 == len(data["iterations"])
    assert data["guards"] == {"max_iter": 4, "budget_seconds": 900.0, "no_progress_k": 2,
                              "escalate_after": 0}
    assert data["state_paths"] == ["*"]
    assert data["started_at"] <= data["ended_at"]
    assert data["elapsed_s"] >= sum(it["duration_s"] for it in data["iterations"]) * 0.99
    first, second = data["iterations"]
    for it in data["iterations"]:
        assert ITERATION_KEYS <= set(it)
        assert it["duration_s"] >= 0
        # every check's result, with its timing and where its full output is
        assert [c["name"] for c in it["checks"]] == [c.name for c in result.spec.checks]
        for check in it["checks"]:
            assert {"passed", "exit_code", "duration_s", "output_file", "reason"} <= set(check)
            assert check["duration_s"] >= 0
    assert first["iter"] == 1 and first["verify_exit"] == 1 and first["revise_exit"] == 0
    assert first["state_hash"].startswith("sha256:") and first["unchanged_streak"] == 0
    assert "checking" in first["output_tail"]
    assert second["iter"] == 2 and second["verify_exit"] == 0 and second["revise_exit"] is None


def test_the_log_is_json_lines_while_the_loop_runs(tmp_path):
    log = tmp_path / "run.json"
    snapshots = []

    class ReadMidRun:
        @hookimpl
        def pytest_loop_iteration_finished(self, spec, record, context):
            lines = log.read_text().splitlines()
            assert all(isinstance(json.loads(line), dict) for line in lines)
            snapshots.append(load_runlog(log))

    run_engine(fixing_loop(tmp_path), log, ReadMidRun())
    assert [s["iterations_run"] for s in snapshots] == [1, 2]
    for snap in snapshots:
        assert snap["verdict"] is None and snap["incomplete"] is True
        assert snap["schema"] == SCHEMA and snap["guards"]["max_iter"] == 4
    assert snapshots[0]["iterations"][0]["revise_exit"] == 0


def test_a_sigkilled_run_leaves_a_readable_log(tmp_path, child_env):
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "run.json"
    hang = "if [ -f it2 ]; then echo $$ > hang.pid; exec sleep 60; fi; echo not yet; exit 1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_loops", "run", "--verify", hang,
         "--revise", "touch it$LOOP_ITERATION", "--budget-seconds", "60", "--no-progress-k", "0",
         "--max-iter", "5", "--log", str(log), "--cwd", str(work), "--quiet"],
        env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = work / "hang.pid"
    try:
        end = time.monotonic() + 30
        while not pid_file.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        assert proc.poll() is None, "the runner ended before its third check"
        assert pid_file.exists(), "the third check never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists():  # the killed runner could not clean up its check
            for _ in range(50):
                text = pid_file.read_text().strip()
                if text:
                    try:
                        os.kill(int(text), signal.SIGKILL)
                        os.waitpid(int(text), 0)  # ours if this process is a subreaper
                    except (ProcessLookupError, ChildProcessError):
                        pass
                    break
                time.sleep(0.01)
    data = load_runlog(log)
    assert data["verdict"] is None and data["incomplete"] is True
    assert data["iterations_run"] == 2
    assert [it["iter"] for it in data["iterations"]] == [1, 2]
    assert [it["revise_exit"] for it in data["iterations"]] == [0, 0]
    assert "not yet" in data["iterations"][0]["output_tail"]
    assert data["schema"] == SCHEMA and data["guards"]["max_iter"] == 5


def test_full_output_is_kept_beside_the_log_and_the_log_keeps_a_tail(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    noisy = "python -c \"import sys; [print(f'line {i}') for i in range(20000)]; sys.exit(1)\""
    spec = LoopSpec(name="noisy", checks=(Check.command_passes(noisy),), revise="echo revise said this",
                    cwd=str(work), guards=Guards(max_iter=2, no_progress_k=0))
    log = tmp_path / "out" / "noisy.json"
    run_engine(spec, log)
    run_dir = tmp_path / "out" / "noisy"
    data = load_runlog(log)
    assert data["run_dir"] == str(run_dir)
    first = data["iterations"][0]
    full = Path(first["checks"][0]["output_file"])
    assert full.parent.parent == run_dir
    lines = full.read_text().splitlines()
    assert lines[0] == "line 0" and lines[-1] == "line 19999" and len(lines) == 20000
    assert len(first["output_tail"]) < 5000
    assert first["output_tail"].rstrip().endswith("line 19999")
    assert "revise said this" in Path(first["revise_output_file"]).read_text()
    assert Path(first["revise_output_file"]).parent == run_dir / "iter-001"
    assert "line 0\nline 1\n" in (run_dir / "iter-001" / "failure.txt").read_text()


def test_the_summary_replaces_the_events_by_atomic_rename(tmp_path, monkeypatch):
    log = tmp_path / "run.json"
    writer = RunLogWriter(log)
    writer.start({"loop": "x", "guards": {}})
    writer.iteration({"iter": 1})
    events = log.read_text()

    def no_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(runlog.os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        writer.finish({"schema": SCHEMA, "iterations": []})
    assert log.read_text() == events  # the old content, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temp file left
    monkeypatch.undo()
    writer.finish({"schema": SCHEMA, "iterations": [], "verdict": "SUCCESS"})
    assert json.loads(log.read_text())["verdict"] == "SUCCESS"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_atomic_write_creates_parents(tmp_path):
    target = tmp_path / "a" / "b" / "f.txt"
    atomic_write_text(target, "hello")
    assert target.read_text() == "hello"


def test_an_aborted_run_says_why(tmp_path):
    log = tmp_path / "run.json"
    writer = RunLogWriter(log)
    writer.start({"loop": "x"})
    writer.iteration({"iter": 1, "elapsed_s": 1.5})
    writer.aborted("RuntimeError: boom")
    data = load_runlog(log)
    assert data["reason"] == "RuntimeError: boom"
    assert data["iterations_run"] == 1 and data["elapsed_s"] == 1.5


def test_a_last_line_cut_short_by_a_kill_is_ignored(tmp_path):
    log = tmp_path / "run.json"
    writer = RunLogWriter(log)
    writer.start({"loop": "x"})
    writer.iteration({"iter": 1})
    with open(log, "a") as f:
        f.write('{"event": "iteration", "rec')
    assert load_runlog(log)["iterations_run"] == 1


@pytest.mark.parametrize("content,message", [
    (None, "no such run log"),
    ("", "empty file"),
    ("hello\n", "no start event"),
    ('{"event": "start"}\nnot json\n{"event": "iteration", "record": {}}\n', "line 2 is not JSON"),
    ('{"schema": "other/1", "iterations": []}', "unknown schema"),
    ('{"schema": "pytest-loops.runlog/1"}', "'iterations' is missing"),
    ("[1, 2]\n", "not a JSON object"),
    (b"\xff\xfe\x00", "not UTF-8"),
])
def test_bad_run_logs_are_one_line_usage_errors(tmp_path, content, message):
    path = tmp_path / "log.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(LoopUsageError, match=message) as info:
        load_runlog(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_directory_is_not_a_run_log(tmp_path):
    with pytest.raises(LoopUsageError, match="is a directory"):
        load_runlog(tmp_path)


def test_each_finished_run_adds_one_index_line(tmp_path):
    spec = fixing_loop(tmp_path)
    artifacts = tmp_path / "artifacts"
    engine = make_engine(runner=ProcessRunner(), artifacts_dir=artifacts)
    first = engine.run(spec)
    engine.run(spec)
    lines = (artifacts / "index.jsonl").read_text().splitlines()
    assert len(lines) == 2
    entry = json.loads(lines[0])
    assert entry["schema"] == INDEX_SCHEMA
    assert entry["loop"] == "fixing" and entry["verdict"] == "SUCCESS" and entry["exit_code"] == 0
    assert entry["log"] == first.log_path and Path(first.log_path).parent == artifacts / "runs"


def test_append_index_writes_one_schema_line(tmp_path):
    index = tmp_path / "new" / "index.jsonl"
    append_index(index, {"loop": "a"})
    append_index(index, {"loop": "b"})
    assert [json.loads(line) for line in index.read_text().splitlines()] == [
        {"schema": INDEX_SCHEMA, "loop": "a"}, {"schema": INDEX_SCHEMA, "loop": "b"}]


# -- parallel writers ------------------------------------------------------------------------

WORKERS = 8
PER_WORKER = 500
INDEX_WORKER = """
import sys
from pytest_loops.artifacts.runlog import append_index
path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for n in range(count):
    append_index(path, {"worker": worker, "n": n, "pad": "x" * 200})
"""


@pytest.mark.slow
def test_parallel_index_appends_never_interleave_or_lose_lines(tmp_path, child_env):
    index = tmp_path / "index.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", INDEX_WORKER, str(index), str(w), str(PER_WORKER)],
                              env=child_env) for w in range(WORKERS)]
    assert [p.wait(60) for p in procs] == [0] * WORKERS
    lines = index.read_text().splitlines()
    assert len(lines) == WORKERS * PER_WORKER
    seen: dict[int, list[int]] = {}
    for line in lines:
        entry = json.loads(line)
        assert entry["schema"] == INDEX_SCHEMA and entry["pad"] == "x" * 200
        seen.setdefault(entry["worker"], []).append(entry["n"])
    assert seen == {w: list(range(PER_WORKER)) for w in range(WORKERS)}


def test_a_write_error_goes_to_on_error_and_the_loop_log_stops(tmp_path, monkeypatch):
    """With on_error, a failed event append is reported once and no later event is
    written (the MAC chain would have a hole); the summary is still tried."""
    seen = []
    log = tmp_path / "run.json"
    writer = RunLogWriter(log, key=None, on_error=lambda path, exc: seen.append((path, exc.errno)))
    writer.start({"loop": "x", "guards": {}})
    writer.close()  # the events file stays open between events: reopened (and failing) on the next
    real_open = runlog.open_append  # the events file is appended through a descriptor

    def full(file, *args, **kwargs):
        if os.fspath(file) == str(log):
            raise OSError(28, "No space left on device")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(runlog, "open_append", full)
    writer.iteration({"iter": 1})
    writer.iteration({"iter": 2})
    monkeypatch.undo()
    assert seen == [(str(log), 28)] and writer.broken
    writer.iteration({"iter": 3})  # still nothing: the chain is broken
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["start"]
    monkeypatch.setattr(runlog.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "full")))
    assert writer.finish({"schema": SCHEMA, "iterations": []}) is False
    assert seen[-1] == (str(log), 28)
    monkeypatch.undo()
    assert writer.finish({"schema": SCHEMA, "iterations": [], "verdict": "MAX_ITER"}) is True


def test_revise_events_and_the_deciding_verdict_are_read_back(tmp_path):
    log = tmp_path / "run.json"
    writer = RunLogWriter(log)
    writer.start({"loop": "x", "spec": {}})
    writer.revise_start({"iter": 1, "started_at": "t"})
    writer.revise_end(1, 0)
    writer.iteration({"iter": 1, "started_at": "t"})
    writer.revise_start({"iter": 2, "started_at": "t"})
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events == ["start", "revise_start", "revise_end", "iteration", "revise_start"]
    run = load_runlog(log)
    assert run["verified"] is True and run["iterations_run"] == 1
    assert run["revise_interrupted"]["iter"] == 2 and "decided" not in run
    writer.revise_end(2, 1)
    writer.iteration({"iter": 2, "started_at": "t"}, verdict="MAX_ITER", reason="cap")
    run = load_runlog(log)
    assert "revise_interrupted" not in run
    assert run["decided"] == {"iter": 2, "verdict": "MAX_ITER", "reason": "cap"}


def test_check_resumable_refuses_duplicate_iterations():
    data = {"iterations": [{"iter": 1}, {"iter": 1}]}
    with pytest.raises(LoopUsageError, match="numbered 1 .duplicate or missing iterations"):
        runlog.check_resumable(data, "--resume run.json")
    runlog.check_resumable({"iterations": [{"iter": 1}, {"iter": 2}]}, "--resume run.json")


@pytest.mark.parametrize("summary", [
    {"schema": SCHEMA, "verdict": "SUCCESS", "iterations": [{"iter": 1, "checks": [{"passed": True}]}]},
    # not plain JSON: int keys (sorted as strings once read back), a Path, a tuple, a scrubbed text
    {"schema": SCHEMA, "verdict": "SUCCESS", "by_iter": {10: "a", 9: "b"}, "iterations": []},
    {"schema": SCHEMA, "verdict": "SUCCESS", "where": Path("/x/y"), "pair": (1, 2.5), "iterations": []},
])
@pytest.mark.parametrize("scrubbed", [False, True])
def test_a_signed_summary_verifies_whatever_its_values(tmp_path, summary, scrubbed):
    """The summary's MAC is taken from the summary in memory when it reads back as
    itself, else from its text parsed back: either way a reader verifies it, and an
    edit after the fact is caught."""
    key = b"k" * 32
    log = tmp_path / "run.json"
    scrub = (lambda text: text.replace("SUCCESS", "SUCCESS")) if scrubbed else None
    writer = RunLogWriter(log, key=key, scrub=scrub)
    writer.start({"loop": "x", "guards": {}})
    assert writer.finish(summary) is True
    data = load_runlog(log, key=key)
    assert data["verified"] is True, data.get("unverified_why")
    log.write_text(log.read_text().replace('"SUCCESS"', '"MAX_ITER"'))
    assert load_runlog(log, key=key)["verified"] is False

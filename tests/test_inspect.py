"""show / diff / verify: reading run logs and .tine files back."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from pytest_loops.artifacts.provenance import write_tine
from pytest_loops.artifacts.runlog import RunLogWriter
from pytest_loops.cli.runview import diff_runs, format_run, load_run, verify_command
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, LoopSpec
from pytest_loops.verdict import Verdict

HMAC = "0123456789abcdef0123456789abcdef"



def make_result(outcomes: list[list[bool]], verdict: Verdict = Verdict.MAX_ITER,
                reason: str = "the iteration cap was reached") -> LoopResult:
    """One iteration per entry of ``outcomes`` (pass/fail of each of two checks)."""
    spec = LoopSpec(name="fix parser", goal="parse everything", revise="./fix.sh",
                    checks=(Check.command_passes("make lint"), Check.test_passes("t.py::test_p")))
    records = []
    for i, passes in enumerate(outcomes, 1):
        last = i == len(outcomes)
        checks = [CheckResult(name=spec.checks[n].name, kind=spec.checks[n].kind.value, passed=ok,
                              exit_code=0 if ok else 1, duration_s=0.5,
                              output_tail="" if ok else f"E   failure {i}.{n}\nE   second line")
                  for n, ok in enumerate(passes)]
        records.append(IterationRecord(
            iter=i, started_at="2026-01-01T00:00:00Z", checks=checks,
            verify_exit=0 if all(passes) else 1, passed=all(passes), duration_s=1.25 * i,
            state_hash=f"h{i}", state_changed=None if i == 1 else True, unchanged_streak=0,
            lesson=None if all(passes) else f"iteration {i}: exit 1", revise_exit=None if last else 0,
            revise_duration_s=None if last else 1.0,
            guard=("max_iter" if verdict is Verdict.MAX_ITER else None) if last else None,
            elapsed_s=2.0 * i))
    return LoopResult(spec=spec, verdict=verdict, reason=reason, iterations=records,
                      started_at="2026-01-01T00:00:00Z", ended_at="2026-01-01T00:00:10Z", elapsed_s=10.0)


def runlog(result: LoopResult) -> dict:
    """The final run log dict, as the engine writes it."""
    spec = result.spec
    return {
        "schema": "pytest-loops.runlog/1", "loop": spec.name, "goal": spec.goal, "source": None,
        "verdict": result.verdict.value, "exit_code": result.exit_code, "reason": result.reason,
        "iterations_run": result.iterations_run, "guards": spec.guards.to_dict(),
        "state_paths": [], "started_at": result.started_at, "ended_at": result.ended_at,
        "elapsed_s": result.elapsed_s, "cwd": ".", "revise": spec.revise, "spec": spec.to_dict(),
        "spec_digest": spec.digest(), "memory_page": None, "lessons_read": [],
        "lessons": [r.lesson for r in result.iterations if r.lesson], "run_dir": "r",
        "artifacts": {"log": "r/run.json"}, "iterations": [r.to_dict() for r in result.iterations],
        "pytest_loops_version": "0+unknown",
    }


def write_log(tmp_path: Path, run: dict, name: str = "run.json") -> Path:
    """``run`` as a finished run log, with its MAC (as the engine writes it)."""
    path = tmp_path / name
    RunLogWriter(path).finish(run)
    return path


def verified(run: dict) -> dict:
    """A run dict as `load_run` returns a log whose MACs held."""
    return {**run, "verified": True, "unverified_why": None}


# --------------------------------------------------------------------------- load_run


def test_load_run_reads_a_run_log_and_a_tine_alike(tmp_path):
    result = make_result([[True, False], [True, False], [True, False]])
    log = load_run(write_log(tmp_path, runlog(result)))
    tine = load_run(write_tine(result, tmp_path / "run.tine"))
    for key in ("loop", "goal", "verdict", "exit_code", "reason", "iterations_run", "spec_digest"):
        assert log[key] == tine[key], key
    assert log["verified"] is True
    # a .tine read on its own is verified when this machine's key vouches for it...
    assert tine["verified"] is True
    assert format_run(log) == format_run(tine)
    # ...its integrity digest alone is no proof against a forger
    unvouched = load_run(write_tine(result, tmp_path / "unvouched.tine", vouch_key=None))
    assert unvouched["verified"] is False
    assert unvouched["unverified_why"] == "its .tine is not authenticated: not vouched by this machine's key"


def test_load_run_tells_a_tine_by_content_too(tmp_path):
    result = make_result([[True, True]], Verdict.SUCCESS, "all checks pass")
    path = Path(write_tine(result, tmp_path / "run.tine"))
    renamed = path.rename(tmp_path / "provenance.bin")
    assert load_run(renamed)["verdict"] == "SUCCESS"


def test_load_run_reads_a_killed_runs_event_log(tmp_path):
    result = make_result([[True, False], [True, False]])
    lines = [{"event": "start", "schema": "pytest-loops.runlog/1", "loop": "fix parser", "goal": "g"}]
    lines += [{"event": "iteration", "record": r.to_dict()} for r in result.iterations]
    path = tmp_path / "killed.json"
    path.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"event": "iter')
    run = load_run(path)
    assert run["verdict"] is None
    text = format_run(run)
    assert "verdict: none [unverified: it carries no MACs" in text and ", the run did not finish" in text
    assert len([x for x in text.splitlines() if x.lstrip().startswith(("1 |", "2 |"))]) == 2


def test_load_run_accepts_a_directory_with_one_log(tmp_path):
    write_log(tmp_path, runlog(make_result([[True, True]], Verdict.SUCCESS, "ok")))
    (tmp_path / "other.json").write_text('{"not": "ours"}')
    assert load_run(tmp_path)["verdict"] == "SUCCESS"


@pytest.mark.parametrize("name, content, expect", [
    ("missing.json", None, "no such file"),
    ("empty.json", b"", "empty file"),
    ("bin.json", b"\xff\xfe" + bytes(range(64)), "run log"),
    ("other.json", b'{"schema": "x/1"}', "unknown schema"),
    ("bad.tine", b"TINEZ1\0garbage", "not a readable .tine"),
    ("cut.tine", b'{"format_version": 2, "gra', "not a readable .tine"),
    (".", None, "no run log in this directory"),
])
def test_load_run_rejects_bad_files_in_one_line_naming_the_file(tmp_path, name, content, expect):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(LoopUsageError) as info:
        load_run(path)
    message = str(info.value)
    assert str(path) in message and expect in message
    assert "\n" not in message


def test_load_run_reads_an_artifacts_directory_through_its_runs(tmp_path):
    """`pytest-loops show .pytest-loops`: the artifacts directory holds its logs in runs/."""
    runs = tmp_path / ".pytest-loops" / "runs"
    runs.mkdir(parents=True)
    write_log(runs, runlog(make_result([[False], [True]], Verdict.SUCCESS, "ok")))
    assert load_run(tmp_path / ".pytest-loops")["verdict"] == "SUCCESS"


def test_several_logs_are_refused_naming_the_newest(tmp_path):
    run = runlog(make_result([[True, True]], Verdict.SUCCESS, "ok"))
    write_log(tmp_path, run, "a.json")
    write_log(tmp_path, run, "b.json")
    os.utime(tmp_path / "a.json", ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
    os.utime(tmp_path / "b.json", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    with pytest.raises(LoopUsageError) as info:
        load_run(tmp_path)
    assert f"the newest is {tmp_path / 'a.json'}" in str(info.value)


def test_load_run_refuses_to_guess_between_several_logs(tmp_path):
    run = runlog(make_result([[True, True]], Verdict.SUCCESS, "ok"))
    write_log(tmp_path, run, "a.json")
    write_log(tmp_path, run, "b.json")
    with pytest.raises(LoopUsageError, match="2 run logs"):
        load_run(tmp_path)


# --------------------------------------------------------------------------- format_run


def test_format_run_shows_one_row_per_iteration_and_the_verdict():
    run = runlog(make_result([[True, False], [False, False], [True, True]], Verdict.SUCCESS,
                             "all checks pass"))
    run["iterations"][1]["unchanged_streak"] = 1
    run["iterations"][1]["state_changed"] = False
    text = format_run(verified(run))
    lines = text.splitlines()
    assert lines[0] == "loop fix parser: parse everything"
    assert '  c1 = "make lint" passes' in lines
    assert '  c2 = the test "t.py::test_p" passes' in lines
    header = next(x for x in lines if x.startswith("iter"))
    assert [c.strip() for c in header.split("|")] == [
        "iter", "c1", "c2", "exit", "duration", "state", "streak", "revise", "guard"]
    rows = [[c.strip() for c in x.split("|")] for x in lines if x.lstrip()[:1].isdigit() and "|" in x]
    assert rows == [
        ["1", "✓", "✗", "1", "1.2s", "-", "0", "0", "-"],
        ["2", "✗", "✗", "1", "2.5s", "same", "1", "0", "-"],
        ["3", "✓", "✓", "0", "3.8s", "changed", "0", "-", "-"],
    ]
    assert "verdict: SUCCESS (exit 0): all checks pass" in lines
    # a run not known to be authentic is never shown as a bare SUCCESS
    unchecked = format_run(run).splitlines()
    assert "verdict: SUCCESS [unverified: not read from a run log, so not checked] (exit 0): all checks pass" \
        in unchecked and "verdict: SUCCESS (exit 0): all checks pass" not in unchecked


def test_format_run_shows_the_guard_and_the_last_failures():
    text = format_run(verified(runlog(make_result([[True, False], [True, False]]))))
    assert text.splitlines()[-7:] == [
        "verdict: MAX_ITER (exit 2): the iteration cap was reached",
        'failed in iteration 2: the test "t.py::test_p" passes',
        "    E   failure 2.1",
        "    E   second line",
        "lessons:",
        "  iteration 1: exit 1",
        "  iteration 2: exit 1",
    ]
    assert "| max_iter" in text


def test_format_run_strips_terminal_escapes_from_untrusted_text():
    run = runlog(make_result([[True, False]]))
    run["loop"] = "evil\x1b[2J\x1b]0;title\x07name"
    run["iterations"][0]["checks"][1]["output_tail"] = "E   \x1b[31mred\x1b[0m"
    text = format_run(run)
    assert "\x1b" not in text and "\x07" not in text
    assert "red" in text


def test_format_run_survives_a_sparse_dict():
    text = format_run({"iterations": [{"iter": 1}], "verdict": "TIMEOUT"})
    assert "verdict: TIMEOUT" in text
    assert "(no iteration finished)" in format_run({"verdict": None})


# --------------------------------------------------------------------------- diff_runs


def test_identical_runs():
    run = runlog(make_result([[True, False], [True, True]], Verdict.SUCCESS, "ok"))
    other = copy.deepcopy(run)
    other["iterations"][0]["duration_s"] = 99.0  # timing is not loop level
    other["started_at"] = "2030-01-01T00:00:00Z"
    assert diff_runs(run, other).splitlines()[-1] == "runs are identical at loop level"


def test_diff_names_the_first_divergent_iteration_and_how():
    a = runlog(make_result([[True, False], [True, False], [True, True]], Verdict.SUCCESS, "ok"))
    b = runlog(make_result([[True, False], [False, False], [True, False]]))
    b["iterations"][1]["state_changed"] = False
    b["iterations"][1]["unchanged_streak"] = 1
    b["iterations"][1]["revise_exit"] = 3
    text = diff_runs(a, b)
    assert "verdict: SUCCESS -> MAX_ITER" in text
    assert "first divergence: iteration 2:" in text
    assert "check '\"make lint\" passes': passed, exit 0 -> failed, exit 1" in text
    assert "state: changed (streak 0) -> same (streak 1)" in text
    assert "revise: exit 0 -> exit 3" in text
    assert "iteration 3" not in text  # only the first divergence
    assert "identical" not in text


def test_diff_when_one_run_is_longer():
    a = runlog(make_result([[True, False]], Verdict.MAX_ITER))
    b = runlog(make_result([[True, False], [True, False]], Verdict.MAX_ITER))
    a["iterations"][0]["revise_exit"] = 0  # same first iteration as b's
    a["iterations"][0]["guard"] = None
    text = diff_runs(a, b)
    assert "iterations: 1 -> 2" in text
    assert "first divergence: iteration 2 is only in B" in text


def test_diff_reports_a_different_reason_and_spec():
    a = runlog(make_result([[True, True]], Verdict.SUCCESS, "ok"))
    b = copy.deepcopy(a)
    b["reason"], b["spec_digest"] = "also ok", "sha256:other"
    text = diff_runs(a, b)
    assert "reason: 'ok' -> 'also ok'" in text and "spec: the loops differ" in text


def test_diff_a_check_that_did_not_run_and_a_guard():
    a = runlog(make_result([[True, False]]))
    b = copy.deepcopy(a)
    del b["iterations"][0]["checks"][1]
    b["iterations"][0]["guard"] = "budget"
    text = diff_runs(a, b)
    assert "failed, exit 1 -> not run" in text
    assert "guard: max_iter -> budget" in text


# --------------------------------------------------------------------------- verify_command


def test_verify_command_good_tampered_and_signed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")
    monkeypatch.setenv("LOOP_KEY", HMAC)
    result = make_result([[True, False]])
    path = write_tine(result, tmp_path / "run.tine", hmac_key=HMAC.encode())
    code, message = verify_command(path, key_env="LOOP_KEY")
    assert code == 0 and "signature verified" in message and HMAC not in message
    monkeypatch.setenv("LOOP_KEY", "a-different-key-0123456789")
    code, message = verify_command(path, key_env="LOOP_KEY")
    assert code == 1 and "mismatch" in message and "a-different-key" not in message
    data = json.loads(Path(path).read_text())
    for step in data["graph"]["steps"].values():
        if step["kind"] == "done":
            step["outputs"]["reason"] = "rewritten"
    Path(path).write_text(json.dumps(data))
    code, message = verify_command(path)
    assert code == 1 and "integrity check failed" in message


@pytest.mark.parametrize("content", [b"", b"\x00\xff" * 40, b"TINEZ1\0xx", b'{"format_version": 2'])
def test_verify_command_unreadable_is_1_with_a_line(tmp_path, content):
    path = tmp_path / "bad.tine"
    path.write_bytes(content)
    code, message = verify_command(path)
    assert code == 1 and message and "\n" not in message


def test_verify_command_on_a_run_log_explains(tmp_path):
    path = write_log(tmp_path, runlog(make_result([[True, True]], Verdict.SUCCESS, "ok")))
    code, message = verify_command(path)
    assert code == 1 and "not a .tine file" in message


def test_verify_command_missing_file(tmp_path):
    code, message = verify_command(tmp_path / "nope.tine")
    assert code == 1 and "no such file" in message


def test_verify_command_key_problems_are_usage_errors(tmp_path, monkeypatch):
    path = write_tine(make_result([[True, True]], Verdict.SUCCESS, "ok"), tmp_path / "r.tine")
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(LoopUsageError, match="NO_SUCH_KEY_VAR is not set"):
        verify_command(path, key_env="NO_SUCH_KEY_VAR")
    monkeypatch.setenv("SHORT_KEY", "tiny")
    with pytest.raises(LoopUsageError) as info:
        verify_command(path, key_env="SHORT_KEY")
    assert "at least 16" in str(info.value) and "tiny" not in str(info.value)
    monkeypatch.setenv("LOOP_KEY", HMAC)
    with pytest.raises(LoopUsageError, match="not both"):
        verify_command(path, key_env="LOOP_KEY", pubkey="k.pub")


# --------------------------------------------------------------------------- with the real engine


def test_show_a_run_log_written_by_the_engine(harness):
    run = harness.run(verify=[1, 1, 0], revise=None, max_iter=5, no_progress_k=0)
    loaded = load_run(run.log_path)
    text = format_run(loaded)
    assert f"verdict: {run.verdict.value}" in text
    rows = [x for x in text.splitlines() if x.lstrip()[:1].isdigit() and " | " in x]
    assert len(rows) == len(run.iterations)

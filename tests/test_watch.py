"""Watch loops: the driver (scripted sources, a fake clock) and `pytest-loops watch` end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_loops.core.watch import (
    BAD_POLLS_TO_ESCALATE,
    UNBOUNDED_MARK,
    FileSource,
    PollAnswer,
    PollSource,
    Tick,
    WatchDriver,
    WatchPlan,
    file_source,
    parse_poll_output,
    watched_patterns,
)
from pytest_loops.errors import LoopUsageError
from pytest_loops.progress.journal import JournalLost, unavailable_reason
from pytest_loops.runtime.process import pid_alive
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import WATCH_SOURCE_SILENCE, Verdict

# -- the driver, with a scripted source --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Script:
    """A source that answers from a list: a Tick, None (the wait ran out) or an exception."""

    def __init__(self, clock: Clock, answers: list[Any], step: float = 0.01) -> None:
        self.clock = clock
        self.answers = list(answers)
        self.step = step
        self.waits: list[float | None] = []
        self.last = "start"

    def wait(self, until: float | None) -> Tick | None:
        self.waits.append(until)
        self.clock.now += self.step
        if until is not None and self.clock.now >= until:
            self.clock.now = until
            return None
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, BaseException):
            raise answer
        if answer is None and until is not None:
            self.clock.now = max(self.clock.now, until)
        return answer

    def settle(self, tick: Tick | None) -> str:
        if tick is not None:
            self.last = tick.digest
        return self.last


def spec(**guards: Any) -> LoopSpec:
    return LoopSpec(name="w", checks=(Check.command_passes("true"),), guards=Guards(**guards))


class Runs:
    """run_once: results in order; records the spec each tick's run was given."""

    def __init__(self, *results: tuple[Verdict, int]) -> None:
        self.results = list(results)
        self.specs: list[LoopSpec] = []

    def __call__(self, tick_spec: LoopSpec, number: int, tick: Tick | None) -> Any:
        self.specs.append(tick_spec)
        verdict, iterations = self.results.pop(0) if self.results else (Verdict.SUCCESS, 1)
        return SimpleNamespace(verdict=verdict, reason=f"{verdict.value} in tick {number}",
                               iterations_run=iterations, log_path=None)


def drive(answers: list[Any], runs: Runs, plan: WatchPlan | None = None, loop: LoopSpec | None = None,
          step: float = 0.01):
    clock = Clock()
    events: list[dict[str, Any]] = []
    driver = WatchDriver(loop or spec(budget_seconds=0), plan or WatchPlan(interval=0.05, silence=0.5),
                         Script(clock, answers, step), runs, clock=clock, emit=events.append)
    return driver.run(), events


def test_unchanged_ticks_idle_without_iterating_a_change_is_fixed_and_silence_ends_no_progress() -> None:
    runs = Runs((Verdict.SUCCESS, 1), (Verdict.SUCCESS, 2))
    result, events = drive([Tick("start"), Tick("start"), Tick("start"), Tick("changed"), Tick("changed")], runs)
    assert len(runs.specs) == 2, "idle ticks run nothing"
    assert (result.generations, result.idle, result.fixes, result.iterations) == (2, 4, 1, 3)
    assert result.verdict is Verdict.NO_PROGRESS and result.exit_code == 4
    assert result.reason.startswith(WATCH_SOURCE_SILENCE)
    kinds = [e["event"] for e in events]
    assert kinds == ["watch_started", "tick", "run", "idle", "idle", "idle", "tick", "run", "idle", "silence",
                     "watch_ended"]
    assert events[-1]["idle"] == 4 and events[-1]["fixes"] == 1


def test_idle_ticks_never_yield_success_and_do_not_reset_the_silence_window() -> None:
    clock = Clock()
    source = Script(clock, [Tick("start")] * 20, step=0.1)
    runs = Runs((Verdict.MAX_ITER, 2))
    result = WatchDriver(spec(budget_seconds=0, max_iter=9), WatchPlan(interval=0.05, silence=0.5), source, runs,
                         clock=clock).run()
    assert result.verdict is Verdict.NO_PROGRESS, "idle ticks never turn the last verdict into SUCCESS"
    assert result.idle == 4 and len(runs.specs) == 1
    assert set(source.waits) == {0.5}, "the window counts from the last run, not from the last idle tick"


def test_a_watch_runs_50_generations_with_new_state_and_keeps_going_each_bounded_by_its_own_guards() -> None:
    loop = spec(max_iter=3, budget_seconds=60, no_progress_k=2, escalate_after=0)
    outcomes = [Verdict.MAX_ITER, Verdict.TIMEOUT, Verdict.NO_PROGRESS, Verdict.SUCCESS]
    runs = Runs((Verdict.SUCCESS, 1), *[(outcomes[i % 4], 3) for i in range(50)])
    answers: list[Any] = [Tick(f"state-{i}") for i in range(50)]
    result, events = drive(answers, runs, WatchPlan(interval=0.05, silence=0.5), loop=loop)
    assert len(runs.specs) == 51, "the start-up run and 50 generations: no cap on the watch"
    assert all(s.guards == loop.guards for s in runs.specs), "every generation gets the loop's own guards"
    assert result.verdict is Verdict.NO_PROGRESS and result.reason.startswith(WATCH_SOURCE_SILENCE)
    assert result.generations == 51 and result.iterations == 151
    assert [e["generation"] for e in events if e["event"] == "run"] == list(range(1, 52))
    started = events[0]
    assert started["generations"] == UNBOUNDED_MARK == "∞"
    assert started["per_generation"] == {"max_iter": 3, "budget_s": 60, "no_progress_k": 2, "escalate_after": 0}


def test_without_a_silence_window_only_an_escalation_or_ctrl_c_ends_a_watch() -> None:
    runs = Runs(*[(Verdict.MAX_ITER, 6)] * 80)
    result, _ = drive([Tick(f"s{i}") for i in range(60)] + [KeyboardInterrupt()], runs,
                      WatchPlan(interval=0.05), loop=spec(budget_seconds=10), step=5.0)
    assert result.interrupted and result.generations == 61 and result.exit_code == 2
    runs = Runs((Verdict.SUCCESS, 1), (Verdict.MAX_ITER, 6), (Verdict.ESCALATE, 2), (Verdict.SUCCESS, 1))
    result, _ = drive([Tick("a"), Tick("b"), Tick("c")], runs, WatchPlan(interval=0.05))
    assert result.verdict is Verdict.ESCALATE and result.generations == 3 and len(runs.results) == 1


@pytest.mark.parametrize("verdict", [Verdict.MAX_ITER, Verdict.TIMEOUT, Verdict.NO_PROGRESS])
def test_a_generation_stopped_by_a_guard_waits_for_the_next_change(verdict: Verdict) -> None:
    runs = Runs((Verdict.SUCCESS, 1), (verdict, 2), (Verdict.SUCCESS, 2))
    result, events = drive([Tick("a"), Tick("b")], runs)
    assert len(runs.specs) == 3 and result.fixes == 1
    assert result.verdict is Verdict.NO_PROGRESS and result.reason.startswith(WATCH_SOURCE_SILENCE)
    assert [e["verdict"] for e in events if e["event"] == "run"] == ["SUCCESS", verdict.value, "SUCCESS"]


def test_an_escalating_generation_ends_the_watch() -> None:
    runs = Runs((Verdict.SUCCESS, 1), (Verdict.ESCALATE, 1))
    result, _ = drive([Tick("a"), Tick("b")], runs)
    assert result.verdict is Verdict.ESCALATE and len(runs.specs) == 2 and result.reason == "ESCALATE in tick 2"


def test_idle_time_counts_toward_no_budget() -> None:
    runs = Runs()
    result, _ = drive([Tick("start")] * 30 + [Tick("b")], runs, WatchPlan(interval=0.05), loop=spec(budget_seconds=2.5),
                      step=1.0)
    assert result.idle == 30 and len(runs.specs) == 2, "30 s of idle ticks, a 2.5 s budget: the watch goes on"
    assert runs.specs[1].guards.budget_seconds == 2.5, "a generation gets the loop's whole budget"


def test_three_bad_polls_in_a_row_escalate_and_a_good_one_resets_the_count() -> None:
    bad = Tick(error="the poll output is not JSON: 'nope'")
    runs = Runs()
    result, events = drive([bad, bad, Tick("start"), bad, bad, bad], runs)
    assert result.verdict is Verdict.ESCALATE and result.exit_code == 5
    assert "3 times in a row" in result.reason and "not JSON" in result.reason
    assert [e["in_a_row"] for e in events if e["event"] == "poll_error"] == [1, 2, 1, 2, 3]
    assert BAD_POLLS_TO_ESCALATE == 3


def test_ctrl_c_ends_with_a_summary_and_the_last_verdict_code() -> None:
    runs = Runs((Verdict.SUCCESS, 1), (Verdict.NO_PROGRESS, 2))
    result, _ = drive([Tick("start"), KeyboardInterrupt()], runs)
    assert result.interrupted and result.exit_code == 0
    assert result.summary().startswith("watch interrupted: 1 generation(s), 1 idle, 0 fix(es), 1 iteration(s); "
                                       "last verdict SUCCESS; exit 0")
    runs = Runs((Verdict.SUCCESS, 1), (Verdict.NO_PROGRESS, 2))
    result, _ = drive([Tick("b"), KeyboardInterrupt()], runs)
    assert result.exit_code == 4, "the last run's verdict, not a green earlier one"


def test_ctrl_c_before_any_run_finished_exits_130() -> None:
    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    clock = Clock()
    result = WatchDriver(spec(), WatchPlan(), Script(clock, []), interrupted, clock=clock).run()
    assert result.verdict is None and result.exit_code == 130 and "no run finished" in result.summary()


@pytest.mark.parametrize(("plan", "message"), [
    (WatchPlan(interval=1.0, silence=0.5), "shorter than the poll interval"),
    (WatchPlan(interval=0), "above 0 seconds"),
])
def test_bad_plans_are_one_usage_line(plan: WatchPlan, message: str) -> None:
    with pytest.raises(LoopUsageError, match=message):
        plan.check()


@pytest.mark.parametrize(("text", "expected"), [
    ('{"ready": true, "state_digest": "abc", "payload": {"n": 1}}', PollAnswer(True, "abc", {"n": 1})),
    ('{"ready": false, "state_digest": "x"}', PollAnswer(False, "x")),
    ('{"ready": true, "state_digest": "x", "settled_at": "2026-01-02T03:04:05Z"}',
     PollAnswer(True, "x", None, "2026-01-02T03:04:05Z")),
    ('{"ready": true, "state_digest": "x", "settled_at": 1700000000.5}', PollAnswer(True, "x", None, 1700000000.5)),
])
def test_poll_output_is_read(text: str, expected: PollAnswer) -> None:
    assert parse_poll_output(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("nope", "not JSON"),
    ("[1]", "not an object"),
    ('{"ready": "yes", "state_digest": "a"}', '"ready"'),
    ('{"ready": true}', '"state_digest"'),
    ('{"ready": true, "state_digest": ""}', '"state_digest"'),
    ('{"ready": true, "state_digest": "x", "settled_at": true}', '"settled_at"'),
    ('{"ready": true, "state_digest": "x", "settled_at": {"t": 1}}', '"settled_at"'),
])
def test_bad_poll_output_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_poll_output(text)


def test_the_poll_command_reads_its_request_and_the_start_up_state_is_the_baseline(tmp_path: Path) -> None:
    from pytest_loops.runtime.process import ProcessRunner

    (tmp_path / "poll.sh").write_text(
        'cat >> requests.jsonl\n'
        'printf \'{"ready": true, "state_digest": "s1", "settled_at": "2026-01-01T00:00:00Z"}\\n\'\n')
    source = PollSource("sh poll.sh", runner=ProcessRunner(), cwd=str(tmp_path), env=None, interval=0.01,
                        output=tmp_path / "poll.out", request={"loop": "w", "poll": "sh poll.sh"})
    assert source.settle(None) == "s1", "after the start-up run the command is asked for the baseline"
    tick = source.wait(None)
    assert tick is not None and tick.digest == "s1" and tick.settled_at == "2026-01-01T00:00:00Z"
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert requests == [{"spec": {"loop": "w", "poll": "sh poll.sh"}, "expected_state_digest": ""},
                        {"spec": {"loop": "w", "poll": "sh poll.sh"}, "expected_state_digest": "s1"}]
    clock = Clock()
    runs = Runs()
    result = WatchDriver(spec(), WatchPlan(interval=0.05, silence=0.5), Script(clock, [Tick("start")]), runs,
                         clock=clock).run()
    assert result.idle == 1 and len(runs.specs) == 1


def test_watched_paths_are_the_state_paths_else_the_look_at_paths_else_the_directory() -> None:
    base = spec()
    assert watched_patterns(base.replace(state_paths=("src/**",), look_at=("lib",))) == ["src/**"]
    assert watched_patterns(base.replace(look_at=("lib/x.py", "the last failure"))) == ["lib/x.py"]
    assert watched_patterns(base) == ["."]


# -- the file source: the change journal wakes it ------------------------------------------------------

needs_inotify = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def source_in(root: Path, **kw: Any) -> FileSource:
    return file_source(root, ["."], [str(root / "out")], interval=kw.pop("interval", 0.01), debounce=0.01)


@needs_inotify
def test_without_events_the_files_are_not_sampled_every_interval(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    source = source_in(tmp_path)
    assert source.wake is not None
    before = source.samples
    assert source.wait(time.monotonic() + 0.3) is None
    assert source.samples - before <= 2, "sampled on a timer, not on the journal's events"


@needs_inotify
def test_a_file_in_a_new_directory_is_a_tick(tmp_path: Path) -> None:
    source = source_in(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b")
    tick = source.wait(time.monotonic() + 30)
    assert tick is not None and tick.digest != ""
    (tmp_path / "sub" / "b.txt").write_text("c")  # the new directory is watched now
    assert source.wait(time.monotonic() + 30) is not None


@needs_inotify
def test_writes_in_skipped_directories_wake_nothing(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "out").mkdir()
    source = source_in(tmp_path)
    before = source.samples
    for name in (".git/x", "out/run.json", "__pycache__"):
        (tmp_path / name).write_text("x") if "/" in name else (tmp_path / name).mkdir()
    assert source.wait(time.monotonic() + 0.3) is None
    assert source.samples - before <= 2


@needs_inotify
def test_a_lost_journal_falls_back_to_sampling_every_interval(tmp_path: Path, monkeypatch) -> None:
    source = source_in(tmp_path)
    assert source.wake is not None

    def lost(timeout: float) -> bool:
        raise JournalLost("the inotify event queue overflowed")

    monkeypatch.setattr(source.wake, "wait", lost)
    (tmp_path / "a.txt").write_text("a")
    assert source.wait(time.monotonic() + 30) is not None
    assert source.wake is None


def test_without_inotify_the_files_are_sampled_every_interval(tmp_path: Path, monkeypatch) -> None:
    from pytest_loops.core import watch

    def unavailable(*_: Any) -> Any:
        raise JournalLost("inotify is Linux only", sticky=True)

    monkeypatch.setattr(watch, "JournalWake", unavailable)
    source = source_in(tmp_path)
    assert source.wake is None
    (tmp_path / "a.txt").write_text("a")
    assert source.wait(time.monotonic() + 30) is not None


# -- the command line, end to end -------------------------------------------------------------------


def cli(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    # -X faulthandler: a watch that never ends is made to print where it waits (ended_by)
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "pytest_loops", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended_by(proc: subprocess.Popen[str], limit: float = 60.0) -> tuple[str, str]:
    """The output of a watch that should end now; one still running after ``limit``
    seconds (a hard limit, never a timed assertion) fails the test with its stacks."""
    try:
        return proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the watch did not end within {limit:g}s\n"
                             f"--- stdout ---\n{out}\n--- stderr ---\n{err}") from None


def events(cwd: Path) -> list[dict[str, Any]]:
    found = []
    for log in (cwd / ".pytest-loops" / "watch").glob("*/watch.jsonl"):
        found += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return found


def wait_for(what, proc: subprocess.Popen[str], limit: float = 60.0) -> None:
    """Until what() holds: an event the watch logged (a hard limit, never a timed assertion)."""
    end = time.monotonic() + limit
    while not what():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the watch never got there"
        time.sleep(0.02)


LOOP = """\
loop "calc":
  goal: calc.txt says good
  done when "grep -q good calc.txt" passes
  revise with "echo good > calc.txt"
  budget: none
{extra}"""

# a shell script (fast to start): the runs of the loop, not the polls, take the time
POLL = """\
n=$(cat calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > calls
if [ $n -eq 3 ]; then echo bad > calc.txt; fi
if [ $n -le 5 ]; then ready=true; else ready=false; fi
if [ $n -lt 3 ]; then state=s1; else state=s2; fi
printf '{"ready": %s, "state_digest": "%s", "payload": {"call": %s}}\\n' $ready $state $n
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "calc.txt").write_text("good\n")
    return tmp_path


def test_a_poll_watch_idles_fixes_a_change_and_ends_no_progress_on_silence(work: Path) -> None:
    (work / "poll.sh").write_text(POLL)
    (work / "w.loop").write_text(LOOP.format(extra='  watch: poll "sh poll.sh" every 0.05s\n'
                                                   "  silence: 1s\n"))
    proc = cli("watch", "w.loop", "--max-iter", "4", cwd=work)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "generations ∞, each bounded by max_iter 4, budget off" in proc.stdout
    assert "[calc] gen 2 iter 2/4 " in proc.stdout, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == (
        "[calc] watch NO_PROGRESS: 2 generation(s), 3 idle, 1 fix(es), 3 iteration(s); last verdict SUCCESS; "
        f"exit 4: {WATCH_SOURCE_SILENCE}: no tick with new state in the silence window of 1s")
    log = events(work)
    runs = [e for e in log if e["event"] == "run"]
    assert [(r["generation"], r["verdict"], r["iterations"], r["fixed"]) for r in runs] == [
        (1, "SUCCESS", 1, False), (2, "SUCCESS", 2, True)]
    idle = [e for e in log if e["event"] == "idle"]
    assert [e["after_generation"] for e in idle] == [1, 2, 2], "the start-up run's state is the baseline"
    assert (work / "calc.txt").read_text() == "good\n"
    gen_logs = sorted(Path(r["log"]).name for r in runs)
    assert gen_logs == ["gen-1.json", "gen-2.json"], "each generation keeps its own run log"
    assert json.loads(Path(runs[1]["log"]).read_text())["verdict"] == "SUCCESS"
    shown = cli("show", str(Path(runs[0]["log"]).parent), cwd=work)
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()
    assert "generations ∞, each bounded by max_iter 4" in rows[0]
    assert rows[2].split() == ["1", "start-up", "run", "SUCCESS", "1", "1", "gen-1.json"]
    assert rows[3].split() == ["2", "new", "state", "s2", "SUCCESS", "2", "yes", "2", "gen-2.json"]
    assert rows[-1].startswith(f"ended NO_PROGRESS (exit 4): {WATCH_SOURCE_SILENCE}")


GENERATIONS_POLL = """\
n=$(cat calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > calls
if [ $n -eq 2 ]; then touch broken; fi
if [ $n -eq 3 ]; then rm -f broken; fi
state=s$n; if [ $n -gt 3 ]; then state=s3; fi
if [ $n -le 5 ]; then ready=true; else ready=false; fi
printf '{"ready": %s, "state_digest": "%s", "settled_at": "t%s"}\\n' $ready $state $n
"""


def test_a_generation_stopped_by_its_own_cap_leaves_the_watch_running(work: Path) -> None:
    (work / "poll.sh").write_text(GENERATIONS_POLL)
    (work / "w.loop").write_text('loop "gens":\n  goal: no broken file\n  done when "test ! -f broken" passes\n'
                                 '  revise with "true"\n  after 2 tries: stop and warn "still broken"\n'
                                 '  budget: none\n  watch: poll "sh poll.sh" every 0.05s\n  silence: 1s\n')
    proc = cli("watch", "w.loop", cwd=work)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    log = events(work)
    runs = [e for e in log if e["event"] == "run"]
    assert [r["generation"] for r in runs] == [1, 2, 3]
    assert runs[1]["verdict"] in ("MAX_ITER", "NO_PROGRESS") and runs[1]["iterations"] <= 2, \
        "the generation is bounded by the loop's own guards"
    assert runs[2]["verdict"] == "SUCCESS", "and the watch went on to the next change"
    assert [e["settled_at"] for e in log if e["event"] == "tick"] == [None, "t2", "t3"]
    assert log[-1]["event"] == "watch_ended" and log[-1]["reason"].startswith(WATCH_SOURCE_SILENCE)


def test_the_poll_payload_reaches_the_run(work: Path) -> None:
    (work / "poll.sh").write_text(POLL)
    (work / "w.loop").write_text(
        'loop "p":\n  goal: see the payload\n  done when "cat $LOOP_WATCH_PAYLOAD >> seen" passes\n'
        '  watch: poll "sh poll.sh" every 0.05s\n  silence: 1s\n')
    proc = cli("watch", "w.loop", cwd=work)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert (work / "seen").read_text() == '{"call": 3}', "the first answer (the baseline's state) is idle"


def test_three_bad_poll_answers_end_escalate_each_logged(work: Path) -> None:
    (work / "w.loop").write_text(LOOP.format(extra='  watch: poll "echo nope" every 0.05s\n'))
    proc = cli("watch", "w.loop", cwd=work)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert proc.stderr.count("bad poll") == 3 and "Traceback" not in proc.stderr
    assert [e["in_a_row"] for e in events(work) if e["event"] == "poll_error"] == [1, 2, 3]
    assert "gave no valid answer 3 times in a row" in proc.stdout


@pytest.mark.parametrize(("extra", "args", "message"), [
    ('  watch: poll "true" every 2s\n  silence: 1s\n', (), "shorter than the poll interval"),
    ("", ("--silence", "0.01", "--watch-interval", "1"), "shorter than the poll interval"),
    ("", ("--max-iter", "-1"), "not a valid max_iter"),
    ("", ("--max-iter", "0"), "the cap of each generation"),
    ("", ("--silence", "soon"), "not a valid silence"),
    ('  watch: poll "" every 2s\n', (), "`watch: poll` has no command"),
])
def test_bad_watch_input_is_one_line_and_exit_64(work: Path, extra: str, args: tuple, message: str) -> None:
    (work / "w.loop").write_text(LOOP.format(extra=extra))
    proc = cli("watch", "w.loop", *args, cwd=work)
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_max_iter_zero_is_bad_input_in_run_too(work: Path) -> None:
    proc = cli("run", "--verify", "true", "--max-iter", "0", cwd=work)
    assert proc.returncode == 64
    assert proc.stderr.strip().splitlines() == [
        "pytest-loops: error: --max-iter: '0' is not a valid max_iter; valid: an integer >= 1 (the cap is always on)"]


@pytest.mark.slow
def test_a_file_watch_fixes_a_change_idles_on_a_rewrite_and_ends_on_silence(work: Path) -> None:
    (work / "w.loop").write_text(LOOP.format(extra="  watch: calc.txt\n  silence: 3s\n"))
    proc = start("watch", "w.loop", "--watch-interval", "0.05", cwd=work)
    try:
        wait_for(lambda: [e["event"] for e in events(work)].count("run") == 1, proc)
        (work / "calc.txt").write_text("bad\n")
        wait_for(lambda: [e["event"] for e in events(work)].count("run") == 2, proc)
        (work / "calc.txt").write_text("good\n")  # written again, the same content: an idle tick
        out, err = ended_by(proc)
    finally:
        proc.kill()
    assert proc.returncode == 4, out + err
    log = events(work)
    assert [e["event"] for e in log] == ["watch_started", "tick", "run", "tick", "run", "idle", "silence",
                                         "watch_ended"]
    assert log[4]["fixed"] and log[4]["iterations"] == 2
    assert ("files calc.txt (the change journal)" if unavailable_reason() is None else "sampled every") in out
    assert log[-1]["reason"].startswith(WATCH_SOURCE_SILENCE)


def test_changes_to_the_runs_own_artifacts_are_no_tick(work: Path) -> None:
    (work / "calc.txt").write_text("bad\n")  # the run fails once: a lesson in lessons.md, then a fix
    # the whole directory is watched
    (work / "w.loop").write_text(LOOP.format(extra='  silence: 1s\n  remember in "lessons.md"\n'))
    proc = cli("watch", "w.loop", "--watch-interval", "0.05", cwd=work)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert [e["event"] for e in events(work)] == ["watch_started", "tick", "run", "silence", "watch_ended"]
    assert (work / "lessons.md").is_file()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 0), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_leave_no_process_behind(work: Path, sig: signal.Signals, code: int) -> None:
    script = textwrap.dedent("""\
        import os, pathlib, time
        pathlib.Path("poll.pid").write_text(str(os.getpid()))
        time.sleep(120)
    """)
    (work / "poll.py").write_text(script)
    (work / "w.loop").write_text(LOOP.format(extra=f'  watch: poll "{sys.executable} poll.py" every 0.05s\n'))
    proc = start("watch", "w.loop", cwd=work)
    try:
        wait_for(lambda: (work / "poll.pid").exists() and (work / "poll.pid").read_text() != "", proc)
        pid = int((work / "poll.pid").read_text())
        proc.send_signal(sig)
        out, err = ended_by(proc)
    finally:
        proc.kill()
    assert proc.returncode == code, out + err
    assert not pid_alive(pid), "the poll command outlived the watch"
    if sig == signal.SIGINT:
        assert "watch interrupted: 1 generation(s), 0 idle, 0 fix(es), 1 iteration(s); last verdict SUCCESS; " \
            "exit 0" in out
        assert [e["event"] for e in events(work)][-1] == "watch_ended"


@pytest.mark.floor  # pids inside a PID namespace are not the host's: this tests the runner's own kill
def test_ctrl_c_during_the_first_run_stops_its_command_and_exits_130(work: Path) -> None:
    (work / "check.py").write_text("import os, pathlib, time\n"
                                   "pathlib.Path('check.pid').write_text(str(os.getpid()))\n"
                                   "time.sleep(120)\n")
    (work / "w.loop").write_text(LOOP.format(extra="").replace('"grep -q good calc.txt"',
                                                                f'"{sys.executable} check.py"'))
    proc = start("watch", "w.loop", cwd=work)
    try:
        wait_for(lambda: (work / "check.pid").exists() and (work / "check.pid").read_text() != "", proc)
        pid = int((work / "check.pid").read_text())
        proc.send_signal(signal.SIGINT)
        out, err = ended_by(proc)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert not pid_alive(pid), "the check outlived the watch"
    assert "watch interrupted: 1 generation(s), 0 idle, 0 fix(es), 0 iteration(s); no run finished; exit 130" in out


def test_show_lists_the_watch_lines(work: Path) -> None:
    (work / "w.loop").write_text(LOOP.format(extra='  watch: poll "sh poll.sh" every 5s\n  silence: 2 minutes\n'))
    out = cli("show", "w.loop", cwd=work).stdout
    assert [line.split() for line in out.splitlines() if line.strip().startswith(("watch_", "silence"))] == [
        ["watch_poll", "sh", "poll.sh", "w.loop:6"], ["watch_interval", "5s", "w.loop:6"],
        ["silence", "120s", "w.loop:7"]]


def test_show_of_a_bad_watch_log_is_one_line(work: Path) -> None:
    log = work / "watch.jsonl"
    log.write_text('{"event": "watch_started"}\nnot json\n')
    proc = cli("show", str(log), cwd=work)
    assert proc.returncode == 64 and proc.stderr.strip() == (
        f"pytest-loops: error: {log}:2: not a watch event (one JSON object a line); "
        "pass the watch.jsonl a watch wrote"), proc.stderr


def test_watch_needs_one_loop(work: Path) -> None:
    two = LOOP.format(extra="") + LOOP.format(extra="").replace('"calc"', '"other"')
    (work / "w.loop").write_text(two)
    proc = cli("watch", "w.loop", cwd=work)
    assert proc.returncode == 64 and "give --name" in proc.stderr
    assert os.path.exists(work / "w.loop")

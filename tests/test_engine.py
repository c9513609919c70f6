"""The loop engine: exact guard semantics, the revise step, hanging commands.

Guard conformance runs through the contract kit (fake clock, scripted exit
codes, no subprocess). Budgets that must kill real commands use real processes
and assert the stated bound, measuring only ``Engine.run``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pluggy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_loops import Check, CheckKind, Guards, LoopSpec, LoopUsageError, Verdict
from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.core.context import resolve_paths
from pytest_loops.core.engine import Engine
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.results import CheckResult
from pytest_loops.runtime.process import ProcessRunner, pid_alive
from pytest_loops.testing import FakeClock, LoopHarness, canned_result

hookimpl = pluggy.HookimplMarker("pytest")

TIMEOUT_SLACK_S = 0.5  # the contract: TIMEOUT within 0.5 s of the budget


# -- helpers ------------------------------------------------------------------------


class ScriptedChecks:
    """Answers checks by name from lists of exit codes (the last one repeats)."""

    def __init__(self, scripts: dict[str, list[int]], clock: FakeClock | None = None,
                 seconds_per_check: float = 0.0) -> None:
        self.scripts = {name: list(codes) for name, codes in scripts.items()}
        self.calls: dict[str, int] = dict.fromkeys(scripts, 0)
        self.clock = clock
        self.seconds = seconds_per_check

    @hookimpl
    def pytest_loop_run_check(self, check, context):
        codes = self.scripts[check.name]
        code = codes[min(self.calls[check.name], len(codes) - 1)]
        self.calls[check.name] += 1
        if self.clock is not None:
            self.clock.advance(self.seconds)
        return CheckResult(name=check.name, kind=check.kind.value, passed=code == 0,
                           exit_code=code, duration_s=0.0, output_tail=f"{check.name} said {code}",
                           reason=f"exit {code}")


class Trace:
    """Records the order in which the engine calls the hooks."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str]] = []

    @hookimpl(tryfirst=True)
    def pytest_loop_run_check(self, check, context):
        self.events.append((context.iteration, "verify"))

    @hookimpl(tryfirst=True)
    def pytest_loop_revise(self, spec, iteration, context):
        self.events.append((iteration, "revise"))

    @hookimpl
    def pytest_loop_iteration_finished(self, spec, record, context):
        self.events.append((record.iter, "finished"))


class FakeRunner:
    """A command runner that spawns nothing: exit codes by command, env recorded."""

    def __init__(self, codes: dict[str, int] | None = None) -> None:
        self.codes = codes or {}
        self.calls: list[dict] = []

    def run(self, command, *, cwd, env=None, timeout=None, output_path=None):
        self.calls.append({"command": command, "cwd": str(cwd), "env": dict(env or {}),
                           "timeout": timeout})
        return canned_result(command, self.codes.get(command, 0), f"output of {command}\n", output_path)


def spec_for(tmp_path: Path, checks, **kw) -> LoopSpec:
    work = kw.pop("cwd", None) or tmp_path / "work"
    Path(work).mkdir(parents=True, exist_ok=True)
    guards = kw.pop("guards", None) or Guards(max_iter=kw.pop("max_iter", 6),
                                              budget_seconds=kw.pop("budget_seconds", 900),
                                              no_progress_k=kw.pop("no_progress_k", 0),
                                              escalate_after=kw.pop("escalate_after", 0))
    return LoopSpec(name=kw.pop("name", "engine-test"), checks=tuple(checks), guards=guards,
                    cwd=str(work), **kw)


def hook_check(name: str) -> Check:
    return Check(CheckKind.HOOK, name)


def engine_with(*plugins, clock=None, runner=None) -> Engine:
    kwargs = {"clock": clock} if clock is not None else {}
    return make_engine(runner=runner or FakeRunner(), plugin_manager=make_plugin_manager(plugins, entry_points=False),
                  write_index=False, **kwargs)


def touch_each_iteration(workspace: Path, iteration: int) -> None:
    (workspace / f"revised-{iteration}").write_text(str(iteration))


# -- SUCCESS and MAX_ITER -------------------------------------------------------------


def test_verify_passes_on_iteration_3_is_success_after_3(harness):
    r = harness.run(verify=[1, 1, 0], revise=touch_each_iteration)
    r.assert_verdict("SUCCESS", iterations=3)
    assert r.exit_code == 0
    assert [it.passed for it in r.iterations] == [False, False, True]
    assert [it.verify_exit for it in r.iterations] == [1, 1, 0]


def test_never_passes_with_max_iter_3_is_max_iter_after_3(harness):
    revised = []
    r = harness.run(verify=[1], revise=lambda ws, i: revised.append(i) or touch_each_iteration(ws, i),
                    max_iter=3)
    r.assert_verdict("MAX_ITER", iterations=3)
    assert r.exit_code == 2
    assert r.iterations[-1].guard == "max_iter"
    assert "max_iter=3" in r.reason
    # the cap is enforced before a revise whose result could never be verified
    assert revised == [1, 2]


def test_passing_on_the_last_allowed_iteration_is_success_not_max_iter(harness):
    harness.run(verify=[1, 1, 0], revise=touch_each_iteration, max_iter=3).assert_verdict("SUCCESS", 3)


@pytest.mark.parametrize("max_iter", [1, 2, 5])
def test_the_cap_holds_for_any_value(harness, max_iter):
    harness.run(verify=[1], revise=touch_each_iteration, max_iter=max_iter).assert_verdict(
        "MAX_ITER", iterations=max_iter)


@pytest.mark.parametrize("max_iter", [0, -1])
def test_max_iter_below_one_is_a_usage_error(harness, max_iter):
    with pytest.raises(LoopUsageError, match="max_iter"):
        harness.run(verify=[1], max_iter=max_iter)


def test_all_checks_must_pass(tmp_path):
    scripted = ScriptedChecks({"a": [0, 1, 0, 0], "b": [4, 0, 5, 0]})
    spec = spec_for(tmp_path, [hook_check("a"), hook_check("b")])
    result = engine_with(scripted).run(spec)
    assert result.verdict is Verdict.SUCCESS
    assert result.iterations_run == 4
    # the loop-runner verify_exit is the first failing check's exit code
    assert [it.verify_exit for it in result.iterations] == [4, 1, 5, 0]
    assert all(len(it.checks) == 2 for it in result.iterations)


# -- NO_PROGRESS ------------------------------------------------------------------------


def test_revise_that_changes_nothing_is_no_progress_at_iteration_3(harness):
    r = harness.run(verify=[1], revise=lambda ws, i: None, no_progress_k=2, max_iter=6)
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert r.exit_code == 4
    assert [it.unchanged_streak for it in r.iterations] == [0, 1, 2]
    assert [it.state_changed for it in r.iterations][1:] == [False, False]
    assert r.iterations[-1].guard == "no_progress"


def test_a_revise_that_changes_the_state_never_stalls(harness):
    r = harness.run(verify=[1], revise=touch_each_iteration, no_progress_k=1, max_iter=4)
    r.assert_verdict("MAX_ITER", iterations=4)
    assert [it.unchanged_streak for it in r.iterations] == [0, 0, 0, 0]
    assert len({it.state_hash for it in r.iterations}) == 4


def test_only_changes_under_the_state_paths_count(harness):
    def outside(ws, i):
        (ws / "notes").mkdir(exist_ok=True)
        (ws / "notes" / f"n{i}").write_text("x")

    r = harness.run(verify=[1], revise=outside, state=["src"], no_progress_k=2,
                    files={"src/app.py": "x = 1\n"})
    r.assert_verdict("NO_PROGRESS", iterations=3)

    def inside(ws, i):
        (ws / "src" / "app.py").write_text(f"x = {i}\n")

    harness.run(verify=[1], revise=inside, state=["src"], no_progress_k=2, max_iter=4,
                files={"src/app.py": "x = 0\n"}).assert_verdict("MAX_ITER", iterations=4)


def test_the_streak_resets_when_the_state_moves(harness):
    def only_second(ws, i):
        if i == 2:
            (ws / "moved").write_text("x")

    r = harness.run(verify=[1], revise=only_second, no_progress_k=2, max_iter=8)
    r.assert_verdict("NO_PROGRESS", iterations=5)
    assert [it.unchanged_streak for it in r.iterations] == [0, 1, 0, 1, 2]


def test_without_state_paths_no_progress_is_off(harness):
    r = harness.run(verify=[1], revise=None, no_progress_k=1, max_iter=4, state=[])
    r.assert_verdict("MAX_ITER", iterations=4)
    assert all(it.state_hash is None for it in r.iterations)
    assert all("unchanged" not in it.guards_seen for it in r.iterations)


def test_no_progress_k_zero_is_off(harness):
    harness.run(verify=[1], revise=None, no_progress_k=0, max_iter=4).assert_verdict("MAX_ITER", 4)


def test_no_progress_k_one_stops_at_iteration_2(harness):
    harness.run(verify=[1], revise=None, no_progress_k=1).assert_verdict("NO_PROGRESS", 2)


# -- ESCALATE -------------------------------------------------------------------------


def test_escalate_after_2_is_escalate_at_iteration_2(harness):
    r = harness.run(verify=[1], revise=touch_each_iteration, escalate_after=2)
    r.assert_verdict("ESCALATE", iterations=2)
    assert r.exit_code == 5
    assert r.iterations[-1].guard == "escalate"
    assert "escalate_after=2" in r.reason


def test_escalate_after_zero_is_off(harness):
    harness.run(verify=[1], revise=touch_each_iteration, escalate_after=0, max_iter=3).assert_verdict(
        "MAX_ITER", 3)


def test_a_human_check_escalates(tmp_path):
    spec = spec_for(tmp_path, [Check.human_confirms("the UI looks right")])
    result = engine_with().run(spec)
    assert result.verdict is Verdict.ESCALATE and result.iterations_run == 1
    assert "a human must confirm" in result.reason


# -- the order of the guards ------------------------------------------------------------


def test_verify_comes_before_every_stop_rule(harness):
    # no progress (state unchanged), escalate_after=2 and the cap all point at
    # iteration 2; the check passing there wins
    r = harness.run(verify=[1, 0], revise=None, no_progress_k=1, escalate_after=2, max_iter=2)
    r.assert_verdict("SUCCESS", iterations=2)


def test_no_progress_comes_before_escalate(harness):
    harness.run(verify=[1], revise=None, no_progress_k=1, escalate_after=2).assert_verdict(
        "NO_PROGRESS", 2)


def test_escalate_comes_before_the_cap(harness):
    harness.run(verify=[1], revise=touch_each_iteration, escalate_after=3, max_iter=3).assert_verdict(
        "ESCALATE", 3)


def test_no_progress_comes_before_the_cap(harness):
    harness.run(verify=[1], revise=None, no_progress_k=2, max_iter=3).assert_verdict("NO_PROGRESS", 3)


def test_each_iteration_verifies_then_revises(tmp_path):
    trace = Trace()
    scripted = ScriptedChecks({"a": [1, 1, 0]})
    spec = spec_for(tmp_path, [hook_check("a")], revise="true")
    result = engine_with(trace, scripted).run(spec)
    assert result.verdict is Verdict.SUCCESS
    assert trace.events == [
        (1, "verify"), (1, "revise"), (1, "finished"),
        (2, "verify"), (2, "revise"), (2, "finished"),
        (3, "verify"), (3, "finished"),
    ]


def test_no_revise_after_a_stopping_guard(tmp_path):
    trace = Trace()
    spec = spec_for(tmp_path, [hook_check("a")], revise="true", escalate_after=1)
    result = engine_with(trace, ScriptedChecks({"a": [1]})).run(spec)
    assert result.verdict is Verdict.ESCALATE
    assert (1, "revise") not in trace.events
    assert result.iterations[0].revise_exit is None


def test_the_lesson_is_written_before_the_revise_step_and_the_stop_rules(tmp_path):
    seen_prompts = []

    class ReadPrompt:
        @hookimpl
        def pytest_loop_revise(self, spec, iteration, context):
            seen_prompts.append(context.prompt_file.read_text())
            return 0

    page = tmp_path / "lessons.md"
    spec = spec_for(tmp_path, [hook_check("a")], max_iter=2, memory_page=str(page))
    result = engine_with(ReadPrompt(), ScriptedChecks({"a": [3]})).run(spec)
    assert result.verdict is Verdict.MAX_ITER
    # iteration 1's lesson is already in iteration 1's prompt
    assert "iter 1: exit 3" in seen_prompts[0]
    # the last iteration stopped at the cap and still left its lesson
    assert "iter 2: exit 3" in page.read_text()


def reference_verdict(codes, changes, max_iter, k, escalate_after, budget, seconds, measurable):
    """The guard order of the contract, written out plainly: (verdict, iterations)."""
    streak, previous, moved = 0, None, 0
    for i in range(1, 10**6):
        if budget > 0 and (i - 1) * seconds >= budget:
            return "TIMEOUT", i - 1
        if codes[min(i - 1, len(codes) - 1)] == 0:
            return "SUCCESS", i
        if measurable:
            streak = 0 if previous is None else (streak + 1 if moved == previous else 0)
            previous = moved
            if k > 0 and streak >= k:
                return "NO_PROGRESS", i
        if escalate_after > 0 and i >= escalate_after:
            return "ESCALATE", i
        if i >= max_iter:
            return "MAX_ITER", i
        if budget > 0 and i * seconds >= budget:
            return "TIMEOUT", i  # used up before this iteration's revise step
        moved += bool(changes[(i - 1) % len(changes)])
    raise AssertionError("unreachable")


@settings(max_examples=60, deadline=None, database=None)
@given(codes=st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=8),
       changes=st.lists(st.booleans(), min_size=1, max_size=8),
       max_iter=st.integers(1, 7), k=st.integers(0, 3), escalate_after=st.integers(0, 7),
       budget=st.sampled_from([0, 5, 10, 17]), seconds=st.sampled_from([0, 2, 3, 5]),
       measurable=st.booleans())
def test_the_guards_follow_the_contract_order(tmp_path_factory, codes, changes, max_iter, k,
                                              escalate_after, budget, seconds, measurable):
    harness = LoopHarness(tmp_path_factory.mktemp("order"))

    def revise(ws, i):
        if changes[(i - 1) % len(changes)]:
            (ws / f"moved-{i}").write_text("x")

    r = harness.run(verify=codes, revise=revise, max_iter=max_iter, no_progress_k=k,
                    escalate_after=escalate_after, budget_seconds=budget, seconds_per_iteration=seconds,
                    state=None if measurable else [])
    expected, iterations = reference_verdict(codes, changes, max_iter, k, escalate_after, budget,
                                             seconds, measurable)
    r.assert_verdict(expected, iterations=iterations)
    assert r.exit_code == Verdict(expected).exit_code
    assert len(r.iterations) <= max_iter


# -- TIMEOUT on a fake clock ----------------------------------------------------------------


def test_budget_runs_out_between_iterations(harness):
    r = harness.run(verify=[1], revise=touch_each_iteration, budget_seconds=10, seconds_per_iteration=4)
    r.assert_verdict("TIMEOUT", iterations=3)
    assert r.exit_code == 3
    assert "budget" in r.reason


def test_budget_zero_is_off(harness):
    harness.run(verify=[1], revise=touch_each_iteration, budget_seconds=0, max_iter=3,
                seconds_per_iteration=10**6).assert_verdict("MAX_ITER", 3)


def test_budget_is_checked_before_any_work_of_an_iteration(tmp_path):
    clock = FakeClock()
    scripted = ScriptedChecks({"a": [1]})

    class SlowRevise:
        @hookimpl
        def pytest_loop_revise(self, spec, iteration, context):
            clock.advance(11)
            return 0

    spec = spec_for(tmp_path, [hook_check("a")], budget_seconds=10, max_iter=5)
    result = engine_with(SlowRevise(), scripted, clock=clock).run(spec)
    assert result.verdict is Verdict.TIMEOUT
    assert result.iterations_run == 1
    assert scripted.calls["a"] == 1  # iteration 2 was not started
    assert "before iteration 2" in result.reason


def test_budget_comes_before_the_revise_step(tmp_path):
    clock = FakeClock()
    trace = Trace()
    scripted = ScriptedChecks({"a": [1]}, clock=clock, seconds_per_check=10)
    spec = spec_for(tmp_path, [hook_check("a")], budget_seconds=10, max_iter=5, revise="true")
    result = engine_with(trace, scripted, clock=clock).run(spec)
    assert result.verdict is Verdict.TIMEOUT and result.iterations_run == 1
    assert (1, "revise") not in trace.events


def test_the_budget_is_the_deadline_of_every_command(tmp_path):
    clock = FakeClock()
    runner = FakeRunner({"false": 1})
    spec = spec_for(tmp_path, [Check.command_passes("false")], revise="echo fix", budget_seconds=30,
                    max_iter=2)
    engine_with(clock=clock, runner=runner).run(spec)
    assert [c["timeout"] for c in runner.calls] == [30.0, 30.0, 30.0]
    # a check's own, shorter timeout is kept
    runner = FakeRunner({"false": 1})
    spec = spec_for(tmp_path, [Check.command_passes("false", timeout=5)], budget_seconds=30, max_iter=1)
    engine_with(clock=clock, runner=runner).run(spec)
    assert runner.calls[0]["timeout"] == 5


# -- the revise step -------------------------------------------------------------------------


def test_revise_exit_nonzero_is_recorded_and_the_loop_goes_on(harness):
    class FailingRevise:
        @hookimpl
        def pytest_loop_revise(self, spec, iteration, context):
            touch_each_iteration(context.workdir, iteration)
            return 7

    r = harness.run(verify=[1, 1, 0], plugins=[FailingRevise()])
    r.assert_verdict("SUCCESS", iterations=3)
    assert [it.revise_exit for it in r.iterations] == [7, 7, None]


def test_revise_shell_command_nonzero_goes_on(harness):
    r = harness.run(verify=[1, 0], revise="echo trying; exit 1")
    r.assert_verdict("SUCCESS", iterations=2)
    assert r.iterations[0].revise_exit == 1
    assert "trying" in r.iterations[0].revise_tail


def test_revise_that_cannot_start_escalates_with_the_reason(harness):
    r = harness.run(verify=[1], revise="no-such-agent-cli --fix")
    r.assert_verdict("ESCALATE", iterations=1)
    assert r.iterations[0].revise_exit == 127
    assert r.iterations[0].guard == "revise"
    assert "could not start" in r.reason
    assert "127" in r.reason and "no-such-agent-cli" in r.reason


def test_revise_that_is_not_executable_escalates(harness):
    r = harness.run(verify=[1], revise="./fix.sh", files={"fix.sh": "#!/bin/sh\nexit 0\n"})
    r.assert_verdict("ESCALATE", iterations=1)
    assert r.iterations[0].revise_exit == 126


def test_revise_in_a_missing_directory_escalates(tmp_path):
    gone = tmp_path / "gone"
    spec = LoopSpec(name="gone", checks=(hook_check("a"),), revise="true", cwd=str(gone),
                    reflexion=False, guards=Guards(no_progress_k=0))
    engine = make_engine(runner=ProcessRunner(), write_index=False,
                    plugin_manager=make_plugin_manager([ScriptedChecks({"a": [1]})], entry_points=False))
    result = engine.run(spec, log_path=tmp_path / "logs" / "run.json")
    assert result.verdict is Verdict.ESCALATE and result.iterations_run == 1
    assert "could not start" in result.reason and "does not exist" in result.reason
    assert not gone.exists()


def test_revise_gets_the_env_contract_and_runs_in_the_workdir(tmp_path):
    runner = FakeRunner({"verify-cmd": 1})
    spec = spec_for(tmp_path, [Check.command_passes("verify-cmd")], revise="revise-cmd",
                    name="env loop", goal="make it pass", max_iter=2)
    result = engine_with(runner=runner).run(spec, log_path=tmp_path / "logs" / "r.json")
    revise_calls = [c for c in runner.calls if c["command"] == "revise-cmd"]
    assert len(revise_calls) == 1
    env = revise_calls[0]["env"]
    work = str((tmp_path / "work").resolve())
    run_dir = tmp_path / "logs" / "r"
    assert revise_calls[0]["cwd"] == work
    assert env["LOOP_NAME"] == "env loop"
    assert env["LOOP_GOAL"] == "make it pass"
    assert env["LOOP_ITERATION"] == "1"
    assert env["LOOP_MAX_ITER"] == "2"
    assert env["LOOP_WORKDIR"] == work
    assert env["LOOP_RUN_DIR"] == str(run_dir) == result.run_dir
    assert env["LOOP_FAILURE_FILE"] == str(run_dir / "iter-001" / "failure.txt")
    assert env["LOOP_PROMPT_FILE"] == str(run_dir / "iter-001" / "prompt.md")
    assert "output of verify-cmd" in Path(env["LOOP_FAILURE_FILE"]).read_text()
    prompt = Path(env["LOOP_PROMPT_FILE"]).read_text()
    assert "make it pass" in prompt and "verify-cmd" in prompt
    # checks see the loop's variables and the harness's python first on PATH
    check_env = runner.calls[0]["env"]
    assert check_env["LOOP_ITERATION"] == "1"
    assert check_env["PATH"].split(os.pathsep)[0] == os.path.dirname(os.sys.executable)


# -- bad plugins are internal errors, and the log says so -------------------------------------


def test_a_check_hook_returning_the_wrong_type_aborts_with_a_logged_reason(tmp_path):
    class Wrong:
        @hookimpl
        def pytest_loop_run_check(self, check, context):
            return "passed"

    spec = spec_for(tmp_path, [hook_check("a")])
    log = tmp_path / "run.json"
    with pytest.raises(TypeError, match="CheckResult"):
        engine_with(Wrong()).run(spec, log_path=log)
    data = load_runlog(log)
    assert data["verdict"] is None and "TypeError" in data["reason"]


def test_a_revise_hook_returning_a_bool_is_an_error(tmp_path):
    class BoolRevise:
        @hookimpl
        def pytest_loop_revise(self, spec, iteration, context):
            return True

    spec = spec_for(tmp_path, [hook_check("a")])
    with pytest.raises(TypeError, match="pytest_loop_revise"):
        engine_with(BoolRevise(), ScriptedChecks({"a": [1]})).run(spec)


# -- real processes: budgets kill hanging commands -----------------------------------------------


def _run_timed(spec: LoopSpec, tmp_path: Path):
    engine = make_engine(runner=ProcessRunner(), write_index=False)
    start = time.monotonic()
    result = engine.run(spec, log_path=tmp_path / "run.json")
    return result, time.monotonic() - start


HANG_WITH_GRANDCHILDREN = (
    "sleep 60 & echo $! > child.pid; "
    "setsid sleep 60 & echo $! > escaped.pid; "
    "sh -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do sleep 0.05; done' & "
    "sleep 60"
)


def _assert_no_survivor(work: Path) -> None:
    for name in ("child.pid", "escaped.pid", "stubborn.pid"):
        pid = int((work / name).read_text())
        assert not pid_alive(pid), f"{name} ({pid}) survived the kill"


@pytest.mark.floor  # pids inside a PID namespace are not the host's: this tests the runner's own kill
def test_a_hanging_verify_is_killed_at_the_budget(tmp_path):
    budget = 1.0
    spec = spec_for(tmp_path, [Check.command_passes(HANG_WITH_GRANDCHILDREN)], budget_seconds=budget,
                    max_iter=3)
    result, took = _run_timed(spec, tmp_path)
    assert result.verdict is Verdict.TIMEOUT, result.reason
    assert result.iterations_run == 1 and result.iterations[0].guard == "budget"
    assert result.iterations[0].checks[0].timed_out
    assert budget <= took <= budget + TIMEOUT_SLACK_S, f"TIMEOUT after {took:.3f}s, budget {budget}s"
    _assert_no_survivor(tmp_path / "work")


@pytest.mark.floor  # pids inside a PID namespace are not the host's: this tests the runner's own kill
def test_a_hanging_revise_is_killed_at_the_budget(tmp_path):
    budget = 1.0
    spec = spec_for(tmp_path, [Check.command_passes("exit 1")], revise=HANG_WITH_GRANDCHILDREN,
                    budget_seconds=budget, max_iter=3)
    result, took = _run_timed(spec, tmp_path)
    assert result.verdict is Verdict.TIMEOUT, result.reason
    assert result.iterations_run == 1 and result.iterations[0].guard == "budget"
    assert "revise" in result.reason
    assert budget <= took <= budget + TIMEOUT_SLACK_S, f"TIMEOUT after {took:.3f}s, budget {budget}s"
    _assert_no_survivor(tmp_path / "work")


def test_a_checks_own_timeout_fails_the_check_but_is_not_the_budget(tmp_path):
    spec = spec_for(tmp_path, [Check.command_passes("sleep 30", timeout=0.2)], budget_seconds=60,
                    max_iter=2)
    result, _ = _run_timed(spec, tmp_path)
    assert result.verdict is Verdict.MAX_ITER
    assert all(it.checks[0].timed_out and not it.checks[0].passed for it in result.iterations)


def test_run_paths_put_the_run_dir_beside_the_log(tmp_path):
    spec = spec_for(tmp_path, [hook_check("a")])
    paths = resolve_paths(spec, log_path=tmp_path / "x" / "run.json")
    assert paths.run_dir == tmp_path / "x" / "run"
    default = resolve_paths(spec, wall=0.0)
    assert default.log.parent == Path(spec.cwd) / ".pytest-loops" / "runs"
    assert default.memory_page == Path(spec.cwd) / ".pytest-loops" / "lessons" / f"{spec.slug}.md"
    assert spec.slug.startswith("engine-test-")  # readable name, then a short hash of it
    assert resolve_paths(spec.replace(reflexion=False)).memory_page is None


# -- check kinds the engine runs ------------------------------------------------------------------


def test_passes_n_times_needs_every_run_to_pass(tmp_path):
    flaky = 'n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n > n; [ "$n" -ne 2 ]'
    spec = spec_for(tmp_path, [Check.command_passes(flaky, times=3)], max_iter=3)
    result = make_engine(runner=ProcessRunner(), write_index=False).run(spec, log_path=tmp_path / "r.json")
    assert result.verdict is Verdict.SUCCESS and result.iterations_run == 2
    first = result.iterations[0].checks[0]
    assert not first.passed and first.runs == 2 and first.reason.startswith("run 2 of 3 failed")
    assert result.iterations[1].checks[0].runs == 3
    assert (tmp_path / "work" / "n").read_text().strip() == "5"


def test_finds_nothing_needs_exit_0_and_no_output(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "todo.txt").write_text("fix the parser\n")
    spec = spec_for(tmp_path, [Check.finds_nothing("cat todo.txt")], revise=": > todo.txt")
    result = make_engine(runner=ProcessRunner(), write_index=False).run(spec, log_path=tmp_path / "r.json")
    assert result.verdict is Verdict.SUCCESS and result.iterations_run == 2
    assert result.iterations[0].checks[0].reason.startswith("found something")
    missing = spec_for(tmp_path, [Check.finds_nothing("cat missing.txt")], max_iter=1)
    result = make_engine(runner=ProcessRunner(), write_index=False).run(missing, log_path=tmp_path / "m.json")
    assert result.verdict is Verdict.MAX_ITER  # no output, but exit 1: not "nothing found"


def test_a_test_check_passes_only_when_the_test_ran_and_passed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "test_x.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n@pytest.mark.skip\ndef test_skipped():\n    pass\n")
    checks = [Check.test_passes("test_x.py::test_ok"), Check.test_passes("test_x.py::test_skipped"),
              Check.test_passes("test_x.py::test_missing")]
    spec = spec_for(tmp_path, checks, max_iter=1)
    # the check's logic is under test, not third-party plugins: keep the child pytest lean
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = make_engine(runner=ProcessRunner(), write_index=False, env=env).run(spec, log_path=tmp_path / "r.json")
    ok, skipped, missing = result.iterations[0].checks
    assert ok.passed, ok.reason
    assert not skipped.passed and "skipped" in skipped.reason
    assert not missing.passed
    assert result.verdict is Verdict.MAX_ITER

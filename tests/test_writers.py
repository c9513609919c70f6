"""The artifact writers are plugins: registered by name, blocked or added like any
pluggy plugin; and LoopState, the iteration's steps in their one order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pluggy
import pytest

from pytest_loops.artifacts.finishers import WRITER_NAMES, ArtifactOptions, make_engine
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.core.state import IllegalTransition, LoopState, Step
from pytest_loops.results import CheckResult, IterationRecord
from pytest_loops.runtime.process import ProcessRunner
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

hookimpl = pluggy.HookimplMarker("pytest")


def _spec(work: Path, verify: str = "exit 1", max_iter: int = 3) -> LoopSpec:
    return LoopSpec(name="w", checks=(Check.command_passes(verify),), cwd=str(work),
                    guards=Guards(max_iter=max_iter, no_progress_k=0))


class Recorder:
    """A user's writer: what it was handed, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @hookimpl
    def pytest_loop_started(self, spec, run):
        self.seen.append(("started", spec.name, run.paths.log.is_file()))

    @hookimpl
    def pytest_loop_iteration_finished(self, record, verdict, reason):
        self.seen.append(("iteration", record.iter, verdict))

    @hookimpl
    def pytest_loop_finished(self, result, run):
        summary = load_runlog(result.log_path)  # already the summary: the built-ins ran first
        self.seen.append(("finished", result.verdict, summary["verdict"], sorted(result.artifacts)))


def test_a_user_writer_receives_every_iteration_and_the_result(tmp_path: Path) -> None:
    pm = make_plugin_manager(entry_points=False)
    recorder = Recorder()
    pm.register(recorder, name="my-writer")
    engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False, artifacts=ArtifactOptions())
    result = engine.run(_spec(tmp_path), log_path=tmp_path / "run.json")
    assert result.verdict is Verdict.MAX_ITER
    assert recorder.seen[0] == ("started", "w", True)  # the run log's start line is on disk
    assert recorder.seen[1:4] == [("iteration", 1, None), ("iteration", 2, None),
                                  ("iteration", 3, Verdict.MAX_ITER)]
    kind, verdict, logged, artifacts = recorder.seen[4]
    assert (kind, verdict, logged) == ("finished", Verdict.MAX_ITER, "MAX_ITER")
    assert {"log", "tine", "handoff"} <= set(artifacts)
    assert len(recorder.seen) == 5


def test_blocking_the_tine_writer_by_name_leaves_no_tine(tmp_path: Path) -> None:
    for blocked in (False, True):
        work = tmp_path / f"blocked-{blocked}"
        work.mkdir()
        pm = make_plugin_manager(entry_points=False)
        if blocked:
            pm.set_blocked("loop-tine")
        engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False,
                             artifacts=ArtifactOptions())
        result = engine.run(_spec(work, "true"), log_path=work / "run.json")
        assert result.verdict is Verdict.SUCCESS
        assert (work / "run.tine").is_file() is not blocked
        assert ("tine" in result.artifacts) is not blocked
        assert load_runlog(work / "run.json")["verdict"] == "SUCCESS"  # the rest is written


def test_unregistering_the_run_log_writer_keeps_the_verdict(tmp_path: Path) -> None:
    pm = make_plugin_manager(entry_points=False)
    engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False)
    assert set(WRITER_NAMES) - {"loop-tine", "loop-handoff"} <= {n for n, _ in pm.list_name_plugin()}
    pm.unregister(name="loop-runlog")
    result = engine.run(_spec(tmp_path, max_iter=2), log_path=tmp_path / "run.json")
    assert result.verdict is Verdict.MAX_ITER and result.iterations_run == 2
    assert not (tmp_path / "run.json").exists()


def test_a_pytest_plugin_blocks_the_tine_writer_by_name(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.path.joinpath("ok.loop").write_text(
        'loop "ok":\n  goal: nothing to fix\n  done when "true" passes\n  after 2 tries: stop\n')
    first = pytester.runpytest_subprocess("--loop", "ok.loop")
    assert first.ret == 0, first.stdout.str()
    runs = pytester.path / ".pytest-loops" / "runs"
    assert len(list(runs.glob("*.tine"))) == 1
    shutil.rmtree(runs)
    pytester.makeconftest('def pytest_configure(config):\n'
                          '    config.pluginmanager.set_blocked("loop-tine")\n')
    second = pytester.runpytest_subprocess("--loop", "ok.loop")
    assert second.ret == 0, second.stdout.str()
    assert list(runs.glob("*.tine")) == []
    (log,) = runs.glob("*.json")
    summary = json.loads(log.read_text())
    assert summary["verdict"] == "SUCCESS" and "tine" not in summary["artifacts"]


def _failed(name: str = "c") -> CheckResult:
    return CheckResult(name=name, kind="command", passed=False, exit_code=1, duration_s=0.0, reason="exit 1")


def test_loop_state_goes_through_its_steps_in_order() -> None:
    state = LoopState()
    state.begin(IterationRecord(iter=1, started_at=""))
    for step in (Step.VERIFY, Step.GUARDS, Step.REFLECT, Step.REVISE, Step.NEXT):
        state.to(step)
    state.begin(IterationRecord(iter=2, started_at=""))
    state.to(Step.VERIFY)
    assert state.decide(None) is False and state.step is Step.VERIFY  # nothing decided
    assert state.decide(Verdict.SUCCESS, "passed") is True
    assert (state.step, state.verdict, state.reason) == (Step.VERDICT, Verdict.SUCCESS, "passed")


@pytest.mark.parametrize(("path", "bad"), [
    ((), Step.GUARDS),  # guards before anything was verified
    ((Step.VERIFY,), Step.REVISE),  # revise without guards and reflect
    ((Step.VERIFY, Step.GUARDS), Step.REVISE),  # revise without reflect
    ((Step.VERIFY, Step.GUARDS, Step.REFLECT), Step.NEXT),  # the next iteration without a revise
    ((Step.VERIFY, Step.VERDICT), Step.VERIFY),  # anything after the verdict
])
def test_an_illegal_transition_raises(path: tuple[Step, ...], bad: Step) -> None:
    state = LoopState()
    state.begin(IterationRecord(iter=1, started_at=""))
    for step in path:
        state.to(step)
    with pytest.raises(IllegalTransition, match=f"-> {bad.value}"):
        state.to(bad)


def test_a_new_iteration_cannot_begin_mid_iteration_or_after_the_verdict() -> None:
    state = LoopState()
    state.begin(IterationRecord(iter=1, started_at=""))
    state.to(Step.VERIFY)
    with pytest.raises(IllegalTransition):
        state.begin(IterationRecord(iter=2, started_at=""))
    state.decide(Verdict.ESCALATE, "x")
    with pytest.raises(IllegalTransition):
        state.decide(Verdict.TIMEOUT, "twice")


def test_loop_state_carries_the_streaks_across_iterations() -> None:
    state = LoopState()
    for i in (1, 2, 3):
        record = IterationRecord(iter=i, started_at="", checks=[_failed()])
        state.begin(record)
        state.to(Step.VERIFY)
        state.failed = [_failed()]
        state.to(Step.GUARDS)
        state.measure(record, "same-hash", measured=True)
        for step in (Step.REFLECT, Step.REVISE, Step.NEXT):
            state.to(step)
        state.records.append(record)
    assert (state.streak, state.same_failure) == (2, 2)
    assert state.history == {"c": [False, False, False]}
    resumed = LoopState.resumed(state.records)  # a resumed run picks the streaks up
    assert (resumed.iteration, resumed.streak, resumed.same_failure) == (3, 2, 2)
    assert resumed.history == state.history

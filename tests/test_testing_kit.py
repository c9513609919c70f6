"""The contract-test kit: FakeClock, LoopHarness, HarnessResult and the loop_harness fixture."""

from __future__ import annotations

import shutil

import pluggy
import pytest

from pytest_loops import Check, Verdict
from pytest_loops.results import CheckResult
from pytest_loops.testing import FakeClock, HarnessResult, LoopHarness, format_iterations

hookimpl = pluggy.HookimplMarker("pytest")


def test_fake_clock_moves_only_when_told():
    clock = FakeClock(5)
    assert clock() == 5.0
    clock.advance(2.5)
    assert clock() == 7.5
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)
    assert clock() == 7.5


def test_the_docstring_example(loop_harness):
    r = loop_harness.run(verify=[1, 1, 1, 1], revise=None, max_iter=6, no_progress_k=2)
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert r.exit_code == 4


def test_the_fixture_lives_under_the_sessions_temp_dir(loop_harness, tmp_path_factory):
    assert loop_harness.base_dir.is_dir()
    assert tmp_path_factory.getbasetemp() in loop_harness.base_dir.parents


def test_each_run_gets_its_own_workspace(harness):
    a = harness.run(verify=[0])
    b = harness.run(verify=[0])
    assert a.workspace != b.workspace
    assert a.workspace.parent == b.workspace.parent == harness.base_dir


def test_without_a_base_dir_a_temp_dir_is_made():
    h = LoopHarness()
    try:
        assert h.base_dir.is_dir() and h.base_dir.name.startswith("loop-harness-")
    finally:
        shutil.rmtree(h.base_dir)


def test_scripted_codes_spawn_no_process_and_the_last_repeats(harness):
    r = harness.run(verify=[3, 0], revise=None, no_progress_k=0)
    r.assert_verdict("SUCCESS", iterations=2)
    assert [it.verify_exit for it in r.iterations] == [3, 0]
    assert not list(r.workspace.rglob("check-*.out"))  # no command ran
    r = harness.run(verify=[0, 4], max_iter=3)
    r.assert_verdict("SUCCESS", iterations=1)
    r = harness.run(verify=[1, 4], max_iter=3, no_progress_k=0)
    assert [it.verify_exit for it in r.iterations] == [1, 4, 4]


def test_a_shell_command_as_verify(harness):
    r = harness.run(verify="test -f done", revise="touch done")
    r.assert_verdict("SUCCESS", iterations=2)
    assert (r.workspace / "done").exists()


def test_a_list_of_checks_and_commands(harness):
    r = harness.run(verify=["true", Check.finds_nothing("cat notes.txt")], files={"notes.txt": "todo\n"},
                    revise=lambda ws, i: (ws / "notes.txt").write_text(""))
    r.assert_verdict("SUCCESS", iterations=2)
    assert len(r.iterations[0].checks) == 2
    assert r.iterations[0].checks[1].reason.startswith("found something")


def test_callable_revise_gets_the_workspace_and_iteration(harness):
    calls = []
    harness.run(verify=[1, 1, 0], revise=lambda ws, i: calls.append((ws, i)) or (ws / f"{i}").touch())
    assert [i for _, i in calls] == [1, 2]
    assert all(ws.name.startswith("run-") for ws, _ in calls)


def test_a_callable_revise_counts_as_run_whatever_it_returns(harness):
    # `lambda ws, i: path.write_text(...)` returns a character count, not an exit code
    for value in (3, "text", None):
        r = harness.run(verify=[1, 0], revise=lambda ws, i, v=value: v)
        assert r.iterations[0].revise_exit == 0


def test_files_are_created_and_state_defaults_to_the_workspace(harness):
    r = harness.run(verify=[1], revise=None, files={"pkg/mod.py": "x = 1\n"}, max_iter=2, no_progress_k=0)
    assert (r.workspace / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert r.result.spec.state_paths == (".",)
    assert r.iterations[0].state_hash is not None
    r = harness.run(verify=[1], state=[], max_iter=1)
    assert r.result.spec.state_paths == () and r.iterations[0].state_hash is None


def test_seconds_per_iteration_with_real_commands(harness):
    r = harness.run(verify="false", revise="true", budget_seconds=5, seconds_per_iteration=2, no_progress_k=0)
    r.assert_verdict("TIMEOUT", iterations=3)


def test_extra_plugins_are_registered(harness):
    class AlwaysPass:
        @hookimpl(tryfirst=True)
        def pytest_loop_run_check(self, check, context):
            return CheckResult(name=check.name, kind="command", passed=True, exit_code=0, duration_s=0.0)

    harness.run(verify="false", plugins=[AlwaysPass()]).assert_verdict("SUCCESS", iterations=1)


def test_name_and_goal_reach_the_spec(harness):
    r = harness.run(verify=[0], name="my loop", goal="be green")
    assert r.result.spec.name == "my loop" and r.result.spec.goal == "be green"


@pytest.mark.parametrize("verify", [[], ()])
def test_verify_is_required(harness, verify):
    with pytest.raises(ValueError, match="verify"):
        harness.run(verify=verify)


def test_revise_of_another_type_is_rejected(harness):
    with pytest.raises(TypeError, match="revise"):
        harness.run(verify=[1], revise=42)


def test_result_properties(harness):
    r = harness.run(verify=[1, 0])
    assert isinstance(r, HarnessResult)
    assert r.verdict is Verdict.SUCCESS and r.exit_code == 0
    assert r.iterations is r.result.iterations and "iteration 2" in r.reason
    assert r.log_path.is_file() and r.log_path.suffix == ".json"


def test_assert_verdict_accepts_names_and_verdicts(harness):
    r = harness.run(verify=[1], escalate_after=1)
    r.assert_verdict("ESCALATE")
    r.assert_verdict("escalate", iterations=1)
    r.assert_verdict(Verdict.ESCALATE, iterations=1)


def test_assert_verdict_fails_with_the_iteration_table(harness):
    r = harness.run(verify=[1], max_iter=2, no_progress_k=0)
    with pytest.raises(AssertionError) as info:
        r.assert_verdict("SUCCESS")
    message = str(info.value)
    assert "expected SUCCESS, got MAX_ITER after 2 iteration(s)" in message
    assert r.table() in message
    with pytest.raises(AssertionError, match="expected MAX_ITER after 3 iteration"):
        r.assert_verdict("MAX_ITER", iterations=3)
    with pytest.raises(ValueError):
        r.assert_verdict("NOT_A_VERDICT")


def test_the_iteration_table(harness):
    r = harness.run(verify=[1, 1, 0], revise=lambda ws, i: (ws / "a").write_text("x") if i == 1 else None)
    r2 = harness.run(verify=[1], revise=None, no_progress_k=1)
    assert format_iterations(r2.iterations).splitlines()[2].split() == [
        "2", "FAIL", "1", "same", "1", "-", "no_progress"]
    lines = format_iterations(r.iterations).splitlines()
    assert lines[0].split() == ["iter", "checks", "verify", "state", "streak", "revise", "guard"]
    assert len(lines) == 4
    assert lines[1].split()[:4] == ["1", "FAIL", "1", "-"]
    assert lines[2].split()[:5] == ["2", "FAIL", "1", "changed", "0"]
    assert lines[3].split()[:5] == ["3", "PASS", "0", "-", "0"]  # a pass is not measured
    assert format_iterations([]) == "iter  checks  verify  state  streak  revise  guard"


def test_exit_codes_mixed_with_commands_are_rejected(harness):
    with pytest.raises(ValueError, match="mixes exit codes"):
        harness.run([1, "true"])

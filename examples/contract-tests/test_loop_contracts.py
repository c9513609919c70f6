"""Contract tests: assert how a loop ends, in a few lines, without --loop.

The `loop_harness` fixture (from the pytest-loops plugin) runs a loop and gives
back its verdict, exit code, reason and iteration table. Scripted verify exit
codes (`verify=[1, 1, 0]`) run no subprocess, and time comes from a fake clock
(`seconds_per_iteration`), so budget tests never sleep. Each run gets its own
workspace directory, which is also the state the no-progress guard watches.
"""

from pathlib import Path


def change_something(workspace: Path, iteration: int) -> None:
    """A revise step that edits the workspace every time and fixes nothing."""
    (workspace / "attempt.txt").write_text(f"attempt {iteration}\n")


# -- one test per verdict ------------------------------------------------------------

def test_success_when_the_checks_pass(loop_harness):
    r = loop_harness.run(verify=[1, 1, 0], revise=change_something, max_iter=6)
    r.assert_verdict("SUCCESS", iterations=3)
    assert r.exit_code == 0


def test_max_iter_when_the_cap_is_reached(loop_harness):
    r = loop_harness.run(verify=[1], revise=change_something, max_iter=3)
    r.assert_verdict("MAX_ITER", iterations=3)
    assert r.exit_code == 2


def test_timeout_when_the_budget_runs_out(loop_harness):
    r = loop_harness.run(verify=[1], revise=change_something, max_iter=10,
                         budget_seconds=25, seconds_per_iteration=10)
    r.assert_verdict("TIMEOUT", iterations=3)
    assert r.exit_code == 3


def test_no_progress_when_nothing_changes(loop_harness):
    r = loop_harness.run(verify=[1, 1, 1, 1], revise=None, max_iter=6, no_progress_k=2)
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert r.exit_code == 4


def test_escalate_after_n_failed_iterations(loop_harness):
    r = loop_harness.run(verify=[1], revise=change_something, max_iter=6, escalate_after=2)
    r.assert_verdict("ESCALATE", iterations=2)
    assert r.exit_code == 5


# -- revise steps: a Python callable, or a shell command -----------------------------

def test_a_callable_revise_repairs_the_workspace(loop_harness):
    def write_the_answer(workspace: Path, iteration: int) -> None:
        (workspace / "answer.txt").write_text("42\n")

    r = loop_harness.run(verify="grep -qx 42 answer.txt", revise=write_the_answer,
                         files={"answer.txt": "41\n"}, max_iter=3)
    r.assert_verdict("SUCCESS", iterations=2)
    assert (r.workspace / "answer.txt").read_text() == "42\n"


def test_a_command_revise_gets_the_loop_environment(loop_harness):
    # The revise command runs through the shell in the workspace with the
    # LOOP_* variables set; this one records two of them, then fixes the file.
    revise = ('printf "%s %s" "$LOOP_ITERATION" "$LOOP_MAX_ITER" > seen.txt && '
              'grep -q "Goal: answer.txt holds 42" "$LOOP_PROMPT_FILE" && echo 42 > answer.txt')
    r = loop_harness.run(verify="grep -qx 42 answer.txt", revise=revise,
                         files={"answer.txt": "41\n"}, max_iter=3, goal="answer.txt holds 42")
    r.assert_verdict("SUCCESS", iterations=2)
    assert (r.workspace / "seen.txt").read_text() == "1 3"


def test_a_revise_that_fails_and_changes_nothing_ends_no_progress(loop_harness):
    r = loop_harness.run(verify="grep -qx 42 answer.txt", revise="exit 1",
                         files={"answer.txt": "41\n"}, max_iter=6, no_progress_k=2)
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert [it.revise_exit for it in r.iterations] == [1, 1, None]
    assert "state unchanged" in r.reason


def test_a_revise_command_that_cannot_start_escalates_at_once(loop_harness):
    # 127: the shell found no such command. It will not be found next time either.
    r = loop_harness.run(verify=[1], revise="no-such-agent-cli --fix", max_iter=6)
    r.assert_verdict("ESCALATE", iterations=1)
    assert r.exit_code == 5
    assert "could not start" in r.reason


# -- the budget, on a fake clock --------------------------------------------------------

def test_the_budget_counts_the_time_of_every_iteration(loop_harness):
    # 4 iterations of 30 s each fit in 120 s; the budget then runs out with the
    # check still failing, long before the cap of 50 iterations.
    r = loop_harness.run(verify=[1], revise=change_something, max_iter=50,
                         budget_seconds=120, seconds_per_iteration=30)
    r.assert_verdict("TIMEOUT", iterations=4)
    assert "budget" in r.reason


def test_a_budget_of_zero_is_off(loop_harness):
    r = loop_harness.run(verify=[1, 1, 1, 0], revise=change_something, max_iter=6,
                         budget_seconds=0, seconds_per_iteration=3600)
    r.assert_verdict("SUCCESS", iterations=4)

"""`@pytest.mark.loop(...)` end to end: nothing without --loop; every verdict under it."""

from __future__ import annotations

import re

import pytest
from plugin_helpers import FIX_ADD, Project


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def assert_no_harness_traceback(output: str) -> None:
    assert "INTERNALERROR" not in output
    assert "pytest_loops/" not in output, "a harness frame leaked into the report"


# -- without --loop nothing changes ----------------------------------------------------------


def test_without_loop_flag_the_marker_changes_nothing(project: Project) -> None:
    project.marked_test(marker='revise="python note.py revised.txt ran", max_iter=3')
    result = project.run("--loop-revise", "python note.py session-revised.txt ran")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    assert not project.exists("revised.txt"), "a revise command ran without --loop"
    assert not project.exists("session-revised.txt"), "--loop-revise ran without --loop"
    assert not project.artifacts.exists(), "an artifact was written without --loop"
    assert "[test_calc.py::test_add] iter" not in result.stdout.str()
    assert "= loops =" not in result.stdout.str()


def test_without_loop_flag_outcomes_equal_plugin_disabled(project: Project) -> None:
    project.marked_test(marker=f'revise={FIX_ADD!r}')
    project.write("test_more.py", """\
        import pytest

        def test_fails():
            assert 0

        @pytest.mark.skip(reason="no")
        def test_skipped():
            pass

        @pytest.mark.xfail(reason="known")
        def test_xfails():
            assert 0
        """)
    enabled = project.run("-rA")
    disabled = project.run("-rA", "-p", "no:loop")
    # (disabled, the marker is unknown: pytest adds a warning about it)
    disabled_outcomes = {k: v for k, v in disabled.parseoutcomes().items() if k not in ("warning", "warnings")}
    assert enabled.parseoutcomes() == disabled_outcomes
    assert enabled.ret == disabled.ret == 1

    def summary(result: pytest.RunResult) -> list[str]:
        return sorted(re.findall(r"^(?:PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR) \S+", result.stdout.str(), re.M))

    assert summary(enabled) == summary(disabled)
    assert "a - b  # BUG" in project.read("calc.py")
    assert not project.artifacts.exists()


def test_without_loop_flag_a_bad_marker_is_not_an_error(project: Project) -> None:
    # the plugin changes nothing without --loop, not even by rejecting a marker
    project.marked_test(marker="max_iter=0, colour='red'")
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1


# -- every verdict under --loop ---------------------------------------------------------------


@pytest.mark.slow
def test_success_repairs_the_test_in_a_fresh_process(project: Project) -> None:
    project.marked_test(marker=f"revise={FIX_ADD!r}, max_iter=3")
    result = project.run("--loop", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*test_calc.py::test_add REPAIRED*",
        "*test_calc.py::test_green PASSED*",
        "*1 passed, 1 repaired in*",
    ])
    assert "a + b" in project.read("calc.py")
    # the re-run was `python -m pytest NODEID` in a subprocess, not in this process
    (log,) = project.run_logs()
    assert log["verdict"] == "SUCCESS"
    assert log["iterations_run"] == 2
    second = log["iterations"][1]["checks"][0]
    assert "-m pytest" in second["command"] and "test_calc.py::test_add" in second["command"]
    assert second["passed"] is True


@pytest.mark.slow
def test_repaired_outcome_has_its_own_letter(project: Project) -> None:
    project.marked_test(marker=f"revise={FIX_ADD!r}")
    result = project.run("--loop")
    assert result.ret == 0
    # the letter follows its file name on pytest's progress line, after the live lines
    result.stdout.re_match_lines([r"^\[test_calc\.py::test_add\] iter 2/6 .*PASS", r"^test_calc\.py L\.\s+\[100%\]$",
                                  r".*1 passed, 1 repaired in .*"])
    assert "L" not in [line.strip() for line in result.stdout.lines]


def test_a_passing_marked_test_runs_no_loop(project: Project) -> None:
    project.write("calc.py", "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    project.marked_test(marker='revise="python note.py revised.txt ran"')
    result = project.run("--loop")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    assert not project.exists("revised.txt")
    assert not (project.artifacts / "runs").exists()
    assert "= loops =" not in result.stdout.str()


def test_an_unmarked_failure_without_loop_revise_is_a_plain_failure(project: Project) -> None:
    project.write("test_plain.py", """\
        import calc

        def test_add():
            assert calc.add(2, 3) == 5
        """)
    result = project.run("--loop")
    result.assert_outcomes(failed=1)
    assert result.ret == 1
    assert not (project.artifacts / "runs").exists()


def test_max_iter_reports_verdict_reason_table_and_tail(project: Project) -> None:
    # the revise changes the state (so no NO_PROGRESS) but never fixes the bug
    project.marked_test(marker='revise="python note.py notes.txt tried", max_iter=2',
                        body='assert calc.add(2, 3) == 5, "add is still broken"')
    result = project.run("--loop")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*loop 'test_calc.py::test_add' ended MAX_ITER (exit 2) after 2 iteration(s)*",
        "*reason: max_iter=2 reached without passing*",
        "*iter*checks*verify*state*streak*revise*guard*",
        "*last failure (tail):*",
    ])
    assert "add is still broken" in out.split("last failure (tail):", 1)[1]
    assert_no_harness_traceback(out)
    assert project.read("notes.txt").splitlines() == ["tried"]  # one revise: the cap comes first


@pytest.mark.slow
def test_timeout_when_the_revise_outlives_the_budget(project: Project) -> None:
    project.marked_test(marker='revise="python sleep.py 60", budget_seconds=1.5, max_iter=5')
    result = project.run("--loop", timeout=60)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ended TIMEOUT (exit 3)*", "*reason: budget of 1.5s ran out*"])
    assert result.duration < 40, "the budget did not stop the hanging revise step"
    assert_no_harness_traceback(result.stdout.str())


@pytest.mark.slow
def test_no_progress_when_the_revise_changes_nothing(project: Project) -> None:
    project.marked_test(marker='revise="python -c pass", no_progress_k=1, max_iter=5')
    result = project.run("--loop")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ended NO_PROGRESS (exit 4)*", "*reason: state unchanged for 1 iteration(s)*"])


@pytest.mark.slow
def test_marker_state_narrows_what_counts_as_progress(project: Project) -> None:
    # notes.txt changes every iteration, but only calc.py is the loop's state
    project.marked_test(marker='revise="python note.py notes.txt tried", state=["calc.py"], '
                               "no_progress_k=1, max_iter=5")
    result = project.run("--loop")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ended NO_PROGRESS (exit 4)*", "*watched: calc.py*"])


@pytest.mark.slow
def test_escalate_after(project: Project) -> None:
    project.marked_test(marker='revise="python note.py notes.txt tried", escalate_after=2, max_iter=5')
    result = project.run("--loop")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ended ESCALATE (exit 5) after 2 iteration(s)*",
                                 "*reason: escalate_after=2 reached*"])


@pytest.mark.slow
def test_escalate_when_the_revise_command_cannot_start(project: Project) -> None:
    project.marked_test(marker="revise=\"sh -c 'echo no-such-cli: not found >&2; exit 127'\", max_iter=5")
    result = project.run("--loop")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ended ESCALATE (exit 5) after 1 iteration(s)*",
                                 "*reason: the revise step could not start*"])
    assert_no_harness_traceback(result.stdout.str())


# -- settings: the marker is the top layer ------------------------------------------------------


@pytest.mark.slow
def test_marker_wins_over_the_command_line(project: Project) -> None:
    project.marked_test(marker='revise="python note.py notes.txt tried", max_iter=2')
    result = project.run("--loop", "--loop-max-iter", "4")
    result.stdout.fnmatch_lines(["*iter 1/2 *", "*reason: max_iter=2 reached*"])
    assert project.read("notes.txt").count("tried") == 1


@pytest.mark.slow
def test_marker_inherits_what_it_does_not_set(project: Project) -> None:
    project.marked_test(marker="max_iter=3")
    result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-no-progress-k", "0")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*iter 1/3 *", "*1 passed, 1 repaired*"])


@pytest.mark.slow
def test_marker_on_a_class_applies_to_its_methods(project: Project) -> None:
    project.write("test_cls.py", f"""\
        import pytest

        import calc


        @pytest.mark.loop(revise={FIX_ADD!r}, max_iter=2)
        class TestCalc:
            def test_add(self):
                assert calc.add(2, 3) == 5
        """)
    result = project.run("--loop", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_cls.py::TestCalc::test_add REPAIRED*"])


@pytest.mark.slow
def test_xfail_and_setup_errors_start_no_loop(project: Project) -> None:
    project.write("test_other.py", """\
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture broke")

        @pytest.mark.loop(revise="python note.py revised.txt ran")
        @pytest.mark.xfail(reason="known", strict=True)
        def test_known():
            assert 0

        @pytest.mark.loop(revise="python note.py revised.txt ran")
        def test_setup_error(broken):
            pass
        """)
    result = project.run("--loop")
    result.assert_outcomes(xfailed=1, errors=1)
    assert not project.exists("revised.txt")


def git_repository(path) -> None:
    import subprocess

    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit",
                                                 "-qm", "base"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)


def test_fan_out_without_git_or_scope_is_a_usage_error(project: Project) -> None:
    project.marked_test(marker='revise="true", branches=2')
    result = project.run("--loop")
    assert result.ret == 4, result.stdout.str()
    assert "not in a git repository" in result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


@pytest.mark.slow
def test_a_marker_fans_the_repair_out_into_branches(project: Project) -> None:
    # branch 0 fixes the bug; branch 1 breaks the test file (read-only: discarded)
    project.write("fix.sh", f"""\
        if [ "$LOOP_BRANCH" = 0 ]; then {FIX_ADD}; else echo "def test_add(): pass" > test_calc.py; fi
        """)
    project.marked_test(marker='revise="sh fix.sh", branches=2, max_iter=3')
    git_repository(project.path)  # fan-out copies a git worktree (outside git it needs a scope)
    result = project.run("--loop", "-v")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_calc.py::test_add REPAIRED*"])
    (log,) = project.run_logs()
    branches = log["iterations"][0]["branches"]
    assert [b["chosen"] for b in branches] == [True, False]
    # the none tier discards the candidate that changed the test; a kernel tier refuses its
    # write (the test file is read-only there), so that candidate passes fewer checks
    assert branches[1]["why"].startswith(("discarded: changed read-only paths: test_calc.py",
                                          "fewer checks pass")), branches[1]["why"]
    assert "a + b" in project.read("calc.py") and "import calc" in project.read("test_calc.py")

"""`pytest --loop --loop-revise CMD`: the session's failing tests become one fix-loop."""

from __future__ import annotations

import pytest
from plugin_helpers import BUGGY_CALC, FIX_ADD, Project

GOOD_CALC = BUGGY_CALC.replace("a - b  # BUG", "a + b")
BAD_SUB = GOOD_CALC.replace("def sub(a, b):\n    return a - b", "def sub(a, b):\n    return a * b")

# every test appends its name to ran.txt, so the test counts how often each one ran
COUNTING_TESTS = """\
from pathlib import Path

import calc


def ran(name):
    with open(Path(__file__).parent / "ran.txt", "a") as f:
        f.write(name + "\\n")


def test_add():
    ran("add")
    assert calc.add(2, 3) == 5


def test_add_again():
    ran("add_again")
    assert calc.add(1, 1) == 2


def test_sub():
    ran("sub")
    assert calc.sub(5, 3) == 2
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def session_run_dir(project: Project, artifacts: str = ".pytest-loops"):
    (run_dir,) = [p for p in (project.path / artifacts / "runs").glob("failing-tests-*") if p.is_dir()]
    return run_dir


def test_repairs_failing_tests_rerunning_only_them_then_one_confirm_run(project: Project) -> None:
    project.write("test_calc.py", COUNTING_TESTS)
    # without fault localization, whose coverage run would count as runs here too
    result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-max-iter", "3", "--loop-suspects", "off")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*loop: 2 failing test(s), revise: python edit.py calc.py*",
        "[[]failing tests[]] iter 1/3  FAIL the failing tests pass*",
        "[[]failing tests[]] iter 2/3  PASS the failing tests pass*",
        "SUCCESS*failing tests: 2 iteration(s)*",
    ])
    assert "1 passed, 2 repaired in" in result.stdout.lines[-1]
    assert "failed" not in result.stdout.lines[-1]
    assert "FAILED" not in result.stdout.str(), "a repaired test is still listed as failed"
    # the session, then the failing tests alone; the confirm run is the clean room's
    # (in its own copy of the tree: it writes the copy's ran.txt)
    assert project.read("ran.txt").split() == [
        "add", "add_again", "sub",
        "add", "add_again",
    ]
    (log,) = project.run_logs()
    assert log["iterations"][-1]["checks"][0]["reason"] == "rerun: 2 test(s) passed; the clean-room run confirms"
    assert log["iterations"][-1]["clean_room"][0]["reason"] == (
        "clean room: all 3 test(s) passed (witnessed); full (no impact map); "
        "impact map of 3 test(s) stored for the next loop")
    iteration = session_run_dir(project) / "iter-002"
    assert (iteration / "failing.ids").read_text().split() == ["test_calc.py::test_add",
                                                               "test_calc.py::test_add_again"]
    assert not (iteration / "confirm.ids").exists()  # no separate confirm run


@pytest.mark.slow
def test_narrows_to_the_tests_still_failing(project: Project) -> None:
    # the first revise repairs one of the two failures, the second the other
    project.write("test_calc.py", COUNTING_TESTS.replace("calc.add(1, 1) == 2", "calc.mul(2, 2) == 4"))
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC},
                                      2: {"calc.py": GOOD_CALC + "\n\ndef mul(a, b):\n    return a * b\n"}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-max-iter", "4")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*iter 2/4  FAIL*", "*iter 3/4  PASS*", "*1 passed, 2 repaired in*"])
    run_dir = session_run_dir(project)
    assert (run_dir / "iter-003" / "failing.ids").read_text().split() == ["test_calc.py::test_add_again"]


@pytest.mark.slow
def test_parametrize_ids_with_spaces_and_colours(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PY_COLORS", "1")  # the child runs colour their output too
    project.write("sub/test_param.py", """\
        import pytest

        import calc


        class TestAdd:
            @pytest.mark.parametrize("a", [1, 2, 3], ids=["one two", "x::y", "[z]"])
            def test_add(self, a):
                assert calc.add(a, 1) == a + 1
        """)
    result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-max-iter", "2", "--color=no")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*SUCCESS*failing tests: 2 iteration(s)*", "*3 repaired in*"])


@pytest.mark.slow
def test_a_setup_error_is_a_failing_test_too(project: Project) -> None:
    project.write("test_fixture.py", """\
        import pytest

        import calc


        @pytest.fixture
        def five():
            assert calc.add(2, 3) == 5, "the fixture needs add"
            return 5


        def test_five(five):
            assert five == 5
        """)
    result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-max-iter", "2")
    assert result.ret == 0
    assert "1 repaired in" in result.stdout.lines[-1]
    assert "error" not in result.stdout.lines[-1]


@pytest.mark.slow
def test_a_regression_is_named_in_the_reason(project: Project) -> None:
    project.write("test_calc.py", COUNTING_TESTS)
    # the revise repairs add and breaks sub, which was green in the session
    revise = project.scripted_revise({1: {"calc.py": BAD_SUB}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-max-iter", "2", "--loop-no-progress-k", "0")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*MAX_ITER*failing tests: 2 iteration(s)*regression: test_calc.py::test_sub passed before the loop "
        "and fail now*",
    ])
    assert "repaired" not in result.stdout.lines[-1]
    assert "2 failed, 1 passed" in result.stdout.lines[-1]


@pytest.mark.slow
def test_a_regression_a_later_revise_repairs_is_no_failure(project: Project) -> None:
    project.write("test_calc.py", COUNTING_TESTS)
    revise = project.scripted_revise({1: {"calc.py": BAD_SUB}, 2: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-max-iter", "4", "--loop-no-progress-k", "0")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*iter 2/4  FAIL*",
        "*iter 3/4  PASS*",
        "SUCCESS*failing tests: 3 iteration(s)*",
    ])
    (row,) = [line for line in result.stdout.lines if line.startswith("SUCCESS ")]
    assert "regression" not in row
    (log,) = project.run_logs()
    reasons = [check["reason"] for it in log["iterations"] for check in it["checks"]]
    assert reasons[1].startswith("regression: test_calc.py::test_sub passed before the loop")  # on the way
    assert reasons[2].startswith("rerun: ")
    assert log["iterations"][2]["clean_room"][0]["reason"].startswith("clean room: all 3 test(s) passed")


@pytest.mark.slow
def test_marker_loops_stay_out_of_the_session_loop(project: Project) -> None:
    project.marked_test("test_marked.py", marker="revise=\"sh -c 'echo no-such-cli: not found >&2; exit 127'\"")
    project.write("test_plain.py", """\
        import calc

        def test_plain():
            assert calc.add(1, 2) == 3
        """)
    result = project.run("--loop", "--loop-revise", FIX_ADD, "--loop-max-iter", "2")
    result.stdout.fnmatch_lines([
        "*ESCALATE*test_marked.py::test_add*revise step could not start*",
        "*SUCCESS*failing tests: 2 iteration(s)*",
    ])
    assert (session_run_dir(project) / "iter-002" / "failing.ids").read_text().split() == [
        "test_plain.py::test_plain"]
    assert result.ret == 1  # the marker loop did not succeed
    assert "1 failed, 1 passed, 1 repaired" in result.stdout.lines[-1]


def test_nothing_to_do_when_every_test_passes(project: Project) -> None:
    project.write("calc.py", GOOD_CALC)
    project.write("test_calc.py", COUNTING_TESTS)
    result = project.run("--loop", "--loop-revise", "python note.py revised.txt ran")
    assert result.ret == 0
    result.assert_outcomes(passed=3)
    assert not project.exists("revised.txt")
    assert not (project.artifacts / "runs").exists()
    assert "= loops =" not in result.stdout.str()


def test_without_a_revise_failures_are_only_reported(project: Project) -> None:
    project.write("test_calc.py", COUNTING_TESTS)
    result = project.run("--loop")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=2)
    assert not (project.artifacts / "runs").exists()


SLOW = "python sleep.py 60"


@pytest.mark.parametrize(("verdict", "revise", "args", "reason"), [
    ("MAX_ITER", "python note.py notes.txt tried", ["--loop-max-iter", "2"], "max_iter=2 reached"),
    ("TIMEOUT", SLOW, ["--loop-budget-seconds", "1.5"], "budget of 1.5s ran out"),
    ("NO_PROGRESS", "python -c pass", ["--loop-no-progress-k", "1"], "state unchanged for 1 iteration(s)"),
    ("ESCALATE", "python note.py notes.txt tried", ["--loop-escalate-after", "1"], "escalate_after=1 reached"),
    ("ESCALATE", "sh -c 'echo no-such-cli: not found >&2; exit 127'", [], "the revise step could not start"),
], ids=["max_iter", "timeout", "no_progress", "escalate_after", "cannot_start"])
@pytest.mark.slow
def test_every_verdict_and_its_exit_code(project: Project, verdict: str, revise: str, args: list[str],
                                         reason: str) -> None:
    # (no counting here: a test that writes into the tree changes the loop's state)
    project.write("test_calc.py", COUNTING_TESTS.replace('    ran(', '    print('))
    result = project.run("--loop", "--loop-revise", revise, "--loop-exitcode=verdict", *args, timeout=90)
    codes = {"MAX_ITER": 2, "TIMEOUT": 3, "NO_PROGRESS": 4, "ESCALATE": 5}
    assert result.ret == codes[verdict]
    result.stdout.fnmatch_lines([f"{verdict}*failing tests:*{reason}*"])
    assert "2 failed, 1 passed" in result.stdout.lines[-1]
    if verdict == "TIMEOUT":
        assert result.duration < 45, "the budget did not stop the hanging revise step"


def test_no_session_loop_when_the_session_stopped_early(project: Project) -> None:
    # with -x the tests after the first failure never ran: repairing the first one
    # must not turn the session green
    project.write("test_calc.py", COUNTING_TESTS)
    result = project.run("--loop", "--loop-revise", "python note.py revised.txt ran", "-x")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*loop: not started: the session stopped early (stopping after 1 failures)*"])
    assert not project.exists("revised.txt")
    assert "1 failed" in result.stdout.lines[-1]


@pytest.mark.slow
def test_junit_xml_is_amended_after_a_session_repair(pytester: pytest.Pytester) -> None:
    import xml.etree.ElementTree as ET

    pytester.makepyfile(calc="def add(a, b):\n    return a - b\n")
    pytester.makepyfile(test_calc="""
        from calc import add

        def test_add():
            assert add(2, 3) == 5

        def test_ok():
            assert True
    """)
    pytester.makepyfile(fix="""
        import pathlib
        p = pathlib.Path("calc.py")
        p.write_text(p.read_text().replace("a - b", "a + b"))
    """)
    result = pytester.runpytest_subprocess("--loop", "--loop-revise", "python fix.py", "-p", "no:cacheprovider",
                                           "--junitxml=junit.xml")
    assert result.ret == 0
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    repaired = cases["test_add"]
    assert repaired.find("failure") is None
    props = {p.get("name"): p.get("value") for p in repaired.iter("property")}
    assert props["verdict"] == "SUCCESS" and props["iterations"] == "2"
    assert "iteration_1" in props and "iteration_2" in props
    assert cases["test_ok"].find("properties") is None


@pytest.mark.slow
def test_affected_green_tests_rerun_with_the_failing_ones(project: Project) -> None:
    # the revise fixes add() but breaks sub(), which only test_sub runs: the localization
    # run's impact map selects test_sub for iteration 2, so the regression shows before
    # any confirm run, and the next revise repairs it
    project.write("test_calc.py", COUNTING_TESTS)
    broken_sub = GOOD_CALC.replace("return a - b", "return b - a")
    revise = project.scripted_revise({1: {"calc.py": broken_sub}, 2: {"calc.py": GOOD_CALC}})
    # no cap: the first iteration's run under coverage covers every test (the map)
    result = project.run("--loop", "--loop-revise", revise, "--loop-max-iter", "4", "--loop-suspects-cap=0")
    assert result.ret == 0, result.stdout.str()
    run_dir = session_run_dir(project)
    assert (run_dir / "iter-002" / "failing.ids").read_text().split() == [
        "test_calc.py::test_add", "test_calc.py::test_add_again", "test_calc.py::test_sub"]
    assert not (run_dir / "iter-002" / "confirm.ids").exists()
    (log,) = project.run_logs()
    assert log["iterations"][1]["checks"][0]["reason"].startswith(
        "regression: test_calc.py::test_sub passed before the loop and fail now")
    assert (run_dir / "suspects.json").is_file() and (run_dir / "impact.json").is_file()


SUBTEST_CALC = "def add(a, b):\n    return a - b if a > 1 else a + b  # BUG\n"
SUBTESTS = """\
import unittest

import calc


class TestCase(unittest.TestCase):
    def test_with_subtests(self):
        for i in range(4):
            with self.subTest(i=i):
                self.assertEqual(calc.add(i, 1), i + 1)


def test_subtests_fixture(subtests):
    for i in range(4):
        with subtests.test(i=i):
            assert calc.add(i, 1) == i + 1


def test_plain():
    assert calc.add(0, 0) == 0
"""


@pytest.mark.parametrize("args", [["--loop-exitcode=pytest"], ["--loop-exitcode=verdict", "-n", "2"]],
                         ids=["pytest-exitcode", "verdict-exitcode-xdist"])
@pytest.mark.slow
def test_tests_with_failing_subtests_are_repaired_once_each(project: Project, args: list[str]) -> None:
    if not hasattr(pytest, "Subtests"):  # pytest >= 9 ships subtests
        pytest.skip("this pytest has no built-in subtests")
    project.write("calc.py", SUBTEST_CALC)
    project.write("test_calc.py", SUBTESTS)
    # a first revise that changes nothing useful, then the fix
    revise = project.scripted_revise({1: {"notes.txt": "tried\n"},
                                      2: {"calc.py": "def add(a, b):\n    return a + b\n"}})
    result = project.run("--loop", f"--loop-revise={revise}", "--loop-max-iter=4", "--loop-no-progress-k=0",
                         *args)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "1 passed, 2 repaired" in result.stdout.lines[-1], result.stdout.lines[-1]
    assert "failed" not in result.stdout.lines[-1]
    (log,) = project.run_logs()
    assert log["verdict"] == "SUCCESS" and len(log["iterations"]) == 3
    reasons = " ".join(check["reason"] for it in log["iterations"] for check in it["checks"])
    assert "regression" not in reasons  # the unittest case "passed" itself while its subTests failed


@pytest.mark.slow
def test_fan_out_judges_each_candidate_in_its_own_copy(project: Project) -> None:
    # branch 0 changes nothing that helps, branch 1 fixes the bug: the candidates' own
    # reruns (in their copies, with the session's --rootdir moved there) tell them apart
    project.write("test_calc.py", COUNTING_TESTS)
    project.write("fix.sh", f'if [ "$LOOP_BRANCH" = 1 ]; then {FIX_ADD}; else echo "# no" >> calc.py; fi\n')
    from test_plugin_marker import git_repository

    git_repository(project.path)
    result = project.run("--loop", "--loop-revise", "sh fix.sh", "--loop-branches", "2", "--loop-max-iter", "3",
                         "--loop-suspects", "off")
    assert result.ret == 0, result.stdout.str()
    (log,) = project.run_logs()
    assert log["iterations_run"] == 2
    first = log["iterations"][0]["branches"]
    assert [(b["passed"], b["failing_tests"], b["chosen"]) for b in first] == [(0, 2, False), (1, 0, True)]
    assert "a + b" in project.read("calc.py") and "# no" not in project.read("calc.py")

"""What a `--loop` session shows: header, live lines, the loops summary, JUnit XML, exit codes."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from plugin_helpers import FIX_ADD, Project, header_settings, junit_cases, loop_header

# one test per verdict; each fails on a condition of its own, so loops do not fix each other
VERDICT_TESTS = """\
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.loop(revise="python note.py ok_success fixed")
def test_success():
    assert (HERE / "ok_success").exists()


@pytest.mark.loop(max_iter=1)
def test_max_iter():
    assert (HERE / "ok_max_iter").exists()


@pytest.mark.loop(revise="python sleep.py 60", budget_seconds=1)
def test_timeout():
    assert (HERE / "ok_timeout").exists()


@pytest.mark.loop(revise="python -c pass", no_progress_k=1)
def test_no_progress():
    assert (HERE / "ok_no_progress").exists()


@pytest.mark.loop(revise="sh -c 'echo no-such-cli: not found >&2; exit 127'")
def test_escalate():
    assert (HERE / "ok_escalate").exists()


def test_plain_fail():
    assert (HERE / "ok_plain").exists()


def test_plain_pass():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


# -- header --------------------------------------------------------------------------------------


def test_header_shows_the_settings_in_effect_and_where_they_came_from(project: Project,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    project.write("pytest.ini", "[pytest]\nloop_no_progress_k = 3\n")
    monkeypatch.setenv("PYTEST_LOOPS_ESCALATE_AFTER", "4")
    result = project.run("--loop", "--loop-max-iter", "2", "--loop-budget-seconds", "30.5",
                         "--loop-revise", "python fix.py --all", "--loop-exitcode", "verdict")
    settings, revise, reproduce = loop_header(result)
    shown, origins = header_settings(settings)
    assert {k: shown[k] for k in ("max_iter", "budget_seconds", "no_progress_k", "escalate_after", "exitcode")} == {
        "max_iter": "2", "budget_seconds": "30.5", "no_progress_k": "3", "escalate_after": "4", "exitcode": "verdict"}
    assert origins == [
        "max_iter from command line", "budget_seconds from command line", "no_progress_k from ini",
        "escalate_after from environment", "revise from command line"]
    assert revise == f"loops: revise: python fix.py --all; artifacts: {project.artifacts}"
    assert reproduce.startswith("loops: reproduce with: pytest --loop ")


def test_the_reproduce_command_pastes_into_a_shell(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    project.write("pytest.ini", "[pytest]\nloop_no_progress_k = 3\nloop_state = calc.py\n")
    monkeypatch.setenv("PYTEST_LOOPS_ESCALATE_AFTER", "4")
    monkeypatch.setenv("PYTEST_LOOPS_ARTIFACTS", "out dir")
    monkeypatch.setenv("PYTEST_LOOPS_MEMORY", "notes/lessons.md")
    first = project.run("--loop", "--loop-max-iter", "2", "--loop-budget-seconds", "100000.25",
                        "--loop-revise", "python fix.py 'it''s'", "--loop-exitcode=verdict", "-k", "green or red")
    settings, revise, reproduce = loop_header(first)
    command = reproduce.removeprefix("loops: reproduce with: ")

    # elsewhere: none of the environment, an ini without the loop keys
    for name in ("PYTEST_LOOPS_ESCALATE_AFTER", "PYTEST_LOOPS_ARTIFACTS", "PYTEST_LOOPS_MEMORY"):
        monkeypatch.delenv(name)
    project.write("pytest.ini", "[pytest]\n")
    args = shlex.split(command)
    assert args[0] == "pytest"
    again = project.pytester.run(sys.executable, "-m", *args)
    assert again.ret == 0, again.stderr.str()
    again_settings, again_revise, again_reproduce = loop_header(again)
    assert again_settings.split(" (")[0] == settings.split(" (")[0]
    assert again_revise == revise
    assert again_reproduce == reproduce
    again.assert_outcomes(passed=1)


# -- live lines and the loops summary ---------------------------------------------------------------


@pytest.mark.slow
def test_a_live_line_per_iteration(project: Project) -> None:
    project.marked_test(marker=f"revise={FIX_ADD!r}, max_iter=3, escalate_after=3")
    result = project.run("--loop")
    assert result.ret == 0
    result.stdout.re_match_lines([
        r"^\[test_calc\.py::test_add\] iter 1/3  FAIL the test \"test_calc\.py::test_add\" passes \(\d+\.\d\ds\)  "
        r"\| elapsed \d+\.\ds, budget left \d+s, unchanged 0/2, escalate 1/3, revise exit 0$",
        r"^\[test_calc\.py::test_add\] iter 2/3  PASS the test \"test_calc\.py::test_add\" passes \(\d+\.\d\ds\)  "
        r"\| elapsed \d+\.\ds, .*escalate 2/3$",
    ])
    assert len(re.findall(r"^\[test_calc\.py::test_add\] iter", result.stdout.str(), re.M)) == 2


@pytest.mark.slow
def test_loop_file_loops_print_live_lines_without_s(project: Project) -> None:
    project.write("test_calc.py", "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n")
    project.write("fix.py", "import pathlib\np = pathlib.Path('calc.py')\n"
                            "p.write_text(p.read_text().replace('a - b  # BUG', 'a + b'))\n")
    project.write("fix.loop", """\
        loop "fix add":
          goal: "make add work"
          done when the test "test_calc.py::test_add" passes
          revise with "python fix.py"
          after 3 tries: stop and warn "no luck"
        """)
    result = project.run("--loop", "fix.loop")  # capture on (no -s)
    assert result.ret == 0, result.stdout.str()
    lines = result.stdout.lines
    live = [line for line in lines if line.startswith("[fix add] iter ")]
    assert [line.split("  ")[0] for line in live] == ["[fix add] iter 1/3", "[fix add] iter 2/3"], lines


@pytest.mark.slow
def test_the_session_loop_banner_is_never_glued_to_the_progress_line(project: Project) -> None:
    project.write("test_add.py", "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n")
    result = project.run("--loop", f"--loop-revise={FIX_ADD}", "-n", "2")
    assert result.ret == 0, result.stdout.str()
    banners = [line for line in result.stdout.lines if "loop: 1 failing test(s)" in line]
    assert len(banners) == 1 and banners[0].startswith("="), result.stdout.lines
    assert not [line for line in result.stdout.lines if "%]=" in line]


@pytest.mark.slow
def test_loops_summary_section(project: Project) -> None:
    project.write("test_verdicts.py", VERDICT_TESTS)
    result = project.run("--loop", "-k", "success or max_iter or escalate")
    assert result.ret == 1
    loops = result.stdout.str().split("= loops =", 1)[1].split("= short test summary info =")[0]
    rows = [line for line in loops.splitlines() if line and not line.startswith((" ", "="))]
    assert len(rows) == 3, loops
    assert re.fullmatch(r"SUCCESS +test_verdicts\.py::test_success: 2 iteration\(s\), \d+\.\d\ds: "
                        r"all 1 check\(s\) passed in iteration 2", rows[0])
    assert re.fullmatch(r"MAX_ITER +test_verdicts\.py::test_max_iter: 1 iteration\(s\), \d+\.\d\ds: "
                        r"max_iter=1 reached without passing .*", rows[1])
    assert re.fullmatch(r"ESCALATE +test_verdicts\.py::test_escalate: 1 iteration\(s\), \d+\.\d\ds: "
                        r"the revise step could not start: .*", rows[2])
    logs = re.findall(r"^    log: (.+)$", loops, re.M)
    assert len(logs) == 3 and len(set(logs)) == 3
    for log in logs:
        assert Path(log).is_file() and Path(log).parent == project.artifacts / "runs"


# -- JUnit XML -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_junit_properties_of_every_loop_test_case(project: Project) -> None:
    project.write("test_verdicts.py", VERDICT_TESTS)
    junit = project.path / "junit.xml"
    result = project.run("--loop", "-k", "success or no_progress or plain_pass", f"--junitxml={junit}")
    assert result.ret == 1
    cases = junit_cases(junit)
    assert set(cases) == {"test_success", "test_no_progress", "test_plain_pass"}
    expected = {"test_success": ("SUCCESS", "0", False), "test_no_progress": ("NO_PROGRESS", "4", True)}
    for name, (verdict, exit_code, failed) in expected.items():
        props = cases[name]["properties"]
        assert props["verdict"] == verdict
        assert props["exit_code"] == exit_code
        assert props["iterations"] == "2"
        assert props["reason"]
        assert props["iteration_1"].startswith("FAIL ")
        assert "iteration_2" in props and "iteration_3" not in props
        assert cases[name]["failed"] is failed
    assert cases["test_success"]["properties"]["iteration_2"].startswith("PASS ")
    assert "state unchanged" in cases["test_no_progress"]["properties"]["iteration_2"]
    assert cases["test_plain_pass"]["properties"] == {}
    assert not cases["test_plain_pass"]["failed"]


def test_junit_failure_carries_the_loop_report(project: Project) -> None:
    project.write("test_verdicts.py", VERDICT_TESTS)
    junit = project.path / "junit.xml"
    project.run("--loop", "-k", "max_iter", f"--junitxml={junit}")
    import xml.etree.ElementTree as ET

    (failure,) = ET.parse(junit).getroot().iter("failure")
    assert "ended MAX_ITER (exit 2)" in failure.text
    assert "reason: max_iter=1 reached" in failure.text


# -- exit codes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("selected", "mode", "expected"), [
    ("success or plain_pass", "pytest", 0),
    ("success or plain_pass", "verdict", 0),
    ("success or plain_fail", "verdict", 1),
    ("plain_fail", "verdict", 1),
    ("max_iter", "pytest", 1),
    ("max_iter", "verdict", 2),
    ("max_iter or plain_fail", "verdict", 2),
    ("timeout", "verdict", 3),
    ("timeout or no_progress or plain_fail", "verdict", 4),
    ("max_iter or escalate or success", "verdict", 5),
    ("max_iter or escalate or success", "pytest", 1),
])
@pytest.mark.slow
def test_exit_codes(project: Project, selected: str, mode: str, expected: int) -> None:
    project.write("test_verdicts.py", VERDICT_TESTS)
    result = project.run("--loop", "-k", selected, f"--loop-exitcode={mode}")
    assert result.ret == expected, result.stdout.str()


@pytest.mark.slow
def test_exitcode_from_ini(project: Project) -> None:
    project.write("test_verdicts.py", VERDICT_TESTS)
    project.write("pytest.ini", "[pytest]\nloop_exitcode = verdict\n")
    assert project.run("--loop", "-k", "escalate").ret == 5
    assert project.run("--loop", "-k", "escalate", "--loop-exitcode", "pytest").ret == 1

"""The header states what is session-wide; each loop prints its own settings as it starts
(marker loops, loop-file loops, the session fix-loop; under xdist on the controller)."""

from __future__ import annotations

import pytest
from plugin_helpers import FIX_ADD, Project

GREEN = "def test_green():\n    pass\n"
CHECK = "import os, sys\n\nsys.exit(0 if os.path.exists('done.txt') else 1)\n"

# a loop file whose loop sets its own cap and budget and revise step
OWN_LOOP = """\
loop "own settings":
  goal: done.txt exists
  done when "python check.py" passes
  revise with "python note.py done.txt"
  budget: 2 minutes
  after 3 tries: stop
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def settings_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "] settings: " in line]


def session_line(result: pytest.RunResult) -> str:
    lines = [line for line in result.stdout.lines if line.startswith("loops: session-wide: ")]
    assert len(lines) == 1, result.stdout.str()
    return lines[0]


def test_header_names_session_wide_settings_and_points_to_each_loop(project: Project) -> None:
    project.write("test_green.py", GREEN)
    result = project.run("--loop", "--loop-max-iter=4")
    line = session_line(result)
    assert line.startswith("loops: session-wide: max_iter=4 budget_seconds=900 ")
    assert line.endswith("(max_iter from command line); per loop: see below")
    assert settings_lines(result) == []  # nothing looped: no loop line
    assert "loops: max_iter=" not in result.stdout.str()


@pytest.mark.slow
def test_a_marker_loop_prints_its_own_settings_not_the_session_defaults(project: Project) -> None:
    project.marked_test(marker=f"revise={FIX_ADD!r}, max_iter=3, budget_seconds=45")
    result = project.run("--loop")
    assert result.ret == 0, result.stdout.str()
    assert session_line(result).startswith("loops: session-wide: max_iter=6 budget_seconds=900 ")
    assert settings_lines(result) == [
        f"[test_calc.py::test_add] settings: max_iter=3 budget=45s no_progress_k=2 no_progress_signal=state "
        f"escalate_after=0 revise={FIX_ADD}"]


def test_a_loop_file_loop_prints_its_own_settings(project: Project) -> None:
    project.write("test_green.py", GREEN)
    project.write("own.loop", OWN_LOOP)
    project.write("check.py", CHECK)
    result = project.run("--loop", "--loop-budget-seconds=900", "--loop-no-progress-k=0")
    assert result.ret == 0, result.stdout.str()
    # the file's cap and budget; the command line's no_progress_k fills the gap
    assert settings_lines(result) == [
        "[own settings] settings: max_iter=3 budget=120s no_progress_k=0 no_progress_signal=state "
        "escalate_after=0 revise=python note.py done.txt"]


@pytest.mark.slow
def test_the_session_fix_loop_prints_its_settings(project: Project) -> None:
    project.write("test_calc.py", "import calc\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n")
    result = project.run("--loop", f"--loop-revise={FIX_ADD}", "--loop-max-iter=2", "--loop-budget-seconds=0")
    assert result.ret == 0, result.stdout.str()
    assert settings_lines(result) == [
        f"[failing tests] settings: max_iter=2 budget=off no_progress_k=2 no_progress_signal=state "
        f"escalate_after=0 revise={FIX_ADD}"]


@pytest.mark.slow
def test_under_xdist_each_loop_line_reaches_the_controller_on_a_line_of_its_own(project: Project) -> None:
    project.marked_test(marker=f"revise={FIX_ADD!r}, max_iter=3")
    project.write("own.loop", OWN_LOOP)
    project.write("check.py", CHECK)
    result = project.run("--loop", "-n", "2")
    assert result.ret == 0, result.stdout.str()
    lines = settings_lines(result)
    # each once, whole: starting the line (not glued to the progress dots), nothing after it
    assert sorted(lines) == sorted([
        "[own settings] settings: max_iter=3 budget=120s no_progress_k=2 no_progress_signal=state "
        "escalate_after=0 revise=python note.py done.txt",
        f"[test_calc.py::test_add] settings: max_iter=3 budget=900s no_progress_k=2 no_progress_signal=state "
        f"escalate_after=0 revise={FIX_ADD}"]), result.stdout.str()

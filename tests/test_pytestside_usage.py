"""Usage errors under --loop-exitcode=verdict: one clean `ERROR:` line and exit 64, also when
found at collection (a loop file's or a marker's revise step that cannot start) and under
xdist; pytest's usage error 4 in the default mode."""

from __future__ import annotations

import pytest
from plugin_helpers import Project

MISSING = "no-such-agent-7f3a fix"
BAD_LOOP = f"""\
loop "fix":
  goal: it works
  done when "true" passes
  revise with "{MISSING}"
"""
GREEN = "def test_green():\n    pass\n"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def one_error_line(result: pytest.RunResult, *pieces: str) -> str:
    """The single `ERROR:` line on stderr; no banner, no module path, no `Exit:` anywhere."""
    errors = [line for line in result.stderr.lines if "ERROR" in line or "Exit" in line]
    assert len(errors) == 1, (result.stdout.str(), result.stderr.str())
    line = errors[0]
    assert line.startswith("ERROR: ") and not line.startswith("ERROR: ERROR"), line
    out = result.stdout.str()
    assert "pytest_loops.pytest_plugin.plugin" not in out and "Exit:" not in out and "ERROR:" not in out, out
    assert not [x for x in result.stdout.lines if x.startswith("!")], out
    for piece in pieces:
        assert piece in line, line
    return line


@pytest.mark.parametrize(("mode", "code"), [("verdict", 64), ("pytest", 4)])
def test_a_loop_file_whose_revise_cannot_start_is_a_usage_error(project: Project, mode: str, code: int) -> None:
    project.write("test_green.py", GREEN)
    project.write("fix.loop", BAD_LOOP)
    result = project.run("--loop", f"--loop-exitcode={mode}")
    assert result.ret == code, (result.stdout.str(), result.stderr.str())
    one_error_line(result, "fix.loop: loop 'fix': revise with", "no-such-agent-7f3a", "cannot start")
    assert not project.exists(".pytest-loops/runs")  # nothing ran


def test_a_marker_whose_revise_cannot_start_exits_64_in_verdict_mode(project: Project) -> None:
    project.marked_test(marker=f"revise={MISSING!r}")
    result = project.run("--loop", "--loop-exitcode=verdict")
    assert result.ret == 64
    one_error_line(result, "test_calc.py::test_add: @pytest.mark.loop(revise=...)", "cannot start")


def test_a_bad_marker_keyword_exits_64_in_verdict_mode(project: Project) -> None:
    project.marked_test(marker="max_iters=3")
    result = project.run("--loop", "--loop-exitcode=verdict")
    assert result.ret == 64
    one_error_line(result, "unknown keyword(s) max_iters")


@pytest.mark.slow
@pytest.mark.parametrize("what", ["marker", "loop file"])
def test_under_xdist_a_collection_usage_error_is_one_line_and_64(project: Project, what: str) -> None:
    if what == "marker":
        project.marked_test(marker=f"revise={MISSING!r}")
    else:
        project.write("test_green.py", GREEN)
        project.write("fix.loop", BAD_LOOP)
    result = project.run("--loop", "--loop-exitcode=verdict", "-n", "2")
    assert result.ret == 64, (result.stdout.str(), result.stderr.str())
    one_error_line(result, "no-such-agent-7f3a", "cannot start")


@pytest.mark.parametrize(("mode", "code"), [("verdict", 64), ("pytest", 4)])
def test_a_bad_option_value_is_one_line(project: Project, mode: str, code: int) -> None:
    project.write("test_green.py", GREEN)
    result = project.run("--loop", f"--loop-exitcode={mode}", "--loop-max-iter=abc")
    assert result.ret == code
    one_error_line(result, "--loop-max-iter: 'abc' is not a valid max_iter")


@pytest.mark.slow
def test_resuming_an_untrusted_run_log_is_one_line_and_64(project: Project) -> None:
    project.marked_test(marker="revise='python sleep.py 30', budget_seconds=1")
    first = project.run("--loop", "--loop-exitcode=verdict")
    assert first.ret == 3, first.stdout.str()  # TIMEOUT: its run log can be continued
    logs = sorted((project.artifacts / "runs").glob("*.json"))
    assert logs
    text = logs[-1].read_text(encoding="utf-8")
    assert '"TIMEOUT"' in text
    logs[-1].write_text(text.replace('"iter": 1', '"iter": 7', 1), encoding="utf-8")
    result = project.run("--loop", "--loop-exitcode=verdict", "--loop-resume")
    assert result.ret == 64, (result.stdout.str(), result.stderr.str())
    one_error_line(result, "--loop-resume")

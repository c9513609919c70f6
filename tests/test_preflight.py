"""A revise command whose program is missing is bad input before the first iteration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import Project, clean_env

from pytest_loops.errors import LoopUsageError
from pytest_loops.runtime.preflight import check_revise, missing_program, program_of

GREEN_TEST = "def test_green():\n    pass\n"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


@pytest.mark.parametrize(("command", "program"), [
    ("claude -p --fix", "claude"),
    ("FOO=1 BAR='a b' ./fix.sh --all", "./fix.sh"),
    ("python fix.py", "python"),
    ("cd src && make", None),          # the shell's own
    ("$AGENT --fix", None),            # an expansion decides
    ("(cd x; ./fix)", None),
    ("env -i agent", None),
    ("if true; then x; fi", None),
    ("'unterminated", None),
    ("", None),
])
def test_the_program_is_the_first_word_the_shell_would_exec(command: str, program: str | None) -> None:
    assert program_of(command) == program


def test_missing_programs_are_named(tmp_path: Path) -> None:
    (tmp_path / "fix.sh").write_text("#!/bin/sh\ntrue\n")
    assert "is not executable" in missing_program("./fix.sh", tmp_path)
    (tmp_path / "fix.sh").chmod(0o755)
    assert missing_program("./fix.sh --go", tmp_path) is None
    assert "does not exist" in missing_program("./nope.sh", tmp_path)
    why = missing_program("no-such-agent-cli --fix", tmp_path, {"PATH": "/nowhere:/also-not"})
    assert "not on PATH" in why and "/nowhere" in why
    # the harness's interpreter is on the loop's PATH, so `python` always starts
    assert missing_program("python fix.py", tmp_path, {"PATH": ""}) is None
    with pytest.raises(LoopUsageError, match=r"--revise: the revise command 'no-such-agent-cli' cannot start"):
        check_revise("no-such-agent-cli", tmp_path, "--revise", {"PATH": "/nowhere"})


def test_the_runner_exits_64_before_any_check_runs(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("pytest-loops")
    marker = tmp_path / "verified"
    done = subprocess.run([str(script), "run", "--verify", f"touch {marker}; false",
                           "--revise", "no-such-agent-cli --fix", "--cwd", str(tmp_path)],
                          capture_output=True, text=True, env=clean_env(), timeout=120)
    assert done.returncode == 64, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--revise" in lines[0] and "not on PATH" in lines[0], lines
    assert not marker.exists(), "a check ran before the revise command was found missing"
    assert not (tmp_path / ".pytest-loops").exists()


@pytest.mark.parametrize(("args", "code"), [([], 4), (["--loop-exitcode=verdict"], 64)])
def test_the_session_revise_is_a_usage_error(project: Project, args: list[str], code: int) -> None:
    project.write("test_green.py", GREEN_TEST)
    result = project.run("--loop", "--loop-revise=no-such-agent-cli --fix", *args)
    assert result.ret == code
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "--loop-revise" in errors[0] and "no-such-agent-cli" in errors[0], result.stderr.lines
    assert "passed" not in result.stdout.str()


def test_a_marker_revise_is_a_usage_error(project: Project) -> None:
    project.marked_test(marker='revise="./missing-fixer.sh"')
    result = project.run("--loop")
    assert result.ret == 4
    assert "test_calc.py::test_add: @pytest.mark.loop(revise=...)" in result.stderr.str()
    assert "does not exist" in result.stderr.str()


def test_without_loop_nothing_is_checked(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    result = project.run(f"--loop-revise={os.devnull}-no-such")
    assert result.ret == 0

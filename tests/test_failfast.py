"""Fail fast on what can never work: a check command the shell cannot start in the first
iteration, before any revise step, is bad input (64); a state path matching nothing is a
warning line (64 under state_unmatched=error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_helpers import Project

from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.errors import LoopUsageError
from pytest_loops.runtime.preflight import check_state_paths, unmatched_state_paths

COUNT = ("python -c \"import pathlib,sys; p=pathlib.Path(sys.argv[1]); "
         "p.write_text(str(int(p.read_text() or 0)+1) if p.exists() else '1')\" {}")


def counter(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "revise-calls"
    return COUNT.format(path), path


def errors_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(("verify", "code", "said"), [
    ("pytestt -q", 127, "not found"),
    ("./verify.sh", 126, "not executable"),
])
def test_a_check_that_cannot_start_is_64_and_no_revise_runs(cli, tmp_path: Path, verify: str, code: int,
                                                             said: str) -> None:
    (tmp_path / "verify.sh").write_text("#!/bin/sh\nexit 0\n")  # not executable
    revise, calls = counter(tmp_path)
    done = cli("run", "--verify", verify, "--revise", revise, "--max-iter", "3", "--cwd", str(tmp_path))
    assert done.returncode == 64, done.stdout + done.stderr
    lines = errors_of(done.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("pytest-loops: error: --verify: the check ")
    assert repr(verify) in lines[0] and f"exited {code}" in lines[0] and said in lines[0]
    assert not calls.exists(), "the revise step ran against a check that can never pass"
    # the run log says the loop stopped before a verdict, with the line
    log = next((tmp_path / ".pytest-loops" / "runs").glob("*.json")).read_text()
    assert "cannot run" in log and '"verdict": "' not in log


def test_a_later_check_that_cannot_start_still_stops_the_first_iteration(cli, tmp_path: Path) -> None:
    revise, calls = counter(tmp_path)
    done = cli("run", "--verify", "true", "--verify", "nope-not-a-program-x", "--revise", revise,
               "--cwd", str(tmp_path))
    assert done.returncode == 64, done.stderr
    assert "'nope-not-a-program-x'" in done.stderr and not calls.exists()


def test_a_real_failure_is_an_ordinary_failing_check(cli, tmp_path: Path) -> None:
    revise, calls = counter(tmp_path)
    done = cli("run", "--verify", "exit 1", "--revise", revise, "--max-iter", "2", "--no-progress-k", "0",
               "--cwd", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert calls.read_text() == "1"  # the cap is applied before a revise step whose result is never seen


def test_127_after_a_revise_step_is_an_ordinary_failure(cli, tmp_path: Path) -> None:
    # after a revise step, 127 is the check's answer like any other: the loop goes on to a verdict
    done = cli("run", "--verify", "if [ -f broken ]; then exit 127; else exit 1; fi", "--revise", "touch broken",
               "--max-iter", "2", "--no-progress-k", "0", "--cwd", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    log = load_runlog(next((tmp_path / ".pytest-loops" / "runs").glob("*.json")))
    assert [it["verify_exit"] for it in log["iterations"]] == [1, 127]


def test_a_loop_file_check_that_cannot_start_is_a_usage_error(pytester: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(pytester, monkeypatch)
    revise, calls = counter(pytester.path)
    project.write("fix.loop", "loop \"fix\":\n  goal: green\n  done when \"pytestt -q\" passes\n"
                  f"  revise with: {revise}\n  after 3 tries: stop and warn \"no\"\n")
    result = project.run("--loop", "--loop-exitcode=verdict", "fix.loop")
    assert result.ret == 64, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "'pytestt -q'" in errors[0] and "exited 127" in errors[0], result.stderr.lines
    assert "fix.loop:3" in errors[0]
    assert not calls.exists()


# -- state paths ---------------------------------------------------------------------

def test_unmatched_state_paths(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "empty").mkdir()
    assert unmatched_state_paths(["src/**", "src/*.py", "empty", "lib/**", "*.rs", "src/a.py"], tmp_path) == [
        "lib/**", "*.rs"]
    assert check_state_paths(["src/**"], tmp_path, "error", "--state") is None
    line = check_state_paths(["lib/**"], tmp_path, "warn", "--state")
    assert line is not None and line.startswith("--state: the state path 'lib/**' matches no file")
    with pytest.raises(LoopUsageError, match=r"^--state: the state paths 'lib/\*\*', 'x' match no file"):
        check_state_paths(["lib/**", "x"], tmp_path, "error", "--state")


def test_the_runner_warns_of_a_state_path_that_matches_nothing(cli, tmp_path: Path) -> None:
    done = cli("run", "--verify", "true", "--state", "srcc/**", "--cwd", str(tmp_path))
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [f"pytest-loops: warning: --state: the state path 'srcc/**' matches no file under "
                        f"{tmp_path}: changes there are not seen, so real edits count as no progress"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_state_unmatched_error_makes_it_64(cli, tmp_path: Path, how: str) -> None:
    marker = tmp_path / "ran"
    args = ["run", "--verify", f"touch {marker}", "--state", "srcc/**", "--cwd", str(tmp_path)]
    env = None
    if how == "flag":
        args += ["--state-unmatched", "error"]
    else:
        env = {"PYTEST_LOOPS_STATE_UNMATCHED": "error"}
    done = cli(*args, env=env)
    assert done.returncode == 64, done.stderr
    assert errors_of(done.stderr) == [
        f"pytest-loops: error: --state: the state path 'srcc/**' matches no file under {tmp_path}: changes "
        "there are not seen, so real edits count as no progress; fix the glob (it is relative to the "
        "working directory)"]
    assert not marker.exists()


def test_pytest_warns_and_errs_on_an_unmatched_state_path(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(pytester, monkeypatch)
    project.write("ok.loop", "loop \"ok\":\n  goal: green\n  done when \"true\" passes\n")
    result = project.run("--loop", "--loop-state=srcc/**", "ok.loop")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["loop: warning: --loop-state: the state path 'srcc/[*][*]' matches no file*"])
    result = project.run("--loop", "--loop-state=srcc/**", "--loop-state-unmatched=error",
                         "--loop-exitcode=verdict", "ok.loop")
    assert result.ret == 64
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "matches no file" in errors[0], result.stderr.lines

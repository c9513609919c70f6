"""Artifacts (run log, .tine, hand-off) are created with the user's umask, or 0600
with the private_artifacts setting."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.limits import artifact_mode, current_umask


def run_loop(cwd: Path, umask: int, *flags: str, env: dict[str, str] | None = None) -> dict[str, int]:
    """A loop that ends MAX_ITER (so it leaves a hand-off too), under ``umask``; each artifact's mode."""
    argv = [sys.executable, "-m", "pytest_loops", "run", "--verify", "false", "--max-iter", "1", "-q",
            "--log", "out/run.json", *flags]
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, preexec_fn=lambda: os.umask(umask))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    files = {"log": cwd / "out" / "run.json", "tine": cwd / "out" / "run.tine",
             "handoff": cwd / "out" / "run.handoff.md"}
    return {name: stat.S_IMODE(path.stat().st_mode) for name, path in files.items()}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_artifacts_follow_the_users_umask(tmp_path: Path, umask: int, mode: int) -> None:
    assert run_loop(tmp_path, umask) == {"log": mode, "tine": mode, "handoff": mode}


def test_private_artifacts_keeps_them_0600_by_flag_or_environment(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert run_loop(tmp_path / "a", 0o022,
                    "--private-artifacts", "on") == {"log": 0o600, "tine": 0o600, "handoff": 0o600}
    (tmp_path / "b").mkdir()
    assert run_loop(tmp_path / "b", 0o022, env={"PYTEST_LOOPS_PRIVATE_ARTIFACTS": "on"}) == {
        "log": 0o600, "tine": 0o600, "handoff": 0o600}
    (tmp_path / "c").mkdir()
    assert run_loop(tmp_path / "c", 0o022, "--private-artifacts", "off",
                    env={"PYTEST_LOOPS_PRIVATE_ARTIFACTS": "on"})["log"] == 0o644, "the flag wins"


def test_a_bad_value_is_one_line_and_exit_64(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", "true", "--private-artifacts",
                           "maybe"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 64 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--private-artifacts" in proc.stderr


def test_the_mode_helpers() -> None:
    old = os.umask(0o077)
    try:
        assert current_umask() == 0o077
        assert artifact_mode() == 0o600 and artifact_mode(private=True) == 0o600
        os.umask(0o002)
        assert artifact_mode() == 0o664 and artifact_mode(private=True) == 0o600
    finally:
        os.umask(old)


def test_the_pytest_option_keeps_them_private(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    assert False\n")
    result = pytester.runpytest_subprocess("--loop", "--loop-revise", "true", "--loop-max-iter", "1",
                                           "--loop-private-artifacts", "on", "-p", "no:cacheprovider")
    logs = list((pytester.path / ".pytest-loops" / "runs").glob("*.json"))
    assert logs, result.stdout.str()
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs[0].parent.glob("*.tine"))

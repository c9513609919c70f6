"""The test suite itself leaves nothing behind in the temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_suite_removes_its_state_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_STATE_HOME", "PYTEST_XDIST_WORKER")}
    env.update(TMPDIR=str(tmp), PYTEST_DEBUG_TEMPROOT=str(tmp_path / "pytest-root"))
    (tmp_path / "pytest-root").mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "tests/test_settings_table.py::test_names_and_spellings_are_unique"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp.glob("pytest-loops-tests-state-*")), "the run's state directory is removed at exit"

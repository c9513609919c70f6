"""The default artifacts directory keeps itself out of version control."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plugin_helpers import SUITE_SETTINGS

from pytest_loops.cli import main as cli
from pytest_loops.runtime.outpaths import GITIGNORE


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ
                if k.startswith(("PYTEST_LOOPS_", "LOOP_")) and not k.startswith(SUITE_SETTINGS)]:
        monkeypatch.delenv(key)


def _run(tmp_path: Path, *extra: str) -> int:
    return cli.main(["run", "--verify", "true", "--cwd", str(tmp_path), "--no-suspects", "-q", *extra])


def test_the_default_directory_ignores_itself(tmp_path: Path) -> None:
    assert _run(tmp_path) == 0
    assert (tmp_path / ".pytest-loops" / ".gitignore").read_text() == GITIGNORE
    mode = (tmp_path / ".pytest-loops" / ".gitignore").stat().st_mode & 0o777
    assert mode == 0o666 & ~_umask()


def test_a_users_gitignore_there_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / ".pytest-loops").mkdir()
    (tmp_path / ".pytest-loops" / ".gitignore").write_text("runs/\n")
    assert _run(tmp_path) == 0
    assert (tmp_path / ".pytest-loops" / ".gitignore").read_text() == "runs/\n"


def test_a_directory_the_user_named_is_theirs(tmp_path: Path) -> None:
    assert _run(tmp_path, "--artifacts", str(tmp_path / "out")) == 0
    assert (tmp_path / "out" / "runs").is_dir()
    assert not (tmp_path / "out" / ".gitignore").exists()
    assert not (tmp_path / ".pytest-loops").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

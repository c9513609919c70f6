"""The harness's git calls never run a program the repository names (runtime/safegit.py).

Each test builds a repository whose configuration, hooks or attributes name a
program that appends to a marker file, proves with a plain ``git`` that the trap
fires, then runs the same commands through :func:`run_git` (and through the two
callers: the hand-off's diff and fan-out's worktree copies) and asserts the marker
was never written.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from pytest_loops.artifacts.handoff import git_diff
from pytest_loops.runtime.safegit import git_argv, git_environment, run_git
from pytest_loops.runtime.treecopy import TreeCopy, new_parent

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

PAYLOAD = """#!/bin/sh
echo "ran: $0 $*" >> {marker}
if [ -n "$1" ] && [ -f "$1" ]; then cat "$1"; else cat; fi
"""


def plain_git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root,
                          env=env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL, check=False)


def git_version() -> tuple[int, ...]:
    words = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True).stdout.split()
    return tuple(int(p) for p in words[2].split(".")[:2] if p.isdigit())


def make_repo(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the repository, the payload program, its marker file)."""
    root = tmp_path / "repo"
    root.mkdir()
    marker = tmp_path / "marker"
    payload = tmp_path / "payload.sh"
    payload.write_text(PAYLOAD.format(marker=marker))
    payload.chmod(0o755)
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    assert plain_git(root, "init", "-q").returncode == 0
    assert plain_git(root, "add", "-A").returncode == 0
    assert plain_git(root, "commit", "-qm", "base").returncode == 0
    return root, payload, marker


def dirty(root: Path) -> None:
    """A change git must read through the filters, and a file whose stat no longer
    matches the index (same bytes: git hashes it again, through the clean filter)."""
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    later = time.time() + 5
    os.utime(root / "test_calc.py", (later, later))


def plant(root: Path, payload: Path, trap: str) -> None:
    if trap == "fsmonitor":
        plain_git(root, "config", "core.fsmonitor", str(payload))
    elif trap == "textconv":
        (root / ".gitattributes").write_text("*.py diff=evil\n")
        plain_git(root, "config", "diff.evil.textconv", str(payload))
    elif trap == "external-diff":
        plain_git(root, "config", "diff.external", str(payload))
    elif trap == "filter":
        (root / ".git" / "info").mkdir(exist_ok=True)
        (root / ".git" / "info" / "attributes").write_text("*.py filter=evil.one\n")
        (root / ".gitattributes").write_text("*.py filter=evil.one\n")
        for key in ("clean", "smudge"):
            plain_git(root, "config", f"filter.evil.one.{key}", str(payload))
        plain_git(root, "config", "filter.evil.one.required", "true")
    elif trap == "process-filter":
        (root / ".gitattributes").write_text("*.py filter=lfsish\n")
        plain_git(root, "config", "filter.lfsish.process", str(payload))
        plain_git(root, "config", "filter.lfsish.required", "true")
    elif trap == "hooks":
        hooks = root / ".git" / "hooks"
        hooks.mkdir(exist_ok=True)
        for name in ("post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc"):
            (hooks / name).write_text(PAYLOAD.format(marker=payload.parent / "marker"))
            (hooks / name).chmod(0o755)
    else:  # pragma: no cover
        raise AssertionError(trap)


TRAPS = ("fsmonitor", "textconv", "external-diff", "filter", "process-filter", "hooks")


def harness_calls(root: Path, tmp_path: Path) -> None:
    """What the harness runs: the hand-off's diff, fan-out's copy made and removed."""
    found = git_diff(root)
    assert found is not None
    copy = TreeCopy(root, new_parent(), "b0")
    assert copy.kind == "git-worktree"
    try:
        copy.create()
        assert (Path(copy.root) / "calc.py").read_text() == (root / "calc.py").read_text()
    finally:
        copy.remove()
    for args in (["status", "--porcelain"], ["diff", "HEAD", "--"], ["ls-files", "--others", "-z"],
                 ["rev-parse", "--show-toplevel"]):
        assert run_git(args, root).returncode == 0, args


@pytest.mark.parametrize("trap", TRAPS)
def test_the_trap_fires_under_plain_git(tmp_path: Path, trap: str) -> None:
    """The control: without the hardening each trap runs its program."""
    root, payload, marker = make_repo(tmp_path)
    plant(root, payload, trap)
    dirty(root)
    plain_git(root, "status", "--porcelain")
    plain_git(root, "diff", "HEAD", "--")
    plain_git(root, "worktree", "add", "--detach", "-q", str(tmp_path / "wt"), "HEAD")
    assert marker.exists(), f"the {trap} trap did not fire under plain git"


@pytest.mark.parametrize("trap", TRAPS)
def test_the_harness_git_calls_never_run_the_program(tmp_path: Path, trap: str) -> None:
    root, payload, marker = make_repo(tmp_path)
    plant(root, payload, trap)
    dirty(root)
    harness_calls(root, tmp_path)
    assert not marker.exists(), marker.read_text()


def test_every_trap_at_once_and_the_diff_is_still_right(tmp_path: Path) -> None:
    root, payload, marker = make_repo(tmp_path)
    for trap in ("fsmonitor", "textconv", "filter", "hooks"):
        plant(root, payload, trap)
    dirty(root)
    found = git_diff(root)
    assert found is not None
    diff, untracked = found
    assert "+    return a + b" in diff
    assert ".gitattributes" in untracked
    harness_calls(root, tmp_path)
    assert not marker.exists(), marker.read_text()


def test_a_planted_bare_repository_is_not_taken_for_one(tmp_path: Path) -> None:
    """A directory made to look like a bare repository (``HEAD``, ``objects/``,
    ``refs/``, a ``config`` with ``core.worktree``) is not discovered."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "marker"
    payload = tmp_path / "payload.sh"
    payload.write_text(PAYLOAD.format(marker=marker))
    payload.chmod(0o755)
    (work / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "objects").mkdir()
    (work / "refs").mkdir()
    (work / "config").write_text(f"[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n"
                                 f"\tfsmonitor = {payload}\n")
    if git_version() < (2, 38):
        pytest.skip("git older than 2.38 has no safe.bareRepository")
    assert plain_git(work, "rev-parse", "--git-dir").returncode == 0  # the control: plain git takes it
    assert run_git(["rev-parse", "--git-dir"], work).returncode != 0
    assert git_diff(work) is None
    assert not marker.exists()


def test_the_environment_and_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_DIR", "/elsewhere")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", "/bin/evil")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.fsmonitor'='/bin/evil'")
    env = git_environment()
    assert "GIT_DIR" not in env and "GIT_EXTERNAL_DIFF" not in env and "GIT_CONFIG_PARAMETERS" not in env
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_ATTR_NOSYSTEM"] == "1"
    argv = git_argv(["diff", "HEAD"], ["x.y"])
    joined = " ".join(argv)
    for needle in ("core.fsmonitor=false", f"core.hooksPath={os.devnull}", "diff.external=",
                   "filter.x.y.clean=", "filter.x.y.smudge=", "filter.x.y.process=", "filter.x.y.required=false"):
        assert needle in joined
    assert {"--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty"} <= set(argv[argv.index("diff"):])
    assert git_argv(["worktree", "add", "x"])[-3:] == ["worktree", "add", "x"]


def test_a_hook_made_executable_later_still_does_not_run(tmp_path: Path) -> None:
    root, payload, marker = make_repo(tmp_path)
    hook = root / ".git" / "hooks" / "post-checkout"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(PAYLOAD.format(marker=marker))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    copy = TreeCopy(root, new_parent(), "b0").create()
    copy.remove()
    assert not marker.exists()

"""The tree guard's git paths (runtime/protect/gitpaths.py): ``.git/config``, hooks,
``info/attributes``, ``.gitattributes`` and the ``.git`` entries are read-only for the
revise step; a change is reported and undone. The guard never walks ``.git`` for it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_loops.runtime.protect import TreeGuard
from pytest_loops.runtime.protect.gitpaths import GIT_REASON, GitPaths

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root, env=env,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / ".gitattributes").write_text("*.bin binary\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def revise(guard: TreeGuard, change) -> list:
    guard.before_revise()
    change()
    return guard.after_revise().violations


def test_config_hooks_and_attributes_changes_are_undone(repo: Path) -> None:
    config = repo / ".git" / "config"
    before = config.read_bytes()
    hook = repo / ".git" / "hooks" / "post-checkout"
    with TreeGuard(repo, interpreter=False) as guard:
        guard.begin()

        def plant() -> None:
            with open(config, "a") as f:
                f.write("[core]\n\tfsmonitor = /bin/evil\n")
            hook.write_text("#!/bin/sh\ntouch /tmp/never\n")
            hook.chmod(0o755)
            (repo / ".git" / "info").mkdir(exist_ok=True)
            (repo / ".git" / "info" / "attributes").write_text("*.py filter=evil\n")
            (repo / ".gitattributes").write_text("*.py diff=evil\n")
            (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")

        found = revise(guard, plant)
    by_path = {v.path: v for v in found}
    for path in (str(config), str(hook), str(repo / ".git" / "info" / "attributes"), ".gitattributes"):
        assert path in by_path, (path, sorted(by_path))
        assert by_path[path].why == GIT_REASON and by_path[path].restored
    assert config.read_bytes() == before
    assert not hook.exists()
    assert not (repo / ".git" / "info" / "attributes").exists()
    assert (repo / ".gitattributes").read_text() == "*.bin binary\n"
    assert "a + b" in (repo / "calc.py").read_text()  # the in-scope fix stays


def test_a_hooks_directory_replaced_by_a_link_is_a_directory_again(repo: Path, tmp_path: Path) -> None:
    hooks = repo / ".git" / "hooks"
    evil = tmp_path / "evil-hooks"
    evil.mkdir()
    (evil / "post-checkout").write_text("#!/bin/sh\n")
    samples = sorted(p.name for p in hooks.iterdir())
    with TreeGuard(repo, interpreter=False) as guard:
        guard.begin()

        def swap() -> None:
            shutil.rmtree(hooks)
            os.symlink(evil, hooks)

        found = revise(guard, swap)
    assert any(v.path == str(hooks) and v.restored for v in found), found
    assert hooks.is_dir() and not hooks.is_symlink()
    assert sorted(p.name for p in hooks.iterdir()) == samples
    assert (evil / "post-checkout").exists()  # the link was removed, never followed


def test_staging_and_same_bytes_are_no_change(repo: Path) -> None:
    """The index is git's (and other tools') to refresh; a file rewritten with its own bytes
    is no change."""
    config = repo / ".git" / "config"
    with TreeGuard(repo, interpreter=False) as guard:
        guard.begin()

        def commit_and_touch() -> None:
            (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
            git(repo, "add", "calc.py")
            data = config.read_bytes()
            config.unlink()
            config.write_bytes(data)  # a new inode, the same bytes

        assert revise(guard, commit_and_touch) == []


def test_a_new_git_directory_below_the_top_is_removed(repo: Path) -> None:
    sub = repo / "pkg"
    sub.mkdir()
    (sub / "mod.py").write_text("x = 1\n")
    with TreeGuard(sub, interpreter=False) as guard:
        guard.begin()
        found = revise(guard, lambda: git(sub, "init", "-q"))
    assert [v.path for v in found if v.why == GIT_REASON] == [str(sub / ".git")]
    assert not (sub / ".git").exists()


def test_above_the_loop_directory_and_a_linked_worktree(repo: Path, tmp_path: Path) -> None:
    sub = repo / "pkg"
    sub.mkdir()
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"), "HEAD")
    wt = tmp_path / "wt"
    paths = GitPaths(str(wt.resolve()))
    common = str((repo / ".git").resolve())
    assert paths.common == common and paths.gitdir != common
    assert os.path.join(common, "config") in paths.fixed and str(wt.resolve() / ".git") in paths.fixed
    with TreeGuard(wt, interpreter=False) as guard:
        guard.begin()

        def plant() -> None:
            with open(os.path.join(common, "config"), "a") as f:
                f.write("[diff]\n\texternal = /bin/evil\n")
            (wt / ".git").write_text("gitdir: /somewhere/else\n")

        found = revise(guard, plant)
    assert {v.path for v in found} >= {os.path.join(common, "config"), str(wt.resolve() / ".git")}
    assert "external" not in Path(common, "config").read_text()
    assert (wt / ".git").read_text().startswith("gitdir: ") and "somewhere" not in (wt / ".git").read_text()
    with TreeGuard(sub, interpreter=False) as guard:  # the loop below the top: .gitattributes above it
        guard.begin()
        found = revise(guard, lambda: (repo / ".gitattributes").write_text("* filter=evil\n"))
    assert [v.path for v in found] == [str((repo / ".gitattributes").resolve())]
    assert (repo / ".gitattributes").read_text() == "*.bin binary\n"


def test_the_harness_config_is_read_only_even_when_new(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "calc.py").write_text("x = 1\n")
    with TreeGuard(root, interpreter=False) as guard:
        guard.begin()

        def plant() -> None:
            (root / "harness").mkdir()
            (root / "harness" / "loop-runner.config.yaml").write_text("run_log:\n  path: test_calc.py\n")

        found = revise(guard, plant)
    assert [v.path for v in found] == ["harness/loop-runner.config.yaml"]
    assert not (root / "harness" / "loop-runner.config.yaml").exists()


def test_objects_are_never_walked(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []
    real = os.listdir

    def spy(path="."):
        listed.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", spy)
    GitPaths(str(repo.resolve())).state()
    assert listed == [str(repo.resolve() / ".git" / "hooks")]  # one listing: hooks/, never objects/


@pytest.mark.parametrize("how", ["commit", "plumbing", "new branch", "reset"])
def test_a_commit_behind_the_loops_back_is_undone(repo: Path, how: str) -> None:
    """A weakened test committed on the branch (the working tree left as it was) would be
    what CI checks out: the branch's refs and HEAD are read-only, put back when moved."""
    head = (repo / ".git" / "HEAD").read_bytes()
    branch = next((repo / ".git" / "refs" / "heads").iterdir())
    tip = branch.read_bytes()
    with TreeGuard(repo, interpreter=False) as guard:
        guard.begin()

        def move() -> None:
            (repo / "weak.txt").write_text("x\n")
            if how == "commit":
                git(repo, "add", "weak.txt")
                git(repo, "commit", "-qm", "weaken")
            elif how == "plumbing":
                env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
                tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True,
                                      check=True).stdout.strip()
                commit = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
                                         "commit-tree", tree, "-p", "HEAD", "-m", "weaken"], cwd=repo, env=env,
                                        capture_output=True, text=True, check=True).stdout.strip()
                git(repo, "update-ref", f"refs/heads/{branch.name}", commit)
            elif how == "new branch":
                git(repo, "checkout", "-q", "-b", "weakened")
            else:
                git(repo, "commit", "-q", "--allow-empty", "-m", "one")
                git(repo, "reset", "-q", "--soft", "HEAD~1")
                git(repo, "commit", "-q", "--allow-empty", "-m", "two")

        found = revise(guard, move)

    assert found and all(v.why == GIT_REASON and v.restored for v in found if ".git" in v.path), found
    assert (repo / ".git" / "HEAD").read_bytes() == head
    assert branch.read_bytes() == tip
    assert not (repo / ".git" / "refs" / "heads" / "weakened").exists()


def test_the_branch_files_are_git_paths(repo: Path) -> None:
    paths = GitPaths(os.path.realpath(repo))
    state = paths.state()
    assert os.path.join(paths.common or "", "HEAD") in state
    assert any(p.startswith(os.path.join(paths.common or "", "refs", "heads") + os.sep) for p in state)
    assert not any(p.endswith(os.sep + "index") for p in state)  # other tools refresh it


def test_a_replacement_ref_and_grafts_are_undone(repo: Path) -> None:
    """``git replace`` makes checkout write other bytes for a file; grafts rewrite history."""
    with TreeGuard(repo, interpreter=False) as guard:
        guard.begin()

        def replace() -> None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
            weak = subprocess.run(["git", "hash-object", "-w", "--stdin"], input="def add(a, b):\n    return 5\n",
                                  cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()
            real = subprocess.run(["git", "rev-parse", "HEAD:calc.py"], cwd=repo, env=env, capture_output=True,
                                  text=True, check=True).stdout.strip()
            git(repo, "replace", real, weak)
            (repo / ".git" / "info").mkdir(exist_ok=True)
            (repo / ".git" / "info" / "grafts").write_text("0" * 40 + "\n")

        found = revise(guard, replace)

    assert {Path(v.path).parent.name for v in found} >= {"replace", "info"}, found
    assert all(v.restored for v in found)
    assert not (repo / ".git" / "refs" / "replace").exists() or not any((repo / ".git" / "refs" / "replace").iterdir())
    assert not (repo / ".git" / "info" / "grafts").exists()

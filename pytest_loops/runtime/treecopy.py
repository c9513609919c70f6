"""Isolated copies of a loop's working tree, one per revise candidate (fan-out).

Inside a git repository a copy is a ``git worktree`` at HEAD with the working
tree's uncommitted changes and untracked files put on top; elsewhere, a copy of
the tree. Every git command goes through :func:`~pytest_loops.runtime.safegit.run_git`:
no hook, filter or fsmonitor program the repository names runs. Either way the
paths the tree guard ignores (VCS data, caches, the harness's own directories)
are left out, and a virtual environment inside the tree is linked, not copied.
Git-ignored files other than those are not in a worktree copy.

A copy is snapshotted right after it is made (lstat of every file, the change
time included: a rewrite cannot hide by setting the modification time back), so
:meth:`TreeCopy.changes` names what a candidate changed, compared by content.
:meth:`TreeCopy.apply` writes those changes into the real tree, each file
replaced whole (a temporary file renamed over it). :meth:`TreeCopy.remove`
deletes the copy and its worktree entry; :func:`remove_all` is the last resort
at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_loops.runtime.protect.rules import IGNORED_DIRS
from pytest_loops.runtime.protect.tree import Entry, _entry
from pytest_loops.runtime.safegit import run_git

COPY_PREFIX = "pytest-loops-branch-"
_DIFF_TEXT_BYTES = 256 * 1024  # files up to this size are diffed by line; bigger ones count their size
_GIT_TIMEOUT = 120.0
_live: set[TreeCopy] = set()
_live_lock = threading.Lock()
_git_lock = threading.Lock()  # git's worktree bookkeeping takes one writer at a time


@dataclass(frozen=True)
class Change:
    """One path a candidate changed: ``modified``, ``added`` or ``deleted``."""

    rel: str
    how: str
    entry: Entry | None  # in the copy (None: deleted)


def _ignored_default(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in IGNORED_DIRS or p.endswith(".egg-info") for p in parts) or "__pycache__" in parts


def _is_venv(path: str) -> bool:
    from pytest_loops.limits import is_venv

    return is_venv(path)


def _git(args: list[str], cwd: str) -> subprocess.CompletedProcess[bytes]:
    """Hardened: no program the repository's configuration, hooks or attributes name runs."""
    return run_git(args, cwd, timeout=_GIT_TIMEOUT)


def git_top(path: str) -> str | None:
    """The top of the git work tree holding ``path`` with at least one commit, or None."""
    try:
        top = _git(["rev-parse", "--show-toplevel"], path)
        if top.returncode != 0:
            return None
        head = _git(["rev-parse", "--verify", "-q", "HEAD"], path)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return os.path.realpath(top.stdout.decode().strip())


class TreeCopy:
    """One copy of ``source`` (the loop's working directory) under ``parent``."""

    def __init__(self, source: str | os.PathLike[str], parent: str | os.PathLike[str], name: str, *,
                 ignored: Callable[[str], bool] = _ignored_default, use_git: bool = True,
                 top: str | None = None, venv_mounts: bool = False) -> None:
        self.source = os.path.realpath(os.fspath(source))
        # each virtual environment an empty directory, where a sandbox mounts the real
        # one read-only (a link would point, in the candidate's view, at itself)
        self.venv_mounts = venv_mounts
        self.path = os.path.join(os.fspath(parent), name)  # the copy's top directory
        self.ignored = ignored
        # ``top``: the git work tree's top, when the caller looked it up already (one
        # lookup for all of an iteration's copies)
        self.top = (top or git_top(self.source)) if use_git else None
        self.kind = "git-worktree" if self.top else "copy"
        sub = os.path.relpath(self.source, self.top) if self.top else "."
        self.root = os.path.normpath(os.path.join(self.path, sub))  # the candidate's working directory
        self.view = self.root  # where its commands see it
        self.base: dict[str, Entry] = {}
        self.removed = False
        self._venvs: list[str] = []  # relative paths of the virtual environments found

    # -- making ----------------------------------------------------------------------

    def create(self) -> TreeCopy:
        with _live_lock:
            _live.add(self)
        if self.top:
            self._worktree()
        else:
            self._copy_tree()
        self.base = self._snapshot()
        return self

    def _worktree(self) -> None:
        assert self.top is not None
        with _git_lock:
            done = _git(["worktree", "add", "--detach", "--quiet", self.path, "HEAD"], self.top)
        if done.returncode != 0:
            raise OSError(f"git worktree add failed: {done.stderr.decode(errors='replace').strip()[-300:]}")
        listed = _git(["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--",
                       self.source], self.top)
        if listed.returncode != 0:
            raise OSError(f"git status failed: {listed.stderr.decode(errors='replace').strip()[-300:]}")
        for item in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
            if len(item) < 4:
                continue
            rel_top = item[3:]
            src = os.path.join(self.top, rel_top)
            rel = os.path.relpath(src, self.source)
            if rel.startswith("..") or self.ignored(rel) or _under_venv(os.path.dirname(src), self.source):
                continue
            dst = os.path.join(self.path, rel_top)
            if os.path.lexists(src):
                _copy_entry(src, dst)
            else:
                _remove_path(dst)
        self._link_venvs()

    def _copy_tree(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        for rel_dir, dirs, files in _walk(self.source, self.ignored, prune=_is_venv, pruned=self._venvs):
            for name in dirs:
                os.makedirs(os.path.join(self.root, rel_dir, name), exist_ok=True)
            for name in files:
                _copy_entry(os.path.join(self.source, rel_dir, name), os.path.join(self.root, rel_dir, name),
                            fresh=True)
        self._link_venvs()

    def _link_venvs(self) -> None:
        """Each virtual environment in the tree, linked, not copied: the checks'
        `.venv/bin/python` (a candidate that changes one changes the real one, which
        the tree guard watches as read-only)."""
        if self.top:  # a worktree has only what git tracks: look for them two levels down
            for name in _listdir(self.source):
                for rel in (name, *(os.path.join(name, sub) for sub in _listdir(os.path.join(self.source, name)))):
                    path = os.path.join(self.source, rel)
                    if not self.ignored(rel) and not os.path.islink(path) and _is_venv(path):
                        self._venvs.append(rel)
        for rel in self._venvs:
            dst = os.path.join(self.root, rel)
            if not os.path.lexists(dst):
                os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
                if self.venv_mounts:
                    os.mkdir(dst)
                else:
                    os.symlink(os.path.join(self.source, rel), dst)

    def _snapshot(self) -> dict[str, Entry]:
        seen: dict[str, Entry] = {}
        for rel_dir, dirs, files in _walk(self.root, self.ignored):
            for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(self.root, rel_dir, d)))]:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                entry = _entry(os.path.join(self.root, rel))
                if entry is not None:
                    seen[rel] = entry
        return seen

    # -- reading ---------------------------------------------------------------------

    def changes(self) -> list[Change]:
        """What changed in the copy since it was made, each compared by content."""
        now = self._snapshot()
        found = []
        for rel, entry in now.items():
            old = self.base.get(rel)
            if old is None:
                found.append(Change(rel, "added", entry))
            elif old != entry and not _same_content(os.path.join(self.root, rel), os.path.join(self.source, rel),
                                                    entry, old):
                found.append(Change(rel, "modified", entry))
        found.extend(Change(rel, "deleted", None) for rel in self.base if rel not in now)
        return sorted(found, key=lambda c: c.rel)

    def diff_size(self, changes: Iterable[Change]) -> int:
        """Lines added and removed (bytes, for big or binary files) over ``changes``."""
        total = 0
        for change in changes:
            mine = os.path.join(self.root, change.rel)
            theirs = os.path.join(self.source, change.rel)
            old, new = _lines(theirs), _lines(mine) if change.entry is not None else []
            if old is None or new is None:
                total += max(_size(mine), _size(theirs))
                continue
            total += sum(1 for line in difflib.unified_diff(old, new, n=0)
                         if line[:1] in "+-" and not line.startswith(("+++", "---")))
        return total

    # -- applying and removing ---------------------------------------------------------

    def apply(self, changes: Iterable[Change], target: str | os.PathLike[str]) -> None:
        """Write ``changes`` into ``target`` (the real working directory)."""
        target = os.fspath(target)
        for change in changes:
            dst = os.path.join(target, change.rel)
            if change.entry is None:
                _remove_path(dst)
                continue
            os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst) or ".", prefix=".pytest-loops-apply-")
            os.close(fd)
            try:
                shutil.copyfile(os.path.join(self.root, change.rel), tmp, follow_symlinks=False)
                os.chmod(tmp, self._mode_for(change, dst))
                os.replace(tmp, dst)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def _mode_for(self, change: Change, dst: str) -> int:
        """The real file's mode, unless the candidate changed it (or made the file)."""
        assert change.entry is not None
        mine = stat.S_IMODE(change.entry.mode)
        base = self.base.get(change.rel)
        if base is not None and stat.S_IMODE(base.mode) == mine:
            try:
                return stat.S_IMODE(os.stat(dst).st_mode)
            except OSError:
                pass
        return mine

    def remove(self) -> None:
        """Delete the copy (and its git worktree entry). Safe to call twice."""
        if self.removed:
            return
        self.removed = True
        if self.top:
            with _git_lock, contextlib.suppress(OSError, subprocess.SubprocessError):
                _git(["worktree", "remove", "--force", "--force", self.path], self.top)
        shutil.rmtree(self.path, ignore_errors=True)
        if self.top:
            with _git_lock, contextlib.suppress(OSError, subprocess.SubprocessError):
                _git(["worktree", "prune"], self.top)
        with _live_lock:
            _live.discard(self)


def remove_all() -> None:
    """Remove every copy still there (at exit: a loop that was killed mid-iteration)."""
    with _live_lock:
        left = list(_live)
    for copy in left:
        copy.remove()


atexit.register(remove_all)


# -- helpers -----------------------------------------------------------------------------


def _walk(root: str, ignored: Callable[[str], bool], *, prune: Callable[[str], bool] | None = None,
          pruned: list[str] | None = None) -> Iterable[tuple[str, list[str], list[str]]]:
    """(relative dir, subdirectories, files) below ``root``, ignored paths and links to
    directories left out of the descent, and directories ``prune`` says (their
    relative paths appended to ``pruned``)."""
    for top, dirs, files in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(top, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for name in dirs:
            rel = os.path.join(rel_dir, name)
            if ignored(rel):
                continue
            if prune is not None and not os.path.islink(os.path.join(top, name)) and prune(os.path.join(top, name)):
                if pruned is not None:
                    pruned.append(rel)
                continue
            if os.path.islink(os.path.join(top, name)):
                files.append(name)  # a link is copied as a link
                continue
            keep.append(name)
        dirs[:] = keep
        yield rel_dir, keep, [f for f in files if not ignored(os.path.join(rel_dir, f))]


def _listdir(path: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _under_venv(directory: str, top: str) -> bool:
    """Whether ``directory`` is in a virtual environment below ``top``."""
    while directory.startswith(top) and directory != top:
        if _is_venv(directory):
            return True
        directory = os.path.dirname(directory)
    return False


def _copy_entry(src: str, dst: str, *, fresh: bool = False) -> None:
    """``src`` (a file or a link) at ``dst``: the bytes and the mode, not the times
    (a candidate's changes are found by content). ``fresh``: nothing is at ``dst``."""
    if not fresh:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        _remove_path(dst)
    try:
        info = os.lstat(src)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(info.st_mode):
        shutil.copyfile(src, dst, follow_symlinks=False)
        if stat.S_IMODE(info.st_mode) & 0o111:
            os.chmod(dst, stat.S_IMODE(info.st_mode))


def _remove_path(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def _same_content(mine: str, theirs: str, entry: Entry, old: Entry) -> bool:
    if entry.kind != old.kind or stat.S_IMODE(entry.mode) != stat.S_IMODE(old.mode):
        return False
    if entry.kind == "l":
        return entry.target == old.target
    if entry.size != old.size:
        return False
    try:
        with open(mine, "rb") as a, open(theirs, "rb") as b:
            while True:
                x, y = a.read(1 << 16), b.read(1 << 16)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def _lines(path: str) -> list[str] | None:
    try:
        if os.path.islink(path) or os.path.getsize(path) > _DIFF_TEXT_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace").splitlines()


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def new_parent() -> Path:
    """A fresh temporary directory to hold one iteration's copies."""
    return Path(tempfile.mkdtemp(prefix=COPY_PREFIX))

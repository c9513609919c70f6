"""A tree's files on disk: entries (stat), the store's copies, and restoring a path without following links."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.limits import is_venv
from pytest_loops.runtime.protect.rules import COPY_BLOCK, IGNORED_DIRS, MEMORY_FILE_BYTES

# --- the state of a tree ------------------------------------------------------------


class Entry(NamedTuple):
    """One path's identity as lstat sees it. Any field changing means "look again"."""

    kind: str  # "f" file, "l" symbolic link, "d" directory (only where listed: venv tops)
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int  # cannot be set back by the writer: a rewrite that restores mtime shows here
    ino: int
    target: str = ""  # a link's target
    nlink: int = 1  # more than one: the same bytes under another name too


def _entry(path: str) -> Entry | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return Entry("l", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, target)
    if stat.S_ISREG(st.st_mode):
        return Entry("f", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, "", st.st_nlink)
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", st.st_mode, 0, 0, 0, st.st_ino)
    return Entry("o", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _executable(entry: Entry) -> bool:
    return entry.kind == "f" and bool(entry.mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))


@dataclass(frozen=True)
class Stored:
    """A loop-start copy of one file in the private store (small ones also in memory,
    where no other process can rewrite them)."""

    path: str  # in the store
    digest: str
    size: int
    mode: int
    data: bytes | None = None


@dataclass(frozen=True)
class Violation:
    """A change to a read-only path: what, how, why it is read-only, and whether it was undone."""

    path: str
    how: str  # "modified" | "deleted" | "added" | "became a link" ...
    why: str
    restored: bool = True

    def describe(self) -> str:
        undone = "" if self.restored else ", could not be undone"
        return f"{printable(self.path)} ({self.how}: {self.why}{undone})"


def printable(path: str) -> str:
    """A path as text that can be written anywhere: bytes that are not UTF-8 (a file
    name the OS gave us as bytes) become backslash escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class RevisePass:
    """What one revise step changed."""

    violations: list[Violation] = field(default_factory=list)
    in_scope: list[tuple[str, str]] = field(default_factory=list)  # (path, how)
    caches_cleared: list[str] = field(default_factory=list)  # bytecode the revise step wrote, removed
    walked: bool = False  # the journal could not vouch: the tree was walked


def _hash_copy(src: str, dst: str | None, should_stop: ShouldStop | None = None) -> tuple[str, int]:
    """sha256 of ``src`` (and a copy of it at ``dst``), read once; ``should_stop`` is
    asked between blocks (:class:`~pytest_loops.deadline.DeadlineReached`)."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = None
        if dst is not None:
            out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while True:
                if should_stop is not None and size and should_stop():
                    raise DeadlineReached(f"while the tree guard copied {src} into its loop-start store")
                block = os.read(fd, COPY_BLOCK)
                if not block:
                    break
                h.update(block)
                size += len(block)
                if out is not None:
                    _write_all(out, block)
        finally:
            if out is not None:
                os.close(out)
    finally:
        os.close(fd)
    return "sha256:" + h.hexdigest(), size


def file_digest(path: str) -> str | None:
    """sha256 of a regular file, never through a link; None if unreadable."""
    try:
        return _hash_copy(path, None)[0]
    except OSError:
        return None



def _parent(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def _makedirs(path: str, made: set[str]) -> None:
    if path not in made:
        os.makedirs(path, exist_ok=True)
        made.add(path)


def _place(src: str, dst: str, mode: int, made: set[str]) -> None:
    """A file at ``dst`` with the bytes of ``src``: a hard link, else a copy."""
    _makedirs(os.path.dirname(dst), made)
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError:
        pass
    _copy_file(src, dst, mode)


def _write_new(dst: str, data: bytes, mode: int, made: set[str]) -> None:
    _makedirs(os.path.dirname(dst), made)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data)
        os.fchmod(fd, stat.S_IMODE(mode))
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _noise(path: str, name: str) -> bool:
    """Journal events never worth a look: caches and bytecode."""
    return name in IGNORED_DIRS


def _same_mode(a: Entry, b: Entry) -> bool:
    return stat.S_IMODE(a.mode) == stat.S_IMODE(b.mode)


def _how(old: Entry | None, new: Entry | None) -> str:
    if old is None:
        return "added"
    if new is None:
        return "deleted"
    if new.kind == "l" and old.kind != "l":
        return "replaced by a link"
    if old.kind == "l" and new.kind == "l":
        return "link retargeted"
    return "modified"


def _ancestor_dirs(root: str, extra: Sequence[str]) -> list[str]:
    dirs: list[str] = []
    for start in [os.path.dirname(root), *[os.path.realpath(e) for e in extra]]:
        path = start
        while True:
            if path not in dirs and path != root:
                dirs.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return dirs


def _real_parents(root: str, rel: str, *, create: bool) -> bool:
    """Make every directory between root and rel a real directory (a link put in
    their place is removed, never followed). False if that cannot be done."""
    path = root
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return True
            try:
                os.mkdir(path, 0o755)
            except OSError:
                return False
            continue
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode):
            continue
        try:
            os.unlink(path)  # a link or a file where a directory was: remove it, do not follow
            if create:
                os.mkdir(path, 0o755)
        except OSError:
            return False
    return True


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _restore_path(path: str, stored: Stored | None, entry: Entry | None) -> bool:
    """Put a file back as the store has it (or remove it when it did not exist):
    written beside it and renamed over it, so a link in its place is replaced."""
    try:
        if stored is None:
            if entry is not None and entry.kind == "l":
                _remove(path)
                os.symlink(entry.target, path)
                return True
            if entry is not None:
                if entry.kind == "f":
                    _remove(path)  # no copy was kept: at least no link or stranger stays
                return False  # existed, but no copy was kept (a venv's package directory)
            _remove(path)
            return True
        tmp = f"{path}.pytest-loops-restore-{os.getpid()}"
        _remove(tmp)
        if stored.data is not None:
            _write_new(tmp, stored.data, stored.mode, set())
        else:
            _copy_file(stored.path, tmp, stored.mode)
            if file_digest(tmp) != stored.digest:  # the store was rewritten behind us
                _remove(tmp)
                return False
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def _copy_file(src: str, dst: str, mode: int) -> None:
    """A new file at ``dst`` (never through a link) with the bytes and mode of ``src``."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    _remove(dst)
    _hash_copy(src, dst)
    os.chmod(dst, stat.S_IMODE(mode))


def clear_bytecode_of(root: str, sources: list[str]) -> list[str]:
    """Remove the cached bytecode of each changed ``.py`` source (relative to ``root``).

    The interpreter trusts a `.pyc` whose recorded source mtime (whole seconds) and
    size match: a same-size edit within the second of the last one, or one that sets
    the mtime back, would run the old code. What a check compiled before the revise
    step is such a cache. Returns the removed paths, relative to ``root``."""
    removed = []
    for rel in sources:
        if not rel.endswith(".py"):
            continue
        folder, name = os.path.split(rel)
        cache = os.path.join(folder, "__pycache__")
        try:
            names = os.listdir(os.path.join(root, cache))
        except OSError:
            continue
        for cached in names:
            if cached.startswith(name[:-3] + ".") and cached.endswith((".pyc", ".pyo")):
                try:
                    os.unlink(os.path.join(root, cache, cached))
                except OSError:
                    continue
                removed.append(os.path.join(cache, cached))
    return removed


def clear_stale_bytecode(root: str) -> list[str]:
    """Remove each cached `.pyc` under ``root`` whose source was written after it.

    The interpreter checks a `.pyc` against its source's mtime in whole seconds (and
    its size): an edit within the second the `.pyc` was written, keeping the size,
    runs the old code. A watch runs the tests again right after an edit; before it
    does, this drops such caches (the VCS, tool caches and virtual environments are
    not walked). Returns the removed paths, relative to ``root``."""
    removed = []
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS and not d.endswith(".egg-info")
                   and not is_venv(os.path.join(top, d))]
        if os.path.basename(top) != "__pycache__":
            continue
        for name in files:
            if not name.endswith(".pyc"):
                continue
            source = os.path.join(os.path.dirname(top), name.split(".", 1)[0] + ".py")
            cached = os.path.join(top, name)
            try:
                if os.stat(source).st_mtime_ns > os.stat(cached).st_mtime_ns:
                    os.unlink(cached)
                    removed.append(os.path.relpath(cached, root))
            except OSError:
                continue
    return removed


def sweep_readonly(root: str, store: Mapping[str, Stored], in_venv: Callable[[str], object],
                   known: set[str]) -> list[Violation]:
    """Every read-only file compared with its loop-start bytes (a write through a hard
    link in another directory raises no event in its own)."""
    found = []
    for rel, stored in store.items():
        if rel in known or in_venv(rel):
            continue
        entry = _entry(os.path.join(root, rel))
        if entry is None or entry.kind != "f" or file_digest(os.path.join(root, rel)) != stored.digest:
            found.append(Violation(rel, "modified" if entry else "deleted",
                                   "changed through another name (a hard link)", restored=False))
    return found


def copy_in(src: str, dst: str, entry: Entry, memory_left: int, should_stop: ShouldStop | None) -> Stored | None:
    """``src`` copied to ``dst`` with its digest; its bytes kept in memory too when small
    and ``memory_left`` allows (read back and checked against the digest)."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        digest, size = _hash_copy(src, dst, should_stop)
    except OSError:
        return None
    data = None
    if size <= MEMORY_FILE_BYTES and memory_left >= size:
        try:
            with open(dst, "rb") as f:
                data = f.read()
        except OSError:
            data = None
        if data is not None and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            data = None
    return Stored(dst, digest, size, stat.S_IMODE(entry.mode), data)

"""The guard's private store on disk: named by its harness, swept when that harness is gone."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile

from pytest_loops.runtime.protect.tree import Stored

STORE_PREFIX = "pytest-loops-store-"


def _owner_tag(pid: int) -> str | None:
    """``PID-START`` of a live process (start time in clock ticks since boot: a reused
    pid has another), None when it is gone."""
    from pytest_loops.runtime.reaper import read_stat

    proc = read_stat(pid)
    return None if proc is None or proc.zombie else f"{pid}-{proc.start}"


def store_prefix() -> str:
    """The private store's name: the harness's pid and start time, so a later loop can
    tell the store of a harness that was killed (SIGKILL leaves no chance to clean up)."""
    return f"{STORE_PREFIX}{_owner_tag(os.getpid()) or os.getpid()}-"


def sweep_stale_stores(directory: str | None = None) -> list[str]:
    """Remove the stores of harnesses that are gone (ours only: same owner); returns them."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(STORE_PREFIX)]
    except OSError:
        return removed
    for name in names:
        parts = name[len(STORE_PREFIX):].split("-")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue  # an older store, or not one: left alone
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        if _owner_tag(int(parts[0])) == f"{parts[0]}-{parts[1]}":
            continue  # its harness still runs
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class TextStore:
    """Files' loop-start bytes appended to one file of the store, their places kept in
    memory: a tree of many small files costs one file creation, not one per file.

    For texts that are read back at most once or twice (the diff audit); what is
    restored or judged has a file and a digest of its own. Each text's digest stays
    in memory: a store rewritten on disk (by a revise step that found it) gives
    nothing back rather than a forged loop-start text."""

    _FLUSH = 1 << 20

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pending = bytearray()
        self._size = 0
        self._where: dict[str, tuple[int, int, bytes]] = {}  # key -> offset, length, sha256
        self.failed = False

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def add(self, key: str, src: str, limit: int) -> bool:
        """Keep ``src`` (a regular file, not followed if a link, at most ``limit``
        bytes) under ``key``; False when it cannot be read or is bigger."""
        if self.failed:
            return False
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return False
            chunks, total = [], 0
            while total <= limit and (chunk := os.read(fd, limit + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total == info.st_size and len(chunks) == 1:
                    break  # the whole file in one read: no second read to find its end
        except OSError:
            return False
        finally:
            os.close(fd)
        if total > limit:
            return False
        data = b"".join(chunks)
        self._where[key] = (self._size + len(self._pending), len(data), hashlib.sha256(data).digest())
        self._pending += data
        if len(self._pending) >= self._FLUSH:
            self.flush()
        return True

    def flush(self) -> None:
        """Write what is held in memory; on a write error (a full disk) those texts are
        forgotten and nothing more is kept: the audit goes without them."""
        if not self._pending or self.failed:
            return
        data, self._pending = bytes(self._pending), bytearray()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], self._size + written)
        except OSError:
            self.failed = True
            self._where = {k: w for k, w in self._where.items() if w[0] < self._size}
            return
        self._size += len(data)

    def digest(self, key: str) -> str | None:
        """The sha256 of the bytes kept under ``key`` (as :func:`file_digest` spells it)."""
        where = self._where.get(key)
        return None if where is None else "sha256:" + where[2].hex()

    def read(self, key: str) -> bytes | None:
        """The bytes kept under ``key``; None when there are none, they cannot be read, or
        they are not what was kept."""
        where = self._where.get(key)
        if where is None:
            return None
        offset, length, digest = where
        if offset >= self._size:  # still in memory
            start = offset - self._size
            return bytes(self._pending[start:start + length])
        try:
            data = os.pread(self._fd, length, offset) if self._fd is not None else None
        except OSError:
            return None
        return data if data is not None and hashlib.sha256(data).digest() == digest else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def kept_digest(stored: Stored | None, texts: TextStore | None, key: str) -> str | None:
    """The loop-start digest of a file the store or the text store holds."""
    if stored is not None:
        return stored.digest
    return texts.digest(key) if texts is not None else None


def kept_bytes(stored: Stored | None, texts: TextStore | None, key: str) -> bytes | None:
    """The loop-start bytes of a file the store (in memory or its copy) or the text store holds."""
    if stored is None:
        return texts.read(key) if texts is not None else None
    if stored.data is not None:
        return stored.data
    try:
        with open(stored.path, "rb") as f:
            return f.read()
    except OSError:
        return None

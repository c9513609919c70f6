"""A change journal for directory trees: Linux inotify through ctypes.

:class:`DirectoryJournal` watches directories one by one (the caller adds a watch
on each directory *before* reading its entries, so nothing changes unseen between
the listing and the watch) and, when drained, says which paths were named by an
event since the last drain. It never claims more than it saw: whenever it cannot
vouch for a complete account (the kernel queue overflowed, a watch vanished
without its directory being deleted, the root moved, the process forked, a
directory lives on a network file system) it raises :class:`JournalLost`, and the
caller falls back to walking the tree.

What inotify does not report, and the caller must cover itself: writes through
``mmap``, writes through a hard link outside the watched directories, and changes
behind a symbolic link.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

from pytest_loops.deadline import DeadlineReached, ShouldStop

__all__ = ["Changes", "DirectoryJournal", "JournalLost", "unavailable_reason", "within"]

# <linux/inotify.h>: the same values on every architecture.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000

_ENTRY_EVENTS = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
WATCH_MASK = (
    IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_ATTRIB
    | _ENTRY_EVENTS
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    # Writes to a file already unlinked from the directory are not state.
    | IN_EXCL_UNLINK
)
# Every directory below the root: never through a symbolic link, never a file.
_CHILD_FLAGS = IN_DONT_FOLLOW | IN_ONLYDIR

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
_READ_SIZE = 65536
# A writer faster than the drain could keep it reading forever; past this many
# bytes the account is declared lost instead (the kernel queue holds 16384 events
# by default, well under it).
_MAX_DRAIN_BYTES = 64 * 1024 * 1024

# Events on these come only from this kernel; changes made by another machine (or
# by the host of a VM share) never show up, so the journal cannot vouch for them.
_REMOTE_FS = frozenset(
    {
        "9p", "afs", "beegfs", "ceph", "cifs", "coda", "davfs", "fuse", "fuseblk",
        "gfs2", "glusterfs", "gpfs", "lustre", "ncpfs", "nfs", "nfs4", "ocfs2",
        "orangefs", "prl_fs", "pvfs2", "smb3", "smbfs", "vboxsf", "virtiofs", "vmhgfs",
    }
)


class JournalLost(Exception):
    """The journal cannot vouch for a complete account of the changes.

    ``sticky``: it will not be able to for this tree either (no inotify, the watch
    limit, a network file system), so the caller should stop trying.
    """

    def __init__(self, reason: str, *, sticky: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sticky = sticky


class Changes(NamedTuple):
    """What one drain saw, as absolute paths."""

    touched: set[str]
    """Every path an event named: written, attributes changed, created, deleted, moved."""
    relisted: set[str]
    """Watched directories whose entries (or own permissions) may have changed."""
    gone: set[str]
    """Directories deleted, moved away or replaced; their watches are dropped."""


class _Libc(NamedTuple):
    init1: Callable[[int], int]
    add_watch: Callable[[int, bytes, int], int]
    rm_watch: Callable[[int, int], int]


@functools.cache
def _libc() -> _Libc | str:
    """The inotify functions, or why they cannot be had."""
    if not sys.platform.startswith("linux"):
        return f"inotify is Linux only (this is {sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init1, add, rm = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
    except (OSError, AttributeError) as exc:  # pragma: no cover - a libc without inotify
        return f"the C library has no inotify ({exc})"
    init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    rm.argtypes, rm.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return _Libc(init1, add, rm)


def unavailable_reason() -> str | None:
    """``None`` if inotify can be used here, else why not."""
    lib = _libc()
    return lib if isinstance(lib, str) else None


def parse_events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """``(wd, mask, name)`` for each ``struct inotify_event`` in ``data``."""
    size = _EVENT.size
    offset, end = 0, len(data)
    while offset < end:
        if offset + size > end:
            raise JournalLost("a truncated inotify event")
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += size
        if offset + length > end:
            raise JournalLost("a truncated inotify event")
        raw = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        yield wd, mask, os.fsdecode(raw) if raw else ""


def _fs_types() -> dict[int, str]:
    """``st_dev -> file system type`` of every mount, from /proc/self/mountinfo."""
    types: dict[int, str] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:  # pragma: no cover - no /proc: nothing known, nothing refused
        return types
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 3 or not right.split():
            continue
        major, _, minor = fields[2].partition(":")
        try:
            types[os.makedev(int(major), int(minor))] = right.split()[0]
        except ValueError:
            continue
    return types


def _is_remote(fs_type: str) -> bool:
    return fs_type in _REMOTE_FS or fs_type.startswith("fuse.")


class DirectoryJournal:
    """Directory watches on one tree and the events they report.

    ``root`` is watched at once (through symbolic links: the root is taken as it
    resolves now); other directories when the caller calls :meth:`watch`, which
    never follows a symbolic link. Raises :class:`JournalLost` if inotify is
    unavailable or the root cannot be watched. Release the descriptor with
    :meth:`close`; it is also closed when the journal is garbage-collected.
    """

    def __init__(self, root: str) -> None:
        lib = _libc()
        if isinstance(lib, str):
            raise JournalLost(lib, sticky=True)
        self._lib = lib
        fd = lib.init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            # EMFILE: the per-user instance limit (128 by default) is shared with
            # every other program; walking still works.
            raise JournalLost(f"inotify_init1 failed: {os.strerror(err)}", sticky=True)
        self._fd = fd
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, os.close, fd)
        self._paths: dict[int, str] = {}  # wd -> directory path
        self._wds: dict[str, int] = {}  # directory path -> wd
        self._fs_types: dict[int, str] | None = None
        self._dev_ok: dict[int, bool] = {}
        self.root = root
        try:
            self._root_wd = self._add(root, 0, follow=True)
        except BaseException:
            self.close()
            raise
        if self._root_wd is None:
            self.close()
            raise JournalLost(f"the root {root} is not a directory that can be watched")

    # -- lifetime

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the inotify descriptor (and so every watch). Idempotent."""
        self._finalizer()
        self._paths.clear()
        self._wds.clear()

    def fileno(self) -> int:
        """The inotify descriptor, readable when events are pending (for ``select``)."""
        if self.closed:
            raise JournalLost("the journal is closed", sticky=True)
        return self._fd

    # -- watches

    def is_watched(self, path: str) -> bool:
        return path in self._wds

    @property
    def watch_count(self) -> int:
        return len(self._wds)

    def watch(self, path: str) -> bool:
        """Watch the directory ``path``: ``True`` if it now is.

        ``False`` if ``path`` is missing, a file or a symbolic link (a link is
        never followed). Raises :class:`JournalLost` if it cannot be watched
        (watch limit, permissions, a network file system) or if the same directory
        is already watched under another path (a bind mount, or a move not yet
        drained).
        """
        if path in self._wds:
            return True
        return self._add(path, _CHILD_FLAGS, follow=False) is not None

    def _add(self, path: str, flags: int, *, follow: bool) -> int | None:
        if self.closed:
            raise JournalLost("the journal is closed", sticky=True)
        wd = self._lib.add_watch(self._fd, os.fsencode(path), WATCH_MASK | flags)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            if err == errno.ENOSPC:
                raise JournalLost(
                    "the inotify watch limit is reached (fs.inotify.max_user_watches)",
                    sticky=True,
                )
            raise JournalLost(f"cannot watch {path}: {os.strerror(err)}", sticky=True)
        other = self._paths.get(wd)
        if other is not None and other != path:
            # One directory, two paths: events would name only one of them.
            raise JournalLost(f"{path} is the same directory as {other}")
        self._paths[wd] = path
        self._wds[path] = wd
        self._check_local(path, follow)
        return wd

    def _check_local(self, path: str, follow: bool) -> None:
        try:
            dev = os.stat(path, follow_symlinks=follow).st_dev
        except OSError:
            return  # gone already: its parent's event says so
        ok = self._dev_ok.get(dev)
        if ok is None:
            fs_type = self._fs_type(dev)
            ok = fs_type is None or not _is_remote(fs_type)
            self._dev_ok[dev] = ok
            if not ok:
                raise JournalLost(
                    f"{path} is on a {fs_type} file system, whose changes from elsewhere"
                    " inotify does not see",
                    sticky=True,
                )

    def _fs_type(self, dev: int) -> str | None:
        if self._fs_types is None or dev not in self._fs_types:
            # Mounts come and go: read the table again for a device not seen yet.
            self._fs_types = _fs_types()
        return self._fs_types.get(dev)

    def _forget(self, gone: set[str]) -> None:
        """Drop the watches on ``gone`` and every directory beneath them."""
        if not self._wds:
            return
        for path in [p for p in self._wds if within(p, gone)]:
            wd = self._wds.pop(path)
            del self._paths[wd]
            # The kernel answers with IN_IGNORED for a wd no longer mapped (ignored
            # in drain), or EINVAL if the directory is already gone.
            self._lib.rm_watch(self._fd, wd)

    # -- events

    def _read(self, should_stop: ShouldStop | None = None) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            if should_stop is not None and should_stop():
                # the events read so far are lost: the caller must walk next time
                raise DeadlineReached(f"while reading the change journal of {self.root}")
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not data:  # pragma: no cover - inotify never reports end of file
                break
            chunks.append(data)
            total += len(data)
            if total > _MAX_DRAIN_BYTES:
                raise JournalLost("changes arrive faster than they can be read")
        return b"".join(chunks)

    def drain(self, ignore: Callable[[str, str], bool] | None = None, *,
              should_stop: ShouldStop | None = None) -> Changes:
        """Read every pending event.

        ``ignore(path, name)``: events about a child of a watched directory for
        which it returns true are dropped (names the caller never looks at).
        Raises :class:`JournalLost` when the events cannot be trusted to be complete,
        and :class:`~pytest_loops.deadline.DeadlineReached` when ``should_stop()``
        answers true before every event is read (the journal can then vouch for
        nothing: close it and walk).
        """
        if self.closed:
            raise JournalLost("the journal is closed", sticky=True)
        if os.getpid() != self._pid:
            # A forked child shares the queue with its parent: each would steal
            # the other's events.
            raise JournalLost("the process forked")
        touched: set[str] = set()
        relisted: set[str] = set()
        gone: set[str] = set()
        deleted: set[int] = set()
        paths = self._paths
        for wd, mask, name in parse_events(self._read(should_stop)):
            if mask & IN_Q_OVERFLOW:
                raise JournalLost("the inotify event queue overflowed")
            path = paths.get(wd)
            if path is None:
                continue  # a watch already dropped: its last events add nothing
            if name:
                child = path + name if path.endswith("/") else path + "/" + name
                if ignore is not None and ignore(child, name):
                    continue
                touched.add(child)
                if mask & _ENTRY_EVENTS:
                    relisted.add(path)
                    if mask & IN_ISDIR or child in self._wds:
                        gone.add(child)
                elif mask & IN_ATTRIB and mask & IN_ISDIR:
                    relisted.add(child)  # its permissions may now hide (or show) it
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if wd == self._root_wd:
                    raise JournalLost(f"the root {path} was moved or deleted")
                gone.add(path)
                relisted.add(os.path.dirname(path))
                if mask & IN_DELETE_SELF:
                    deleted.add(wd)
            elif mask & IN_IGNORED:
                if wd not in deleted and path not in gone:
                    raise JournalLost(f"the watch on {path} was removed")
                del paths[wd]
                if self._wds.get(path) == wd:
                    del self._wds[path]
            elif mask & IN_UNMOUNT:
                raise JournalLost(f"the file system under {path} was unmounted")
            elif mask & IN_ATTRIB:
                relisted.add(path)
        if gone:
            self._forget(gone)
        return Changes(touched, relisted, gone)


def within(path: str, tops: set[str]) -> bool:
    """Whether ``path`` is one of ``tops`` or beneath one."""
    while True:
        if path in tops:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent

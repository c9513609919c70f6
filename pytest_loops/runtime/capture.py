"""A command's output: captured from its pipe under a cap, read back line by line.

A command writes into a pipe; :class:`Capture` copies it to the output file,
keeping at most ``cap`` bytes: the first half as it comes, the last half in
memory until the end, and between them one line saying how many bytes were
dropped. Memory stays bounded by the cap whatever the command prints, and so
does every file the loop writes from the output (:func:`output_lines` reads it
back without loading it whole).

No thread of its own: the thread that waits for the command calls :meth:`Capture.pump`
whenever the pipe is readable (it selects on :meth:`Capture.fileno` beside the
command's pidfd), and :meth:`Capture.finish` drains what is left once the
command is over.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import select
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

from pytest_loops.limits import open_own

__all__ = ["Capture", "close_parent_ends", "grow_pipe", "output_lines", "stdin_file"]

_CHUNK = 1 << 20  # also the pipe's size where it can be set: fewer wake-ups on big outputs
_QUIET = 0.05  # after the command: this long without output and the output is over
_AFTER_STOP = 4 * _CHUNK  # a writer that escaped cannot keep the drain going


class Capture:
    """Copies a command's output from its pipe to its file, keeping at most ``cap``
    bytes (0: all): the first half as it comes, the last half in memory until the
    end, and between them one line saying how many bytes were dropped.

    Takes ownership of both descriptors: :meth:`finish` closes them."""

    def __init__(self, read_fd: int, out_fd: int, cap: int, keep_last: int = 0) -> None:
        self._read_fd, self._out_fd = read_fd, out_fd
        self._keep_last = keep_last
        self.last = b""  # the last ``keep_last`` bytes of what went to the file
        self._cap = cap
        self._head = cap - cap // 2 if cap else -1
        self._tail_room = cap // 2
        self._written = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._kept = 0
        self._failed = False  # the output file cannot be written: keep counting, stop copying
        self._digest = hashlib.sha256()  # of what went to the file
        self.total = 0
        self.at_end = False  # every writer has closed the pipe
        os.set_blocking(read_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def pump(self, most: int = 4 * _CHUNK) -> int:
        """Copy what the pipe holds now, without waiting and at most about ``most``
        bytes (a flood must not keep the caller from its deadline); return the bytes
        read (0 when there was nothing, or at the end of the output: see ``at_end``)."""
        got = 0
        while not self.at_end and got < most:
            try:
                data = os.read(self._read_fd, _CHUNK)
            except BlockingIOError:
                break
            except OSError:
                self.at_end = True
                break
            if not data:
                self.at_end = True
                break
            got += len(data)
            self._take(data)
            if len(data) < _CHUNK:
                break
        return got

    def finish(self) -> int:
        """Drain the output of a command that is over (its writers are dead, or
        escaped: then at most a few MiB more, and no more than ``_QUIET`` seconds
        of silence), write the kept tail, close both descriptors; return how
        many bytes the command wrote in all."""
        left = _AFTER_STOP
        try:
            while not self.at_end and left > 0:
                got = self.pump()
                left -= got
                if not got and not self.at_end:
                    try:
                        if not select.select([self._read_fd], [], [], _QUIET)[0]:
                            break
                    except (OSError, ValueError):
                        break
            self._write_tail()
        finally:
            for fd in (self._read_fd, self._out_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        return self.total

    def _take(self, data: bytes) -> None:
        self.total += len(data)
        if self._head < 0 or self._written < self._head:
            room = len(data) if self._head < 0 else self._head - self._written
            self._write(data[:room])
            self._written += min(room, len(data))
            data = data[room:]
        if data:
            self._tail.append(data)
            self._kept += len(data)
            while self._tail and self._kept - len(self._tail[0]) >= self._tail_room:
                self._kept -= len(self._tail.popleft())

    def _write_tail(self) -> None:
        tail = self._tail
        dropped = self.total - self._written - self._kept
        if self._kept > self._tail_room:
            cut = self._kept - self._tail_room
            tail[0] = tail[0][cut:]
            dropped += cut
        if dropped:
            marker = f"\n[pytest-loops: {dropped} bytes of output dropped here (output_cap={self._cap})]\n"
            self._write(marker.encode())
        for block in tail:
            self._write(block)

    def _write(self, data: bytes) -> None:
        if self._keep_last and data:
            self.last = (self.last + data)[-self._keep_last:] if len(data) < self._keep_last \
                else data[-self._keep_last:]
        if self._failed:
            return
        try:
            _write_all(self._out_fd, data)
            self._digest.update(data)
        except OSError:  # a full disk: the command goes on, its output file is short
            self._failed = True

    def sha256(self) -> str | None:
        """The hex digest of the output file as written, None when a write failed."""
        return None if self._failed else self._digest.hexdigest()


def output_lines(path: str | None, fallback: str = "", longest: int = 1 << 16) -> Iterator[str]:
    """The lines of a command's output file, read as they are needed (UTF-8, errors
    replaced; a line longer than ``longest`` characters comes in pieces), or the
    lines of ``fallback`` when there is no file to read."""
    if path:
        try:
            # in the run directory, which the check can write: never a file it linked there
            with io.TextIOWrapper(open_own(path), encoding="utf-8", errors="replace") as f:
                while line := f.readline(longest):
                    yield line
            return
        except OSError:
            pass
    yield from fallback.splitlines(keepends=True)


def grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _CHUNK)
    except (ImportError, OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def stdin_file(data: bytes | None) -> Any:
    """What a command reads on its standard input: ``data`` from an unlinked temporary
    file (a command that never reads it cannot block), else ``/dev/null``."""
    if data is None:
        return subprocess.DEVNULL
    f = tempfile.TemporaryFile()
    f.write(data)
    f.seek(0)
    return f


def close_parent_ends(fd: int, stdin: Any) -> None:
    """Close the parent's copies of a started command's output pipe and input file."""
    os.close(fd)
    if not isinstance(stdin, int):
        stdin.close()

"""A command's output: captured from its pipe under a cap, read back line by line.

A command writes into a pipe; :class:`Capture` copies it to the output file in
a thread, keeping at most ``cap`` bytes: the first half as it comes, the last
half in memory until the end, and between them one line saying how many bytes
were dropped. Memory stays bounded by the cap whatever the command prints, and
so does every file the loop writes from the output (:func:`output_lines` reads
it back without loading it whole).
"""

from __future__ import annotations

import collections
import os
import select
import threading
from collections.abc import Iterator

__all__ = ["Capture", "grow_pipe", "output_lines"]

_CHUNK = 1 << 20  # also the pipe's size where it can be set: fewer wake-ups on big outputs


class Capture:
    """Copies a command's output from its pipe to its file, keeping at most ``cap``
    bytes (0: all): the first half as it comes, the last half in memory until the
    end, and between them one line saying how many bytes were dropped."""

    def __init__(self, read_fd: int, out_fd: int, cap: int) -> None:
        self._read_fd, self._out_fd = read_fd, out_fd
        self._cap = cap
        self._head = cap - cap // 2 if cap else -1
        self._tail_room = cap // 2
        self._stopping = False
        self.total = 0
        self._thread = threading.Thread(target=self._pump, name="pytest-loops-output", daemon=True)
        self._thread.start()

    def finish(self) -> int:
        """Wait for the output to end (its writers are dead: the pipe is at EOF or
        drained); return how many bytes the command wrote in all."""
        self._stopping = True
        self._thread.join()
        return self.total

    def _pump(self) -> None:
        written = 0
        tail: collections.deque[bytes] = collections.deque()
        kept = 0
        left_after_stop = 4 * _CHUNK  # a writer that escaped cannot keep us here
        try:
            while True:
                if not select.select([self._read_fd], [], [], 0.05)[0]:
                    if self._stopping:
                        break
                    continue
                data = os.read(self._read_fd, _CHUNK)
                if not data:
                    break
                self.total += len(data)
                if self._stopping:
                    left_after_stop -= len(data)
                    if left_after_stop < 0:
                        break
                if self._head < 0 or written < self._head:
                    room = len(data) if self._head < 0 else self._head - written
                    _write_all(self._out_fd, data[:room])
                    written += min(room, len(data))
                    data = data[room:]
                if data:
                    tail.append(data)
                    kept += len(data)
                    while tail and kept - len(tail[0]) >= self._tail_room:
                        kept -= len(tail.popleft())
        except OSError:
            pass
        finally:
            try:
                dropped = self.total - written - kept
                if kept > self._tail_room:
                    cut = kept - self._tail_room
                    tail[0] = tail[0][cut:]
                    dropped += cut
                if dropped:
                    marker = f"\n[pytest-loops: {dropped} bytes of output dropped here (output_cap={self._cap})]\n"
                    _write_all(self._out_fd, marker.encode())
                for block in tail:
                    _write_all(self._out_fd, block)
            except OSError:
                pass
            finally:
                os.close(self._read_fd)
                os.close(self._out_fd)


def output_lines(path: str | None, fallback: str = "", longest: int = 1 << 16) -> Iterator[str]:
    """The lines of a command's output file, read as they are needed (UTF-8, errors
    replaced; a line longer than ``longest`` characters comes in pieces), or the
    lines of ``fallback`` when there is no file to read."""
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
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

"""The working tree's lock: loops that revise one tree never interleave, also across
xdist workers and separate ``pytest --loop`` runs. Every wait for it is bounded and spoken.

The holder records who it is next to the lock (``tree.lock.holder``: pid, the
process's start time from ``/proc`` so a reused pid is not mistaken for it,
command line, since when, host). A waiter

* says at once, in one line, who holds the lock (pid, command, since when); a
  stopped holder (``T`` in ``/proc/PID/stat``) is named as stopped, with how to
  resume it;
* says so again whenever the holder or its state changes, and every
  :data:`STILL_WAITING_EVERY` seconds ("still waiting for pid N ...");
* counts the wait against the loop's budget: when ``should_stop()`` answers true
  it raises :class:`~pytest_loops.deadline.DeadlineReached` naming the holder,
  and the engine ends the loop TIMEOUT;
* without a budget (``should_stop`` is None) waits for as long as the holder
  holds the lock, saying so every :data:`STILL_WAITING_EVERY` seconds: a loop
  run without a budget was asked to take the time it needs.

A holder that died released its lock with its process (the lock is an ``flock``);
the next loop takes it over and names the dead holder, whose unfinished changes
may still be in the tree.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from filelock import FileLock, Timeout

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.limits import replace_fresh

__all__ = ["STILL_WAITING_EVERY", "Holder", "TreeLock", "holder_state", "read_holder", "terminal_say"]

STILL_WAITING_EVERY = 30.0  # seconds between "still waiting" lines
POLL_S = 0.25  # how often the budget and the holder are looked at while waiting
COMMAND_CHARS = 200  # a holder's command line is shown up to this long


class Holder(NamedTuple):
    """Who holds the lock, as the holder recorded it."""

    pid: int
    start: int | None  # start time in clock ticks since boot (/proc/PID/stat field 22)
    command: str
    since: str  # ISO 8601 UTC
    host: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command}) since {self.since}"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a process, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the command name may hold spaces and ")"
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [os.fsdecode(a) for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    text = shlex.join(argv) if argv else " ".join(sys.argv)
    if len(text) <= COMMAND_CHARS:
        return text
    half = (COMMAND_CHARS - 3) // 2  # both ends: the program and its last arguments
    return text[:half] + "..." + text[-half:]


def _this_process() -> Holder:
    pid = os.getpid()
    found = _proc_stat(pid)
    now = time.time()
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return Holder(pid, found[1] if found else None, _command(pid), since, socket.gethostname())


def read_holder(path: str | os.PathLike[str]) -> Holder | None:
    """The holder a ``tree.lock.holder`` file names; None when absent or unreadable."""
    try:
        data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
        start = data.get("start")
        return Holder(int(data["pid"]), int(start) if start is not None else None, str(data["command"]),
                      str(data["since"]), str(data["host"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def holder_state(holder: Holder) -> str:
    """``running``, ``stopped`` (SIGSTOP, or a debugger), ``gone`` (no such process, or
    the pid now belongs to a process that started at another time), or ``elsewhere``
    (recorded on another host: it cannot be looked at from here)."""
    if holder.host != socket.gethostname():
        return "elsewhere"
    found = _proc_stat(holder.pid)
    if found is None:
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "running"  # someone else's process
        return "running"  # no /proc: alive is all that can be told
    state, start = found
    if state in ("Z", "X") or (holder.start is not None and start != holder.start):
        return "gone"
    return "stopped" if state in ("T", "t") else "running"


def _state_note(holder: Holder, state: str) -> str:
    if state == "stopped":
        return (f"; pid {holder.pid} is stopped (SIGSTOP); resume it with kill -CONT {holder.pid} "
                "or end it")
    if state == "gone":
        return (f"; pid {holder.pid} is gone, but the lock is still held (by a process it left "
                "behind): end that process")
    if state == "elsewhere":
        return f" on {holder.host}"
    return ""


class TreeLock:
    """One loop's hold on the working tree (see the module docstring).

    :param path: the lock file (``.pytest-loops/tree.lock``); the holder record is
        written next to it as ``<path>.holder``.
    :param say: shows one line to the user at once (the terminal, or stderr).
    :param clock: monotonic seconds, for the "still waiting" lines.
    :param still_every: seconds between "still waiting" lines.
    """

    def __init__(self, path: str | os.PathLike[str], *, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, still_every: float = STILL_WAITING_EVERY) -> None:
        self.path = Path(path)
        self.info_path = self.path.with_name(self.path.name + ".holder")
        self.say = say
        self.clock = clock
        self.still_every = still_every
        self._lock = FileLock(str(self.path))
        self._me: Holder | None = None

    def acquire(self, should_stop: ShouldStop | None = None) -> None:
        """Take the lock; raises :class:`DeadlineReached` when ``should_stop()`` answers
        true first. Without ``should_stop``, waits as long as the lock is held."""
        from pytest_loops.runtime.outpaths import keep_out_of_git

        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep_out_of_git(self.path.parent)
        if not self._try(0):
            self._wait(should_stop)
        self._record()

    def _try(self, timeout: float) -> bool:
        try:
            self._lock.acquire(timeout=timeout, poll_interval=0.05)
        except Timeout:
            return False
        return True

    def _wait(self, should_stop: ShouldStop | None) -> None:
        started = self.clock()
        said_at: float | None = None
        said: tuple[Holder | None, str] | None = None
        while True:
            holder = read_holder(self.info_path)
            state = holder_state(holder) if holder else "unknown"
            now = self.clock()
            if said is None or (holder, state) != said:
                self.say(self._line(holder, state, now - started, first=said is None))
                said, said_at = (holder, state), now
            elif said_at is not None and now - said_at >= self.still_every:
                self.say(self._line(holder, state, now - started, first=False))
                said_at = now
            if should_stop is not None and should_stop():
                who = holder.describe() + _state_note(holder, state) if holder else \
                    "by a process that did not record itself"
                raise DeadlineReached(f"while waiting for the working tree's lock {self.path}, held by {who}")
            if self._try(POLL_S):
                return

    def _line(self, holder: Holder | None, state: str, waited: float, *, first: bool) -> str:
        if holder is None:
            who = "a process that did not record itself (an older pytest-loops, or one just starting)"
            return (f"loop: waiting for the working tree's lock {self.path}, held by {who}" if first
                    else f"loop: still waiting for the working tree's lock {self.path} ({waited:.0f}s)")
        if first:
            return (f"loop: waiting for the working tree's lock {self.path}: held by {holder.describe()}"
                    f"{_state_note(holder, state)}")
        return (f"loop: still waiting for pid {holder.pid} ({holder.command}) to release the working tree's "
                f"lock ({waited:.0f}s){_state_note(holder, state)}")

    def _record(self) -> None:
        """Write who holds the lock now; name a dead previous holder that never cleared its record."""
        before = read_holder(self.info_path)
        if before is not None and before.pid != os.getpid() and holder_state(before) == "gone":
            self.say(f"loop: took over the working tree's lock {self.path}: pid {before.pid} ({before.command}), "
                     f"which held it since {before.since}, is gone without releasing it; the tree may "
                     "still hold its unfinished changes")
        self._me = _this_process()
        try:
            replace_fresh(self.info_path, json.dumps(self._me._asdict()))
        except OSError:
            pass  # waiters then say "did not record itself"; the lock holds regardless

    def release(self) -> None:
        """Let the next loop in (a no-op when the lock is not held)."""
        if not self._lock.is_locked:
            return
        try:
            mine = read_holder(self.info_path)
            if self._me is not None and mine is not None and mine.pid == self._me.pid:
                self.info_path.unlink()
        except OSError:
            pass
        finally:
            self._me = None
            self._lock.release()


def terminal_say(config: Any) -> Callable[[str], None]:
    """Show a line at once: through pytest's terminal writer, or on stderr where there
    is none (an xdist worker, whose terminal nobody sees)."""
    reporter = None if hasattr(config, "workerinput") else config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is None:
            print(line, file=sys.stderr, flush=True)
            return
        reporter.ensure_newline()
        reporter.write_line(line)
        reporter.flush()

    return say

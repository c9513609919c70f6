"""Processes by pid, as the process runner handles them: signalling one or a group,
reaping, whether one is alive, this process's children and the clock it counts
start times in (from ``/proc``), a pidfd to wait on, and becoming a child
subreaper so that escaped descendants of our commands are re-parented to us.

Linux-specific where it reads ``/proc``; each helper degrades (None, or the
plain ``kill``) where it cannot tell.
"""

from __future__ import annotations

import os
import sys
import threading

from pytest_loops.runtime.reaper import read_small

_PR_SET_CHILD_SUBREAPER = 36
_lock = threading.Lock()
_tried = False
_enabled = False  # prctl succeeded: orphans of our commands become our children


def enable_subreaper() -> None:
    """Become a child subreaper (Linux only), once per process; failures are ignored."""
    global _tried, _enabled
    if _tried:
        return
    with _lock:
        if _tried:
            return
        _tried = True
        if not sys.platform.startswith("linux"):
            return
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            status = libc.prctl(
                ctypes.c_int(_PR_SET_CHILD_SUBREAPER),
                ctypes.c_ulong(1),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
            )
            _enabled = status == 0
        except (OSError, AttributeError):  # no libc / no prctl: fall back to groups only
            pass


def subreaper_enabled() -> bool:
    """Whether this process became a child subreaper (``enable_subreaper`` succeeded)."""
    return _enabled


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def ticks_now() -> int | None:
    """Clock ticks since boot, the unit of a process's start time in /proc (rounded
    down by one tick, so a process started right after this is never older)."""
    try:
        uptime = float(read_small("/proc/uptime").split()[0])
        return max(0, int(uptime * os.sysconf("SC_CLK_TCK")) - 1)
    except (OSError, ValueError, IndexError):
        return None


def own_children() -> set[int] | None:
    """This process's children (all threads), from /proc; None when it cannot tell."""
    try:
        tasks = os.listdir("/proc/self/task")
        children: set[int] = set()
        for tid in tasks:
            children.update(int(pid) for pid in read_small(f"/proc/self/task/{tid}/children", 1 << 20).split())
        return children
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True while the process runs; a zombie (dead, not yet reaped) does not count."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when `pid` exits (Linux >= 5.3), or None."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None


def reap_if_exited(pid: int) -> bool:
    """Reap ``pid`` if it has exited; True when it is gone."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True

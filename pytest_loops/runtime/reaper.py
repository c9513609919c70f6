"""What outlives the harness: a cgroup per command and a watchdog process.

A SIGKILLed harness cannot clean up after itself, so on Linux two things make a
command's process tree die with it whatever the tree did with sessions or its
environment:

* a *cgroup leaf per command*, where a cgroup hierarchy is writable (cgroup v2,
  else the v1 ``pids`` or ``freezer`` controller). The command's first process
  joins it before ``exec``; every descendant stays in it, so killing the leaf is
  exact (``cgroup.kill`` on v2, a kill-until-empty loop on v1).
* a *watchdog*, started once per harness process (``python -I -S`` on this file,
  in its own session). The harness tells it, one line per event through a pipe,
  each command's process group, start time, cgroup and the members it learns.
  When the pipe hits EOF or the harness's pidfd fires, it kills whatever the
  harness had not finished cleaning up (cgroup first, then the process group and
  every known member, and every process whose environment carries one of the
  harness's command tags, which covers a command the harness was killed before
  announcing; with their descendants, stopped before they are killed so none can
  fork away), removes the cgroup directories and exits. A clean exit
  leaves nothing registered, so the watchdog just exits.

Commands get no PR_SET_PDEATHSIG: from Python it takes a ``preexec_fn``, which
forces a full fork() of the harness for every command (+16 ms each, measured),
or an extra ``setpriv`` exec (+9 ms); the cgroup and the watchdog already cover
a harness that dies.

``PYTEST_LOOPS_CGROUP`` picks the hierarchy: ``v2``, ``v1`` or ``off`` (default:
the first that works). This file imports only the standard library: the
watchdog runs it as a script, without the package.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import sys
import threading
import time
from collections import namedtuple
from typing import Any

CGROUP_VARIABLE = "PYTEST_LOOPS_CGROUP"
TAG_VARIABLE = "PYTEST_LOOPS_COMMAND_TAG"
"""Set in every command's environment to ``HARNESS_PID-N-NS``: traces orphans back to
their command, and every process of a harness's commands back to the harness."""
_LEAF_PREFIX = "pytest-loops-"


# --- the process table ------------------------------------------------------


# One line of the process table, as read from /proc/PID/stat; ``start`` is in clock
# ticks since boot, so (pid, start) never repeats. A named tuple, not a dataclass:
# the watchdog imports as little as it can, to start fast.
Proc = namedtuple("Proc", "pid ppid pgid sid start zombie")


def read_small(path: str, limit: int = 1 << 16) -> bytes:
    """Up to ``limit`` bytes of a small file (/proc, cgroup files), read with plain
    read(2) calls instead of Python's buffered file objects; raises OSError as open() does."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, limit)
        if not data or len(data) >= limit:
            return data
        chunks = [data]
        while len(data) < limit and (more := os.read(fd, limit - len(data))):
            chunks.append(more)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def read_stat(pid: int) -> Proc | None:
    try:
        data = read_small(f"/proc/{pid}/stat")
    except OSError:
        return None
    # the command name is in parentheses and may itself contain ") "
    fields = data[data.rindex(b")") + 2 :].split()
    try:
        return Proc(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]),
                    start=int(fields[19]), zombie=fields[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def snapshot() -> dict[int, Proc] | None:
    """Every visible process by pid, or None where there is no /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, Proc] = {}
    for name in names:
        if name.isdigit():
            proc = read_stat(int(name))
            if proc is not None:
                table[proc.pid] = proc
    return table if table else None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --- cgroups --------------------------------------------------------------------


class Cgroup:
    """One command's cgroup leaf (v2, or a v1 ``pids``/``freezer`` hierarchy)."""

    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    def __repr__(self) -> str:
        return f"Cgroup({self.path!r}, v{self.version})"

    def pids(self) -> list[int]:
        """The processes in the leaf and in any cgroup made below it (a nested harness's)."""
        pids: list[int] = []
        for directory, _subdirs, _files in os.walk(self.path):
            try:
                with open(os.path.join(directory, "cgroup.procs"), "rb") as f:
                    pids += [int(word) for word in f.read().split()]
            except (OSError, ValueError):
                pass
        return pids

    def empty(self) -> bool:
        """No process in the leaf or below it. On v2 one read of ``cgroup.events``
        (its ``populated`` line covers the whole subtree); otherwise :meth:`pids`."""
        if self.version == 2:
            try:
                for line in read_small(os.path.join(self.path, "cgroup.events")).splitlines():
                    if line.startswith(b"populated "):
                        return line.split()[1] == b"0"
            except (OSError, IndexError):
                pass
        return not self.pids()

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join."""
        return os.path.join(self.path, "cgroup.procs")

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            _kill(pid, sig)

    def kill(self, within: float = 2.0) -> None:
        """SIGKILL every process in the leaf; new forks cannot get away."""
        if self.version == 2 and _write(os.path.join(self.path, "cgroup.kill"), "1"):
            return
        freezer = os.path.join(self.path, "freezer.state")
        frozen = self.version == 1 and _write(freezer, "FROZEN")
        end = time.monotonic() + within
        try:
            while True:
                pids = self.pids()
                if not pids or time.monotonic() > end:
                    return
                for pid in pids:
                    _kill(pid, signal.SIGKILL)
                time.sleep(0.002)
        finally:
            if frozen:
                _write(freezer, "THAWED")

    def remove(self, within: float = 2.0) -> bool:
        """rmdir the leaf, waiting for killed members to be gone from it; False if it stays."""
        try:
            os.rmdir(self.path)  # the common case: an empty leaf with nothing below it
            return True
        except FileNotFoundError:
            return True
        except OSError:
            pass
        end = time.monotonic() + within
        me = os.getpid()
        while True:
            for pid in self.pids():
                # a killed member re-parented to us (a subreaper) is our zombie: on some
                # kernels it keeps the leaf busy until it is reaped
                entry = read_stat(pid)
                if entry is not None and entry.zombie and entry.ppid == me:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
            for directory, _subdirs, _files in os.walk(self.path, topdown=False):
                try:
                    os.rmdir(directory)  # cgroups below it first: a nested harness's
                except OSError:
                    pass
            if not os.path.exists(self.path):
                return True
            if time.monotonic() > end:
                return False
            time.sleep(0.005)


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def _hierarchies() -> list[tuple[str, int]]:
    """Where this process's cgroups are, best first: [(directory, version)]."""
    choice = os.environ.get(CGROUP_VARIABLE, "").strip().lower()
    if choice == "off" or not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
        with open("/proc/self/cgroup") as f:
            own = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return []
    found: list[tuple[str, int]] = []
    for fields in mounts:
        try:
            dash = fields.index("-")
        except ValueError:
            continue
        root, point, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3]
        if fstype == "cgroup2" and choice in ("", "v2"):
            paths = [p for i, c, p in (x for x in own if len(x) == 3) if i == "0" and c == ""]
            version = 2
        elif fstype == "cgroup" and choice in ("", "v1") and ({"pids", "freezer"} & set(options.split(","))):
            wanted = {"pids", "freezer"} & set(options.split(","))
            paths = [p for _i, c, p in (x for x in own if len(x) == 3) if wanted & set(c.split(","))]
            version = 1
        else:
            continue
        if not paths:
            continue
        path = paths[0]
        if root != "/" and (path == root or path.startswith(root + "/")):
            path = path[len(root):]
        directory = os.path.join(point, path.lstrip("/"))
        if os.path.isdir(directory) and os.access(directory, os.W_OK):
            found.append((directory, version))
    found.sort(key=lambda item: (-item[1], "freezer" in item[0]))  # v2, then v1 pids, then freezer
    return found


_leaves = itertools.count(1)
_bases_lock = threading.Lock()
_bases: list[tuple[str, int]] | None = None


def new_cgroup() -> Cgroup | None:
    """A fresh, empty cgroup leaf for one command, or None where none can be made."""
    global _bases
    with _bases_lock:
        if _bases is None:
            _bases = _hierarchies()
        for base in list(_bases):
            path = os.path.join(base[0], f"{_LEAF_PREFIX}{os.getpid()}-{next(_leaves)}")
            try:
                os.mkdir(path)
            except OSError:
                _bases.remove(base)  # not writable after all: never try it again
                continue
            _watchdog.base(*base)
            return Cgroup(path, base[1])
    return None


# --- the watchdog, harness side -----------------------------------------------------


class Watchdog:
    """The harness's end of the watchdog: one line per event, never blocking for long."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Any = None  # the watchdog's Popen
        self._fd: int | None = None
        self._bases: list[tuple[str, int]] = []  # where this harness makes cgroup leaves
        self._tried = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> bool:
        """Start the watchdog once per process (Linux); False where it cannot run."""
        if self._tried:
            return self._fd is not None
        with self._lock:
            if self._tried:
                return self._fd is not None
            self._tried = True
            if not sys.platform.startswith("linux") or not sys.executable:
                return False
            import subprocess

            # imported here: this file also runs as a script of its own (``-I -S``)
            from pytest_loops.runtime.procimage import helper_environment

            read_end, write_end = os.pipe()
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), "watch", str(os.getpid())],
                    stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True, close_fds=True, cwd="/",
                    env=helper_environment())  # never the signing key: its environ is readable
            except OSError:
                os.close(write_end)
                return False
            finally:
                os.close(read_end)
            self._fd = write_end
            for directory, version in self._bases:
                self.send("H", directory, version)
            import atexit

            atexit.register(self._stop)
            return True

    def _stop(self) -> None:
        """At a clean exit: close the pipe (nothing is registered, so the watchdog just
        ends) and reap it, rather than leave a running child for the interpreter to warn of."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=2)
            except Exception:  # still busy with leftovers: it finishes on its own
                pass

    def base(self, directory: str, version: int) -> None:
        """Tell the watchdog, once, where this harness makes cgroup leaves: after the
        harness dies it kills every leaf there named after it, announced or not."""
        if (directory, version) in self._bases:
            return
        self._bases.append((directory, version))
        self.send("H", directory, version)

    def send(self, *words: object) -> None:
        fd = self._fd
        if fd is None:
            return
        line = (" ".join(str(w) for w in words) + "\n").encode()
        try:
            os.write(fd, line)  # under PIPE_BUF: one atomic write, whatever the thread
        except OSError:  # the watchdog is gone: carry on without it
            self._fd = None


_watchdog = Watchdog()


def watchdog() -> Watchdog:
    """This process's watchdog, started on first use."""
    _watchdog.start()
    return _watchdog


# --- the watchdog, its own side -----------------------------------------------------


class _Command:
    def __init__(self, pgid: int, start: int, cgroup: Cgroup | None) -> None:
        self.pgid, self.start, self.cgroup = pgid, start, cgroup
        self.members: dict[int, int] = {}  # pid -> start time


def with_descendants(found: set[int], table: dict[int, Proc]) -> set[int]:
    """Add to ``found`` (in place, and return it) every descendant in ``table``."""
    children: dict[int, list[int]] = {}
    for entry in table.values():
        children.setdefault(entry.ppid, []).append(entry.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _doomed(command: _Command, table: dict[int, Proc]) -> set[int]:
    """Every live process of a command: known members, its group and session while
    the id is still its own, and all their descendants."""
    found = {pid for pid, start in command.members.items()
             if pid in table and table[pid].start == start}
    leader = table.get(command.pgid)
    if command.pgid > 0 and (leader is None or leader.start == command.start):  # the id was not reused
        found |= {p.pid for p in table.values() if command.pgid in (p.pgid, p.sid)}
    if command.cgroup is not None:
        found |= {pid for pid in command.cgroup.pids() if pid in table}
    with_descendants(found, table)
    found.discard(os.getpid())
    return {pid for pid in found if not table[pid].zombie} if table else found


def tagged(harness: int, table: dict[int, Proc]) -> set[int]:
    """Live processes whose environment carries a command tag of ``harness``: the
    processes of its commands, also of one it was killed before it could announce."""
    needle = f"{TAG_VARIABLE}={harness}-".encode()
    found: set[int] = set()
    for pid, entry in table.items():
        if entry.zombie or pid == os.getpid():
            continue
        if environ_has(pid, needle):
            found.add(pid)
    return found


def environ_has(pid: int, needle: bytes) -> bool:
    """Whether a process's environment holds an entry starting with ``needle``."""
    try:
        data = read_small(f"/proc/{pid}/environ", 1 << 26)  # the kernel caps it far below
    except OSError:
        return False
    return data.startswith(needle) or b"\0" + needle in data


def kill_commands(commands: list[_Command], harness: int | None = None) -> None:
    """Kill what is left of the commands: cgroups at once, then stop everything else
    that can be traced to them, or by its command tag to ``harness`` (so nothing
    forks away), and kill it."""
    for command in commands:
        if command.cgroup is not None:
            command.cgroup.kill()
    stopped: set[int] = set()
    for _round in range(20):
        table = snapshot() or {}
        new = set().union(*(_doomed(c, table) for c in commands)) - stopped
        if harness is not None:
            new |= with_descendants(tagged(harness, table), table) - stopped - {os.getpid()}
        if not new:
            break
        for pid in new:
            _kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        _kill(pid, signal.SIGKILL)
    for command in commands:
        if command.cgroup is not None:
            command.cgroup.remove()


def _watch(harness: int) -> None:
    """Read events until the harness is gone, then kill what it left behind."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    commands: dict[str, _Command] = {}
    bases: list[tuple[str, int]] = []
    try:
        pidfd: int | None = os.pidfd_open(harness)
    except (AttributeError, OSError):
        pidfd = None
    buffer = b""
    gone = False
    while True:
        waiting = [0] if pidfd is None else [0, pidfd]
        # once the harness is gone, read what it wrote before it died, then stop
        pause = 0 if gone else None if pidfd is not None else 0.5
        ready = select.select(waiting, [], [], pause)[0]
        gone = gone or pidfd in ready or (pidfd is None and os.getppid() != harness)
        data = os.read(0, 1 << 16) if 0 in ready else b""
        if not data and (gone or 0 in ready):
            break
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            _event(commands, line.decode(errors="replace").split(), bases)
    # a command the harness started but was killed before announcing is found by its
    # leaf (named after the harness) and by its tag
    kill_commands(list(commands.values()) + _unannounced(bases, harness, commands), harness)


def _unannounced(bases: list[tuple[str, int]], harness: int, known: dict[str, _Command]) -> list[_Command]:
    """The harness's cgroup leaves no announced command names: commands it never
    announced (short ones are not) or was killed before announcing."""
    named = {c.cgroup.path for c in known.values() if c.cgroup is not None}
    found = []
    prefix = f"{_LEAF_PREFIX}{harness}-"
    for directory, version in bases:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if name.startswith(prefix) and path not in named:
                found.append(_Command(0, 0, Cgroup(path, version)))
    return found


def _event(commands: dict[str, _Command], words: list[str], bases: list[tuple[str, int]] | None = None) -> None:
    try:
        if words[0] == "H":  # H cgroup-base-dir version: where the harness makes leaves
            if bases is not None and (words[1], int(words[2])) not in bases:
                bases.append((words[1], int(words[2])))
        elif words[0] == "C":  # C id pgid start cgroup-dir|- version
            cgroup = None if words[4] == "-" else Cgroup(words[4], int(words[5]))
            commands[words[1]] = _Command(int(words[2]), int(words[3]), cgroup)
        elif words[0] == "P":  # P id pid start
            commands[words[1]].members[int(words[2])] = int(words[3])
        elif words[0] == "D":  # D id: the harness cleaned it up
            commands.pop(words[1], None)
    except (IndexError, ValueError, KeyError):
        pass


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "watch":
    _watch(int(sys.argv[2]))

"""Subprocesses for checks and revise steps: own session, deadline, capped log, tail.

Every command runs through ``/bin/sh`` in a new session, with stdin from
``/dev/null`` and stdout+stderr going through a pipe that a thread copies into
a file, at most ``output_cap`` bytes of it, copied by the thread that waits for the
command (see :mod:`pytest_loops.runtime.capture`).
No descendant outlives its command: when the command ends or its deadline
passes, its process group, every descendant seen while it ran, and
every orphan that can be traced back to it get SIGTERM, then SIGKILL after a
short grace, and are reaped.

On Linux the harness makes itself a child subreaper, so descendants that
escape with ``setsid`` are re-parented to it instead of to init, and it walks
``/proc`` while a command runs to learn the command's whole process tree.
Orphans are attributed to a command by that tree, by its process group or
session, or by a per-command tag in their environment; nothing else is ever
signalled. Where a cgroup hierarchy is writable, each command also gets a
cgroup leaf of its own, which makes all this exact, and a watchdog process
kills what is left if the harness itself is killed (see :mod:`pytest_loops.runtime.reaper`).
Elsewhere only the process group is cleaned up. Signalling, reaping and reading
single processes by pid is :mod:`pytest_loops.runtime.pids`.
"""

from __future__ import annotations

import itertools
import os
import select
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_loops.defaults import DEFAULT_OUTPUT_CAP
from pytest_loops.limits import create_fresh
from pytest_loops.results import CommandResult
from pytest_loops.runtime import reaper
from pytest_loops.runtime.capture import Capture, close_parent_ends, grow_pipe, stdin_file
from pytest_loops.runtime.pids import (
    enable_subreaper,
    open_pidfd,
    own_children,
    pid_alive,
    reap_if_exited,
    signal_group,
    signal_pid,
    subreaper_enabled,
    ticks_now,
)
from pytest_loops.runtime.reaper import Proc, read_stat, snapshot

if TYPE_CHECKING:
    from pytest_loops.sandbox import Confinement

__all__ = ["ProcessRunner", "TerminationGuard", "TAG_VARIABLE", "DEFAULT_OUTPUT_CAP", "pid_alive"]

TAG_VARIABLE = reaper.TAG_VARIABLE

_POLL_MAX = 0.01  # seconds between exit checks: keeps deadlines precise to ~10 ms
_SCAN_FIRST = 0.05  # first /proc walk: most commands that escape live longer; sooner costs short ones
_SCAN_MAX = 0.2  # later walks further apart, to stay cheap on long commands
_REAP_WAIT = 2.0  # how long to wait for SIGKILLed processes to become reapable
# the command's shell joins its cgroup leaf before it runs anything, then runs the
# command itself: one shell, as `/bin/sh -c COMMAND` ($0 is /bin/sh, no arguments,
# the same pid). A write from Python after Popen() would race with the command's
# first forks; a preexec_fn costs a full fork() of the harness; a second shell
# (`exec /bin/sh -c "$1"`) costs an exec per command.
_JOIN = "{{ echo $$ >{procs}; }} 2>/dev/null; {command}"


def _joined(procs: str, command: str) -> list[str]:
    """``/bin/sh -c`` running ``command`` after the shell joined the cgroup leaf ``procs``."""
    return ["/bin/sh", "-c", _JOIN.format(procs=shlex.quote(procs), command=command)]

_tags = itertools.count(1)  # with the pid, makes each command's tag unique


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# --- one command in flight ---------------------------------------------------


class _Running:
    """What is known about one running command's processes.

    Read by the thread running the command and by :meth:`ProcessRunner.terminate_all`
    (another thread or a signal handler), so it holds no lock: every update is a
    single dict/set operation.
    """

    def __init__(self, proc: subprocess.Popen[bytes], tag: str, cgroup: reaper.Cgroup | None = None) -> None:
        self.proc = proc
        self.cgroup = cgroup  # its cgroup leaf: every descendant, whatever it did
        self.dog = reaper.watchdog()  # told every member, to kill them if the harness dies
        self.pid = proc.pid  # also its process group and session id
        self.tag = tag
        self.needle = f"{TAG_VARIABLE}={tag}".encode() + b"\0"
        self.known: dict[int, int] = {}  # pid -> start time of every member ever seen
        self.not_ours: set[tuple[int, int]] = set()  # children of ours without the tag
        self.group_gone = False
        self.terminated = False  # terminate_all() asked for it: stop waiting, clean up
        self.children_before: set[int] = set()  # our children when it started: never its own
        self.main_start: int | None = None  # the main process's start time (clock ticks)
        self.announced = False  # the watchdog was told of it ("C")
        self.sole: Callable[[], bool] = lambda: False  # is it the only command running?

    def announce(self) -> None:
        """Tell the watchdog this command's group, start time and leaf, once."""
        if self.announced:
            return
        self.announced = True
        started = read_stat(self.pid)
        cgroup = self.cgroup
        self.dog.send("C", self.tag, self.pid, started.start if started else 0,
                      cgroup.path if cgroup is not None else "-", cgroup.version if cgroup is not None else 0)

    def members(self, table: dict[int, Proc] | None) -> dict[int, Proc]:
        """The processes in ``table`` that belong to this command (and remember them)."""
        if table is None:
            return {}
        me = os.getpid()
        found: set[int] = set()
        # the main process only while unreaped: after that its pid may be reused
        if self.proc.returncode is None and self.pid in table:
            found.add(self.pid)
        for pid, start in list(self.known.items()):
            entry = table.get(pid)
            if entry is not None and entry.start == start:
                found.add(pid)
        if self.cgroup is not None:
            found.update(pid for pid in self.cgroup.pids() if pid in table)
        if not self.group_gone:
            # while any member of the group/session exists, its id cannot be reused
            group = [p.pid for p in table.values() if self.pid in (p.pgid, p.sid)]
            if group:
                found.update(group)
            elif self.proc.returncode is not None:
                self.group_gone = True
        sole = self.sole()
        for entry in table.values():  # orphans re-parented to us (we are a subreaper)
            if entry.ppid != me or entry.pid in found or entry.zombie:
                continue
            key = (entry.pid, entry.start)
            if key in self.not_ours:
                continue
            if reaper.environ_has(entry.pid, self.needle):
                found.add(entry.pid)
            elif sole and entry.pid not in self.children_before and self.main_start is not None \
                    and entry.start >= self.main_start:
                # the only command running: a new child of ours started after it can only
                # be its escaped descendant, whatever it did to its environment
                found.add(entry.pid)
            else:
                self.not_ours.add(key)
        reaper.with_descendants(found, table)
        found.discard(me)
        found.discard(self.dog.pid)
        result = {pid: table[pid] for pid in found}
        if result:
            self.announce()  # its members are only heard of after the command itself
        for pid, entry in result.items():
            if self.known.get(pid) != entry.start:
                self.dog.send("P", self.tag, pid, entry.start)
            self.known[pid] = entry.start
        return result

    def signal(self, sig: int, table: dict[int, Proc] | None) -> list[Proc]:
        """Send ``sig`` to the group and every live member; return the live members."""
        if not self.group_gone and not signal_group(self.pid, sig) and self.proc.returncode is not None:
            self.group_gone = True
        if self.cgroup is not None:
            if sig == signal.SIGKILL:
                self.cgroup.kill(within=0)
            else:
                self.cgroup.signal(sig)
        live = [p for p in self.members(table).values() if not p.zombie]
        for entry in live:
            signal_pid(entry.pid, sig)
        return live

    def alive(self) -> bool:
        """Whether any process of this command still runs (zombies do not count)."""
        table = snapshot()
        if table is None:
            if self.proc.returncode is None:
                return True
            return not self.group_gone and signal_group(self.pid, 0)
        return any(not p.zombie for p in self.members(table).values())


# --- the runner ----------------------------------------------------------------


class ProcessRunner:
    """Runs shell commands for checks and revise steps; see the module docstring.

    Several threads may share one runner. On Linux the first :meth:`run` makes
    this process a child subreaper for the rest of its life, so that escaped
    descendants come back to it to be killed and reaped.

    :param grace_seconds: time between SIGTERM and SIGKILL when a command is stopped.
    :param tail_chars: how many characters of the output end up in ``CommandResult.tail``.
    :param output_cap: bytes of a command's output kept in its file (0: no cap); beyond
        it the first and last halves are kept, with a line saying how much was dropped.
    """

    def __init__(self, *, grace_seconds: float = 0.2, tail_chars: int = 2000,
                 output_cap: int = DEFAULT_OUTPUT_CAP) -> None:
        self.grace_seconds = max(0.0, float(grace_seconds))
        self.tail_chars = max(0, int(tail_chars))
        self.output_cap = max(0, int(output_cap))
        self._active: dict[int, _Running] = {}
        self._strays: dict[int, int] = {}  # killed but not yet reaped: pid -> start time
        # leaves a killed member kept busy past the wait: removed on a later run (the
        # watchdog removes what is left when the harness exits)
        self._leaves: list[reaper.Cgroup] = []
        self._terminations = 0  # bumped by every terminate_all(), seen by starting commands
        self._starting: set[int] = set()  # threads between Popen() and registration
        self._deferred: list[Callable[[], None]] = []  # signal behaviour held back meanwhile

    def run(
        self,
        command: str,
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        output_path: str | os.PathLike[str] | None = None,
        sandbox: Confinement | None = None,
        pass_fds: Sequence[int] = (),
        tagged: bool = True,
        stdin_data: bytes | None = None,
    ) -> CommandResult:
        """Run ``command`` with ``/bin/sh`` in ``cwd`` and wait for it, at most ``timeout`` s.

        Output (stdout and stderr together) goes through a pipe to ``output_path``
        (parent directories are created) or to a temporary file that is deleted
        once its tail is read; at most ``output_cap`` bytes of it are kept.
        ``env=None`` inherits ``os.environ``. A command that cannot start gives ``exit_code=None`` and a
        one-line ``start_error``; this method does not raise for that. A command killed by a signal has a
        negative ``exit_code`` (``-signal``), as in :mod:`subprocess`.

        ``sandbox``: the command runs confined (:mod:`pytest_loops.sandbox`); the
        harness's tag stays on the confining process, never inside. ``pass_fds``: open
        descriptors the command inherits (the clean room's witness channel). ``tagged=False``:
        no tag in the command's environment (a judged run carries no harness variable); its
        escaped processes are found by its tree, its cgroup and by running alone.
        ``stdin_data``: what it reads on its standard input (:func:`stdin_file`; else ``/dev/null``).
        """
        started = time.monotonic()

        def failed(reason: str) -> CommandResult:
            return CommandResult(
                command=command,
                exit_code=None,
                duration_s=time.monotonic() - started,
                start_error=_one_line(reason),
            )

        problem = _cwd_problem(cwd)
        if problem:
            return failed(problem)
        enable_subreaper()
        dog = reaper.watchdog()  # before the command: never taken for one of its children
        if self._strays:
            self._reap_strays(snapshot())
        if self._leaves:
            self.sweep_leaves()

        tag = f"{os.getpid()}-{next(_tags)}-{time.monotonic_ns()}"
        child_env = dict(os.environ if env is None else env)
        if tagged:
            child_env[TAG_VARIABLE] = tag
        else:
            child_env.pop(TAG_VARIABLE, None)
        keep_output = output_path is not None
        try:
            if output_path is not None:
                path = os.fspath(output_path)
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                out_fd = create_fresh(path)  # never through a link left in the run directory
            else:
                out_fd, path = tempfile.mkstemp(prefix="pytest-loops-", suffix=".out")
        except OSError as exc:
            return failed(f"cannot write the output file {output_path}: {exc.strerror or exc}")

        running: _Running | None = None
        capture: Capture | None = None
        cgroup = reaper.new_cgroup()
        children_before = own_children() or set()
        ticks_before = ticks_now()
        terminations = self._terminations
        thread = threading.get_ident()
        try:
            # until the command is registered, a TerminationGuard defers raising in
            # this thread: an exception inside Popen() would lose the running child
            self._starting.add(thread)
            pipe_r, pipe_w = os.pipe()
            grow_pipe(pipe_w)
            launch, stdin = None, subprocess.DEVNULL
            try:
                argv = ["/bin/sh", "-c", command]
                if sandbox is not None:
                    launch = sandbox.launch(argv)
                    argv = launch.argv
                    child_env.update(launch.env_set)
                    child_env.update({k: v for k, v in launch.env_if_set.items() if k in child_env})
                if cgroup is not None:
                    argv = _joined(cgroup.procs, "exec " + shlex.join(argv) if sandbox is not None else command)
                stdin = stdin_file(stdin_data)
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=child_env,
                    stdin=stdin,
                    stdout=pipe_w,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(*pass_fds, *(launch.pass_fds if launch is not None else ())),
                    preexec_fn=launch.preexec_fn if launch is not None else None,
                )
            except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
                os.close(pipe_r)
                os.close(out_fd)
                _unlink(path)
                self._drop_cgroup(cgroup)
                reason = getattr(exc, "strerror", None) or str(exc)
                return failed(f"cannot start the command in {os.fspath(cwd)}: {reason}")
            finally:
                close_parent_ends(pipe_w, stdin)  # the child has its own copies
                if launch is not None:
                    launch.close()
            # 4 bytes per character at most, plus room for a sequence cut at the start
            capture = Capture(pipe_r, out_fd, self.output_cap,
                              keep_last=4 * self.tail_chars + 4 if self.tail_chars else 0)
            # registered at once, so terminate_all() from a signal handler sees it
            running = _Running(proc, tag, cgroup)
            if cgroup is None:
                # no leaf to find it by: the watchdog is told its group at once. A command
                # in a leaf is announced only when it lives long enough to be scanned
                # (its members are sent then): should the harness die first, the watchdog
                # finds its leaf by name and its processes by their tag
                running.announce()
            running.children_before = children_before
            running.main_start = ticks_before
            # another command registered, or between its Popen() and registration
            # (fan-out runs candidates at once): then a new child may be that one's
            running.sole = lambda: len(self._active) == 1 and not self._starting
            self._active[id(running)] = running
            self._starting.discard(thread)
            self._resume_deferred()
            if self._terminations != terminations:
                # terminate_all() ran while this command was starting: it counts as running
                running.terminated = True
            timed_out = self._wait(running, None if timeout is None else started + timeout, capture)
            self._stop(running)
        except BaseException:
            # KeyboardInterrupt or SystemExit from a signal handler: leave nothing behind
            if running is not None:
                self._stop(running)
            if capture is not None:
                capture.finish()
            if not keep_output:
                _unlink(path)
            raise
        finally:
            self._starting.discard(thread)
            if running is not None:
                self._active.pop(id(running), None)
                if self._drop_cgroup(running.cgroup) and running.announced:
                    dog.send("D", tag)
            self._resume_deferred()
        size = capture.finish()
        duration = time.monotonic() - started

        tail = capture.last.decode("utf-8", errors="replace")[-self.tail_chars:] if self.tail_chars else ""
        if not keep_output:
            _unlink(path)
        return CommandResult(
            command=command,
            exit_code=proc.returncode,
            duration_s=duration,
            tail=tail,
            output_file=path if keep_output else None,
            output_bytes=size,
            timed_out=timed_out,
            output_sha256=capture.sha256() if keep_output else None,
        )

    def terminate_all(self) -> None:
        """Kill every command this runner is running now, with all its descendants.

        SIGTERM first, SIGKILL after ``grace_seconds``. Safe to call from a
        signal handler or another thread; the threads running those commands
        then return (or unwind) as usual.
        """
        self._terminations += 1
        runs = list(self._active.values())
        if not runs:
            return
        for running in runs:
            running.terminated = True
            running.signal(signal.SIGTERM, snapshot())
        end = time.monotonic() + self.grace_seconds
        while time.monotonic() < end and any(r.alive() for r in runs):
            time.sleep(_POLL_MAX)
        for running in runs:
            running.signal(signal.SIGKILL, snapshot())

    # -- internals --

    def _resume_deferred(self) -> None:
        """Carry out what a signal handler held back while a command was starting."""
        while self._deferred and threading.get_ident() not in self._starting:
            self._deferred.pop()()

    def _wait(self, running: _Running, deadline: float | None, capture: Capture | None = None) -> bool:
        """Wait for the main process, copying its output meanwhile; True when the
        deadline came first.

        On Linux a pidfd wakes the wait the moment the process exits, so a short
        command costs no polling delay; elsewhere it polls with a short backoff.
        """
        proc = running.proc
        pidfd = open_pidfd(proc.pid)
        delay = 0.001
        scan_gap = _SCAN_FIRST
        next_scan = time.monotonic() + scan_gap
        try:
            while proc.poll() is None and not running.terminated:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return True
                if now >= next_scan:
                    running.members(snapshot())  # learn descendants before they escape
                    scan_gap = min(scan_gap * 1.5, _SCAN_MAX)
                    next_scan = time.monotonic() + scan_gap
                if pidfd is not None:
                    pause = max(0.0, next_scan - now)
                else:
                    pause = min(delay, max(0.0, next_scan - now))
                    delay = min(delay * 2, _POLL_MAX)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - now))
                # a terminate_all from another thread must be noticed promptly too
                pause = max(min(pause, _POLL_MAX if pidfd is None else 0.05), 0.0005)
                watched = [] if pidfd is None else [pidfd]
                if capture is not None and not capture.at_end:
                    watched.append(capture.fileno())
                if watched:
                    ready = select.select(watched, [], [], pause)[0]
                    if capture is not None and capture.fileno() in ready:
                        capture.pump()
                else:
                    time.sleep(pause)
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _stop(self, running: _Running) -> None:
        """SIGTERM everything of the command, SIGKILL what is left after the grace, reap.

        Loops until nothing of the command is left, since members may still fork;
        gives up waiting for zombies after a while and reaps those on a later run.
        """
        proc = running.proc
        if self._nothing_left(running):
            return
        kill_at: float | None = None
        give_up: float | None = None
        pause = 0.0002  # a member that is just exiting (a sandbox's own init) is usually gone at once
        while True:
            proc.poll()
            table = snapshot()
            members = {
                pid: p
                for pid, p in running.members(table).items()
                if not self._reaped(p, running.pid)
            }
            live = proc.returncode is None or any(not p.zombie for p in members.values())
            if table is None and not live:  # no /proc: only the group can be asked
                live = not running.group_gone and signal_group(running.pid, 0)
            if not live and not members:
                break
            now = time.monotonic()
            if live and kill_at is None:
                running.signal(signal.SIGTERM, table)
                kill_at = now + self.grace_seconds
            elif live and kill_at is not None and now >= kill_at:
                running.signal(signal.SIGKILL, table)
                give_up = give_up or now + _REAP_WAIT
            elif not live:  # only zombies left, waiting to be re-parented to us
                give_up = give_up or now + _REAP_WAIT
            if give_up is not None and now >= give_up:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        if proc.returncode is None:  # unkillable main process (D state): wait it out
            proc.wait()
        for pid, entry in members.items():  # reap later what did not die in time
            self._strays[pid] = entry.start

    def _nothing_left(self, running: _Running) -> bool:
        """The common case, told without walking /proc: the command exited by itself,
        its process group is empty, no other member was ever seen, and (we being a
        subreaper, so escaped orphans become our children) we have no child but the
        main processes of other running commands."""
        if running.proc.poll() is None or running.terminated or not subreaper_enabled():
            return False
        if any(pid != running.pid for pid in running.known) or signal_group(running.pid, 0):
            return False
        if running.cgroup is not None and not running.cgroup.empty():
            return False
        children = own_children()
        if children is None:
            return False
        others = {r.pid for r in list(self._active.values()) if r is not running} | {running.dog.pid}
        return children <= others

    def _drop_cgroup(self, cgroup: reaper.Cgroup | None) -> bool:
        """Remove a command's cgroup leaf; False while something is still in it (kept,
        and tried again by :meth:`sweep_leaves`)."""
        if cgroup is None or cgroup.remove(within=2.0):  # only waits when something was killed in it
            return True
        self._leaves.append(cgroup)
        return False

    def sweep_leaves(self) -> int:
        """Remove the leaves kept busy when their commands ended, where they are empty
        now; the number still left."""
        self._leaves = [leaf for leaf in self._leaves if not leaf.remove(within=0)]
        return len(self._leaves)

    @staticmethod
    def _reaped(entry: Proc, main_pid: int) -> bool:
        """waitpid a member that is our own zombie child; never the main process,
        which belongs to its Popen object."""
        if entry.pid == main_pid or not entry.zombie or entry.ppid != os.getpid():
            return False
        return reap_if_exited(entry.pid)

    def _reap_strays(self, table: dict[int, Proc] | None) -> None:
        if table is None:
            return
        me = os.getpid()
        for pid, start in list(self._strays.items()):
            entry = table.get(pid)
            if entry is None or entry.start != start:
                self._strays.pop(pid, None)
            elif entry.zombie and entry.ppid == me:
                reap_if_exited(pid)
                self._strays.pop(pid, None)
            elif not entry.zombie:
                signal_pid(pid, signal.SIGKILL)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _cwd_problem(cwd: Any) -> str | None:
    try:
        path = os.fspath(cwd)
    except TypeError:
        return f"the working directory is not a path: {cwd!r}"
    if not os.path.exists(path):
        return f"the working directory does not exist: {path}"
    if not os.path.isdir(path):
        return f"the working directory is not a directory: {path}"
    return None


# --- signals ---------------------------------------------------------------------


class TerminationGuard:
    """While active, SIGTERM and SIGINT first end every command of ``runner``.

    Then the signal behaves as before: the previous Python handler is called if
    there was one, else SIGINT raises KeyboardInterrupt and SIGTERM raises
    ``SystemExit(143)``. A signal that was ignored stays ignored. Previous
    handlers are restored on exit. Outside the main thread (where Python cannot
    install handlers) the guard does nothing.
    """

    _SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, runner: ProcessRunner) -> None:
        self.runner = runner
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> TerminationGuard:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self._SIGNALS:
            previous = signal.getsignal(sig)
            if previous == signal.SIG_IGN:
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        while self._previous:
            sig, previous = self._previous.popitem()
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        runner = self.runner
        previous = self._previous.get(signum)
        runner.terminate_all()
        if threading.get_ident() in runner._starting:
            # raising inside Popen() would orphan the child: the runner raises once
            # the command is registered (terminate_all() already marked it)
            runner._deferred.append(lambda: self._resume(signum, frame, previous))
            return
        self._resume(signum, frame, previous)

    @staticmethod
    def _resume(signum: int, frame: FrameType | None, previous: Any) -> None:
        """Behave as the signal did before the guard."""
        if callable(previous):
            previous(signum, frame)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

"""Watch loops: a loop that stays up and runs again when its source says something changed.

A watch runs the loop once, then waits for a *tick*: a settled batch of changes in
the watched files (:class:`FileSource`) or a poll command answering ready
(:class:`PollSource`). Each tick carries a state digest. A tick whose digest equals
the digest after the last run is *idle*: it is recorded as an event, runs nothing,
counts toward no guard except the budget, and never yields SUCCESS by itself. A
tick with a new digest runs the loop once more through the engine (``run_once``):
its checks and, while they fail, its revise step.

The guards span the whole watch: ``max_iter`` caps the iterations of every tick's
run together (0: no cap, allowed in watch mode only), the budget is the watch's
wall clock (idle time included); no-progress and escalate-after judge each tick's
run. A ``silence`` window ends the watch NO_PROGRESS (reason
:data:`~pytest_loops.verdict.WATCH_SOURCE_SILENCE`) when no tick with new state
arrives in time. SUCCESS does not end a watch; TIMEOUT, ESCALATE and the cap do.
Ctrl-C ends it with a summary and the last run's verdict code (0 when it was
green; 130 when no run had finished). See docs/watch.md.

This module drives the loop through a callable and imports no engine: the
command line (:mod:`pytest_loops.cli.watching`) builds the engine and its writers.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_loops.errors import LoopUsageError
from pytest_loops.spec import Guards, LoopSpec
from pytest_loops.verdict import WATCH_SOURCE_SILENCE, Verdict

__all__ = ["BAD_POLLS_TO_ESCALATE", "UNBOUNDED", "FileSource", "JournalWake", "PollSource", "Tick", "WatchDriver",
           "WatchPlan", "WatchResult", "parse_poll_output"]

UNBOUNDED = 1_000_000_000
"""The cap a tick's run is given when the watch has none (``max_iter`` 0)."""

BAD_POLLS_TO_ESCALATE = 3
"""Bad poll outputs in a row that end a watch ESCALATE."""

_POLL_OUTPUT_LIMIT = 1 << 20  # bytes of a poll command's output read as its answer


@dataclass(frozen=True)
class WatchPlan:
    """How a loop is watched. ``poll``: a shell command (else the files are watched);
    ``interval``: seconds between polls or scans of the files; ``silence``: seconds
    without a tick with new state before the watch ends NO_PROGRESS (0: off);
    ``debounce``: seconds the files must stay unchanged before a change is a tick;
    ``max_iter``: iterations of the whole watch (0: no cap)."""

    poll: str | None = None
    interval: float = 0.5
    silence: float = 0.0
    debounce: float = 0.1
    max_iter: int = 0

    def check(self, where: str = "watch") -> None:
        """Bad values are one LoopUsageError line (exit 64)."""
        for name in ("interval", "silence", "debounce"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise LoopUsageError(f"{value!r} is not a valid {name}; valid: a number of seconds >= 0",
                                     location=where)
        if self.interval <= 0:
            raise LoopUsageError("the poll interval must be above 0 seconds", location=where,
                                 fix="write e.g. `every 30s`")
        if self.silence and self.silence < self.interval:
            raise LoopUsageError(f"the silence window ({self.silence:g}s) is shorter than the poll interval "
                                 f"({self.interval:g}s): it would end the watch between two polls",
                                 location=where, fix="make the silence window at least the poll interval")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 0:
            raise LoopUsageError(f"{self.max_iter!r} is not a valid max_iter; valid: an integer >= 0 "
                                 "(0: no cap, in watch mode only)", location=where)


@dataclass(frozen=True)
class Tick:
    """What a source reported: a state digest and payload, or why its answer was bad."""

    digest: str = ""
    payload: Any = None
    error: str | None = None


class RunOutcome(Protocol):
    """What a tick's run reports: a :class:`~pytest_loops.results.LoopResult`, or the like."""

    @property
    def verdict(self) -> Verdict: ...

    @property
    def reason(self) -> str: ...

    @property
    def iterations_run(self) -> int: ...

    @property
    def log_path(self) -> str | None: ...


class Source(Protocol):
    def wait(self, until: float | None) -> Tick | None:
        """The next tick, or None once ``until`` (the driver's clock) has passed."""

    def settle(self, tick: Tick | None) -> str:
        """The state digest after a run (the run's own changes are not a tick)."""


@dataclass
class WatchResult:
    """How a watch ended. ``verdict`` is None only when it was interrupted before any run finished."""

    verdict: Verdict | None
    reason: str
    ticks: int = 0
    idle: int = 0
    fixes: int = 0
    iterations: int = 0
    interrupted: bool = False
    last: RunOutcome | None = None
    runs: list[RunOutcome] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.verdict is not None:
            return self.verdict.exit_code
        return 130

    def summary(self, exit_code: int | None = None) -> str:
        """The one line a watch ends with (Ctrl-C included); ``exit_code``: the one the
        process exits with, when not the verdict's (pytest's codes)."""
        how = "interrupted" if self.interrupted else (self.verdict.value if self.verdict else "ended")
        last = f"last verdict {self.last.verdict.value}" if self.last is not None else "no run finished"
        return (f"watch {how}: {self.ticks} tick(s), {self.idle} idle, {self.fixes} fix(es), "
                f"{self.iterations} iteration(s); {last}; exit {self.exit_code if exit_code is None else exit_code}"
                + (f": {self.reason}" if self.reason else ""))


RunOnce = Callable[[LoopSpec, int, Tick | None], RunOutcome]
Emit = Callable[[dict[str, Any]], None]


class WatchDriver:
    """Runs one loop as a watch: ``run_once(spec, tick_number, tick)`` runs it once
    (the engine, with the guards this driver hands it) and returns its result."""

    def __init__(self, spec: LoopSpec, plan: WatchPlan, source: Source, run_once: RunOnce, *,
                 clock: Callable[[], float] = time.monotonic, emit: Emit | None = None) -> None:
        plan.check()
        self.spec = spec
        self.plan = plan
        self.source = source
        self.run_once = run_once
        self.clock = clock
        self.emit = emit or (lambda event: None)
        self._settled = ""  # the state digest after the last run

    def run(self) -> WatchResult:
        result = WatchResult(verdict=None, reason="")
        self._t0 = self.clock()
        self.emit({"event": "watch_started", "loop": self.spec.name, "poll": self.plan.poll,
                   "interval_s": self.plan.interval, "silence_s": self.plan.silence,
                   "max_iter": self.plan.max_iter, "budget_s": self.spec.guards.budget_seconds})
        try:
            self._watch(result)
        except KeyboardInterrupt:
            result.interrupted = True
            result.verdict = result.last.verdict if result.last is not None else None
            result.reason = "stopped by Ctrl-C"
        self.emit({"event": "watch_ended", "verdict": result.verdict.value if result.verdict else None,
                   "reason": result.reason, "exit_code": result.exit_code, "ticks": result.ticks,
                   "idle": result.idle, "fixes": result.fixes, "iterations": result.iterations,
                   "interrupted": result.interrupted, "elapsed_s": self._elapsed()})
        return result

    def _elapsed(self) -> float:
        return round(self.clock() - self._t0, 3)

    def _budget_deadline(self) -> float | None:
        budget = self.spec.guards.budget_seconds
        return self._t0 + budget if budget > 0 else None

    def _watch(self, result: WatchResult) -> None:
        if self._tick(result, None):
            return
        last_digest = self._settled
        quiet_since = self.clock()
        bad = 0
        while True:
            ends = [t for t in (self._budget_deadline(),
                                quiet_since + self.plan.silence if self.plan.silence else None) if t is not None]
            tick = self.source.wait(min(ends) if ends else None)
            if tick is None:
                self._ended_waiting(result, quiet_since)
                return
            if tick.error is not None:
                bad += 1
                self.emit({"event": "poll_error", "error": tick.error, "in_a_row": bad,
                           "elapsed_s": self._elapsed()})
                if bad >= BAD_POLLS_TO_ESCALATE:
                    result.verdict = Verdict.ESCALATE
                    result.reason = (f"the poll command gave no valid answer {bad} times in a row; "
                                     f"the last: {tick.error}")
                    return
                continue
            bad = 0
            if tick.digest == last_digest:
                result.idle += 1
                self.emit({"event": "idle", "digest": tick.digest, "idle": result.idle,
                           "elapsed_s": self._elapsed()})
                continue
            if self._tick(result, tick):
                return
            last_digest = self._settled
            quiet_since = self.clock()

    def _ended_waiting(self, result: WatchResult, quiet_since: float) -> None:
        deadline = self._budget_deadline()
        if deadline is not None and self.clock() >= deadline:
            result.verdict = Verdict.TIMEOUT
            result.reason = f"budget of {self.spec.guards.budget_seconds:g}s ran out while watching"
        else:
            result.verdict = Verdict.NO_PROGRESS
            result.reason = (f"{WATCH_SOURCE_SILENCE}: no tick with new state in the silence window of "
                             f"{self.plan.silence:g}s")
        self.emit({"event": "silence" if result.verdict is Verdict.NO_PROGRESS else "budget",
                   "elapsed_s": self._elapsed()})

    def _tick_spec(self, used: int) -> LoopSpec | None:
        """The spec a tick's run gets: the iterations and budget the watch has left."""
        g = self.spec.guards
        cap = self.plan.max_iter
        budget = g.budget_seconds
        if budget > 0:
            budget = budget - (self.clock() - self._t0)
            if budget <= 0:
                return None
        guards = Guards(max_iter=cap - used if cap else UNBOUNDED, budget_seconds=budget,
                        no_progress_k=g.no_progress_k, escalate_after=g.escalate_after)
        return self.spec.replace(guards=guards)

    def _tick(self, result: WatchResult, tick: Tick | None) -> bool:
        """Run the loop for one tick with new state; True when the watch ends with it."""
        cap = self.plan.max_iter
        if cap and result.iterations >= cap:  # the last run passed on the last iteration there was
            result.verdict = Verdict.MAX_ITER
            result.reason = f"max_iter={cap} reached over the watch's ticks; a new change came after it"
            return True
        spec = self._tick_spec(result.iterations)
        if spec is None:
            result.verdict = Verdict.TIMEOUT
            result.reason = f"budget of {self.spec.guards.budget_seconds:g}s ran out while watching"
            return True
        result.ticks += 1
        self.emit({"event": "tick", "tick": result.ticks, "digest": tick.digest if tick else None,
                   "elapsed_s": self._elapsed()})
        run = self.run_once(spec, result.ticks, tick)
        # the state after the run, before anyone hears of it: what the run changed is no tick,
        # and a change made once its end is logged is one
        self._settled = self.source.settle(tick)
        result.runs.append(run)
        result.last = run
        result.iterations += run.iterations_run
        fixed = run.verdict is Verdict.SUCCESS and run.iterations_run > 1
        result.fixes += fixed
        self.emit({"event": "run", "tick": result.ticks, "verdict": run.verdict.value, "reason": run.reason,
                   "iterations": run.iterations_run, "fixed": fixed, "log": run.log_path,
                   "elapsed_s": self._elapsed()})
        verdict = run.verdict
        if verdict in (Verdict.TIMEOUT, Verdict.ESCALATE):
            result.verdict, result.reason = verdict, run.reason
            return True
        if self.plan.max_iter and result.iterations >= self.plan.max_iter and verdict is not Verdict.SUCCESS:
            result.verdict = Verdict.MAX_ITER
            result.reason = (f"max_iter={self.plan.max_iter} reached over the watch's ticks "
                             f"without passing: {run.reason}")
            return True
        result.verdict, result.reason = verdict, run.reason
        return False


# -- sources ------------------------------------------------------------------------------

Sleep = Callable[[float], None]


SAMPLE_ANYWAY_EVERY = 16
"""With the change journal on, the files are sampled only when it reports an event,
and every this-many-th interval anyway: a bound on how long a change inotify never
reports (a write through mmap, a file behind a symbolic link) can go unseen."""


class JournalWake:
    """Waits until the change journal (inotify) reports an event under ``root``.

    Every directory below ``root`` is watched, except those named in ``skip_names``
    and those in ``skip_paths``; a directory that appears is watched when its parent's
    event is read. Raises :class:`~pytest_loops.progress.journal.JournalLost` when
    inotify cannot be used here (the caller then samples every interval)."""

    def __init__(self, root: str, skip_names: Sequence[str], skip_paths: Sequence[str]) -> None:
        from pytest_loops.progress.journal import DirectoryJournal

        self.root = os.path.abspath(root)
        self.skip_names = tuple(skip_names)
        self.skip_paths = {os.path.abspath(p) for p in skip_paths}
        self.journal = DirectoryJournal(self.root)
        try:
            self._watch_tree(self.root)
        except BaseException:
            self.journal.close()
            raise

    def _skipped(self, path: str, name: str) -> bool:
        import fnmatch

        return path in self.skip_paths or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.skip_names)

    def _watch_tree(self, top: str) -> None:
        stack = [top]
        while stack:
            path = stack.pop()
            if path != self.root and not self.journal.watch(path):
                continue  # gone, a file or a symbolic link: never followed
            try:
                entries = list(os.scandir(path))  # listed after the watch: nothing appears unseen
            except OSError:
                continue
            stack += [e.path for e in entries if e.is_dir(follow_symlinks=False) and not self._skipped(e.path, e.name)]

    def wait(self, timeout: float) -> bool:
        """True when an event about a path that is not skipped arrived within ``timeout`` s."""
        import select

        readable, _, _ = select.select([self.journal.fileno()], [], [], max(0.0, timeout))
        if not readable:
            return False
        changes = self.journal.drain(ignore=self._skipped)
        for path in sorted(changes.relisted | changes.touched):
            if os.path.isdir(path) and not os.path.islink(path) and not self.journal.is_watched(path):
                self._watch_tree(path)
        return bool(changes.touched or changes.relisted)

    def close(self) -> None:
        self.journal.close()


class FileSource:
    """Ticks from the watched files: the state fingerprint (its change journal, inotify,
    falling back to a walk) and each file's size and mtime are sampled when ``wake``
    (a :class:`JournalWake`) reports an event, or every ``interval`` without one;
    a difference that stays unchanged for ``debounce`` is a tick. A
    write that leaves every file's content as it was is a tick with the same digest
    (idle). ``fingerprint`` is a :class:`~pytest_loops.progress.fingerprint.StateFingerprint`
    over the watched paths that excludes the run's artifacts."""

    def __init__(self, fingerprint: Any, *, interval: float, debounce: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = time.sleep,
                 wake: JournalWake | None = None) -> None:
        self.fp = fingerprint
        self.interval = interval
        self.debounce = debounce
        self.clock = clock
        self.sleep = sleep
        self.wake = wake
        self.samples = 0
        self._quiet = 0  # intervals without an event since the last sample (with the journal)
        self._seen = self._sample()

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` (less when the journal reports an event); whether to sample now."""
        if self.wake is None:
            self.sleep(seconds)
            return True
        from pytest_loops.progress.journal import JournalLost

        try:
            woke = self.wake.wait(seconds)
        except JournalLost:  # the journal cannot vouch any more: sample every interval from now on
            self.wake.close()
            self.wake = None
            return True
        self._quiet = 0 if woke else self._quiet + 1
        return woke or self._quiet % SAMPLE_ANYWAY_EVERY == 0

    def _sample(self) -> tuple[str, tuple[tuple[str, int, int], ...]]:
        self.samples += 1
        digest = self.fp.compute()
        stamps = []
        root = self.fp.root
        for key in self.fp.files:
            try:
                st = os.stat(os.path.join(root, key), follow_symlinks=False)
            except OSError:
                continue
            stamps.append((key, st.st_mtime_ns, st.st_size))
        return digest, tuple(stamps)

    def wait(self, until: float | None) -> Tick | None:
        while True:
            now = self.clock()
            if until is not None and now >= until:
                return None
            if not self._pause(self.interval if until is None else max(0.0, min(self.interval, until - now))):
                continue
            sample = self._sample()
            if sample == self._seen:
                continue
            while until is None or self.clock() < until:  # settle: the same sample twice, `debounce` apart
                self.sleep(self.debounce)
                again = self._sample()
                if again == sample:
                    break
                sample = again
            self._seen = sample
            return Tick(digest=sample[0])

    def settle(self, tick: Tick | None) -> str:
        self._seen = self._sample()
        return self._seen[0]


def file_source(root: str | os.PathLike[str], patterns: Sequence[str], exclude: Sequence[str], *,
                interval: float, debounce: float) -> FileSource:
    """A :class:`FileSource` over ``patterns`` under ``root`` (``exclude``: absolute paths
    that are no state), woken by the change journal when inotify can be used here."""
    from pytest_loops.progress.fingerprint import StateFingerprint
    from pytest_loops.progress.journal import JournalLost
    from pytest_loops.progress.matching import DEFAULT_EXCLUDES

    fingerprint = StateFingerprint(root, list(patterns), exclude=list(exclude))
    wake = None
    inside = all(not os.path.isabs(p) and not os.path.normpath(p).startswith("..") for p in patterns)
    if inside:  # the journal watches the root's tree only
        try:
            wake = JournalWake(os.fspath(root), DEFAULT_EXCLUDES, exclude)
        except JournalLost:
            wake = None
    return FileSource(fingerprint, interval=interval, debounce=debounce, wake=wake)


def parse_poll_output(text: str) -> tuple[bool, str, Any]:
    """``(ready, state_digest, payload)`` from a poll command's output; ValueError says
    what is wrong. The output is one JSON object ``{"ready": bool, "state_digest":
    "...", "payload": ...}``; ``payload`` may be left out."""
    try:
        data = json.loads(text)
    except ValueError:
        shown = " ".join(text.split())[:80]
        raise ValueError(f"the poll output is not JSON: {shown!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the poll output is a JSON {type(data).__name__}, not an object")
    ready = data.get("ready")
    if not isinstance(ready, bool):
        raise ValueError(f'"ready" is {ready!r}; it must be true or false')
    digest = data.get("state_digest")
    if not isinstance(digest, str) or not digest:
        raise ValueError(f'"state_digest" is {digest!r}; it must be a non-empty string')
    return ready, digest, data.get("payload")


class PollSource:
    """Ticks from a poll command, run every ``interval`` through ``runner`` (a
    :class:`~pytest_loops.runtime.process.ProcessRunner`: deadline, output cap,
    process group killed, nothing orphaned). An answer with ``"ready": true`` is a
    tick; output that is not the JSON answer, or a command that fails, is a bad tick."""

    def __init__(self, command: str, *, runner: Any, cwd: str, env: dict[str, str] | None, interval: float,
                 output: Path, clock: Callable[[], float] = time.monotonic, sleep: Sleep = time.sleep,
                 timeout: float = 300.0) -> None:
        self.command = command
        self.runner = runner
        self.cwd = cwd
        self.env = env
        self.interval = interval
        self.output = output
        self.clock = clock
        self.sleep = sleep
        self.timeout = timeout
        self._last = ""
        self._first = True

    def _poll(self, until: float | None) -> Tick | None:
        left = self.timeout if until is None else max(0.05, min(self.timeout, until - self.clock()))
        done = self.runner.run(self.command, cwd=self.cwd, env=self.env, timeout=left,
                               output_path=self.output)
        if done.start_error:
            return Tick(error=f"the poll command could not start: {done.start_error}")
        if done.timed_out:
            if until is not None and self.clock() >= until:
                return None
            return Tick(error=f"the poll command ran past {left:g}s and was stopped")
        if done.exit_code != 0:
            return Tick(error=f"the poll command exited {done.exit_code}: {' '.join(done.tail.split())[-120:]}")
        try:
            with open(self.output, "rb") as f:
                text = f.read(_POLL_OUTPUT_LIMIT).decode("utf-8", "replace")
            ready, digest, payload = parse_poll_output(text)
        except OSError as exc:
            return Tick(error=f"the poll output could not be read: {exc.strerror or exc}")
        except ValueError as exc:
            return Tick(error=str(exc))
        if not ready:
            return None
        return Tick(digest=digest, payload=payload)

    def wait(self, until: float | None) -> Tick | None:
        while True:
            now = self.clock()
            if until is not None and now >= until:
                return None
            if not self._first:
                self.sleep(self.interval if until is None else max(0.0, min(self.interval, until - now)))
                if until is not None and self.clock() >= until:
                    return None
            self._first = False
            tick = self._poll(until)
            if tick is not None:
                if tick.error is None:
                    self._last = tick.digest
                return tick

    def settle(self, tick: Tick | None) -> str:
        return tick.digest if tick is not None else self._last


def watched_patterns(spec: LoopSpec) -> list[str]:
    """The paths a file watch follows: the loop's state paths, else its look-at paths, else its directory."""
    if spec.state_paths:
        return list(spec.state_paths)
    paths = [p for p in spec.look_at if p and not any(c.isspace() for c in p)]
    return paths or ["."]


def artifact_excludes(paths: Sequence[str | os.PathLike[str] | None]) -> list[str]:
    """The run's own files, as absolute excludes of the watch's fingerprint."""
    out: list[str] = []
    for p in paths:
        if p:
            out += [str(Path(p).resolve()), str(Path(p).resolve()) + ".lock"]
    return out

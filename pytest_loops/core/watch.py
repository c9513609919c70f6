"""Watch loops: a loop that stays up and runs again when its source says something changed.

A watch runs the loop once (the start-up run), then waits for a *tick*: a settled
batch of changes in the watched files (:class:`FileSource`) or a poll command
answering ready (:class:`PollSource`). Each tick carries a state digest. The
state after the start-up run is the baseline; a tick whose digest equals the
state after the last run is *idle*: it is recorded as an event, runs nothing and
never yields SUCCESS by itself. A tick with a new digest starts a *generation*:
the loop run once more through the engine (``run_once``), its checks and, while
they fail, its revise step.

As in AGH's watch loops, the watch itself is unbounded (its cap is shown as ∞):
the guards (``max_iter``, the budget, no-progress, escalate-after) bound each
generation, with the loop's own values, never the watch's lifetime. A generation
that ends MAX_ITER, TIMEOUT or NO_PROGRESS waits for the next change. A watch
ends only by its silence window (no tick with new state in time: NO_PROGRESS,
reason :data:`~pytest_loops.verdict.WATCH_SOURCE_SILENCE`), by a generation that
escalates (or three bad poll answers in a row: ESCALATE), or by Ctrl-C (a summary
and the last generation's verdict code; 130 when none had finished). See
docs/watch.md.

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
from pytest_loops.spec import LoopSpec
from pytest_loops.verdict import WATCH_SOURCE_SILENCE, Verdict

__all__ = ["BAD_POLLS_TO_ESCALATE", "UNBOUNDED_MARK", "FileSource", "JournalWake", "PollSource", "Tick", "WatchDriver",
           "PollAnswer", "WatchPlan", "WatchResult", "parse_poll_output"]

UNBOUNDED_MARK = "∞"
"""How the watch's own cap (there is none: it runs generations until silence) is shown."""

BAD_POLLS_TO_ESCALATE = 3
"""Bad poll outputs in a row that end a watch ESCALATE."""

_POLL_OUTPUT_LIMIT = 1 << 20  # bytes of a poll command's output read as its answer


@dataclass(frozen=True)
class WatchPlan:
    """How a loop is watched. ``poll``: a shell command (else the files are watched);
    ``interval``: seconds between polls or scans of the files; ``silence``: seconds
    without a tick with new state before the watch ends NO_PROGRESS (0: off);
    ``debounce``: seconds the files must stay unchanged before a change is a tick.
    There is no cap on the watch itself: the loop's guards bound each generation."""

    poll: str | None = None
    interval: float = 0.5
    silence: float = 0.0
    debounce: float = 0.1

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


@dataclass(frozen=True)
class Tick:
    """What a source reported: a state digest and payload, or why its answer was bad.
    ``settled_at``: when the source says its state settled (a poll answer's own
    ``settled_at``, kept as given), else None."""

    digest: str = ""
    payload: Any = None
    error: str | None = None
    settled_at: Any = None


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
    """How a watch ended. ``verdict`` is None only when it was interrupted before any
    generation finished. ``generations``: the loop's runs (the start-up run is the first)."""

    verdict: Verdict | None
    reason: str
    generations: int = 0
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
        return (f"watch {how}: {self.generations} generation(s), {self.idle} idle, {self.fixes} fix(es), "
                f"{self.iterations} iteration(s); {last}; exit {self.exit_code if exit_code is None else exit_code}"
                + (f": {self.reason}" if self.reason else ""))


RunOnce = Callable[[LoopSpec, int, Tick | None], RunOutcome]
Emit = Callable[[dict[str, Any]], None]


class WatchDriver:
    """Runs one loop as a watch: ``run_once(spec, generation, tick)`` runs it once
    (the engine, with the loop's own guards bounding that generation) and returns its result."""

    def __init__(self, spec: LoopSpec, plan: WatchPlan, source: Source, run_once: RunOnce, *,
                 clock: Callable[[], float] = time.monotonic, emit: Emit | None = None) -> None:
        plan.check()
        self.spec = spec
        self.plan = plan
        self.source = source
        self.run_once = run_once
        self.clock = clock
        self.emit = emit or (lambda event: None)
        self._settled = ""  # the state digest after the last generation

    def run(self) -> WatchResult:
        result = WatchResult(verdict=None, reason="")
        self._t0 = self.clock()
        g = self.spec.guards
        self.emit({"event": "watch_started", "loop": self.spec.name, "poll": self.plan.poll,
                   "interval_s": self.plan.interval, "silence_s": self.plan.silence,
                   "generations": UNBOUNDED_MARK,
                   "per_generation": {"max_iter": g.max_iter, "budget_s": g.budget_seconds,
                                      "no_progress_k": g.no_progress_k, "escalate_after": g.escalate_after}})
        try:
            self._watch(result)
        except KeyboardInterrupt:
            result.interrupted = True
            result.verdict = result.last.verdict if result.last is not None else None
            result.reason = "stopped by Ctrl-C"
        self.emit({"event": "watch_ended", "verdict": result.verdict.value if result.verdict else None,
                   "reason": result.reason, "exit_code": result.exit_code, "generations": result.generations,
                   "idle": result.idle, "fixes": result.fixes, "iterations": result.iterations,
                   "interrupted": result.interrupted, "elapsed_s": self._elapsed()})
        return result

    def _elapsed(self) -> float:
        return round(self.clock() - self._t0, 3)

    def _watch(self, result: WatchResult) -> None:
        if self._generation(result, None):
            return
        last_digest = self._settled  # the start-up run's state is the baseline
        quiet_since = self.clock()
        bad = 0
        while True:
            tick = self.source.wait(quiet_since + self.plan.silence if self.plan.silence else None)
            if tick is None:
                result.verdict = Verdict.NO_PROGRESS
                result.reason = (f"{WATCH_SOURCE_SILENCE}: no tick with new state in the silence window of "
                                 f"{self.plan.silence:g}s")
                self.emit({"event": "silence", "elapsed_s": self._elapsed()})
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
                           "after_generation": result.generations, "settled_at": tick.settled_at,
                           "elapsed_s": self._elapsed()})
                continue
            if self._generation(result, tick):
                return
            last_digest = self._settled
            quiet_since = self.clock()

    def _generation(self, result: WatchResult, tick: Tick | None) -> bool:
        """Run the loop for the start-up run or a tick with new state, bounded by the
        loop's own guards; True when the watch ends with it (an escalation)."""
        result.generations += 1
        number = result.generations
        self.emit({"event": "tick", "generation": number, "tick": number,
                   "digest": tick.digest if tick else None,
                   "settled_at": tick.settled_at if tick else None, "elapsed_s": self._elapsed()})
        run = self.run_once(self.spec, number, tick)
        result.runs.append(run)
        result.last = run
        result.iterations += run.iterations_run
        fixed = run.verdict is Verdict.SUCCESS and run.iterations_run > 1
        result.fixes += fixed
        # the state after the run, before anyone hears of it: what the run changed is no tick,
        # and a change made once its end is logged is one
        self._settled = self.source.settle(tick)
        self.emit({"event": "run", "generation": number, "tick": number, "verdict": run.verdict.value,
                   "reason": run.reason, "iterations": run.iterations_run, "fixed": fixed, "log": run.log_path,
                   "baseline": self._settled, "elapsed_s": self._elapsed()})
        result.verdict, result.reason = run.verdict, run.reason
        return run.verdict is Verdict.ESCALATE


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


@dataclass(frozen=True)
class PollAnswer:
    """A poll command's answer: ``{"ready", "state_digest", "payload", "settled_at"}``."""

    ready: bool
    digest: str
    payload: Any = None
    settled_at: Any = None


def parse_poll_output(text: str) -> PollAnswer:
    """The answer in a poll command's output; ValueError says what is wrong. The
    output is one JSON object ``{"ready": bool, "state_digest": "...", "payload": ...,
    "settled_at": ...}``; ``payload`` and ``settled_at`` (when the source's state
    settled, as the source writes it: a time stamp or a number) may be left out."""
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
    settled_at = data.get("settled_at")
    if settled_at is not None and (isinstance(settled_at, bool) or not isinstance(settled_at, (str, int, float))
                                   or (isinstance(settled_at, float) and not math.isfinite(settled_at))):
        raise ValueError(f'"settled_at" is {settled_at!r}; it must be a time stamp (a string or a number)')
    return PollAnswer(ready, digest, data.get("payload"), settled_at)


class PollSource:
    """Ticks from a poll command, run every ``interval`` through ``runner`` (a
    :class:`~pytest_loops.runtime.process.ProcessRunner`: deadline, output cap,
    process group killed, nothing orphaned). The command reads, on its standard
    input, ``{"spec": request, "expected_state_digest": "..."}`` (the state after the
    last generation; "" before the baseline is known). An answer with ``"ready":
    true`` is a tick; output that is not the JSON answer, or a command that fails,
    is a bad tick. After the start-up run the command is asked once for the
    baseline, so an unchanged first answer is idle."""

    def __init__(self, command: str, *, runner: Any, cwd: str, env: dict[str, str] | None, interval: float,
                 output: Path, clock: Callable[[], float] = time.monotonic, sleep: Sleep = time.sleep,
                 timeout: float = 300.0, request: dict[str, Any] | None = None) -> None:
        self.command = command
        self.runner = runner
        self.cwd = cwd
        self.env = env
        self.interval = interval
        self.output = output
        self.clock = clock
        self.sleep = sleep
        self.timeout = timeout
        self.request = dict(request or {})
        self.expected = ""  # the state after the last generation, as the command is told
        self._first = True

    def _poll(self, until: float | None, *, any_answer: bool = False) -> Tick | None:
        left = self.timeout if until is None else max(0.05, min(self.timeout, until - self.clock()))
        stdin = json.dumps({"spec": self.request, "expected_state_digest": self.expected},
                           default=str).encode() + b"\n"
        done = self.runner.run(self.command, cwd=self.cwd, env=self.env, timeout=left,
                               output_path=self.output, stdin_data=stdin)
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
            answer = parse_poll_output(text)
        except OSError as exc:
            return Tick(error=f"the poll output could not be read: {exc.strerror or exc}")
        except ValueError as exc:
            return Tick(error=str(exc))
        if not answer.ready and not any_answer:
            return None
        return Tick(digest=answer.digest, payload=answer.payload, settled_at=answer.settled_at)

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
                return tick

    def settle(self, tick: Tick | None) -> str:
        if tick is None and not self.expected:  # after the start-up run: its state is the baseline
            self._first = False  # the next answer comes an interval later, as any poll
            baseline = self._poll(None, any_answer=True)
            if baseline is not None and baseline.error is None:
                self.expected = baseline.digest
        elif tick is not None:
            self.expected = tick.digest
        return self.expected


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

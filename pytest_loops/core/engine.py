"""The control loop: verify -> guards -> reflect -> revise, until a verdict.

Each iteration runs, in this order: budget (before work, and enforced during
commands), cap, verify, progress, lesson, no-progress, escalate, revise. The
cap is also applied at the end of the iteration that reaches it, so no revise
step is paid for whose result could never be verified. The
engine never imports pytest; time comes from an injectable clock and commands
from an injectable runner, so every guard is testable without sleeping or
spawning.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from pytest_loops.artifacts.lessons import compose_lesson
from pytest_loops.artifacts.reflexion import MemoryPage
from pytest_loops.artifacts.runlog import SCHEMA, RunLogWriter, append_index
from pytest_loops.core import guards
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.core.revise import (
    CANNOT_START_EXIT_CODES,
    build_prompt,
    loop_env,
    write_failure_file,
)
from pytest_loops.deadline import DeadlineReached
from pytest_loops.results import CheckResult, CommandResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, CheckKind, LoopSpec, Pipeline
from pytest_loops.verdict import Verdict

if TYPE_CHECKING:
    from pytest_loops.runtime.cleanroom import CleanRoom
    from pytest_loops.runtime.protect import TreeGuard

ARTIFACTS_DIRNAME = ".pytest-loops"
AUDIT_CHOICES = ("error", "warn", "off")


class CommandRunner(Protocol):
    """Runs one shell command; see :class:`pytest_loops.runtime.process.ProcessRunner`."""

    def run(self, command: str, *, cwd: str | os.PathLike, env: Mapping[str, str] | None = None,
            timeout: float | None = None, output_path: str | os.PathLike | None = None) -> CommandResult: ...


class Fingerprint(Protocol):
    def compute(self) -> str: ...


def with_python_on_path(env: Mapping[str, str]) -> dict[str, str]:
    """The harness's interpreter first on PATH, so `python` in a loop's commands is
    the one pytest-loops runs under (as tox and nox do), and LOOP_PYTHON names it."""
    result = dict(env)
    bindir = os.path.dirname(sys.executable)
    parts = result.get("PATH", "").split(os.pathsep) if result.get("PATH") else []
    if bindir and (not parts or parts[0] != bindir):
        result["PATH"] = os.pathsep.join([bindir, *parts])
    result["LOOP_PYTHON"] = sys.executable
    return result


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


def _stamp(wall: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + f"{int(wall % 1 * 1000):03d}"


def _version() -> str:
    from pytest_loops import __version__

    return __version__


@dataclass
class LoopContext:
    """What a check or revise implementation may use during one iteration."""

    spec: LoopSpec
    iteration: int
    workdir: Path
    run_dir: Path
    runner: CommandRunner
    clock: Callable[[], float]
    deadline: float | None
    base_env: dict[str, str]
    lessons: list[str] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)
    suspects_note: str = ""  # what localization cost, or why it was skipped (one line)
    budget_hit: bool = False
    scrub: Callable[[str], str] | None = None  # masks secret values before anything is written
    previous: IterationRecord | None = None  # the iteration before this one (narrowed reruns)
    clean_room: CleanRoom | None = None  # set while the checks run in the clean room
    label_prefix: str = ""  # output file names of this context's commands start with it
    audit_literals: frozenset[str] = frozenset()  # literals of the failing assertions so far
    # check name -> the pytest node ids its output named failed so far: in the clean
    # room each must be witnessed passing (never skipped, xfailed or deselected)
    failed_tests_seen: dict[str, set[str]] = field(default_factory=dict)
    # called with (path, OSError) when an artifact cannot be written; None: raise
    artifact_error: Callable[[str, OSError], None] | None = None

    @property
    def iteration_dir(self) -> Path:
        path = self.run_dir / f"iter-{self.iteration:03d}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def prompt_file(self) -> Path:
        return self.iteration_dir / "prompt.md"

    @property
    def failure_file(self) -> Path:
        return self.iteration_dir / "failure.txt"

    def time_left(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.clock())

    def check_label(self, check: Check) -> str:
        """A stable file-name label for a check: its 1-based position in the loop."""
        try:
            index = self.spec.checks.index(check) + 1
        except ValueError:
            index = 0
        return f"{self.label_prefix}check-{index}"

    def run_command(self, command: str, *, label: str, timeout: float | None = None,
                    extra_env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a shell command in the loop's workdir with the budget as a deadline.

        Sets ``budget_hit`` when the command was killed because the budget ran out
        (as opposed to its own timeout).
        """
        left = self.time_left()
        effective = timeout
        budget_limited = False
        if left is not None and (effective is None or left <= effective):
            effective, budget_limited = left, True
        env = dict(self.base_env)
        if self.clean_room is None:
            env.update(loop_env(self.spec, self))
        if extra_env:
            env.update(extra_env)
        output_path: Path | None = self.run_dir / f"iter-{self.iteration:03d}" / f"{label}.out"
        try:
            self.iteration_dir  # noqa: B018 - creates it
        except OSError as exc:
            if self.artifact_error is None:
                raise
            self.artifact_error(str(self.run_dir / f"iter-{self.iteration:03d}"), exc)
            output_path = None  # the runner keeps the output in a temporary file
        result = self.runner.run(command, cwd=self.workdir, env=env, timeout=effective,
                                 output_path=output_path)
        if result.timed_out and budget_limited:
            self.budget_hit = True
        if self.scrub is not None:
            result = scrub_output(result, self.scrub)
        return result


def scrub_output(result: CommandResult, scrub: Callable[[str], str]) -> CommandResult:
    """Mask secrets in a command's output file and tail, in place."""
    if result.output_file:
        from pytest_loops.redact import scrub_file

        scrub_file(result.output_file, scrub)
    tail = scrub(result.tail)
    return result if tail == result.tail else dataclasses.replace(result, tail=tail)


@dataclass(frozen=True)
class RunPaths:
    log: Path
    run_dir: Path
    artifacts_dir: Path
    memory_page: Path | None


def resolve_paths(spec: LoopSpec, *, artifacts_dir: str | os.PathLike | None = None,
                  log_path: str | os.PathLike | None = None,
                  memory_page: str | os.PathLike | None = None, wall: float | None = None) -> RunPaths:
    """Where a run's artifacts go. The run dir is the log path without its suffix."""
    cwd = Path(spec.cwd).resolve()
    base = Path(artifacts_dir) if artifacts_dir else cwd / ARTIFACTS_DIRNAME
    if not base.is_absolute():
        base = cwd / base
    if log_path:
        log = Path(log_path)
        log = log if log.is_absolute() else cwd / log
    else:
        stamp = _stamp(time.time() if wall is None else wall)
        log = base / "runs" / f"{spec.slug}-{stamp}-{os.getpid()}.json"
    page: Path | None = None
    if spec.reflexion:
        chosen = memory_page or spec.memory_page
        page = Path(chosen) if chosen else base / "lessons" / f"{spec.slug}.md"
        page = page if page.is_absolute() else cwd / page
    return RunPaths(log=log, run_dir=log.with_suffix(""), artifacts_dir=base, memory_page=page)


class Engine:
    """Runs loops. Construct once, call :meth:`run` per loop.

    :param runner: runs shell commands (default: :class:`~pytest_loops.runtime.process.ProcessRunner`).
    :param clock: monotonic seconds (inject a fake one in tests).
    :param wall: wall-clock seconds for timestamps.
    :param plugin_manager: a pluggy manager with the ``pytest_loop_*`` hooks
        (default: :func:`~pytest_loops.core.pluginmanager.make_plugin_manager`).
    :param fingerprint_factory: ``(root, patterns, exclude) -> Fingerprint``.
    :param finishers: called as ``f(result, paths)`` after the verdict, before the
        run log summary is written; they may add to ``result.artifacts``.
    """

    def __init__(self, *, runner: CommandRunner | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 plugin_manager: pluggy.PluginManager | None = None,
                 fingerprint_factory: Callable[..., Fingerprint] | None = None,
                 artifacts_dir: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None,
                 write_index: bool = True,
                 localize: bool = True,
                 clean_room: bool | None = None,
                 audit: str = "error",
                 hide_env: Sequence[str] = (),
                 finishers: Sequence[Callable[[LoopResult, RunPaths], None]] = ()) -> None:
        if runner is None:
            from pytest_loops.runtime.process import ProcessRunner

            runner = ProcessRunner()
        self.runner = runner
        self.clock = clock
        self.wall = wall
        self.pm = plugin_manager or make_plugin_manager(entry_points=False)
        if fingerprint_factory is None:
            from pytest_loops.progress.fingerprint import StateFingerprint

            fingerprint_factory = StateFingerprint
        self.fingerprint_factory = fingerprint_factory
        self.artifacts_dir = artifacts_dir
        full_env = with_python_on_path(os.environ if env is None else env)
        from pytest_loops.redact import make_redactor, secret_values

        self.scrub = make_redactor(full_env) if secret_values(full_env) else None
        # signing keys and the like never reach a child: a revise step could re-sign a forgery
        self.hidden_env = tuple(h for h in hide_env if h)
        self.env = {k: v for k, v in full_env.items() if k not in self.hidden_env}
        if clean_room is None:  # the clean room needs real processes
            from pytest_loops.runtime.process import ProcessRunner

            clean_room = isinstance(runner, ProcessRunner)
        self.clean_room = clean_room
        if audit not in AUDIT_CHOICES:
            raise ValueError(f"audit={audit!r}; valid: {', '.join(AUDIT_CHOICES)}")
        self.audit = audit
        self.write_index = write_index
        self.localize = localize
        self.finishers = list(finishers)
        # "PATH: [Errno N] message" for each artifact the last run could not write
        self.artifact_errors: list[str] = []
        self._log: RunLogWriter | None = None  # the run log of the loop running now

    def _artifact_failed(self, path: str | os.PathLike, exc: OSError) -> None:
        """An artifact could not be written: note it and carry on. Artifacts record a
        loop; they never decide or lose its verdict."""
        what = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else str(exc) or type(exc).__name__
        self.artifact_errors.append(f"{path}: {what}")

    def _run_check(self, check: Check, ctx: LoopContext) -> Any:
        """A check that cannot write what it needs to run (a full disk) fails, naming
        the file and the errno; the loop goes on to a verdict."""
        try:
            return self.pm.hook.pytest_loop_run_check(check=check, context=ctx)
        except OSError as exc:
            where = getattr(exc, "filename", None) or ctx.run_dir
            self._artifact_failed(where, exc)
            return CheckResult(name=check.name, kind=check.kind.value, passed=False, exit_code=None,
                               duration_s=0.0, reason=f"could not run: {self.artifact_errors[-1]}")

    def _write(self, path: str | os.PathLike, write: Callable[[], Any]) -> bool:
        """``write()``, with an OSError turned into an artifact error; True when it worked."""
        try:
            write()
            return True
        except OSError as exc:
            self._artifact_failed(getattr(exc, "filename", None) or path, exc)
            return False

    # -- one loop -----------------------------------------------------------------

    def run(self, spec: LoopSpec, *, log_path: str | os.PathLike | None = None,
            memory_page: str | os.PathLike | None = None,
            first_results: Mapping[str, CheckResult] | None = None,
            resume_from: Mapping[str, Any] | None = None,
            before_start: Callable[[Callable[[], bool] | None], None] | None = None) -> LoopResult:
        """Drive one loop to its verdict.

        ``first_results`` (check name -> result) stands in for running those checks
        in iteration 1, when the caller has just run them (a failed pytest test).
        ``resume_from`` is a loaded run log (:func:`~pytest_loops.artifacts.runlog.load_runlog`)
        of a killed or stopped run: its iterations, streak and spent time carry
        over, and the new log names the old one. A revise step the killed run
        had started and not finished is run again, once; a verdict it had decided
        and not yet written out is kept (see :func:`resume_plan`).
        ``before_start(should_stop)`` runs first, on the loop's budget (the working
        tree's lock is waited for so); it may raise :class:`DeadlineReached`.

        One run writes a run log at a time: a second run given the same log path
        raises LoopUsageError naming the run that holds it.
        """
        wall0 = self.wall()
        self.artifact_errors = []
        paths = resolve_paths(spec, artifacts_dir=self.artifacts_dir, log_path=log_path,
                              memory_page=memory_page, wall=wall0)
        if any(p is not None and p.is_relative_to(paths.artifacts_dir) for p in (paths.log, paths.memory_page)):
            from pytest_loops.runtime.outpaths import keep_out_of_git

            keep_out_of_git(paths.artifacts_dir)
        locks = []
        try:
            # the log resumed from too: a run still writing it, or a second resume of
            # it, would count its iterations twice
            old = (resume_from or {}).get("log_path")
            if old and Path(old).resolve() != paths.log.resolve():
                locks.append(self._hold_log(Path(old), what="the run log to resume is still being written",
                                            fix="wait for that run to end, or stop it"))
            locks.append(self._hold_log(paths.log))
            return self._run(spec, paths, wall0, first_results, resume_from, before_start)
        finally:
            for lock in reversed(locks):
                if lock is not None:
                    lock.release()

    def _hold_log(self, log: Path, *, what: str = "another run is writing this run log",
                  fix: str = "give each run its own --log") -> Any:
        """The run log's lock, held for the run (None when the lock file cannot be made:
        an artifact error, not a lost verdict)."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(log) + ".lock", timeout=0)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            from pytest_loops.errors import LoopUsageError

            raise LoopUsageError(f"{what} ({_log_holder(log)})", location=str(log), fix=fix) from None
        except OSError as exc:
            self._artifact_failed(str(log) + ".lock", exc)
            return None
        return lock

    def _run(self, spec: LoopSpec, paths: RunPaths, wall0: float,
             first_results: Mapping[str, CheckResult] | None,
             resume_from: Mapping[str, Any] | None,
             before_start: Callable[[Callable[[], bool] | None], None] | None = None) -> LoopResult:
        hook = self.pm.hook
        prior = [IterationRecord.from_dict(r) for r in (resume_from or {}).get("iterations", [])]
        spent = float((resume_from or {}).get("elapsed_s") or 0.0)
        if prior and not spent:
            spent = prior[-1].elapsed_s
        t0 = self.clock() - max(0.0, spent)  # the budget counts the time already spent
        workdir = Path(spec.cwd).resolve()
        g = spec.guards
        deadline = t0 + g.budget_seconds if g.budget_seconds > 0 else None
        # long waits and hashes ask this between files and chunks (DeadlineReached)
        stop = None if deadline is None else (lambda: self.clock() > deadline)
        page = MemoryPage(paths.memory_page, loop_name=spec.name, goal=spec.goal) if paths.memory_page else None
        lessons_read = page.read_lessons() if page else []
        lessons = list(lessons_read)
        written_lessons: list[str] = []
        fingerprint = None
        if spec.state_paths:
            exclude = [str(paths.artifacts_dir), str(paths.log), str(paths.run_dir)]
            if paths.memory_page:
                exclude += [str(paths.memory_page), str(paths.memory_page) + ".lock"]
            fingerprint = self.fingerprint_factory(workdir, list(spec.state_paths), exclude=exclude)
            if hasattr(fingerprint, "should_stop"):
                fingerprint.should_stop = stop

        from pytest_loops.runtime.protect import TreeGuard, check_files

        own = [_relative(p, workdir) for p in (paths.log, paths.run_dir, paths.memory_page,
                                               paths.artifacts_dir) if p]
        own_files = [p for p in own if p]
        own_files += [p + ".lock" for p in own_files]
        watch = TreeGuard(workdir, scope=spec.scope, protect=spec.protect, own=own_files,
                          readonly_files=check_files(spec, str(workdir)),
                          extra_ancestors=[tempfile.gettempdir()], should_stop=stop)
        self._literals: set[str] = set()
        log = RunLogWriter(paths.log, scrub=self.scrub, on_error=self._artifact_failed)
        header: dict[str, Any] = {
            "loop": spec.name, "goal": spec.goal, "source": spec.source,
            "guards": g.to_dict(), "state_paths": list(spec.state_paths),
            "started_at": _iso(wall0), "cwd": str(workdir), "revise": spec.revise,
            "spec": _shown_spec(spec), "spec_digest": spec.digest(),
            "memory_page": str(paths.memory_page) if paths.memory_page else None,
            "lessons_read": lessons_read, "run_dir": str(paths.run_dir),
            "pytest_loops_version": _version(),
        }
        if resume_from is not None:
            header["resumed_from"] = resume_from.get("log_path") or (resume_from.get("artifacts") or {}).get("log")
            header["resumed_after_iterations"] = len(prior)
        g_plan = resume_plan(resume_from, spec, prior)
        if resume_from is not None and resume_from.get("incomplete"):
            # a killed run's revise step (or check) may still be running in its own
            # process group: stop it, or it would finish beside the one run again
            stop_leftovers(resume_from.get("run_dir"))
        log.start({**header, "pid": os.getpid()})  # who holds the log (the summary need not say)
        for old in prior:  # the new log holds the whole loop
            decided = g_plan.decided if old is prior[-1] else None
            log.iteration(old.to_dict(), verdict=decided[0] if decided else None,
                          reason=decided[1] if decided else "")
        self._log = log

        # Bytecode a revise step writes into the tree is removed after it (the guard), and
        # the clean room has no __pycache__ at all: no prefix of our own is needed, which
        # would make every Python process compile the standard library again.
        run_env = dict(self.env)
        visible = [c for c in spec.checks if not c.hidden]
        records: list[IterationRecord] = list(prior)
        verdict: Verdict | None = None
        reason = ""
        previous_hash: str | None = prior[-1].state_hash if prior else None
        streak = prior[-1].unchanged_streak if prior else 0
        previous_signature = prior[-1].failure_signature if prior else None
        same_failure = prior[-1].same_failure_streak if prior else 0
        history: dict[str, list[bool]] = {}  # check name -> pass/fail per iteration (flapping)
        failed_tests_seen: dict[str, set[str]] = {}
        for old in prior:
            for c in old.checks:
                history.setdefault(c.name, []).append(c.passed)
            _note_failed_tests(failed_tests_seen, old.checks)
        iteration = len(prior)
        record: IterationRecord | None = None
        pending = g_plan.revise  # the record of an iteration whose revise step was cut off
        if g_plan.decided is not None:
            verdict, reason = Verdict(g_plan.decided[0]), g_plan.decided[1]
        try:
            if before_start is not None:
                before_start(stop)
            while verdict is None:
                iteration += 1
                elapsed = self.clock() - t0
                if guards.budget_exhausted(elapsed, g.budget_seconds):
                    verdict = Verdict.TIMEOUT
                    reason = f"budget of {g.budget_seconds:g}s used up before iteration {iteration}"
                    break
                if iteration > g.max_iter:  # only a resumed run can get here
                    iteration -= 1
                    verdict = Verdict.MAX_ITER
                    reason = (f"max_iter={g.max_iter} already reached by the resumed run; "
                              "raise the cap (--max-iter) to continue")
                    break
                resumed = pending is not None and pending.iter == iteration
                record = (pending if pending is not None and resumed
                          else IterationRecord(iter=iteration, started_at=_iso(self.wall())))
                pending = None
                it0 = self.clock()
                ctx = LoopContext(spec=spec, iteration=iteration, workdir=workdir,
                                  run_dir=paths.run_dir, runner=self.runner, clock=self.clock,
                                  deadline=deadline, base_env=run_env, lessons=lessons,
                                  scrub=self.scrub, previous=records[-1] if records else None,
                                  artifact_error=self._artifact_failed, failed_tests_seen=failed_tests_seen)
                if resumed:
                    # verify, progress, lesson and guards ran before the kill: only the
                    # revise step is run again, so no iteration is counted twice
                    failed = [c for c in record.checks if not c.passed]
                    previous_hash = record.state_hash or previous_hash
                    streak = record.unchanged_streak
                    previous_signature = record.failure_signature
                    same_failure = record.same_failure_streak
                    for c in record.checks:
                        history.setdefault(c.name, []).append(c.passed)
                    verdict, reason = self._revise(spec, ctx, record, failed, watch)
                    verdict, reason = self._end_iteration(spec, record, verdict, reason, iteration, t0, it0,
                                                          fingerprint, records, log, ctx)
                    continue

                # verify (hidden checks run only in the clean room, before SUCCESS)
                for check in visible:
                    if iteration == 1 and not prior and first_results and check.name in first_results:
                        checked = first_results[check.name]
                    else:
                        checked = self._run_check(check, ctx)
                    if not isinstance(checked, CheckResult):
                        raise TypeError(
                            f"pytest_loop_run_check returned {type(checked).__name__} for {check.name!r}; "
                            "expected a CheckResult"
                        )
                    record.checks.append(checked)
                    if ctx.budget_hit:
                        break
                record.verify_duration_s = self.clock() - it0
                failed = [c for c in record.checks if not c.passed]
                _note_failed_tests(failed_tests_seen, failed)  # read before any revise step runs
                record.passed = bool(record.checks) and not failed and len(record.checks) == len(visible)
                first_failed = failed[0] if failed else None
                record.verify_exit = first_failed.exit_code if first_failed else 0
                record.output_tail = (first_failed or record.checks[-1]).output_tail if record.checks else ""

                verdict, reason = self._after_verify(spec, ctx, record, failed, watch)
                failed = [c for c in record.checks if not c.passed]  # the clean room may have failed one
                if verdict is None:
                    # progress
                    if fingerprint is not None:
                        if deadline is not None and hasattr(fingerprint, "should_stop"):
                            # hashing stops on time it spends past the deadline; a budget
                            # the checks used up to the second is the guards' to judge
                            since = self.clock()
                            fingerprint.should_stop = lambda since=since: self.clock() > max(deadline, since)
                        current = fingerprint.compute()
                        streak = guards.next_unchanged_streak(previous_hash, current, streak)
                        record.state_hash = current
                        # the first measurement has nothing to compare with: None
                        record.state_changed = None if previous_hash is None else current != previous_hash
                        previous_hash = current
                    record.unchanged_streak = streak
                    record.failure_signature = iteration_signature(failed)
                    same_failure = (same_failure + 1 if previous_signature == record.failure_signature
                                    and previous_signature is not None else 0)
                    record.same_failure_streak = same_failure
                    previous_signature = record.failure_signature
                    for c in record.checks:
                        history.setdefault(c.name, []).append(c.passed)
                    # only checks a machine can never pass are left: a human is needed
                    machine_ok = all(c.needs_human for c in failed)
                    # lesson
                    if page is not None and not machine_ok:
                        line = compose_lesson(iteration, record.verify_exit,
                                              record.state_changed if fingerprint is not None else "untracked",
                                              failed, loop_name=spec.name)
                        if self.scrub is not None:
                            line = self.scrub(line)
                        self._write(page.path, functools.partial(page.append, line))
                        record.lesson = line
                        written_lessons.append(line)
                        lessons.append(line)
                    verdict, reason = self._guards(spec, record, failed, iteration, streak,
                                                   measurable=fingerprint is not None, machine_ok=machine_ok,
                                                   history=history)
                if verdict is None:
                    verdict, reason = self._revise(spec, ctx, record, failed, watch)
                verdict, reason = self._end_iteration(spec, record, verdict, reason, iteration, t0, it0,
                                                      fingerprint, records, log, ctx)
        except DeadlineReached as exc:  # a wait or a hash ran into the budget
            verdict = Verdict.TIMEOUT
            reason = f"budget of {g.budget_seconds:g}s ran out {exc}"
            if record is not None and (not records or records[-1] is not record):
                reason = f"budget of {g.budget_seconds:g}s ran out during iteration {record.iter} {exc}"
                record.guard, record.elapsed_s = "budget", self.clock() - t0
                records.append(record)
                log.iteration(record.to_dict(), verdict=verdict.value, reason=reason)
        except BaseException as exc:
            log.aborted(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise
        finally:
            self._log = None
            log.close()  # the events file, open while the loop ran
            close = getattr(fingerprint, "close", None)
            if close is not None:
                close()  # release the change journal (an inotify descriptor) now
            watch.close()  # and the guard's journal and private store

        result = LoopResult(
            spec=spec, verdict=verdict, reason=reason, iterations=records,
            started_at=_iso(wall0), ended_at=_iso(self.wall()), elapsed_s=self.clock() - t0,
            log_path=str(paths.log), run_dir=str(paths.run_dir),
            memory_page=str(paths.memory_page) if paths.memory_page else None,
            artifacts={"log": str(paths.log), "run_dir": str(paths.run_dir)},
        )
        if paths.memory_page and paths.memory_page.exists():
            result.artifacts["memory"] = str(paths.memory_page)
        if (paths.run_dir / "suspects.json").is_file():
            result.artifacts["suspects"] = str(paths.run_dir / "suspects.json")
        if self.scrub is not None:  # what the checks' processes wrote there (test ids, caches)
            from pytest_loops.redact import scrub_tree

            scrub_tree(paths.run_dir, self.scrub)
        # The verdict is decided: from here on an artifact that cannot be written is
        # an artifact error (reported, recorded where possible), never a lost verdict.
        for finish in self.finishers:
            try:
                finish(result, paths)
            except OSError as exc:
                self._artifact_failed(getattr(exc, "filename", None) or paths.run_dir, exc)
        self.artifact_errors += [v for k, v in result.artifacts.items() if k.endswith("_error")]
        summary = {"schema": SCHEMA, **header, **summarize(result), "lessons": written_lessons}
        if self.artifact_errors:
            summary["artifact_errors"] = list(self.artifact_errors)
        if not log.finish(summary):
            # the log stays the killed-run events (resumable); a .tine claiming a
            # verdict the log does not hold would contradict it, so there is none
            for key in ("tine",):
                written = result.artifacts.pop(key, None)
                if written:
                    Path(written).unlink(missing_ok=True)
        # the run log's own failure is named first: it is the one a reader looks for
        self.artifact_errors.sort(key=lambda e: not e.startswith(f"{paths.log}:"))
        if self.write_index:
            self._write(paths.artifacts_dir / "index.jsonl", lambda: append_index(
                paths.artifacts_dir / "index.jsonl", {
                    "loop": spec.name, "verdict": result.verdict.value, "exit_code": result.exit_code,
                    "iterations_run": result.iterations_run, "elapsed_s": round(result.elapsed_s, 3),
                    "started_at": result.started_at, "log": str(paths.log),
                }))
        hook.pytest_loop_finished(spec=spec, result=result)
        return result

    # -- the steps ----------------------------------------------------------------

    def _end_iteration(self, spec: LoopSpec, record: IterationRecord, verdict: Verdict | None, reason: str,
                       iteration: int, t0: float, it0: float, fingerprint: Any,
                       records: list[IterationRecord], log: RunLogWriter,
                       ctx: LoopContext) -> tuple[Verdict | None, str]:
        record.guards_seen = self._guards_seen(spec, record, iteration, t0, fingerprint is not None)
        record.duration_s = self.clock() - it0
        record.elapsed_s = self.clock() - t0
        records.append(record)
        # the verdict goes into the same line as its iteration: a run killed after it
        # resumes to this verdict, never to one more iteration
        log.iteration(record.to_dict(), verdict=verdict.value if verdict else None, reason=reason)
        self.pm.hook.pytest_loop_iteration_finished(spec=spec, record=record, context=ctx)
        return verdict, reason

    def _after_verify(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord,
                      failed: list[CheckResult], watch: TreeGuard) -> tuple[Verdict | None, str]:
        if ctx.budget_hit:
            record.guard = "budget"
            return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s ran out during "
                                     f"iteration {record.iter} (a check was killed)")
        if record.passed:
            hidden = any(c.hidden for c in spec.checks)
            if hidden and not self.clean_room:
                verdict, why = self._hidden_here(spec, ctx, record)
                if verdict is not None:
                    return verdict, why
            elif self.clean_room and (watch.started or hidden):  # a revise step ran: it must have earned this
                watch.begin()  # nothing revised yet (hidden checks only): the tree as it is
                c0 = self.clock()
                try:
                    verdict, why = self._confirm(spec, ctx, record, watch)
                finally:
                    record.clean_room_s = self.clock() - c0
                if verdict is not None:
                    return verdict, why
                if not record.passed:  # the clean room's run is the iteration's: the loop goes on
                    return None, ""
            return Verdict.SUCCESS, f"all {len(spec.checks)} check(s) passed in iteration {record.iter}"
        return None, ""

    def _hidden_here(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord) -> tuple[Verdict | None, str]:
        """Without a clean room (a runner that spawns nothing): the hidden checks run here."""
        for check in (c for c in spec.checks if c.hidden):
            result = self._run_check(check, ctx)
            if isinstance(result, CheckResult):
                record.clean_room.append(result)
                if not result.passed:
                    record.guard = "hidden_check"
                    return Verdict.ESCALATE, f"the hidden check {check.name} did not pass: {result.reason}"
        return None, ""

    def _confirm(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord,
                 watch: TreeGuard) -> tuple[Verdict | None, str]:
        """Run every check again in a clean room; a verdict other than SUCCESS, or None.
        A clean room that cannot be made or filled (the temp directory gone, a full
        disk) confirms nothing: ESCALATE, never a lost verdict."""
        try:
            return self._confirm_in_room(spec, ctx, record, watch)
        except OSError as exc:
            record.guard = "clean_room"
            where = f" ({exc.filename})" if exc.filename else ""
            return Verdict.ESCALATE, (f"the clean room could not be built to confirm the pass: "
                                      f"{exc.strerror or exc}{where}")

    def _confirm_in_room(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord,
                         watch: TreeGuard) -> tuple[Verdict | None, str]:
        from pytest_loops.runtime.cleanroom import CleanRoom

        with CleanRoom(str(ctx.workdir), self.env) as room:
            tampered = watch.verify_store()
            if tampered:
                record.guard = "clean_room"
                return Verdict.ESCALATE, ("the loop-start copies of read-only files were changed "
                                          f"behind the harness: {', '.join(tampered[:5])}")
            outside = watch.ancestor_changes()
            if outside:
                record.guard = "clean_room"
                return Verdict.ESCALATE, f"configuration outside the tree changed: {outside[0]}"
            watch.build_clean_room(room.root)
            cwd = Path(room.root) / os.path.relpath(ctx.workdir, watch.root)
            clean = LoopContext(spec=spec, iteration=ctx.iteration, workdir=cwd, run_dir=ctx.run_dir,
                                runner=self.runner, clock=self.clock, deadline=ctx.deadline,
                                base_env=dict(room.env), scrub=self.scrub, clean_room=room,
                                label_prefix="cleanroom-", failed_tests_seen=ctx.failed_tests_seen)
            for check in spec.checks:
                result = self._run_check(check, clean)
                if not isinstance(result, CheckResult):
                    raise TypeError(f"pytest_loop_run_check returned {type(result).__name__} for "
                                    f"{check.name!r} in the clean room; expected a CheckResult")
                record.clean_room.append(result)
                if clean.budget_hit:
                    record.guard = "budget"
                    return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s ran out "
                                             f"during the clean-room confirmation of iteration {record.iter}")
                if not result.passed and check.hidden:
                    record.guard = "hidden_check"
                    return Verdict.ESCALATE, (f"the hidden check {check.name} did not pass in the clean "
                                              f"room: {result.reason}")
                if not result.passed and check.options.get("session_fix"):
                    # the session fix-loop's judged run is its confirm run: a test it finds
                    # failing (a regression) is the next iteration's to repair, not an escalation
                    record.checks = [result if c.name == check.name else c for c in record.checks]
                    record.passed = False
                    record.verify_exit = result.exit_code
                    record.output_tail = result.output_tail
                    return None, ""
                if not result.passed:
                    record.guard = "clean_room"
                    return Verdict.ESCALATE, (
                        f"{check.name} passed in the working tree but not in the clean room "
                        f"(the loop-start tests and configuration, only the in-scope changes, a fresh "
                        f"environment): {result.reason}")
            changed = watch.readonly_digests(room.root)
            if changed:
                record.guard = "clean_room"
                return Verdict.ESCALATE, ("the code under test changed read-only files while it was "
                                          f"judged in the clean room: {', '.join(changed[:5])}")
        return None, ""

    def _guards(self, spec: LoopSpec, record: IterationRecord, failed: list[CheckResult],
                iteration: int, streak: int, *, measurable: bool,
                machine_ok: bool, history: Mapping[str, list[bool]]) -> tuple[Verdict | None, str]:
        g = spec.guards
        why = ""
        signal = spec.no_progress_signal
        if signal in ("state", "both") and guards.no_progress(streak, g.no_progress_k, measurable):
            why = (f"state unchanged for {streak} iteration(s) in a row "
                   f"(no_progress_k={g.no_progress_k}; watched: {', '.join(spec.state_paths)})")
        elif signal in ("failure", "both") and guards.no_progress(record.same_failure_streak,
                                                                 g.no_progress_k, True):
            why = (f"the same failure {record.same_failure_streak + 1} iterations in a row "
                   f"(no_progress_k={g.no_progress_k}, signal={signal}): {_failed_names(failed)}")
        else:
            flappers = [name for name, seen in history.items() if guards.flapping(seen, g.no_progress_k)]
            if flappers:
                why = (f"flapping: {', '.join(flappers[:3])} alternated pass/fail for the last "
                       f"{max(4, 2 * g.no_progress_k)} iterations; the revise step undoes its own fixes")
        if why:
            record.guard = "no_progress"
            if spec.escalate_when_blocked:
                return Verdict.ESCALATE, f"blocked, asking a human: {why}"
            return Verdict.NO_PROGRESS, why
        if machine_ok:
            record.guard = "human"
            return Verdict.ESCALATE, "; ".join(c.reason for c in failed)
        if guards.should_escalate(iteration, g.escalate_after):
            record.guard = "escalate"
            return Verdict.ESCALATE, (f"escalate_after={g.escalate_after} reached: still failing after "
                                      f"{iteration} iteration(s) ({_failed_names(failed)})")
        if guards.cap_reached(iteration, g.max_iter):
            record.guard = "max_iter"
            if spec.stop_message:
                return Verdict.MAX_ITER, spec.stop_message
            return Verdict.MAX_ITER, (f"max_iter={g.max_iter} reached without passing "
                                      f"({_failed_names(failed)})")
        return None, ""

    def _revise(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord,
                failed: list[CheckResult], watch: TreeGuard) -> tuple[Verdict | None, str]:
        if ctx.deadline is not None and self.clock() >= ctx.deadline:
            record.guard = "budget"
            return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s used up before "
                                     f"the revise step of iteration {record.iter}")
        failure_file = ctx.failure_file
        self._write(failure_file, lambda: write_failure_file(failure_file, failed, scrub=ctx.scrub))
        if self.localize:
            from pytest_loops.localization.localize import localize

            try:
                if localize(ctx, failed) is not None:
                    record.suspects_file = str(ctx.iteration_dir / "suspects.json")
                record.suspects_note = ctx.suspects_note or None
            except OSError as exc:
                self._artifact_failed(getattr(exc, "filename", None) or failure_file.parent, exc)
        prompt = build_prompt(spec, ctx, failed)
        self._write(failure_file.with_name("prompt.md"),
                    lambda: ctx.prompt_file.write_text(prompt, encoding="utf-8"))
        r0 = self.clock()
        watch.before_revise()
        # the iteration so far (verify, guards): a run killed during the revise step
        # resumes by running it again, not by verifying this iteration twice
        if self._log is not None:
            self._log.revise_start(record.to_dict())
        outcome = self.pm.hook.pytest_loop_revise(spec=spec, iteration=record.iter, context=ctx)
        record.revise_duration_s = self.clock() - r0
        if self._log is not None:
            self._log.revise_end(record.iter, _exit_of(outcome))
        passed = watch.after_revise()
        record.protected_changes = [v.describe() for v in passed.violations]
        record.caches_cleared = len(passed.caches_cleared)
        if passed.violations:
            record.guard = "protected"
            undone = all(v.restored for v in passed.violations)
            shown = ", ".join(v.describe() for v in passed.violations[:6])
            more = f" and {len(passed.violations) - 6} more" if len(passed.violations) > 6 else ""
            return Verdict.ESCALATE, (f"revise step changed read-only paths: {shown}{more}; "
                                      + ("they were restored" if undone else "not all could be restored"))
        if self.audit != "off" and passed.in_scope:
            verdict, why = self._audit(spec, ctx, record, watch, failed)
            if verdict is not None:
                return verdict, why
        if outcome is None:
            return None, ""
        if isinstance(outcome, CommandResult):
            record.revise_exit = outcome.exit_code
            record.revise_tail = outcome.tail
            record.revise_output_file = outcome.output_file
            if ctx.budget_hit:
                record.guard = "budget"
                return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s ran out during "
                                         f"the revise step of iteration {record.iter} (it was killed)")
            if outcome.start_error or outcome.exit_code in CANNOT_START_EXIT_CODES:
                record.guard = "revise"
                why = outcome.start_error or f"exit {outcome.exit_code}: {outcome.tail.strip()[-200:]}"
                return Verdict.ESCALATE, f"the revise step could not start: {why}"
            return None, ""
        if isinstance(outcome, bool) or not isinstance(outcome, int):
            raise TypeError(f"pytest_loop_revise returned {outcome!r}; expected an int exit code, "
                            "a CommandResult or None")
        record.revise_exit = outcome
        return None, ""

    def _audit(self, spec: LoopSpec, ctx: LoopContext, record: IterationRecord, watch: TreeGuard,
               failed: list[CheckResult]) -> tuple[Verdict | None, str]:
        """The diff audit over every in-scope file changed since the loop started."""
        from pytest_loops.runtime.audit import FileChange, failing_literals

        for check in failed:
            self._literals |= failing_literals(_read_text(check.output_file) or check.output_tail)
        ctx.audit_literals = frozenset(self._literals)
        diff = []
        for rel, how in watch.changes_since_start():
            if not rel.endswith(".py"):
                continue
            after = None if how == "deleted" else _read_text(str(watch.root) + "/" + rel)
            diff.append(FileChange(rel, watch.start_text(rel), after))
        if not diff:
            return None, ""
        found = [f for batch in self.pm.hook.pytest_loop_audit(diff=diff, context=ctx) or [] for f in batch or []]
        if not found:
            return None, ""
        from pytest_loops.runtime.protect import printable

        lines = [printable(f.describe() if hasattr(f, "describe") else str(f)) for f in found]
        record.audit_findings = lines
        if self.audit == "warn":
            return None, ""
        record.guard = "audit"
        shown = "; ".join(lines[:3]) + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")
        return Verdict.ESCALATE, f"the diff audit flagged the revise step's changes: {shown}"

    def _guards_seen(self, spec: LoopSpec, record: IterationRecord, iteration: int, t0: float,
                     measurable: bool) -> dict[str, Any]:
        g = spec.guards
        elapsed = self.clock() - t0
        seen: dict[str, Any] = {"iteration": f"{iteration}/{g.max_iter}", "elapsed_s": round(elapsed, 3)}
        if g.budget_seconds > 0:
            seen["budget_left_s"] = round(max(0.0, g.budget_seconds - elapsed), 3)
        if measurable and g.no_progress_k > 0:
            seen["unchanged"] = f"{record.unchanged_streak}/{g.no_progress_k}"
        if g.escalate_after > 0:
            seen["escalate_after"] = f"{iteration}/{g.escalate_after}"
        return seen

    # -- several loops ------------------------------------------------------------

    def run_pipeline(self, pipeline: Pipeline, **kwargs: Any) -> list[LoopResult]:
        """Run stages in order, fail-fast: a stage that does not reach SUCCESS stops the rest."""
        results: list[LoopResult] = []
        for stage in pipeline.stages:
            result = self.run(stage, **kwargs)
            results.append(result)
            if not result.succeeded:
                break
        return results


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed run does first: run an interrupted revise step again, or write
    out a verdict the killed run had decided; neither (the default): verify next."""

    revise: IterationRecord | None = None
    decided: tuple[str, str] | None = None  # (verdict, reason)


def resume_plan(resume_from: Mapping[str, Any] | None, spec: LoopSpec,
                prior: Sequence[IterationRecord]) -> ResumePlan:
    """The plan for resuming from ``resume_from`` (a loaded run log) with ``spec``.

    A verdict the killed run had decided (its last iteration line names it) is
    kept, unless it is MAX_ITER or TIMEOUT and the resumed run raised that limit.
    """
    if not resume_from:
        return ResumePlan()
    pending = resume_from.get("revise_interrupted")
    if isinstance(pending, dict):
        try:
            record = IterationRecord.from_dict(pending)
        except (TypeError, ValueError, AttributeError):
            return ResumePlan()  # not a record: verify that iteration afresh
        if record.iter == len(prior) + 1:
            return ResumePlan(revise=record)
    decided = resume_from.get("decided")
    if not isinstance(decided, dict) or not prior or decided.get("iter") != prior[-1].iter:
        return ResumePlan()
    try:
        verdict = Verdict(str(decided.get("verdict")))
    except ValueError:
        return ResumePlan()
    found = resume_from.get("guards")
    logged: dict[str, Any] = found if isinstance(found, dict) else {}
    raised = {Verdict.MAX_ITER: "max_iter", Verdict.TIMEOUT: "budget_seconds"}.get(verdict)
    if raised and logged.get(raised) != getattr(spec.guards, raised):
        return ResumePlan()
    return ResumePlan(decided=(verdict.value, str(decided.get("reason") or "")))


def stop_leftovers(run_dir: Any, *, wait_s: float = 10.0) -> list[int]:
    """Kill the processes a killed run left behind: those whose environment names its
    run directory (``LOOP_RUN_DIR``). Linux (/proc) only; returns their pids."""
    import signal

    if not isinstance(run_dir, str) or not run_dir or not os.path.isdir("/proc"):
        return []
    needle = f"LOOP_RUN_DIR={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
            found.append(int(entry))
        except OSError:
            continue
    end = time.monotonic() + wait_s
    while found and time.monotonic() < end and any(_alive(pid) for pid in found):
        time.sleep(0.02)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"  # a zombie is gone
    except OSError:
        return False


def _exit_of(outcome: Any) -> int | None:
    if isinstance(outcome, CommandResult):
        return outcome.exit_code
    return outcome if isinstance(outcome, int) and not isinstance(outcome, bool) else None


def _log_holder(log: Path) -> str:
    """"held by pid N since T" from the start line of the run log being written."""
    import json

    try:
        with open(log, encoding="utf-8") as f:
            start = json.loads(f.readline())
        pid, since = start.get("pid"), start.get("started_at")
    except (OSError, ValueError, AttributeError):
        pid = since = None
    if pid is None:
        return "held by a run that has not written its start line yet"
    return f"held by pid {pid} since {since}"


def _shown_spec(spec: LoopSpec) -> dict[str, Any]:
    """The spec as the run log shows it while the loop runs (a revise step can read the
    log): what a hidden check runs is not in it."""
    data = spec.to_dict()
    for i, check in enumerate(data["checks"]):
        if check.get("hidden"):
            data["checks"][i] = {"kind": check["kind"], "name": f"hidden check {i + 1}", "hidden": True,
                                 "command": "(hidden)" if check.get("command") else None,
                                 "node_id": "(hidden)" if check.get("node_id") else None}
    return data


def _read_text(path: str | None, limit: int = 1 << 20) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def iteration_signature(failed: list[CheckResult]) -> str | None:
    """One fingerprint of what failed this iteration: each failed check's name and
    normalized failure (line numbers, addresses, temp paths and timings stripped)."""
    if not failed:
        return None
    import hashlib

    from pytest_loops.progress.signature import failure_signature

    parts = []
    for c in sorted(failed, key=lambda c: c.name):
        kind = "pytest" if c.kind == "pytest" or "pytest" in (c.command or "") else "command"
        parts.append(f"{c.name}\0{c.exit_code}\0{failure_signature(c.output_tail, kind=kind)}")
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _note_failed_tests(seen: dict[str, set[str]], checks: list[CheckResult]) -> None:
    """Add the node ids the failed command checks' output names as failed to ``seen``."""
    from pytest_loops.runtime.capture import output_lines
    from pytest_loops.runtime.cleanroom import failed_node_ids

    for c in checks:
        if not c.passed and c.kind == CheckKind.COMMAND.value:
            seen.setdefault(c.name, set()).update(failed_node_ids(output_lines(c.output_file, c.output_tail)))


def _failed_names(failed: list[CheckResult]) -> str:
    names = ", ".join(f"{c.name}: {c.reason}" if c.reason else c.name for c in failed[:3])
    more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    return f"failing: {names}{more}" if names else "no check passed"


def summarize(result: LoopResult) -> dict[str, Any]:
    """The run-log summary keys (the loop-runner keys and ours)."""
    return {
        "verdict": result.verdict.value,
        "exit_code": result.exit_code,
        "reason": result.reason,
        "iterations_run": result.iterations_run,
        "ended_at": result.ended_at,
        "elapsed_s": round(result.elapsed_s, 6),
        "artifacts": dict(result.artifacts),
        "iterations": [r.to_dict() for r in result.iterations],
    }


def run_loop(spec: LoopSpec, **engine_kwargs: Any) -> LoopResult:
    """Run one loop with a default engine: ``run_loop(spec, runner=..., clock=...)``."""
    run_kwargs = {k: engine_kwargs.pop(k) for k in ("log_path", "memory_page") if k in engine_kwargs}
    return Engine(**engine_kwargs).run(spec, **run_kwargs)

"""The control loop: verify -> guards -> reflect -> revise, until a verdict.

Each iteration runs, in this order: budget (before work, and enforced during
commands), cap, verify, progress, no-progress, escalate, lesson, revise; the
guards' ruling takes effect after the lesson, so the iteration that stops a loop
still leaves its lesson. The cap is also applied at the end of the iteration
that reaches it, so no revise step is paid for whose result could never be
verified. :class:`~pytest_loops.core.state.LoopState` carries the iteration and
checks the order of its steps.

The engine writes no artifact itself: the run log, the lessons page, ``.tine`` and
the hand-off are hook implementations (``pytest_loop_started``, ``..._iteration_finished``,
``..._finished``; see docs/hooks.md), and localization is an object handed in. The
engine never imports pytest; time comes from an injectable clock and commands
from an injectable runner, so every guard is testable without sleeping or
spawning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from pytest_loops.core import contextfile, ctxadapter, fanout, guards, isolation, revisestep
from pytest_loops.core.context import (
    CommandRunner,
    Fingerprint,
    Localizer,
    LoopContext,
    LoopRun,
    RunPaths,
    hold_run_log,
    resolve_paths,
    with_python_on_path,
)
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.core.revise import CANNOT_START_EXIT_CODES, build_prompt, write_failure_file
from pytest_loops.core.state import LoopState, ResumePlan, Step, resume_plan, stop_leftovers
from pytest_loops.core.usage import record_usage, spent_guard, spent_seen
from pytest_loops.deadline import DeadlineReached
from pytest_loops.limits import write_fresh
from pytest_loops.results import CheckResult, CommandResult, IterationRecord, LoopResult
from pytest_loops.runtime.cleanroom import note_failed_tests
from pytest_loops.runtime.importguard import imports_guarded
from pytest_loops.spec import Check, LoopSpec, Pipeline
from pytest_loops.verdict import Verdict

if TYPE_CHECKING:
    from pytest_loops.runtime.protect import TreeGuard
    from pytest_loops.sandbox import Choice

AUDIT_CHOICES = ("error", "warn", "off")


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


@dataclass
class _Loop:
    """One loop while the engine drives it."""

    spec: LoopSpec
    paths: RunPaths
    run: LoopRun
    state: LoopState
    plan: ResumePlan
    t0: float
    deadline: float | None
    stop: Callable[[], bool] | None
    workdir: Path
    watch: TreeGuard
    fingerprint: Any
    first_results: Mapping[str, CheckResult] | None
    pending: IterationRecord | None  # the record of an iteration whose revise step was cut off
    lessons: list[str] = field(default_factory=list)
    literals: set[str] = field(default_factory=set)  # failing assertions' literals (the audit)
    revised: set[str] = field(default_factory=set)  # in-scope paths a revise step changed (not a check)
    # check name -> the pytest node ids its output named failed so far (the clean room's rule)
    failed_tests_seen: dict[str, set[str]] = field(default_factory=dict)
    ctx: LoopContext | None = None
    isolation: isolation.Isolation | None = None
    usage_dir: Path | None = None  # LOOP_USAGE_FILE's directory: outside the tree, writable by the revise step


class Engine:
    """Runs loops. Construct once, call :meth:`run` per loop.

    :param runner: runs shell commands (default: :class:`~pytest_loops.runtime.process.ProcessRunner`).
    :param clock: monotonic seconds (inject a fake one in tests).
    :param wall: wall-clock seconds for timestamps.
    :param plugin_manager: a pluggy manager with the ``pytest_loop_*`` hooks
        (default: :func:`~pytest_loops.core.pluginmanager.make_plugin_manager`, which
        has no artifact writers: :func:`pytest_loops.artifacts.finishers.make_engine`
        makes an engine with the built-in writers and localization).
    :param fingerprint_factory: ``(root, patterns, exclude) -> Fingerprint``.
    :param localizer: failing tests, narrowed reruns and suspects for checks and the
        revise step (:class:`pytest_loops.localization.localize.Localizer`); None: none.
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
                 localizer: Localizer | None = None,
                 clean_room: bool | None = None,
                 audit: str = "error",
                 audit_allow: Sequence[str] = (),
                 hide_env: Sequence[str] = (),
                 sandbox: str | None = None,
                 sandbox_writable: Sequence[str] | None = None,
                 sandbox_network: bool | None = None,
                 grants: Sequence[str] | None = None,
                 adapter: ctxadapter.AdapterOptions | None = None) -> None:
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
        self.audit_allow = tuple(audit_allow)  # globs of non-text files the revise step may add
        # the kernel's isolation needs real processes too: chosen once, for every loop
        sandbox, self.sandbox_writable, self.sandbox_network = isolation.from_environment(
            sandbox, sandbox_writable, sandbox_network, self.env)
        self.sandbox: Choice | None = isolation.choose_sandbox(sandbox) if clean_room else None
        self.write_index = write_index
        # grants given here (the API, --grants) replace the loop's own line; None: the loop's
        self.grants = None if grants is None else tuple(grants)
        self.adapter = adapter or ctxadapter.AdapterOptions()
        self.localize = localize
        self.localizer = localizer
        # "PATH: [Errno N] message" for each artifact the last run could not write
        self.artifact_errors: list[str] = []

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
            before_start: Callable[[Callable[[], bool] | None], None] | None = None,
            observed: Mapping[str, str] | None = None) -> LoopResult:
        """Drive one loop to its verdict.

        ``observed`` (tree-relative path -> reason): files the caller saw the tests read
        before any revise step (the session's own run): read-only for the loop.

        ``first_results`` (check name -> result) stands in for running those checks
        in iteration 1, when the caller has just run them (a failed pytest test).
        ``resume_from`` is a loaded run log (:func:`~pytest_loops.artifacts.runlog.load_runlog`)
        of a killed or stopped run: its iterations, streak and spent time carry
        over, and the new log names the old one. A revise step the killed run
        had started and not finished is run again, once; a verdict it had decided
        and not yet written out is kept (see :func:`~pytest_loops.core.state.resume_plan`).
        ``before_start(should_stop)`` runs first, on the loop's budget (the working
        tree's lock is waited for so); it may raise :class:`DeadlineReached`.

        One run writes a run log at a time: a second run given the same log path
        raises LoopUsageError naming the run that holds it.
        """
        fanout.check_fan_out(spec)  # bad input before anything runs or is written
        if self.grants is not None and tuple(self.grants) != spec.grants:
            spec = spec.replace(grants=self.grants, origin={**spec.origin, "grants": "the engine's grants"})
        wall0 = self.wall()
        self.artifact_errors = []
        paths = resolve_paths(spec, artifacts_dir=self.artifacts_dir, log_path=log_path,
                              memory_page=memory_page, wall=wall0)
        if log_path:  # a run log given a path writes over no file that is not one (nor do .tine, hand-off)
            from pytest_loops.runtime.outpaths import check_artifact_paths

            check_artifact_paths(paths.log, "the run log path")
        if any(p is not None and p.is_relative_to(paths.artifacts_dir) for p in (paths.log, paths.memory_page)):
            from pytest_loops.runtime.outpaths import keep_out_of_git

            keep_out_of_git(paths.artifacts_dir)
        locks = []
        try:
            # the log resumed from too: a run still writing it, or a second resume of
            # it, would count its iterations twice
            old = (resume_from or {}).get("log_path")
            if old and Path(old).resolve() != paths.log.resolve():
                locks.append(hold_run_log(Path(old), self._artifact_failed,
                                            what="the run log to resume is still being written",
                                            fix="wait for that run to end, or stop it"))
            locks.append(hold_run_log(paths.log, self._artifact_failed))
            # from here to the verdict's last artifact this process imports no module
            # the loop wrote into its tree (pytest_loops.runtime.importguard)
            with imports_guarded(spec.cwd or os.getcwd(), time.time()):
                loop = self._start(spec, paths, wall0, first_results, resume_from)
                if observed and not resume_from:
                    loop.watch.observe(dict(observed))
                    loop.run.header["observed_readonly"] = sorted(observed)[:200]
                return self._drive(loop, wall0, before_start)
        finally:
            for lock in reversed(locks):
                if lock is not None:
                    lock.release()

    def _start(self, spec: LoopSpec, paths: RunPaths, wall0: float,
               first_results: Mapping[str, CheckResult] | None,
               resume_from: Mapping[str, Any] | None) -> _Loop:
        """Everything a loop needs before its first iteration; the writers are told it started."""
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
        plan = resume_plan(resume_from, spec, prior)
        run = LoopRun(spec=spec, paths=paths, header={}, scrub=self.scrub, artifact_failed=self._artifact_failed,
                      artifact_errors=self.artifact_errors, prior=prior, decided=plan.decided,
                      write_index=self.write_index)
        lessons_read = list(self.pm.hook.pytest_loop_recall(spec=spec, run=run) or [])
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
        from pytest_loops import __version__

        usage_dir = Path(tempfile.mkdtemp(prefix="pytest-loops-usage-"))
        confined = None if self.sandbox is None else isolation.Isolation(
            self.sandbox, watch, own=[paths.log, paths.run_dir, paths.memory_page, paths.artifacts_dir],
            writable=(*self.sandbox_writable, str(usage_dir)), network=self.sandbox_network)
        run.header.update({
            "sandbox": isolation.header(self.sandbox),
            "loop": spec.name, "identity": spec.identity, "goal": spec.goal, "source": spec.source,
            "guards": g.to_dict(), "state_paths": list(spec.state_paths),
            "started_at": _iso(wall0), "cwd": str(workdir), "revise": spec.revise,
            "spec": spec.shown_dict(), "spec_digest": spec.digest(),
            "memory_page": str(paths.memory_page) if paths.memory_page else None,
            "lessons_read": lessons_read, "run_dir": str(paths.run_dir),
            "pytest_loops_version": __version__,
        })
        if resume_from is not None:
            run.header["resumed_from"] = (resume_from.get("log_path")
                                          or (resume_from.get("artifacts") or {}).get("log"))
            run.header["resumed_after_iterations"] = len(prior)
        if resume_from is not None and resume_from.get("incomplete"):
            # a killed run's revise step (or check) may still be running in its own
            # process group: stop it, or it would finish beside the one run again
            stop_leftovers(resume_from.get("run_dir"))
        state = LoopState.resumed(prior)
        failed_tests_seen: dict[str, set[str]] = {}
        for old in prior:
            note_failed_tests(failed_tests_seen, old.checks)
        if plan.decided is not None:
            state.decide(Verdict(plan.decided[0]), plan.decided[1])
        self.pm.hook.pytest_loop_started(spec=spec, run=run)
        return _Loop(spec=spec, paths=paths, run=run, state=state, plan=plan, t0=t0, deadline=deadline,
                     stop=stop, workdir=workdir, watch=watch, fingerprint=fingerprint,
                     first_results=first_results if not prior else None, pending=plan.revise,
                     lessons=list(lessons_read), failed_tests_seen=failed_tests_seen, isolation=confined,
                     usage_dir=usage_dir)

    def _drive(self, loop: _Loop, wall0: float,
               before_start: Callable[[Callable[[], bool] | None], None] | None) -> LoopResult:
        """Iterations until a verdict; the result, recorded by the writers."""
        spec, paths, state, hook = loop.spec, loop.paths, loop.state, self.pm.hook
        try:
            if before_start is not None:
                before_start(loop.stop)
            while state.verdict is None:
                self._iteration(loop)
        except DeadlineReached as exc:  # a wait or a hash ran into the budget
            self._ran_out(loop, exc)
        except BaseException as exc:
            hook.pytest_loop_aborted(spec=spec, run=loop.run,
                                     error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise
        finally:
            close = getattr(loop.fingerprint, "close", None)
            if close is not None:
                close()  # release the change journal (an inotify descriptor) now
            if loop.watch.started:  # what the last checks changed of the read-only files goes back
                with contextlib.suppress(OSError, DeadlineReached):
                    loop.watch.before_revise()
            loop.watch.close()  # and the guard's journal and private store
            if loop.isolation is not None:
                loop.isolation.close()
            if loop.usage_dir is not None:
                shutil.rmtree(loop.usage_dir, ignore_errors=True)
        assert state.verdict is not None
        result = LoopResult(
            spec=spec, verdict=state.verdict, reason=state.reason, iterations=state.records,
            started_at=_iso(wall0), ended_at=_iso(self.wall()), elapsed_s=self.clock() - loop.t0,
            log_path=str(paths.log), run_dir=str(paths.run_dir),
            memory_page=str(paths.memory_page) if paths.memory_page else None,
            artifacts={"log": str(paths.log), "run_dir": str(paths.run_dir)},
            sandbox=dict(loop.run.header.get("sandbox") or {}),
        )
        if paths.memory_page and paths.memory_page.exists():
            result.artifacts["memory"] = str(paths.memory_page)
        if (paths.run_dir / "suspects.json").is_file():
            result.artifacts["suspects"] = str(paths.run_dir / "suspects.json")
        if self.scrub is not None:  # what the checks' processes wrote there (test ids, caches)
            from pytest_loops.redact import scrub_tree

            scrub_tree(paths.run_dir, self.scrub)
        # The verdict is decided: from here on an artifact that cannot be written is an
        # artifact error (reported, recorded where possible), never a lost verdict.
        hook.pytest_loop_finished(spec=spec, result=result, run=loop.run)
        return result

    def _ran_out(self, loop: _Loop, exc: DeadlineReached) -> None:
        """A wait or a hash ran into the budget: TIMEOUT, the iteration it cut recorded."""
        state, budget = loop.state, loop.spec.guards.budget_seconds
        record, reason = state.record, f"budget of {budget:g}s ran out {exc}"
        cut = record is not None and (not state.records or state.records[-1] is not record)
        if record is not None and cut:
            reason = f"budget of {budget:g}s ran out during iteration {record.iter} {exc}"
        if state.step is not Step.VERDICT:
            state.decide(Verdict.TIMEOUT, reason)
        else:
            state.verdict, state.reason = Verdict.TIMEOUT, reason
        if record is not None and cut:
            record.guard, record.elapsed_s = "budget", self.clock() - loop.t0
            state.records.append(record)
            self.pm.hook.pytest_loop_iteration_finished(spec=loop.spec, record=record, context=loop.ctx,
                                                        run=loop.run, verdict=Verdict.TIMEOUT, reason=reason)

    def _iteration(self, loop: _Loop) -> None:
        """One iteration: verify -> guards -> reflect -> revise -> next, or a verdict."""
        spec, state, g = loop.spec, loop.state, loop.spec.guards
        state.iteration += 1
        if guards.budget_exhausted(self.clock() - loop.t0, g.budget_seconds):
            state.decide(Verdict.TIMEOUT, f"budget of {g.budget_seconds:g}s used up before iteration {state.iteration}")
            return
        if state.iteration > g.max_iter:  # only a resumed run can get here
            state.iteration -= 1
            state.decide(Verdict.MAX_ITER, f"max_iter={g.max_iter} already reached by the resumed run; "
                                           "raise the cap (--max-iter) to continue")
            return
        pending, loop.pending = loop.pending, None
        resumed = pending is not None and pending.iter == state.iteration
        record = pending if pending is not None and resumed else IterationRecord(
            iter=state.iteration, started_at=_iso(self.wall()))
        state.begin(record)
        it0 = self.clock()
        ctx = loop.ctx = LoopContext(
            spec=spec, iteration=state.iteration, workdir=loop.workdir, run_dir=loop.paths.run_dir,
            runner=self.runner, clock=self.clock, deadline=loop.deadline, base_env=dict(self.env),
            lessons=loop.lessons, scrub=self.scrub, previous=state.records[-1] if state.records else None,
            artifact_error=self._artifact_failed, localizer=self.localizer,
            failed_tests_seen=loop.failed_tests_seen, confine=loop.isolation, usage_dir=loop.usage_dir)
        if state.iteration == 1 and not resumed and loop.first_results is None and self.clean_room \
                and not loop.watch.started:
            ctx.closure_dir = loop.paths.run_dir / "closure"  # what the tests read, observed
        if resumed:
            # verify, progress, lesson and guards ran before the kill: only the revise
            # step is run again, so no iteration is counted twice
            state.resume_revise(record)
            state.to(Step.REVISE)
            if not state.decide(*self._revise(loop, ctx, record, state.failed)):
                state.to(Step.NEXT)
            self._end_iteration(loop, record, ctx, it0)
            return
        state.to(Step.VERIFY)
        decided = self._verify(loop, ctx, record, it0)
        if ctx.closure_dir is not None:
            self._observe_closure(loop, ctx)
        if not state.decide(*decided):
            revisestep.verify_cannot_start(loop, record)
            state.to(Step.GUARDS)
            measured = loop.fingerprint is not None
            state.measure(record, self._measure(loop) if measured else None, measured)
            # only checks a machine can never pass are left: a human is needed
            machine_ok = all(c.needs_human for c in state.failed)
            ruling = guards.rule(spec, record, state.failed, state.iteration, state.streak, measurable=measured,
                                  machine_ok=machine_ok, history=state.history)
            state.to(Step.REFLECT)
            if not machine_ok:
                self._reflect(loop, record, "untracked" if not measured else record.state_changed)
            if not state.decide(*ruling):
                state.to(Step.REVISE)
                if not state.decide(*self._revise(loop, ctx, record, state.failed)):
                    state.to(Step.NEXT)
        self._end_iteration(loop, record, ctx, it0)

    def _verify(self, loop: _Loop, ctx: LoopContext, record: IterationRecord,
                it0: float) -> tuple[Verdict | None, str]:
        """Run the visible checks (hidden ones run only in the clean room, before SUCCESS)."""
        visible = [c for c in loop.spec.checks if not c.hidden]
        first = loop.first_results if record.iter == 1 else None
        for check in visible:
            checked = first[check.name] if first and check.name in first else self._run_check(check, ctx)
            if not isinstance(checked, CheckResult):
                raise TypeError(f"pytest_loop_run_check returned {type(checked).__name__} for {check.name!r}; "
                                "expected a CheckResult")
            record.checks.append(checked)
            if ctx.budget_hit:
                break
        record.verify_duration_s = self.clock() - it0
        failed = [c for c in record.checks if not c.passed]
        note_failed_tests(loop.failed_tests_seen, failed)  # read before any revise step runs
        record.passed = bool(record.checks) and not failed and len(record.checks) == len(visible)
        first_failed = failed[0] if failed else None
        record.verify_exit = first_failed.exit_code if first_failed else 0
        record.output_tail = (first_failed or record.checks[-1]).output_tail if record.checks else ""
        verdict = self._after_verify(loop.spec, ctx, record, failed, loop.watch)
        loop.state.failed = [c for c in record.checks if not c.passed]  # the clean room may have failed one
        return verdict

    def _observe_closure(self, loop: _Loop, ctx: LoopContext) -> None:
        """The files and helpers the first verify's tests read: read-only from now on."""
        from pytest_loops.core.closure import read_closure

        directory, ctx.closure_dir = ctx.closure_dir, None
        if directory is None or loop.watch.started:
            return
        observed = read_closure(directory, loop.watch.root)
        if observed:
            loop.watch.observe(observed)
            loop.run.header["observed_readonly"] = sorted(observed)[:200]

    def _measure(self, loop: _Loop) -> str:
        """The watched state's fingerprint now."""
        fingerprint, deadline = loop.fingerprint, loop.deadline
        if deadline is not None and hasattr(fingerprint, "should_stop"):
            # hashing stops on time it spends past the deadline; a budget the checks
            # used up to the second is the guards' to judge
            since = self.clock()
            fingerprint.should_stop = lambda since=since: self.clock() > max(deadline, since)
        return str(fingerprint.compute())

    def _reflect(self, loop: _Loop, record: IterationRecord, state_changed: bool | str | None) -> None:
        """The lesson of a failed iteration, by whichever writer keeps lessons."""
        line = self.pm.hook.pytest_loop_reflect(spec=loop.spec, run=loop.run, record=record,
                                                failed=loop.state.failed, state_changed=state_changed)
        if line:
            record.lesson = line
            loop.run.lessons.append(line)
            loop.lessons.append(line)

    # -- the steps ----------------------------------------------------------------

    def _end_iteration(self, loop: _Loop, record: IterationRecord, ctx: LoopContext, it0: float) -> None:
        state = loop.state
        record.guards_seen = guards.seen(loop.spec, record, state.iteration, self.clock() - loop.t0,
                                               loop.fingerprint is not None)
        record.guards_seen.update(spent_seen(loop.spec.guards, [*state.records, record]))
        record.duration_s = self.clock() - it0
        record.elapsed_s = self.clock() - loop.t0
        state.records.append(record)
        # the verdict goes into the same line as its iteration (the run log writer): a run
        # killed after it resumes to this verdict, never to one more iteration
        self.pm.hook.pytest_loop_iteration_finished(spec=loop.spec, record=record, context=ctx, run=loop.run,
                                                    verdict=state.verdict, reason=state.reason)

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
        """Run every check again in a clean room (:mod:`pytest_loops.core.confirm`)."""
        from pytest_loops.core.confirm import confirm

        mounted = self.sandbox is not None and self.sandbox.tier.value == "namespaces"
        return confirm(spec, ctx, record, watch, run_check=self._run_check, env=self.env, scrub=self.scrub,
                       localizer=self.localizer, mounted=mounted)

    def _revise(self, loop: _Loop, ctx: LoopContext, record: IterationRecord,
                failed: list[CheckResult]) -> tuple[Verdict | None, str]:
        """The revise step, then the money and token guards on what the loop has spent."""
        verdict, why = self._revise_step(loop, ctx, record, failed)
        if verdict is None and record.revise_duration_s is not None:
            verdict, why = spent_guard(loop.spec.guards, [*loop.state.records, record], record)
        return verdict, why

    def _revise_step(self, loop: _Loop, ctx: LoopContext, record: IterationRecord,
                     failed: list[CheckResult]) -> tuple[Verdict | None, str]:
        spec, watch = loop.spec, loop.watch
        if ctx.deadline is not None and self.clock() >= ctx.deadline:
            record.guard = "budget"
            return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s used up before "
                                     f"the revise step of iteration {record.iter}")
        failure_file = ctx.failure_file
        self._write(failure_file, lambda: write_failure_file(failure_file, failed, scrub=ctx.scrub))
        if self.localize and self.localizer is not None:
            try:
                if self.localizer.localize(ctx, failed) is not None:
                    record.suspects_file = str(ctx.iteration_dir / "suspects.json")
                record.suspects_note = ctx.suspects_note or None
            except OSError as exc:
                self._artifact_failed(getattr(exc, "filename", None) or failure_file.parent, exc)
        prompt = build_prompt(spec, ctx, failed)
        self._write(failure_file.with_name("prompt.md"),
                    lambda: write_fresh(ctx.prompt_file, prompt))
        answer = self._ask_adapter(loop, ctx, record) if spec.context_adapter else None
        self._write(failure_file.parent,
                    lambda: contextfile.write_context_file(self.pm, spec, ctx, record, adapter=answer))
        r0 = self.clock()
        # a read-only file the checks changed is put back before the revise step starts
        record.protected_changes = [v.describe() for v in watch.before_revise()]
        # the iteration so far (verify, guards): a run killed during the revise step
        # resumes by running it again, not by verifying this iteration twice
        self.pm.hook.pytest_loop_revise_started(spec=spec, run=loop.run, record=record)
        with self._watching(loop, ctx, record):
            outcome = fanout.revise_outcome(self.pm, spec, ctx, record, watch, self._run_check)
        record.revise_duration_s = self.clock() - r0
        record_usage(ctx.usage_dir, record)
        self.pm.hook.pytest_loop_revise_finished(spec=spec, run=loop.run, record=record,
                                                 exit_code=revisestep.exit_of(outcome))
        passed = watch.after_revise()
        record.protected_changes += [v.describe() for v in passed.violations]
        record.caches_cleared = len(passed.caches_cleared)
        if passed.violations:
            record.guard = "protected"
            undone = all(v.restored for v in passed.violations)
            shown = ", ".join(v.describe() for v in passed.violations[:6])
            more = f" and {len(passed.violations) - 6} more" if len(passed.violations) > 6 else ""
            return Verdict.ESCALATE, (f"revise step changed read-only paths: {shown}{more}; "
                                      + ("they were restored" if undone else "not all could be restored"))
        loop.revised.update(rel for rel, _ in passed.in_scope)
        if self.audit != "off" and passed.in_scope:
            verdict, why = self._audit(loop, ctx, record, failed)
            if verdict is not None:
                return verdict, why
        watch.mark()  # what is judged from now on is what was audited
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

    def _ask_adapter(self, loop: _Loop, ctx: LoopContext,
                     record: IterationRecord) -> ctxadapter.AdapterAnswer:
        """Run the loop's context adapter before this revise step (:func:`revisestep.ask_adapter`)."""
        return revisestep.ask_adapter(loop, ctx, record, options=self.adapter, env=self.env, scrub=self.scrub,
                                      write=self._write)

    def _watching(self, loop: _Loop, ctx: LoopContext, record: IterationRecord) -> Any:
        """The live view of the revise step (:mod:`pytest_loops.core.live`), when anything shows it."""
        hook = self.pm.hook
        if not hook.pytest_loop_revise_progress.get_hookimpls():
            return contextlib.nullcontext()
        from pytest_loops.core.live import ReviseWatcher

        spec, run = loop.spec, loop.run
        return ReviseWatcher(
            lambda progress: hook.pytest_loop_revise_progress(spec=spec, run=run, record=record, progress=progress),
            iteration=record.iter, iteration_dir=ctx.iteration_dir, workdir=loop.workdir,
            exclude=[loop.paths.artifacts_dir, loop.paths.run_dir], usage_dir=ctx.usage_dir,
            prior=loop.state.records, scrub=self.scrub,
            describe=lambda line: hook.pytest_loop_revise_line(spec=spec, line=line))

    def _audit(self, loop: _Loop, ctx: LoopContext, record: IterationRecord,
               failed: list[CheckResult]) -> tuple[Verdict | None, str]:
        """The diff audit over every in-scope file changed since the loop started."""
        return revisestep.audit(loop, ctx, record, failed, pm=self.pm, mode=self.audit, allow=self.audit_allow)

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


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return None

"""What a loop leaves behind, written by hook implementations: the run log, the lessons
page, `.tine` provenance and a hand-off.

Each writer is a plugin object registered by name on the loop's plugin manager
(:func:`register_writers`), so a user can add one, or switch one off like any
pluggy plugin (``pm.set_blocked("loop-tine")`` / ``pm.unregister(name=...)``; see
docs/hooks.md). The run log is written as events while the loop runs (a killed
run leaves a readable log) and as a summary by atomic rename at the end; the
`.tine` and the hand-off are written after the verdict and before that summary,
so the summary lists them. A failure to write any of them is recorded in the
summary (``tine_error`` / ``handoff_error``, ``artifact_errors``: the file and the
errno) and never loses the run log or the verdict.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from pytest_loops.artifacts.provenance import MIN_HMAC_KEY_BYTES
from pytest_loops.core.context import LoopRun
from pytest_loops.core.usage import usage_summary
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import LoopSpec
from pytest_loops.verdict import Verdict

if TYPE_CHECKING:
    from pytest_loops.core.engine import Engine

hookimpl = pluggy.HookimplMarker("pytest")

@dataclass(frozen=True)
class ArtifactOptions:
    """How a loop's provenance and hand-off are written."""

    tine: bool = True
    tine_path: str | None = None  # default: beside the run log, suffix .tine
    hmac_key_env: str | None = None  # name of the variable holding the HMAC key
    ed25519_key: str | None = None  # path of an Ed25519 private key file
    handoff: bool = True
    resume_command: Callable[[LoopResult], str] | None = None
    private_artifacts: bool = False  # run log, .tine and hand-off 0600, not the user's umask
    flags: tuple[str, str] = ("--sign-key-env", "--sign-key-file")  # named in errors

    def signing_key(self) -> bytes | None:
        """The HMAC key, read from its variable now (never stored); an Ed25519 key file
        is loaded once to check it. Bad input: LoopUsageError naming the flag."""
        env_flag, file_flag = self.flags
        if self.hmac_key_env is not None and self.ed25519_key is not None:
            raise LoopUsageError("give an HMAC key variable or an Ed25519 key file, not both",
                                 location=f"{env_flag} / {file_flag}")
        if self.ed25519_key is not None:
            from pytest_loops.artifacts.provenance import _signing_key

            try:
                _signing_key(None, self.ed25519_key)
            except LoopUsageError as exc:
                raise LoopUsageError(exc.message, location=f"{file_flag} {self.ed25519_key}",
                                     fix=exc.fix) from None
            return None
        if self.hmac_key_env is None:
            return None
        value = os.environ.get(self.hmac_key_env)
        if not value:
            raise LoopUsageError(f"environment variable {self.hmac_key_env} is not set or empty",
                                 location=env_flag, fix="export the HMAC key (>= 16 bytes) in it")
        key = value.encode()
        if len(key) < MIN_HMAC_KEY_BYTES:
            raise LoopUsageError(f"the HMAC key in {self.hmac_key_env} is {len(key)} bytes; it must be "
                                 f"at least {MIN_HMAC_KEY_BYTES}", location=env_flag,
                                 fix="make one with `tine keygen --hmac --out FILE`")
        return key


class RunLogWriterPlugin:
    """The run log (``pytest-loops.runlog/1``): events while the loop runs, the summary
    at the end by atomic rename, then a line in the artifacts directory's index."""

    name = "loop-runlog"

    def __init__(self, private: bool = False) -> None:
        self.private = private  # the private_artifacts setting: 0600, not the user's umask

    @staticmethod
    def _log(run: LoopRun) -> Any:
        return run.writers.get(RunLogWriterPlugin.name)

    @hookimpl
    def pytest_loop_started(self, run: LoopRun) -> None:
        from pytest_loops.artifacts.runlog import RunLogWriter

        log = RunLogWriter(run.paths.log, scrub=run.scrub, on_error=run.artifact_failed, private=self.private)
        run.writers[self.name] = log
        log.start({**run.header, "pid": os.getpid()})  # who holds the log (the summary need not say)
        for old in run.prior:  # the new log holds the whole loop
            decided = run.decided if old is run.prior[-1] else None
            log.iteration(old.to_dict(), verdict=decided[0] if decided else None,
                          reason=decided[1] if decided else "")

    @hookimpl
    def pytest_loop_revise_started(self, run: LoopRun, record: IterationRecord) -> None:
        # the iteration so far (verify, guards): a run killed during the revise step
        # resumes by running it again, not by verifying this iteration twice
        log = self._log(run)
        if log is not None:
            log.revise_start(record.to_dict())

    @hookimpl
    def pytest_loop_revise_finished(self, run: LoopRun, record: IterationRecord, exit_code: int | None) -> None:
        log = self._log(run)
        if log is not None:
            log.revise_end(record.iter, exit_code)

    @hookimpl(tryfirst=True)
    def pytest_loop_iteration_finished(self, record: IterationRecord, run: LoopRun,
                                       verdict: Verdict | None, reason: str) -> None:
        # the verdict goes into the same line as its iteration: a run killed after it
        # resumes to this verdict, never to one more iteration
        log = self._log(run)
        if log is not None:
            log.iteration(record.to_dict(), verdict=verdict.value if verdict else None, reason=reason)

    @hookimpl
    def pytest_loop_aborted(self, run: LoopRun, error: str) -> None:
        log = self._log(run)
        if log is not None:
            log.aborted(error)

    @hookimpl(tryfirst=True)
    def pytest_loop_finished(self, spec: LoopSpec, result: LoopResult, run: LoopRun) -> None:
        from pytest_loops.artifacts.runlog import SCHEMA, append_index

        log, paths = run.writers.pop(self.name, None), run.paths
        if log is None:
            return
        run.artifact_errors += [v for k, v in result.artifacts.items() if k.endswith("_error")]
        summary = {"schema": SCHEMA, **run.header, **summarize(result), "lessons": list(run.lessons)}
        if run.artifact_errors:
            summary["artifact_errors"] = list(run.artifact_errors)
        if not log.finish(summary):
            # the log stays the killed-run events (resumable); a .tine claiming a
            # verdict the log does not hold would contradict it, so there is none
            written = result.artifacts.pop("tine", None)
            if written:
                Path(written).unlink(missing_ok=True)
        # the run log's own failure is named first: it is the one a reader looks for
        run.artifact_errors.sort(key=lambda e: not e.startswith(f"{paths.log}:"))
        if not run.write_index:
            return
        index = paths.artifacts_dir / "index.jsonl"
        try:
            append_index(index, {
                "loop": spec.name, "verdict": result.verdict.value, "exit_code": result.exit_code,
                "iterations_run": result.iterations_run, "elapsed_s": round(result.elapsed_s, 3),
                "started_at": result.started_at, "log": str(paths.log),
            })
        except OSError as exc:
            run.artifact_failed(getattr(exc, "filename", None) or index, exc)


def summarize(result: LoopResult) -> dict[str, Any]:
    """The run-log summary keys (the loop-runner keys and ours). ``iterations`` is the
    loop's records as they are (the writer reads them one at a time: flat memory)."""
    return {
        "verdict": result.verdict.value,
        "exit_code": result.exit_code,
        "reason": result.reason,
        "iterations_run": result.iterations_run,
        "ended_at": result.ended_at,
        "elapsed_s": round(result.elapsed_s, 6),
        "artifacts": dict(result.artifacts),
        "iterations": result.iterations,
        **usage_summary(result.iterations),  # the loop's spend: {} when nothing was reported
    }


class LessonsWriter:
    """The lessons page: read back at the start, one line per failed iteration."""

    name = "loop-lessons"

    @hookimpl
    def pytest_loop_recall(self, spec: LoopSpec, run: LoopRun) -> list[str] | None:
        from pytest_loops.artifacts.lessons_page import LessonsPage, own_lessons

        if run.paths.memory_page is None:
            return None
        page = LessonsPage(run.paths.memory_page, loop_name=spec.identity, goal=spec.goal)
        run.writers[self.name] = page
        label = run.scrub(spec.identity) if run.scrub is not None else spec.identity
        lessons = own_lessons(page.read_lessons(), label, unlabelled=not spec.anonymous)
        try:
            page.track(label)  # from here on, what others write on the page is undone
        except OSError as exc:
            run.artifact_failed(getattr(exc, "filename", None) or page.path, exc)
        return lessons

    @hookimpl
    def pytest_loop_reflect(self, spec: LoopSpec, run: LoopRun, record: IterationRecord,
                            failed: list[CheckResult], state_changed: bool | str | None) -> str | None:
        from pytest_loops.artifacts.lessons import compose_lesson

        page = run.writers.get(self.name)
        if page is None:
            return None
        line = compose_lesson(record.iter, record.verify_exit, state_changed, failed, loop_name=spec.identity)
        if run.scrub is not None:
            line = run.scrub(line)
        try:
            page.append(line)
        except OSError as exc:  # the lesson stays in the run log; the page is an artifact
            run.artifact_failed(getattr(exc, "filename", None) or page.path, exc)
        self._undone(run, page, [])
        return line

    @hookimpl(tryfirst=True)
    def pytest_loop_iteration_finished(self, run: LoopRun) -> None:
        """What a revise step or a check wrote on the page during the iteration is undone
        (before the run log's line for it, which records what was removed)."""
        page = run.writers.get(self.name)
        if page is not None:
            self._undone(run, page, self._undo(run, page))

    @hookimpl
    def pytest_loop_finished(self, run: LoopRun) -> None:
        page = run.writers.pop(self.name, None)
        if page is not None:
            self._undo(run, page)  # the clean room and the last writers ran since
            page.close()

    @staticmethod
    def _undo(run: LoopRun, page: Any) -> list[str]:
        try:
            return list(page.undo_foreign())
        except OSError as exc:
            run.artifact_failed(getattr(exc, "filename", None) or page.path, exc)
            return []

    @staticmethod
    def _undone(run: LoopRun, page: Any, removed: list[str]) -> None:
        removed = [*page.removed, *removed]
        page.removed.clear()
        if removed:  # into the run log's summary (its header is part of it)
            kept = run.header.setdefault("lessons_page_restored", [])
            kept += removed[: max(0, 50 - len(kept))]


class TineWriter:
    """`.tine` provenance (opentine) beside the run log, vouched by the local key and
    signed when a key is given. A file the local key could not vouch for is still
    written; ``artifacts.tine_unvouched`` in the run log says why."""

    name = "loop-tine"

    def __init__(self, options: ArtifactOptions, key: bytes | None) -> None:
        self.options, self.key = options, key

    @hookimpl
    def pytest_loop_started(self) -> None:
        """opentine is imported before any check runs: code under test that edits an
        installed package while it is checked cannot reach the harness's own process."""
        import opentine  # noqa: F401

        from pytest_loops.artifacts import provenance  # noqa: F401

    @hookimpl(tryfirst=True)
    def pytest_loop_finished(self, result: LoopResult, run: LoopRun) -> None:
        from pytest_loops.artifacts.provenance import write_tine

        options = self.options
        target = Path(options.tine_path) if options.tine_path else run.paths.log.with_suffix(".tine")
        unvouched: list[str] = []
        try:
            result.artifacts["tine"] = write_tine(result, target, hmac_key=self.key,
                                                  ed25519_key_path=options.ed25519_key,
                                                  on_unvouched=unvouched.append,
                                                  private=options.private_artifacts)
            if unvouched:
                result.artifacts["tine_unvouched"] = unvouched[-1]
        except Exception as exc:  # noqa: BLE001 - provenance must never cost the run log
            result.artifacts["tine_error"] = artifact_error(target, exc)


class HandoffWriter:
    """A hand-off page for a human when the loop did not succeed."""

    name = "loop-handoff"

    def __init__(self, resume_command: Callable[[LoopResult], str] | None = None, private: bool = False) -> None:
        self.resume_command = resume_command
        self.private = private

    @hookimpl(tryfirst=True)
    def pytest_loop_finished(self, result: LoopResult, run: LoopRun) -> None:
        if result.succeeded:
            return
        from pytest_loops.artifacts.handoff import write_handoff

        command = self.resume_command(result) if self.resume_command else ""
        target = run.paths.log.with_name(run.paths.log.stem + ".handoff.md")
        try:
            result.artifacts["handoff"] = write_handoff(result, target, resume_command=command,
                                                        private=self.private)
        except Exception as exc:  # noqa: BLE001 - same: the run log comes first
            result.artifacts["handoff_error"] = artifact_error(target, exc)


WRITER_NAMES = (RunLogWriterPlugin.name, LessonsWriter.name, TineWriter.name, HandoffWriter.name)


def writers(options: ArtifactOptions | None = None) -> list[Any]:
    """The built-in writers for these options, in registration order: the run log and
    the lessons page always, the ``.tine`` and the hand-off as ``options`` say (None:
    neither). Validates the signing key first (bad input: LoopUsageError naming the flag)."""
    # pluggy calls the last registered of the tryfirst implementations first: the
    # .tine, then the hand-off, then the run log's summary, which lists them both
    found: list[Any] = [RunLogWriterPlugin(options.private_artifacts if options else False), LessonsWriter()]
    if options is None:
        return found
    key = options.signing_key()
    if options.handoff:
        found.append(HandoffWriter(options.resume_command, options.private_artifacts))
    if options.tine:
        found.append(TineWriter(options, key))
    return found


def register_writers(pm: pluggy.PluginManager, options: ArtifactOptions | None = None) -> pluggy.PluginManager:
    """Register the built-in writers on ``pm`` by name (one already registered or
    blocked under its name is left as it is); returns ``pm``."""
    for writer in writers(options):
        if pm.get_plugin(writer.name) is None and not pm.is_blocked(writer.name):
            pm.register(writer, name=writer.name)
    return pm


def make_engine(*, plugins: Iterable[object | str] = (), artifacts: ArtifactOptions | None = None,
                **kwargs: Any) -> Engine:
    """An :class:`~pytest_loops.core.engine.Engine` with the built-in writers and
    localization: ``kwargs`` go to the engine; ``plugin_manager`` (default: a new
    one with ``plugins``) gets the writers for ``artifacts`` registered."""
    from pytest_loops.agents import register_agents
    from pytest_loops.core.engine import Engine
    from pytest_loops.core.pluginmanager import make_plugin_manager
    from pytest_loops.localization.localize import Localizer

    pm = kwargs.pop("plugin_manager", None) or make_plugin_manager(plugins, entry_points=False)
    kwargs.setdefault("localizer", Localizer())
    return Engine(plugin_manager=register_writers(register_agents(pm), artifacts), **kwargs)




def artifact_error(path: str | os.PathLike, exc: BaseException) -> str:
    """One line naming the file and the errno: "PATH: [Errno 28] No space left on device"."""
    if isinstance(exc, OSError) and exc.errno:
        return f"{getattr(exc, 'filename', None) or path}: [Errno {exc.errno}] {exc.strerror}"
    return f"{path}: {type(exc).__name__}: {exc}"


def artifact_errors_line(errors: Sequence[str]) -> str | None:
    """The one stderr line for the artifacts a run could not write (None: all written)."""
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"pytest-loops: could not write {errors[0]}{more}; the verdict stands"

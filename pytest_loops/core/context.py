"""What a running loop hands its checks, its revise step and its writers.

:class:`LoopContext` is one iteration as a check or revise implementation sees it;
:class:`LoopRun` is one loop as the artifact writers (hook implementations) see it.
Checks, revise and localization import this module, never the engine, and the
localization they use is an object the upper layer hands in (:class:`Localizer`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_loops.defaults import CLOSURE_ENV
from pytest_loops.results import CheckResult, CommandResult, IterationRecord
from pytest_loops.spec import Check, LoopSpec

if TYPE_CHECKING:
    from pytest_loops.runtime.cleanroom import CleanRoom
    from pytest_loops.sandbox import Confinement

ARTIFACTS_DIRNAME = ".pytest-loops"


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


class Localizer(Protocol):
    """Fault localization as checks and revise use it; handed in by the layer above
    (:class:`pytest_loops.localization.localize.Localizer`), None: none."""

    def failing_tests(self, failed: list[CheckResult]) -> list[str]: ...

    def narrowed_command(self, command: str, last: CheckResult, context: LoopContext) -> tuple[str, int] | None: ...

    def localize(self, context: LoopContext, failed: list[CheckResult]) -> Path | None: ...

    def suspect_functions(self, suspects: list[dict], limit: int) -> list[str]: ...


def loop_env(spec: LoopSpec, context: LoopContext) -> dict[str, str]:
    """LOOP_* variables every command of the loop gets (see docs: the env contract)."""
    return {
        "LOOP_NAME": spec.name,
        "LOOP_GOAL": spec.goal,
        "LOOP_ITERATION": str(context.iteration),
        "LOOP_MAX_ITER": str(spec.guards.max_iter),
        "LOOP_WORKDIR": str(context.workdir),
        "LOOP_RUN_DIR": str(context.run_dir),
    }


class CommandRunner(Protocol):
    """Runs one shell command; see :class:`pytest_loops.runtime.process.ProcessRunner`."""

    def run(self, command: str, *, cwd: str | os.PathLike, env: Mapping[str, str] | None = None,
            timeout: float | None = None, output_path: str | os.PathLike | None = None,
            sandbox: Confinement | None = None, pass_fds: Sequence[int] = ()) -> CommandResult: ...


class Fingerprint(Protocol):
    def compute(self) -> str: ...


def stamp_of(wall: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + f"{int(wall % 1 * 1000):03d}"


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
    localizer: Localizer | None = None  # failing tests, narrowed reruns, suspects; None: none
    branch: int | None = None  # a fan-out candidate's number: its workdir is a copy of the tree
    real_workdir: Path | None = None  # for a candidate: the loop's own working directory
    # for a candidate seen as the working tree under a layer of its own: (upper, work) dirs
    layer: tuple[str, str] | None = None
    # (context, "revise" | "check") -> how the kernel confines that command; None: not at all
    confine: Callable[[LoopContext, str], Confinement | None] | None = None
    # the first verify's pytest runs record what the tests read here (the judge's closure)
    closure_dir: Path | None = None
    revise_env: dict[str, str] = field(default_factory=dict)  # more variables for the revise step (LOOP_MCP_CONFIG)
    # where revise steps report what they spent (LOOP_USAGE_FILE), outside the tree; None: nowhere
    usage_dir: Path | None = None

    def moved(self, value: str) -> str:
        """A path (or ``--rootdir=PATH``, ``-c PATH``...) under the loop's working
        directory, as the same path in this candidate's copy; else ``value``."""
        if self.real_workdir is None or getattr(self.confine, "mounts_copies", False):
            return value  # not a candidate, or its copy is seen at the project's own path
        from pytest_loops.runtime.cleanroom import move_path

        return move_path(value, os.path.realpath(self.real_workdir), os.path.realpath(self.workdir))

    # the iteration directory as last made and checked; forgotten whenever a command
    # ran (a check or revise step could have put a link in its place since)
    _made_dir: Path | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def iteration_dir(self) -> Path:
        """This iteration's directory, made once: checked again only after a command ran."""
        path = self._made_dir
        if path is not None:
            return path
        path = self.run_dir / f"iter-{self.iteration:03d}"
        for made in (self.run_dir, path):  # a link a revise step put there goes, never written through
            if made.is_symlink():
                made.unlink()
        path.mkdir(parents=True, exist_ok=True)
        self._made_dir = path
        return path

    def forget_dir(self) -> None:
        """A command ran: the iteration directory is checked again before the next write."""
        self._made_dir = None

    @property
    def prompt_file(self) -> Path:
        return self.iteration_dir / "prompt.md"

    @property
    def failure_file(self) -> Path:
        return self.iteration_dir / "failure.txt"

    @property
    def context_file(self) -> Path:
        """``iteration_dir/context.json``: the revise step's JSON contract (``LOOP_CONTEXT_FILE``)."""
        return self.iteration_dir / "context.json"

    @property
    def usage_file(self) -> Path | None:
        """This revise step's ``LOOP_USAGE_FILE`` (a fan-out candidate has its own), or None."""
        if self.usage_dir is None:
            return None
        return self.usage_dir / f"{self.label_prefix}iter-{self.iteration:03d}.json"

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

    def confined_runner(self) -> CommandRunner:
        """The runner with this context's check confinement on every command (for code
        that starts its own pytest runs: localization's re-run under coverage)."""
        sandbox = self.confine(self, "check") if self.confine is not None else None
        return _ConfinedRunner(self.runner, sandbox, self.forget_dir)

    def run_command(self, command: str, *, label: str, timeout: float | None = None,
                    extra_env: Mapping[str, str] | None = None, revise: bool = False,
                    pass_fds: Sequence[int] = ()) -> CommandResult:
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
            if self.closure_dir is not None:
                env[CLOSURE_ENV] = str(self.closure_dir)
        if extra_env:
            env.update(extra_env)
        if not label.startswith(self.label_prefix):  # a revise candidate's own output file
            label = self.label_prefix + label
        output_path: Path | None
        try:
            output_path = self.iteration_dir / f"{label}.out"
        except OSError as exc:
            if self.artifact_error is None:
                raise
            self.artifact_error(str(self.run_dir / f"iter-{self.iteration:03d}"), exc)
            output_path = None  # the runner keeps the output in a temporary file
        sandbox = self.confine(self, "revise" if revise else "check") if self.confine is not None else None
        more: dict[str, Any] = {}
        if sandbox is not None:
            more["sandbox"] = sandbox
        if pass_fds:
            more["pass_fds"] = tuple(pass_fds)
        if self.clean_room is not None and (sandbox is None or not sandbox.unsets_tag):
            more["tagged"] = False  # a judged run carries no variable of the harness's
        try:
            result = self.runner.run(command, cwd=self.workdir, env=env, timeout=effective,
                                     output_path=output_path, **more)
        finally:
            self.forget_dir()
        if result.timed_out and budget_limited:
            self.budget_hit = True
        if self.scrub is not None:
            result = scrub_output(result, self.scrub)
        return result


@dataclass
class _ConfinedRunner:
    inner: CommandRunner
    sandbox: Confinement | None
    ran: Callable[[], None] = lambda: None  # told after every command

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        if self.sandbox is not None:
            kwargs.setdefault("sandbox", self.sandbox)
        try:
            return self.inner.run(command, **kwargs)
        finally:
            self.ran()


def scrub_output(result: CommandResult, scrub: Callable[[str], str]) -> CommandResult:
    """Mask secrets in a command's output file and tail, in place."""
    changed = False
    if result.output_file:
        from pytest_loops.redact import scrub_file

        changed = scrub_file(result.output_file, scrub)
    tail = scrub(result.tail)
    if tail == result.tail and not (changed and result.output_sha256):
        return result
    # a rewritten file's digest is taken again from the file, when it is asked for
    return dataclasses.replace(result, tail=tail, output_sha256=None if changed else result.output_sha256)


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
        stamp = stamp_of(time.time() if wall is None else wall)
        log = base / "runs" / f"{spec.slug}-{stamp}-{os.getpid()}.json"
    page: Path | None = None
    if spec.reflexion:
        chosen = memory_page or spec.memory_page
        page = Path(chosen) if chosen else base / "lessons" / f"{spec.slug}.md"
        page = page if page.is_absolute() else cwd / page
    return RunPaths(log=log, run_dir=log.with_suffix(""), artifacts_dir=base, memory_page=page)


def hold_run_log(log: Path, on_error: Callable[[str, OSError], None], *,
                 what: str = "another run is writing this run log",
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
        on_error(str(log) + ".lock", exc)
        return None
    return lock


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


@dataclass
class LoopRun:
    """One running loop as its writers see it: handed to the ``pytest_loop_*`` hooks
    that record a loop (run log, lessons page, ``.tine``, hand-off)."""

    spec: LoopSpec
    paths: RunPaths
    header: dict[str, Any]  # the run log's start line (what the loop is, where it writes)
    scrub: Callable[[str], str] | None = None  # masks secret values before anything is written
    # called with (path, OSError) when an artifact cannot be written: reported, never raised
    artifact_failed: Callable[[str | os.PathLike, OSError], None] = lambda path, exc: None
    artifact_errors: list[str] = field(default_factory=list)  # "PATH: [Errno N] message"
    prior: Sequence[IterationRecord] = ()  # the iterations of the run resumed from
    decided: tuple[str, str] | None = None  # (verdict, reason) the resumed run had decided
    lessons: list[str] = field(default_factory=list)  # lessons written by this run
    write_index: bool = True  # the artifacts directory's index.jsonl gets a line
    writers: dict[str, Any] = field(default_factory=dict)  # each writer's own state, by its name

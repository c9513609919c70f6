"""The state of one ``--loop`` session, and how it runs one loop.

What the session's hooks (session.py), its loop-file items (items.py) and its fix-loop
(fixloop.py) share: the session's settings and directories, the tests' outcomes and
cost model, the session key, and running a loop under the working tree's lock with
this session's engine. It imports none of them.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.options import (
    AUDIT_CHOICES,
    SUSPECTS_CHOICES,
    artifact_options,
    choice_value,
    option_value,
    sandbox_values,
    usage_exit,
)
from pytest_loops.pytest_plugin.terminal import live_write, settings_line
from pytest_loops.settings import GUARD_KEYS, Resolved, given_grants, spec_origin

if TYPE_CHECKING:
    from pytest_loops.core.engine import Engine
    from pytest_loops.results import LoopResult
    from pytest_loops.spec import Check, LoopSpec

# context.ARTIFACTS_DIRNAME, named here so a session with nothing to loop never imports the engine
ARTIFACTS_DIRNAME = ".pytest-loops"

# Never part of a test tree's state: virtualenvs and build output change on
# their own and would fake progress (caches are excluded by the fingerprint).
TREE_EXCLUDES = (".venv", "venv", ".tox", ".nox", "node_modules", "build", "dist", "*.egg-info")

SESSION_LOOP_NAME = "failing tests"  # the session fix-loop's name
SESSION_KEY = pytest.StashKey["SessionState"]()
MAP_STORE_KEY = pytest.StashKey[Any]()  # the fix-loop's impact-map store, opened before any conftest


class SessionState:
    """What one `--loop` session knows, and how it runs a loop (the hooks: session.LoopSession)."""

    def __init__(self, config: pytest.Config, settings: Resolved, exitcode: str) -> None:
        self.config = config
        self.settings = settings
        self.exitcode = exitcode
        self.rootdir = Path(config.rootpath)
        artifacts = settings["artifacts"]
        self.artifacts_dir = Path(artifacts) if artifacts else self.rootdir / ARTIFACTS_DIRNAME
        if not self.artifacts_dir.is_absolute():
            self.artifacts_dir = self.rootdir / self.artifacts_dir
        self.rows: list[dict[str, Any]] = []  # one per finished loop (also from xdist workers)
        self.revise_view: Any = None  # what the terminal shows of a running revise step (made on first use)
        self.live_feed: Any = None  # an xdist controller: what its workers' loops print live (livefeed.Feed)
        self.worker_feed: Any = None  # an xdist worker: where its loops' live lines go (livefeed.WorkerFeed)
        self.failed_nodeids: list[str] = []  # failing tests outside any marker loop
        self.passed_nodeids: list[str] = []  # tests every part of which passed (subtests too)
        self._failed_set: set[str] = set()  # the two lists above as sets, for membership
        self._passed_set: set[str] = set()
        self.usage_message = ""  # a usage error that stopped the running session
        self.collect_usage_errors: list[str] = []  # found while collecting loop files
        self.loop_files = 0  # loop files collected
        # anything to loop (a loop marker, a loop file, a revise command): None until
        # collection has decided it (on an xdist controller: until a worker said so)
        self.has_loops: bool | None = None
        self.announced: set[tuple[Any, Any]] = set()  # loops whose settings line the controller printed
        # failed reports per test as pytest counted them in session.testsfailed: one test
        # with subtests can fail several times (each subtest, and maybe the test itself)
        self.failed_reports: dict[str, int] = {}
        self.ignored_lines: dict[str, list[Any]] = {}  # loop file -> lines not acted on
        self.collection_errors = 0  # collectors that failed (a bad loop file, an import error)
        self.loop_failures = 0  # marker-loop tests that failed (counted in session.testsfailed)
        self.session_result: LoopResult | None = None
        # the session fix-loop's cost model: each test's time, pytest's start-up (CPU
        # seconds before the session started) and the plain run's wall time
        self.durations: dict[str, float] = {}
        self.report_s: dict[str, float] = {}  # per failing test: making its failure reports
        self.startup_s = 0.0
        self.session_t0: float | None = None
        self.plain_run_s = 0.0
        self.collect_s = 0.0  # collecting every test file
        self.test_files = 0
        self.artifact_errors: list[str] = []  # artifacts the loops could not write (one line at the end)
        self.sharding: Any = None  # --loop-shard=I/N: a sharding.Sharding
        if settings.values.get("shard"):
            from pytest_loops.pytest_plugin.sharding import Sharding

            self.sharding = Sharding(settings["shard"], self)
        workerinput = getattr(config, "workerinput", None)
        self._testrunuid: str | None = workerinput["testrunuid"] if workerinput else None
        # authenticates the results the check items of a loop share: made on the
        # controller when first needed, in memory only (never the environment or a file),
        # and handed to xdist workers through workerinput (pytest_configure_node). A
        # worker given none uses a key of its own: its stored results are then trusted
        # by it alone.
        self._session_key: bytes | None = None
        if workerinput:
            try:
                given = bytes.fromhex(workerinput["loop_session_key"])
            except (KeyError, TypeError, ValueError):
                given = b""
            if len(given) >= 16:
                self._session_key = given
        config.stash[SESSION_KEY] = self

    @property
    def testrunuid(self) -> str:
        """This run's id (an xdist worker's is its controller's), made when first needed."""
        if self._testrunuid is None:
            import uuid

            self._testrunuid = uuid.uuid4().hex
        return self._testrunuid

    @property
    def session_key(self) -> bytes:
        if self._session_key is None:
            from pytest_loops.runtime.trust import new_session_key

            self._session_key = new_session_key()
        return self._session_key

    @session_key.setter
    def session_key(self, value: bytes) -> None:
        self._session_key = value

    def artifact_options(self) -> Any:
        """How a finished loop's artifacts are written (the signing key is checked here)."""
        from dataclasses import replace

        return replace(artifact_options(self.config), resume_command=self.resume_command)

    # -- settings ---------------------------------------------------------------------

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def child_args(self) -> list[str]:
        """Arguments that make a child pytest see the same rootdir and config."""
        args = [f"--rootdir={self.rootdir}"]
        if self.config.inipath:
            args += ["-c", str(self.config.inipath)]
        return args

    def make_engine(self) -> Engine:
        from pytest_loops.core.ctxadapter import adapter_options

        def exclude_trees(root, patterns, exclude=()):
            from pytest_loops.progress.fingerprint import StateFingerprint

            return StateFingerprint(root, patterns, exclude=[*exclude, *TREE_EXCLUDES])

        from pytest_loops.artifacts.finishers import make_engine
        from pytest_loops.runtime.process import ProcessRunner

        return make_engine(runner=ProcessRunner(output_cap=self.settings["output_cap"]),
                           plugin_manager=self.config.pluginmanager, artifacts=self.artifact_options(),
                           artifacts_dir=self.artifacts_dir, fingerprint_factory=exclude_trees,
                           localize=choice_value(self.config, "suspects", SUSPECTS_CHOICES) == "on",
                           audit=choice_value(self.config, "audit", AUDIT_CHOICES),
                           audit_allow=tuple(option_value(self.config, "audit_allow") or ()),
                           hide_env=[option_value(self.config, "sign_key_env") or ""],
                           adapter=adapter_options(self.settings.values, self.artifacts_dir),
                           **sandbox_values(self.settings))

    def resume_command(self, result: LoopResult) -> str:
        return self.reproduce_command() + " --loop-resume"

    def spec_for(self, name: str, goal: str, checks: tuple[Check, ...], values: Resolved,
                 anonymous: bool = False) -> LoopSpec:
        from pytest_loops.spec import Guards, LoopSpec

        return LoopSpec(
            name=name, goal=goal, checks=checks, revise=values["revise"],
            guards=Guards(**{k: values[k] for k in GUARD_KEYS}),  # the settings table's guard rows
            state_paths=tuple(values["state_paths"] or ["."]),
            memory_page=values["lessons_page"], cwd=str(self.rootdir), origin=spec_origin(values),
            no_progress_signal=values["no_progress_signal"], reflexion=bool(values["lessons"]),
            branches=values["branches"], max_parallel=values["max_parallel"], source=name,
            anonymous=anonymous, context_adapter=values.values.get("context_adapter"),
            grants=given_grants(values) or (),
        )

    def run_loop(self, spec: LoopSpec, **kwargs: Any) -> LoopResult:
        """Run one loop holding the working tree's lock: loops that revise the same
        tree never interleave, also across xdist workers."""
        from pytest_loops.core.pluginmanager import register_builtins

        register_builtins(self.config.pluginmanager)  # the checks and revise steps loops run
        from pytest_loops.core.fanout import check_fan_out

        try:
            check_fan_out(spec)
        except LoopUsageError as exc:
            usage_exit(self.config, str(exc))
        self.announce(spec)
        self.check_state_paths(spec)
        revises = spec.revise or len(self.config.pluginmanager.hook.pytest_loop_revise.get_hookimpls()) > 1
        if not revises:  # a loop that changes nothing needs no lock
            return self._run(spec, **kwargs)
        from pytest_loops.runtime.treelock import TreeLock, terminal_say

        # the wait is spoken and counts against the loop's budget (TIMEOUT naming the holder)
        lock = TreeLock(self.rootdir / ARTIFACTS_DIRNAME / "tree.lock", say=terminal_say(self.config))
        try:
            return self._run(spec, before_start=lock.acquire, **kwargs)
        finally:
            lock.release()

    def check_state_paths(self, spec: LoopSpec) -> None:
        """A state path that matches no file: a warning line, or (state_unmatched=error) a
        usage error."""
        from pytest_loops.runtime.preflight import check_state_paths

        mode = self.settings.values.get("state_unmatched") or "warn"
        origin = spec.origin.get("state_paths") or "command line"
        where = {"command line": "--loop-state", "environment": "PYTEST_LOOPS_STATE"}.get(origin, origin)
        try:
            line = check_state_paths(spec.state_paths, spec.cwd, mode, where)
        except LoopUsageError as exc:
            usage_exit(self.config, str(exc))
        if line and not self.is_worker:
            live_write(self.config, lambda reporter: reporter.write_line(f"loop: warning: {line}", yellow=True))

    def announce(self, spec: LoopSpec) -> None:
        """The loop's own settings, one line as it starts. An xdist worker's loops are
        announced by the controller when their first report arrives (a worker has no
        terminal of its own)."""
        if self.is_worker:
            return
        line = settings_line(spec)
        live_write(self.config, lambda reporter: reporter.write_line(line))

    def _run(self, spec: LoopSpec, **kwargs: Any) -> LoopResult:
        """Ctrl-C or SIGTERM of pytest first ends the loop's running command, whole tree."""
        from pytest_loops.runtime.process import TerminationGuard

        engine = self.make_engine()
        with TerminationGuard(engine.runner):  # type: ignore[arg-type]  # a ProcessRunner here
            try:
                result = engine.run(spec, resume_from=self.resume_point(spec), **kwargs)
                self.artifact_errors += engine.artifact_errors
                return result
            except LoopUsageError as exc:  # a check that cannot start, found in the first iteration
                self.artifact_errors += engine.artifact_errors
                usage_exit(self.config, str(exc))
            except SystemExit as exc:
                # the guard turns SIGTERM into SystemExit(143), which pytest would
                # report as an INTERNALERROR with a traceback and exit 3
                if exc.code != 128 + signal.SIGTERM:
                    raise
                pytest.exit(f"terminated by SIGTERM while the loop {spec.name!r} ran; its running command "
                            "and every descendant were stopped", returncode=exc.code)

    def resume_point(self, spec: LoopSpec) -> dict[str, Any] | None:
        """With --loop-resume: the latest run log of this loop that did not finish or was
        stopped by its budget; None when there is nothing to continue.

        That log must be trusted before anything is taken over: its MACs hold, its
        spec digest is its spec's, its spec is this loop's (limits and revise step
        aside) and its loop file is unchanged. Otherwise the session stops with a
        usage error (one line naming the log and the fix)."""
        if not self.config.getoption("loop_resume"):
            return None
        from pytest_loops.artifacts.runlog import check_resumable, check_trusted, load_runlog

        logs = sorted((self.artifacts_dir / "runs").glob(f"{spec.slug}-*.json"),
                      key=lambda p: p.stat().st_mtime)
        for path in reversed(logs):
            try:
                data = load_runlog(path)
            except LoopUsageError:
                continue  # not a run log
            if data.get("loop") != spec.name:
                continue
            if data.get("verdict") not in (None, "TIMEOUT"):
                return None
            try:
                check_trusted(data, f"--loop-resume {path}", spec=spec)
                check_resumable(data, f"--loop-resume {path}")
            except LoopUsageError as exc:
                # a usage error (64 under --loop-exitcode=verdict, else pytest's 4),
                # from inside a running test too
                usage_exit(self.config, str(exc))
            return data
        return None

    def reproduce_command(self) -> str:
        """This session's command line, every ``--loop-*`` value in the ``=`` form (pytest reads
        a value after a space as a test path too while it settles the rootdir). The flags and
        which values are written come from the settings table (``settings.reproduce_pairs``)."""
        from pytest_loops.settings import own_options, reproduce_pairs

        args = ["pytest", "--loop", *(f"{flag}={value}" for flag, value in reproduce_pairs(self.settings))]
        own = own_options()
        rest: list[str] = []
        skip = False
        for arg in self.config.invocation_params.args:
            if skip:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if name in own:
                skip = "=" not in arg and name != "--loop"
                continue
            rest.append(arg)
        return " ".join(shlex.quote(a) for a in args + rest)

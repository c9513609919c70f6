"""A `--loop` session: fix-loops around failing tests, live lines, summary, exit code.

Registered by :mod:`pytest_loops.pytest_plugin.plugin` only when ``--loop`` is given.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.items import (
    SESSION_KEY,
    LoopFileCollector,
    merge_file_spec,
    shared_result,
)
from pytest_loops.pytest_plugin.session_hooks import (
    MARKER_LOOPS,
    REPORT_TIMER,
    MarkerLoops,
    ReportTimer,
)
from pytest_loops.pytest_plugin.terminal import (
    SETTINGS_PROPERTY,
    failure_text,
    is_loop_report,
    iteration_line,
    live_write,
    loop_properties,
    settings_line,
    shown,
    summary_rows,
)
from pytest_loops.results import CheckResult, LoopResult
from pytest_loops.settings import GUARD_KEYS, Resolved, spec_origin
from pytest_loops.spec import Check, CheckKind, Guards, LoopSpec
from pytest_loops.verdict import EXIT_INTERNAL, EXIT_USAGE, Verdict

if TYPE_CHECKING:
    from pytest_loops.core.engine import Engine

# context.ARTIFACTS_DIRNAME, named here so a session with nothing to loop never imports the engine
ARTIFACTS_DIRNAME = ".pytest-loops"
# what a loop file's name ends with (sources.files.is_loop_file decides; this only spares
# every other collected file the import of the loop readers)
LOOP_FILE_ENDINGS = (".loop", ".loop.yaml", ".loop.yml")

# Never part of a test tree's state: virtualenvs and build output change on
# their own and would fake progress (caches are excluded by the fingerprint).
TREE_EXCLUDES = (".venv", "venv", ".tox", ".nox", "node_modules", "build", "dist", "*.egg-info")

SESSION_LOOP_NAME = "failing tests"
# workeroutput key: a usage error an xdist worker found, raised by the controller
USAGE_ERROR_KEY = "loop_usage_error"


def _number(value: Any) -> str:
    """A setting as text that parses back to the same value (`:g` keeps only 6 digits)."""
    return format(value, ".15g") if isinstance(value, float) else str(value)


def _process_age() -> float:
    """Wall seconds since this process started (pytest's start-up, at session start);
    its CPU seconds where /proc is not there."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.process_time()


class LoopSession:
    """The plugin object of one `--loop` session."""

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
        self.failed_nodeids: list[str] = []  # failing tests outside any marker loop
        self.passed_nodeids: list[str] = []  # tests every part of which passed (subtests too)
        self._failed_set: set[str] = set()  # the two lists above as sets, for membership
        self._passed_set: set[str] = set()
        self.usage_message = ""  # a usage error that stopped the running session
        self.collect_usage_errors: list[str] = []  # found while collecting loop files
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
        workerinput = getattr(config, "workerinput", None)
        self.testrunuid = workerinput["testrunuid"] if workerinput else uuid.uuid4().hex
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

        from pytest_loops.pytest_plugin.plugin import artifact_options

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
        def exclude_trees(root, patterns, exclude=()):
            from pytest_loops.progress.fingerprint import StateFingerprint

            return StateFingerprint(root, patterns, exclude=[*exclude, *TREE_EXCLUDES])

        from pytest_loops.artifacts.finishers import make_engine
        from pytest_loops.pytest_plugin.plugin import (
            AUDIT_CHOICES,
            SUSPECTS_CHOICES,
            _choice,
            _option,
        )
        from pytest_loops.runtime.process import ProcessRunner

        return make_engine(runner=ProcessRunner(output_cap=self.settings["output_cap"]),
                           plugin_manager=self.config.pluginmanager, artifacts=self.artifact_options(),
                           artifacts_dir=self.artifacts_dir, fingerprint_factory=exclude_trees,
                           localize=_choice(self.config, "suspects", SUSPECTS_CHOICES) == "on",
                           audit=_choice(self.config, "audit", AUDIT_CHOICES),
                           hide_env=[_option(self.config, "sign_key_env") or ""])

    def resume_command(self, result: LoopResult) -> str:
        return self.reproduce_command() + " --loop-resume"

    def spec_for(self, name: str, goal: str, checks: tuple[Check, ...], values: Resolved) -> LoopSpec:
        return LoopSpec(
            name=name, goal=goal, checks=checks, revise=values["revise"],
            guards=Guards(**{k: values[k] for k in GUARD_KEYS}),  # the settings table's guard rows
            state_paths=tuple(values["state_paths"] or ["."]),
            memory_page=values["memory_page"], cwd=str(self.rootdir), origin=spec_origin(values),
            no_progress_signal=values["no_progress_signal"], reflexion=bool(values["reflexion"]),
            source=name,
        )

    def run_loop(self, spec: LoopSpec, **kwargs: Any) -> LoopResult:
        """Run one loop holding the working tree's lock: loops that revise the same
        tree never interleave, also across xdist workers."""
        from pytest_loops.core.pluginmanager import register_builtins

        register_builtins(self.config.pluginmanager)  # the checks and revise steps loops run
        self.announce(spec)
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
                from pytest_loops.pytest_plugin.plugin import usage_exit

                usage_exit(self.config, str(exc))
            return data
        return None

    # -- loop files -------------------------------------------------------------------------

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector):
        if not file_path.name.lower().endswith(LOOP_FILE_ENDINGS):
            return None
        from pytest_loops.sources import is_loop_file

        if is_loop_file(file_path):
            return LoopFileCollector.from_parent(parent, path=file_path)
        return None

    def not_acted_on(self, loop_file: Any) -> None:
        """Remember a loop file's lines this project keeps but does not act on (shown with -v)."""
        lines = [*loop_file.config, *loop_file.ignored]
        for spec in loop_file.all_loops():
            lines += spec.ignored
        if lines:
            self.ignored_lines[loop_file.path] = sorted(lines, key=lambda i: i.line)

    def loop_file_spec(self, spec: LoopSpec) -> LoopSpec:
        """A loop from a file with the session's settings filling its gaps."""
        spec = merge_file_spec(spec, self.settings)
        if not spec.state_paths:
            spec = spec.replace(state_paths=(".",))
        return spec

    def shared_result(self, nodeid: str, spec: LoopSpec, loop_file: str | None = None) -> LoopResult:
        return shared_result(self.artifacts_dir / "sessions" / self.testrunuid, nodeid, spec,
                             self.run_loop, key=self.session_key, loop_file=loop_file)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """On the xdist controller: give each worker the session key, in memory."""
        node.workerinput["loop_session_key"] = self.session_key.hex()

    # -- reporting ----------------------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        revise = s["revise"] or "(none: failing tests are reported, not revised)"
        origins = ", ".join(f"{k} from {s.origin[k]}" for k in (*GUARD_KEYS, "revise")
                            if s.origin.get(k, "default") != "default")
        lines = [  # a marker or a loop file may set its own: each loop prints its settings as it starts
            f"loops: session-wide: max_iter={s['max_iter']} budget_seconds={_number(s['budget_seconds'])} "
            f"no_progress_k={s['no_progress_k']} no_progress_signal={s['no_progress_signal']} "
            f"escalate_after={s['escalate_after']} "
            f"exitcode={self.exitcode}" + (f" ({origins})" if origins else "") + "; per loop: see below",
            f"loops: revise: {revise}; artifacts: {self.artifacts_dir}",
            "loops: reproduce with: " + self.reproduce_command(),
        ]
        return [shown(line) for line in lines]

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

    @pytest.hookimpl
    def pytest_loop_iteration_finished(self, spec: LoopSpec, record: Any) -> None:
        if self.is_worker:
            return
        line = iteration_line(spec, record)
        if getattr(record, "suspects_note", None):  # localization's cost, or why it was skipped
            line += shown(f", {record.suspects_note}")
        live_write(self.config, lambda reporter: reporter.write_line(line))

    # -- fix-loops around marked tests ---------------------------------------------------

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Reject a bad `@pytest.mark.loop(...)` (or a loop file's revise step that cannot
        start) before anything runs."""
        from pytest_loops.pytest_plugin.plugin import marker_layer

        if self.collect_usage_errors:
            self._usage_at_collection(self.collect_usage_errors[0], items)
            return
        marked = False
        for item in items:
            marker = item.get_closest_marker("loop")
            if marker is not None:
                marked = True
                try:
                    layer = marker_layer(marker, item.nodeid)
                    if layer.get("revise"):
                        from pytest_loops.runtime.preflight import check_revise

                        check_revise(layer["revise"], self.rootdir,
                                     f"{item.nodeid}: @pytest.mark.loop(revise=...)")
                except LoopUsageError as exc:
                    self._usage_at_collection(str(exc), items)
                    return
        pm = self.config.pluginmanager
        if marked and pm.get_plugin(MARKER_LOOPS) is None:  # without a marker, no test pays for it
            pm.register(MarkerLoops(self), MARKER_LOOPS)
        if self.settings["revise"] and not self.is_worker and pm.get_plugin(REPORT_TIMER) is None:
            pm.register(ReportTimer(self), REPORT_TIMER)  # the session fix-loop's cost model

    def _usage_at_collection(self, message: str, items: list[pytest.Item]) -> None:
        from pytest_loops.pytest_plugin.plugin import usage_error, usage_exit

        if self.is_worker:
            # A UsageError raised on an xdist worker crashes it and the controller
            # reports an INTERNALERROR: run nothing here and let the controller
            # raise it (pytest_testnodedown).
            self.config.workeroutput[USAGE_ERROR_KEY] = message  # type: ignore[attr-defined]  # xdist
            items[:] = []
            return
        if self.exitcode == "verdict":
            usage_exit(self.config, message)  # one ERROR: line and 64, not pytest's banner
        usage_error(self.config, message)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """On the xdist controller: a worker found a bad marker; fail as a usage error."""
        message = (getattr(node, "workeroutput", None) or {}).get(USAGE_ERROR_KEY)
        if message:
            from pytest_loops.pytest_plugin.plugin import usage_error, usage_exit

            if self.exitcode == "verdict":
                usage_exit(self.config, message)
            usage_error(self.config, message)

    def marker_report(self, item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport):
        """A failed test with a loop marker: run its fix-loop; the report carries the verdict."""
        if call.when != "call" or not report.failed or hasattr(report, "wasxfail"):
            return report
        marker = item.get_closest_marker("loop")
        if marker is None:
            return report
        from pytest_loops.pytest_plugin.plugin import marker_layer

        values = self.settings.with_layer("marker", marker_layer(marker, item.nodeid))
        check = Check.test_passes(item.nodeid, options={"pytest_args": self.child_args()})
        spec = self.spec_for(item.nodeid, f"make {item.nodeid} pass", (check,), values)
        seed = CheckResult(name=check.name, kind=CheckKind.PYTEST.value, passed=False, exit_code=1,
                           duration_s=report.duration, output_tail=shown(report.longreprtext)[-2000:],
                           reason="the test failed (in the session)", failing_tests=(item.nodeid,))
        result = self.run_loop(spec, first_results={check.name: seed})
        self._resume_progress_line(item)
        props = loop_properties(result)
        report.user_properties.extend(props)
        item.user_properties.extend(props)  # JUnit XML writes properties from the teardown report
        if result.verdict is Verdict.SUCCESS:
            report.outcome = "passed"
            report.longrepr = None
        else:
            report.longrepr = failure_text(result)
        return report

    def _resume_progress_line(self, item: pytest.Item) -> None:
        """The live lines broke pytest's progress line: start it again, so the test's
        letter lands after its file name, not alone on a line without the percentage."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.is_worker and reporter.verbosity <= 0:
            reporter.write_fspath_result(item.nodeid, "")

    @pytest.hookimpl
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        if report.when != "call" or not report.passed or not getattr(report, "user_properties", None):
            return None
        props = dict(report.user_properties)
        if (report.when == "call" and report.passed and is_loop_report(props) and props["verdict"] == "SUCCESS"
                and int(str(props.get("iterations", 1))) > 1):  # passed only after a repair
            return "repaired", "L", ("REPAIRED", {"green": True})
        return None

    # -- collecting outcomes (on the controller under xdist) -----------------------------------

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:

        self.startup_s = _process_age()
        self.session_t0 = time.perf_counter()

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:

        if self.session_t0 is not None:
            self.collect_s = time.perf_counter() - self.session_t0
            self.test_files = len({item.nodeid.split("::", 1)[0] for item in session.items})

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors += 1

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(getattr(report, "user_properties", ()) or ())
        if not hasattr(report, "context"):  # a subtest's time is inside its test's call already
            self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + (report.duration or 0.0)
        if report.when == "call" and is_loop_report(props):
            key = (props.get("loop"), props.get("artifact_log"))
            if key not in self.announced and props.get(SETTINGS_PROPERTY) and self._workers():
                self.announced.add(key)  # a worker ran it: its settings line, on this terminal
                line = shown(props[SETTINGS_PROPERTY])
                live_write(self.config, lambda reporter: reporter.write_line(line))
            if all((row.get("loop"), row.get("artifact_log")) != key for row in self.rows):
                self.rows.append(props)  # the check items of one loop share one row
            if report.failed:
                self.loop_failures += 1
            return
        if report.failed and not hasattr(report, "wasxfail"):
            self.failed_reports[report.nodeid] = self.failed_reports.get(report.nodeid, 0) + 1
        if report.failed and (report.when == "call" or report.when == "setup"):
            if report.nodeid not in self._failed_set:
                self._failed_set.add(report.nodeid)
                self.failed_nodeids.append(report.nodeid)
            if report.nodeid in self._passed_set:  # a subtest failed after the test passed
                self._passed_set.discard(report.nodeid)
                self.passed_nodeids.remove(report.nodeid)
        elif report.when == "call" and report.passed:
            if report.nodeid not in self._failed_set and report.nodeid not in self._passed_set:
                self._passed_set.add(report.nodeid)
                self.passed_nodeids.append(report.nodeid)

    def _workers(self) -> bool:
        """True on an xdist controller with workers: the loops run elsewhere."""
        return self.config.pluginmanager.get_plugin("dsession") is not None

    # -- the session fix-loop ---------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        if self.session_t0 is not None:
            import time

            self.plain_run_s = self.startup_s + time.perf_counter() - self.session_t0
        stopped = session.shouldfail or session.shouldstop
        if self.failed_nodeids and self.settings["revise"] and exitstatus in (0, 1) and stopped:
            # -x / --maxfail: the tests after the stop never ran, so a repair of the
            # ones that did could not stand for the session (it would exit 0)
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_sep("=", f"loop: not started: the session stopped early ({stopped}); "
                                        "run without -x / --maxfail to repair the failing tests")
        elif self.failed_nodeids and self.settings["revise"] and exitstatus in (0, 1):
            from pytest_loops.pytest_plugin.fixloop import run_session_loop

            try:
                self.session_result = run_session_loop(self)
            except KeyboardInterrupt:
                # one line, no traceback; pytest's "interrupted" exit (2), or 130 under
                # --loop-exitcode=verdict where 2 means MAX_ITER (as `pytest-loops run`)
                code = 130 if self.exitcode == "verdict" else int(pytest.ExitCode.INTERRUPTED)
                pytest.exit(f"interrupted (Ctrl-C) during the fix-loop {SESSION_LOOP_NAME!r}; its running "
                            f"command was stopped and its run log in {self.artifacts_dir / 'runs'} can be "
                            "continued with --loop-resume", returncode=code)
            self.rows.append(dict(loop_properties(self.session_result)))
            if self.session_result.succeeded:
                self._mark_repaired(session)
        self._set_exitstatus(session)

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A usage error that stopped the running session: its line is printed at the
        end as one ``ERROR:`` line on stderr, not in pytest's ``!`` banner."""
        from pytest_loops.pytest_plugin.plugin import is_usage_exit

        if not is_usage_exit(excinfo.value):
            return
        self.usage_message = str(getattr(excinfo.value, "msg", excinfo.value))
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and hasattr(reporter, "_keyboardinterrupt_memo"):
            reporter._keyboardinterrupt_memo = None

    def _report_usage_error(self) -> None:
        if self.usage_message:
            try:
                sys.stderr.write(shown(f"ERROR: {self.usage_message}") + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """JUnit XML is written at session finish, before the session loop's verdict is
        known to it: give the tests the loop repaired their loop properties and drop
        their first-run failure, so CI's test view matches the terminal and exit code."""
        xmlpath = getattr(config.option, "xmlpath", None)
        result = self.session_result
        if xmlpath and not self.is_worker:
            from pytest_loops.artifacts.junit import mark_repaired, mask_xml

            try:
                if result is not None:
                    mark_repaired(Path(xmlpath), self.failed_nodeids, loop_properties(result),
                                  repaired=result.succeeded, prefix=getattr(config.option, "junitprefix", None))
                mask_xml(Path(xmlpath))  # last: a test's node id (a parametrize id) may hold a secret
            except OSError as exc:
                self._artifact_failed(xmlpath, exc)
        self._report_artifact_errors()
        self._report_usage_error()

    def _artifact_failed(self, path: str | Path, exc: OSError) -> None:
        from pytest_loops.artifacts.finishers import artifact_error

        self.artifact_errors.append(artifact_error(path, exc))

    def _report_artifact_errors(self) -> None:
        """One stderr line for every artifact this session could not write; pytest's
        exit code stays its own (an artifact records a result, it is not one)."""
        if not self.artifact_errors:
            return
        from pytest_loops.artifacts.finishers import artifact_errors_line

        line = artifact_errors_line(self.artifact_errors)
        if line is None:
            return
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _mark_repaired(self, session: pytest.Session) -> None:
        """Failures the session loop repaired count as repaired, not failed."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        repaired = set(self.failed_nodeids)
        if reporter is not None:
            # one "repaired" per test, whatever its subtests reported: the test's other
            # failed reports (each subtest) and its "passed" report (a unittest case
            # whose subTests failed passes itself) no longer count
            counted: set[str] = set()
            for key in ("failed", "error", "passed"):
                kept = []
                for rep in reporter.stats.get(key, []):
                    nodeid = getattr(rep, "nodeid", None)
                    if nodeid not in repaired:
                        kept.append(rep)
                    elif key != "passed" and nodeid not in counted:
                        counted.add(nodeid)
                        reporter.stats.setdefault("repaired", []).append(rep)
                if kept:
                    reporter.stats[key] = kept
                else:  # an empty key still turns pytest's final summary line red
                    reporter.stats.pop(key, None)
        session.testsfailed = max(0, session.testsfailed - sum(self.failed_reports.get(n, 0)
                                                               for n in repaired))

    def _set_exitstatus(self, session: pytest.Session) -> None:
        failed_loops = [row for row in self.rows if row.get("verdict") != "SUCCESS"]
        status = int(session.exitstatus)
        if status not in (0, 1):  # interrupted, internal or usage error, no tests
            if self.exitcode == "verdict":  # there, 2-5 must mean verdicts only
                session.exitstatus = {
                    2: EXIT_USAGE if self.collection_errors else 130,
                    3: EXIT_INTERNAL, 4: EXIT_USAGE, 5: EXIT_USAGE,
                }.get(status, status)
            return
        plain = session.testsfailed - self.loop_failures > 0
        if self.exitcode == "verdict":
            if failed_loops:
                status = max(Verdict(row["verdict"]).exit_code for row in failed_loops)
            else:
                status = 1 if plain else 0
        else:
            status = 1 if (plain or failed_loops) else 0
        session.exitstatus = status

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.ignored_lines and self.config.get_verbosity() > 0:
            terminalreporter.section("loop files: lines not acted on")
            for path, lines in self.ignored_lines.items():
                for line in lines:
                    terminalreporter.write_line(shown(f"{path}:{line.line}: {line.text.strip()}  ({line.why})"))
        if self.rows:
            terminalreporter.section("loops")
            for line in summary_rows(self.rows):
                terminalreporter.write_line(line)
        try:
            report = self.write_report()  # also with no loop: a CI upload step expects the file
        except OSError as exc:
            from pytest_loops.pytest_plugin.plugin import _option

            self._artifact_failed(_option(self.config, "report"), exc)
            report = None
        if report:
            terminalreporter.write_line(f"loops: HTML report: {report}")

    def write_report(self) -> str | None:
        """--loop-report FILE: this session's loops in one HTML file."""
        from pytest_loops.pytest_plugin.plugin import _option

        target = _option(self.config, "report")
        if not target or self.is_worker:
            return None
        from pytest_loops.artifacts.report import write_html_report
        from pytest_loops.artifacts.runlog import load_runlog

        runs = []
        for row in self.rows:
            try:
                runs.append(load_runlog(row["artifact_log"]))
            except (KeyError, LoopUsageError):
                continue
        path = Path(target)
        return write_html_report(runs, path if path.is_absolute() else Path(self.config.invocation_params.dir) / path)

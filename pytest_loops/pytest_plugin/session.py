"""A `--loop` session: fix-loops around failing tests, live lines, summary, exit code.

Registered by :mod:`pytest_loops.pytest_plugin.plugin` only when ``--loop`` is given.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.options import (
    choice_value,
    is_usage_exit,
    marker_layer,
    option_value,
    usage_error,
    usage_exit,
)
from pytest_loops.pytest_plugin.session_hooks import (
    LOOP_REPORTS,
    MARKER_LOOPS,
    REPORT_TIMER,
    LoopReports,
    MarkerLoops,
    ReportTimer,
)
from pytest_loops.pytest_plugin.state import SESSION_LOOP_NAME, SessionState
from pytest_loops.pytest_plugin.terminal import (
    SETTINGS_PROPERTY,
    ReviseView,
    adapter_lines,
    failure_text,
    is_loop_report,
    iteration_line,
    live_write,
    loop_properties,
    shown,
    summary_rows,
    verify_line,
)
from pytest_loops.settings import GUARD_KEYS, REVISE_OUTPUTS
from pytest_loops.verdict import EXIT_INTERNAL, EXIT_USAGE, Verdict

if TYPE_CHECKING:
    from pytest_loops.pytest_plugin.sharding import FileUnit
    from pytest_loops.spec import LoopSpec

# what a loop file's name ends with (sources.files.is_loop_file decides; this only spares
# every other collected file the import of the loop readers)
LOOP_FILE_ENDINGS = (".loop", ".loop.yaml", ".loop.yml", "loop-runner.config.yaml", "loop-runner.config.yml")

# workeroutput key: a usage error an xdist worker found, raised by the controller
USAGE_ERROR_KEY = "loop_usage_error"
# workeroutput key: whether an xdist worker collected anything to loop
FOUND_KEY = "loop_found"

NOTHING_TO_LOOP = ("loop: nothing to loop: no collected test carries a loop marker, no loop file was "
                   "collected and no revise command is set")


def loop_marked(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with a loop marker on themselves or on a parent (a class, a module),
    as ``item.get_closest_marker("loop")`` finds it; each parent is looked at once."""
    parents: dict[int, bool] = {}

    def marked(node: Any) -> bool:
        if node is None:
            return False
        known = parents.get(id(node))
        if known is None:
            known = parents[id(node)] = (any(m.name == "loop" for m in node.own_markers)
                                         or marked(node.parent))
        return known

    found = []
    for item in items:
        known = parents.get(id(item.parent))  # the items of one module share it
        if known is None:
            known = marked(item.parent)
        if known or any(m.name == "loop" for m in item.own_markers):
            found.append(item)
    return found


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


class LoopSession(SessionState):
    """The plugin object of one `--loop` session: its hooks."""

    # -- loop files -------------------------------------------------------------------------

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector):
        if not file_path.name.lower().endswith(LOOP_FILE_ENDINGS):
            return None
        from pytest_loops.sources import is_loop_file

        if is_loop_file(file_path):
            from pytest_loops.pytest_plugin.items import LoopFileCollector

            self.loop_files += 1
            return LoopFileCollector.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """On the xdist controller: give each worker the session key, in memory."""
        node.workerinput["loop_session_key"] = self.session_key.hex()
        if self.sharding is not None:
            self.sharding.configure_node(node)
        from pytest_loops.pytest_plugin import livefeed

        if self.live_feed is None:  # the workers' loops' live lines, printed here as they come
            self.live_feed = livefeed.Feed(lambda text: live_write(self.config, lambda r: r.write_line(text)))
        node.workerinput[livefeed.WORKER_KEY] = str(self.live_feed.path)

    def _feed_line(self, *lines: str) -> None:
        """On an xdist worker: hand live lines to the controller's feed."""
        if self.worker_feed is None:
            from pytest_loops.pytest_plugin.livefeed import worker_feed

            self.worker_feed = worker_feed(self.config) or False
        if self.worker_feed:
            for line in lines:
                self.worker_feed.line(line)

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
            f"loops: revise: {revise}; artifacts: {self.artifacts_dir}"
            + (f"; shard {self.sharding.text}" if self.sharding is not None else ""),
            "loops: reproduce with: " + self.reproduce_command(),
        ]
        return [shown(line) for line in lines]

    @pytest.hookimpl
    def pytest_loop_iteration_finished(self, spec: LoopSpec, record: Any) -> None:
        line = iteration_line(spec, record)
        if getattr(record, "suspects_note", None):  # localization's cost, or why it was skipped
            line += shown(f", {record.suspects_note}")
        lines = [line, *adapter_lines(spec, record)]
        if self.is_worker:
            self._feed_line(*lines)
            return
        live_write(self.config, lambda reporter: [reporter.write_line(one) for one in lines])

    @pytest.hookimpl
    def pytest_loop_revise_started(self, spec: LoopSpec, record: Any) -> None:
        """The checks' result, before the revise step runs (it may take minutes)."""
        line = verify_line(spec, record)
        if self.is_worker:
            self._feed_line(line)
            return
        live_write(self.config, lambda reporter: reporter.write_line(line))

    @pytest.hookimpl
    def pytest_loop_revise_progress(self, spec: LoopSpec, progress: Any) -> None:
        if self.is_worker:  # heartbeat lines (no terminal to rewrite), or the streamed output
            if self.revise_view is None:
                self.revise_view = ReviseView(choice_value(self.config, "revise_output", REVISE_OUTPUTS),
                                              self._feed_line)
            self.revise_view.show(spec, progress)
            return
        if self.revise_view is None:
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            tty = reporter is not None and getattr(getattr(reporter, "_tw", None), "hasmarkup", False)
            self.revise_view = ReviseView(
                choice_value(self.config, "revise_output", REVISE_OUTPUTS),
                lambda text: live_write(self.config, lambda r: r.write_line(text)),
                (lambda text: _rewrite(self.config, text)) if tty else None)
        self.revise_view.show(spec, progress)

    # -- fix-loops around marked tests ---------------------------------------------------

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Decide, once, whether this session has anything to loop (a test with a loop
        marker, a loop file, a revise command): only then are the per-report hooks
        registered. Reject a bad `@pytest.mark.loop(...)` (or a loop file's revise step
        that cannot start) before anything runs."""
        if self.loop_files:  # a loop_paths loop a workspace loop shadows is not run
            from pytest_loops.pytest_plugin.shadowing import drop_shadowed

            drop_shadowed(self.config, items, self.rootdir)
        marked = loop_marked(items)
        self.has_loops = bool(marked or self.loop_files or self.settings["revise"])
        if self.sharding is not None:  # the other shards' loops: deselected
            file_unit: FileUnit | None = None
            if self.loop_files:
                from pytest_loops.pytest_plugin.items import loop_unit

                file_unit = loop_unit
            marked = self.sharding.select(self.config, items, marked, file_unit)
        if self.has_loops:
            self.watch_reports()
        if self.collect_usage_errors:
            self._usage_at_collection(self.collect_usage_errors[0], items)
            return
        for item in marked:
            marker = item.get_closest_marker("loop")
            assert marker is not None
            try:
                layer = marker_layer(marker, item.nodeid)
                if layer.get("revise"):
                    from pytest_loops.agents import program_to_check
                    from pytest_loops.runtime.preflight import check_revise

                    check_revise(program_to_check(layer["revise"]), self.rootdir,
                                 f"{item.nodeid}: @pytest.mark.loop(revise=...)")
            except LoopUsageError as exc:
                self._usage_at_collection(str(exc), items)
                return
        pm = self.config.pluginmanager
        if marked and pm.get_plugin(MARKER_LOOPS) is None:  # without a marker, no test pays for it
            pm.register(MarkerLoops(self), MARKER_LOOPS)
        if self.settings["revise"] and not self.is_worker and pm.get_plugin(REPORT_TIMER) is None:
            pm.register(ReportTimer(self), REPORT_TIMER)  # the session fix-loop's cost model

    def watch_reports(self) -> None:
        """Register the per-report hooks (session_hooks.LoopReports), once."""
        pm = self.config.pluginmanager
        if pm.get_plugin(LOOP_REPORTS) is None:
            pm.register(LoopReports(self), LOOP_REPORTS)

    def _usage_at_collection(self, message: str, items: list[pytest.Item]) -> None:
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
        """On the xdist controller: whether the worker had anything to loop; a worker
        that found a bad marker fails the session as a usage error."""
        output = getattr(node, "workeroutput", None) or {}
        if self.sharding is not None:
            self.sharding.node_down(node)
        if output.get(FOUND_KEY, True):  # a worker that did not say: assume it had
            self.has_loops = True
        message = output.get(USAGE_ERROR_KEY)
        if message:
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
        from pytest_loops.results import CheckResult
        from pytest_loops.spec import Check, CheckKind

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

    # -- collecting outcomes (on the controller under xdist) -----------------------------------

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.settings["revise"] and not self.is_worker:  # the session fix-loop's cost model
            self.startup_s = _process_age()
        self.session_t0 = time.perf_counter()
        if self._workers():  # an xdist controller collects nothing: its workers' loops report here
            self.has_loops = bool(self.settings["revise"])  # and each worker says what it found
            self.watch_reports()

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors += 1

    def logreport(self, report: pytest.TestReport) -> None:
        """One test report (LoopReports.pytest_runtest_logreport): the loops' rows, the
        tests' outcomes and durations for the session fix-loop."""
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
            if self.sharding is not None and self.settings["revise"]:
                self.sharding.note_failure(report)  # its failure site picks its shard
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
        if self.live_feed is not None:  # the workers are done: their last lines, then no more
            self.live_feed.close()
            self.live_feed = None
        if self.is_worker:
            self.config.workeroutput[FOUND_KEY] = bool(self.has_loops)  # type: ignore[attr-defined]  # xdist
            if self.sharding is not None:
                self.sharding.worker_done(self.config)
            return
        if self.session_t0 is not None:
            import time

            self.plain_run_s = self.startup_s + time.perf_counter() - self.session_t0
        stopped = session.shouldfail or session.shouldstop
        if self.sharding is not None and self.failed_nodeids and self.settings["revise"]:
            self._shard_failures()
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
        if self.sharding is not None:
            try:
                self.sharding.write()
            except OSError as exc:
                self._artifact_failed(self.artifacts_dir / "shard.json", exc)
        self._set_exitstatus(session)

    def _shard_failures(self) -> None:
        """Keep the failing tests whose failure group is this shard's; the others are
        another job's fix-loop (they still show as failed here, and count in no exit code)."""
        assert self.sharding is not None
        here, elsewhere = self.sharding.split_failures(self.failed_nodeids)
        self.failed_nodeids = here
        self.sharding.elsewhere = elsewhere
        if elsewhere:
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_sep("=", f"loop: shard {self.sharding.text}: {len(elsewhere)} failing test(s) "
                                        "belong to other shards' fix-loops (grouped by where they fail)")

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A usage error that stopped the running session: its line is printed at the
        end as one ``ERROR:`` line on stderr, not in pytest's ``!`` banner."""
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
        if status == int(pytest.ExitCode.NO_TESTS_COLLECTED) and self.exitcode == "verdict" \
                and self.sharding is not None and self.sharding.deselected:
            session.exitstatus = 0  # a shard whose every item is another shard's: no verdict here failed
            return
        if status not in (0, 1):  # interrupted, internal or usage error, no tests
            if self.exitcode == "verdict":  # there, 2-5 must mean verdicts only
                session.exitstatus = {
                    2: EXIT_USAGE if self.collection_errors else 130,
                    3: EXIT_INTERNAL, 4: EXIT_USAGE, 5: EXIT_USAGE,
                }.get(status, status)
            return
        elsewhere = sum(self.failed_reports.get(n, 0) for n in self.sharding.elsewhere) if self.sharding else 0
        plain = session.testsfailed - self.loop_failures - elsewhere > 0
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
            self._artifact_failed(option_value(self.config, "report"), exc)
            report = None
        if report:
            terminalreporter.write_line(f"loops: HTML report: {report}")
        if not self.is_worker:
            self._speak_ci(terminalreporter, report)
        if self.has_loops is False and not self.is_worker and not self.rows:
            terminalreporter.write_line(NOTHING_TO_LOOP)

    def _runs(self) -> list[dict[str, Any]]:
        """The run logs of this session's loops, as read back (verified)."""
        from pytest_loops.artifacts.runlog import assess, load_runlog

        runs = []
        for row in self.rows:
            try:
                runs.append(assess(load_runlog(row["artifact_log"])))
            except (KeyError, LoopUsageError):
                continue
        return runs

    def _speak_ci(self, terminalreporter: Any, report: str | None) -> None:
        """GitHub Actions: the job summary (GITHUB_STEP_SUMMARY) and the annotations."""
        import os

        from pytest_loops.artifacts import cisummary

        wants_summary = bool(os.environ.get(cisummary.SUMMARY_ENV)) and bool(self.rows)
        wants_notes = (cisummary.annotations_wanted() and bool(self.settings.values.get("annotations", True))
                       and any(row.get("verdict") != "SUCCESS" for row in self.rows))
        if not (wants_summary or wants_notes):
            return
        runs = self._runs()
        if wants_summary:
            artifacts = [str(self.artifacts_dir)] + ([report] if report else [])
            title = "pytest-loops" + (f" (shard {self.sharding.text})" if self.sharding is not None else "")
            try:
                cisummary.append_summary(cisummary.summary_markdown(runs, title=title, artifacts=artifacts))
            except OSError as exc:
                self._artifact_failed(os.environ[cisummary.SUMMARY_ENV], exc)
        if wants_notes:
            for line in cisummary.annotation_lines(runs, self.rootdir):
                terminalreporter.write_line(line)

    def write_report(self) -> str | None:
        """--loop-report FILE: this session's loops in one HTML file."""
        target = option_value(self.config, "report")
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


def _rewrite(config: pytest.Config, text: str) -> None:
    """The revise step's status line, rewritten in place on a terminal ("": cleared)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        reporter.rewrite(text, erase=True)
        return
    with capman.global_and_fixture_disabled():
        reporter.rewrite(text, erase=True)

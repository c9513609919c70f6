"""Hooks a ``--loop`` session registers only when they have work: the per-report
bookkeeping once a loop exists, the marker loops' report wrapper, and the failing
tests' report timer of the session fix-loop."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pytest_loops.pytest_plugin.terminal import is_loop_report

MARKER_LOOPS = "loop-marker-loops"


class MarkerLoops:
    """Registered by the session only when a collected test carries a loop marker."""

    def __init__(self, session: Any) -> None:  # a session.LoopSession
        self.session = session

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = yield
        return self.session.marker_report(item, call, report)


REPORT_TIMER = "loop-report-timer"


class ReportTimer:
    """Registered only when the session fix-loop may run: how long each failing test's
    failure reports took to make (their tracebacks), part of what a rerun costs."""

    def __init__(self, session: Any) -> None:  # a session.LoopSession
        self.session = session

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        t0 = time.perf_counter()
        report = yield
        if report.failed:
            spent = self.session.report_s
            spent[item.nodeid] = spent.get(item.nodeid, 0.0) + time.perf_counter() - t0
        return report


LOOP_REPORTS = "loop-reports"


class LoopReports:
    """The hooks that run once per test report, registered by the session only when a
    loop exists: a collected test with a loop marker, a loop file, a revise command
    for the session fix-loop, or xdist workers whose loops report to this controller.
    A ``--loop`` session with nothing to loop never calls them."""

    def __init__(self, session: Any) -> None:  # a session.LoopSession
        self.session = session
        # the tests' outcomes and times are the session fix-loop's alone: without a revise
        # command only the reports of loops (their properties) are read
        self.every_report = bool(session.settings["revise"])

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The session fix-loop's cost model: how long collecting took, over how many files."""
        state = self.session
        if state.session_t0 is not None:
            state.collect_s = time.perf_counter() - state.session_t0
            state.test_files = len({item.nodeid.split("::", 1)[0] for item in session.items})

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.every_report or getattr(report, "user_properties", None):
            self.session.logreport(report)

    @pytest.hookimpl
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        if report.when != "call" or not report.passed or not getattr(report, "user_properties", None):
            return None
        props = dict(report.user_properties)
        if (is_loop_report(props) and props["verdict"] == "SUCCESS"
                and int(str(props.get("iterations", 1))) > 1):  # passed only after a repair
            return "repaired", "L", ("REPAIRED", {"green": True})
        return None

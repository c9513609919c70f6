"""Hooks a ``--loop`` session registers only when they have work: the marker loops'
report wrapper, and the failing tests' report timer of the session fix-loop."""

from __future__ import annotations

import time
from typing import Any

import pytest

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

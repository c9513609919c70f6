"""Loaded (``-p``) into the pytest processes ``pytest --loop-watch`` starts: each test
or collector that fails is one JSON line in the file named by
:data:`REPORT_ENV`, so the watch knows which node ids to run again."""

from __future__ import annotations

import json
import os
from typing import Any

REPORT_ENV = "PYTEST_LOOPS_WATCH_REPORT"


def _note(nodeid: str, what: str) -> None:
    path = os.environ.get(REPORT_ENV)
    if path and nodeid:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"nodeid": nodeid, "failed": what}) + "\n")


def pytest_runtest_logreport(report: Any) -> None:
    if report.failed:
        _note(report.nodeid, report.when)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _note(report.nodeid, "collect")

"""The harness's own witness inside a pytest run of the clean room.

Registered as a ``pytest11`` entry point, so pytest loads it in every run of an
environment where pytest-loops is installed, before any conftest or test module
is imported; in a run the harness does not judge it finds no channel and does
nothing. The harness judges a run by handing it an open, anonymous file (a file
descriptor the process inherits: no variable, no argument, no path names it)
whose first line holds a per-run nonce. At import the witness finds that file
among its inherited descriptors, keeps it (not inherited further) and appends
one JSON line per test phase outcome and one when the session finishes (with
pytest's own exit status), each carrying the nonce. The harness reads the
outcome through that channel of its own instead of trusting the process's exit
code, its output or a JUnit file it wrote, and accepts a pass only when this
record and the exit code agree.

Where plugins are not loaded from entry points (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``,
or an installation without the entry point), the harness names the module with
``-p`` and the channel in ``PYTEST_LOOPS_JUDGE`` instead (``nonce:path``); the
variable is removed at import.

The module imports nothing of the harness: the code under test is judged with
as little of pytest-loops in its process as possible.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

import pytest

VARIABLE = "PYTEST_LOOPS_JUDGE"
# The first line of a channel file: MAGIC, then the nonce (32 hex digits), then a newline.
MAGIC = b"\x00pytest-loops-witness "
HEADER_SIZE = len(MAGIC) + 32 + 1


def _inherited_channel() -> tuple[int, str] | None:
    """The channel file among this process's inherited descriptors, and its nonce."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            fd = int(name)
        except ValueError:
            continue
        if fd <= 2:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < HEADER_SIZE:
                continue
            head = os.pread(fd, HEADER_SIZE, 0)
        except OSError:
            continue
        if head.startswith(MAGIC) and head.endswith(b"\n"):
            nonce = head[len(MAGIC):-1].decode("ascii", "replace")
            try:
                os.set_inheritable(fd, False)  # a process a test starts is not judged by it
            except OSError:
                pass
            return fd, nonce
    return None


_fd: int | None = None
_nonce = ""
_path = ""
_found = _inherited_channel()
if _found is not None:
    _fd, _nonce = _found
    _path = f"/proc/{os.getpid()}/fd/{_fd}"
else:
    _spec = os.environ.pop(VARIABLE, "")
    _nonce, _, _path = _spec.partition(":")
    if _path:
        try:
            _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            _fd = None
# `python -P -m pytest`: the working directory is put on sys.path by us, after
# pytest itself was imported, so nothing in the tree can stand in for it.
if _fd is not None and sys.flags.safe_path and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())


def active() -> bool:
    """Whether this process is a run the harness judges."""
    return _fd is not None


def _emit(record: dict[str, Any]) -> None:
    if _fd is None:
        return
    record["nonce"] = _nonce
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    try:
        os.write(_fd, data)
    except OSError:
        pass


def _is_worker(config: Any) -> bool:
    return hasattr(config, "workerinput")


WORKER_KEY = "pytest_loops_judge"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Under pytest-xdist: each worker gets the channel in memory (never its environment),
    so what a test call raised is recorded where it ran, before any report is sent."""
    if _fd is not None:
        node.workerinput[WORKER_KEY] = f"{_nonce}:{_path}"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    global _fd, _nonce
    if _is_worker(config):
        spec = config.workerinput.pop(WORKER_KEY, "")
        nonce, _, path = str(spec).partition(":")
        if path and _fd is None:
            try:
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                _nonce = nonce
            except OSError:
                _fd = None
    if _fd is None:
        return  # a run nobody judges: no hook of the witness is called per test
    # registered here, not as module hooks: a plain run pays no call per report
    config.pluginmanager.register(_Recorder())
    if not _is_worker(config):
        _emit({"event": "start", "pid": os.getpid()})


class _Recorder:
    """The witness's per-test hooks, registered only in a run the harness judges."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
        """What the call itself did, recorded before any report is made of it: a report
        rewritten afterwards (a patched TestReport) cannot turn a raise into a pass."""
        report = yield
        if call.when == "call" and call.excinfo is not None:
            _emit({"event": "test", "nodeid": item.nodeid, "when": "raised", "outcome": "raised",
                   "xfail": False})
        return report

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or report.outcome != "passed":
            _emit({"event": "test", "nodeid": report.nodeid, "when": report.when,
                   "outcome": report.outcome, "xfail": hasattr(report, "wasxfail")})

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            _emit({"event": "collect", "nodeid": report.nodeid, "outcome": "failed"})

    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        if _is_worker(session.config):
            return
        _emit({"event": "finish", "exitstatus": int(exitstatus), "failed": int(session.testsfailed),
               "collected": int(session.testscollected), "pid": os.getpid()})

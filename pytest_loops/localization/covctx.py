"""A pytest plugin for the child pytest processes a loop starts: per-test coverage.

Loaded with ``-p pytest_loops.localization.covctx``; configured by the environment variable
:data:`ENV`, a JSON object::

    {"out": "/path/spectra.json", "root": "/project", "omit": ["*/site-packages/*", ...]}

Without that variable the plugin does nothing. With it, coverage starts just
before pytest loads the initial conftest files (as pytest-cov does: the
project's import-time code is measured, the start-up of installed plugins is
not, which keeps the cost of a single-test run low) and every test runs in its
own coverage context, named by its node id, like pytest-cov's
``--cov-context=test``. Code that runs outside any one test -- imports,
collection, setting up fixtures wider than a function -- is recorded under the
empty context ``""``: its effects are shared by many tests.

Measuring pauses where only pytest and its plugins run, to keep a single-test
run cheap: while plugins configure themselves, while a report (a failure's
traceback) is made, and after the last test. Project code that runs only there
(a conftest's ``pytest_configure``, a ``__repr__`` shown in a traceback) is not
measured; pytest-xdist is turned off, since its workers would not be measured.

A failing assertion formats its message before it raises: pytest's rewritten
``assert`` calls its helpers (``_saferepr``, ``_call_reprcompare``, ...), a
unittest ``assert*`` method calls ``safe_repr`` or ``_formatMessage``, and the
project's ``__repr__``/``__str__``/``__eq__`` run for that. From the first such
call until the test's call phase (or its subtest) reports, lines go to the
test's *after-failure* context (:data:`AFTER`): still measured (the impact map
counts them), but not evidence of where the bug is.

At the end the plugin writes ``out`` (atomically): per context, the lines it ran
in each file under ``root``; each test's outcome; the files that define tests.
:func:`pytest_loops.localization.spectra.read_spectra` reads it. If coverage cannot
start, ``out`` holds ``{"error": "..."}`` instead.

This module imports nothing from the rest of the package (it runs inside the
project's test process, which must stay as close to a plain pytest run as
possible), and not pytest itself (the harness imports its constants).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import pytest

# pytest's own marker, without importing pytest into the harness process that
# reads this module's constants
hookimpl = pluggy.HookimplMarker("pytest")

ENV = "PYTEST_LOOPS_COVCTX"
SHARED = ""
AFTER = "\x00after"  # a test's context + this: lines run while its failure was being formatted
FORMAT = "pytest-loops.spectra/1"

# pytest-xdist runs tests in worker processes this plugin does not measure.
_XDIST_OFF: dict[str, object] = {"dist": "no", "numprocesses": None, "tx": []}


def _write(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, separators=(",", ":"))
    os.replace(tmp, path)


class _Recorder:
    """One coverage session, the current context and the outcomes seen so far."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import time

        began = time.perf_counter()
        import coverage
        import coverage.collector

        # Every Collector records its creator's stack for a debug message;
        # inspect.stack() under pytest's deep hook stack reads the source of
        # every frame, a large share of the cost of starting.
        if callable(getattr(coverage.collector, "short_stack", None)):
            coverage.collector.short_stack = lambda *args, **kwargs: ""

        self.out = str(settings["out"])
        given = os.path.abspath(str(settings["root"]))
        self.root = os.path.realpath(given)
        include = sorted({os.path.join(given, "*"), os.path.join(self.root, "*")})
        here = os.path.realpath(__file__)
        omit = [*settings.get("omit", ()), here, os.path.splitext(here)[0] + ".py*"]
        # config_file=False: the project's own .coveragerc (source=, plugins=,
        # branch=...) must not change what is measured or how.
        self.cov = coverage.Coverage(data_file=None, include=include, omit=omit,
                                     config_file=False, auto_data=False, branch=False)
        # sys.monitoring (the default core on newer Pythons) has no dynamic contexts
        self.cov.set_option("run:core", "ctrace")
        self.cov.set_option("run:disable_warnings", [
            "no-data-collected", "module-not-measured", "module-not-imported",
            "already-imported", "include-ignored", "no-ctracer", "couldnt-parse", "no-sysmon",
        ])
        self.context = SHARED
        self.outcomes: dict[str, str] = {}
        self.test_files: set[str] = set()
        self.collect_errors: list[str] = []
        self.exitstatus: int | None = None
        self.collected: int | None = None
        self.config: object = None  # the pytest config of the measured session
        self.paused = False
        self.in_call = False  # a test's call phase runs (its failure formatting is watched)
        self.restore: list[tuple[object, str, object]] = []  # what _watch_formatting replaced
        self.cov.start()
        self.start_s = time.perf_counter() - began  # what measuring cost before the first test

    def pause(self) -> None:
        if not self.paused:
            self.cov.stop()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.cov.start()
            self.paused = False

    def switch(self, context: str) -> str:
        previous = self.context
        if context != previous:
            self.cov.switch_context(context)
            self.context = context
        return previous

    def formatting(self) -> None:
        """A failure message is being made: the rest of this call phase is after the failure."""
        if self.in_call and not self.paused and not self.context.endswith(AFTER) and self.context != SHARED:
            self.switch(self.context + AFTER)

    def failure_reported(self) -> None:
        """A call phase (or one subtest of it) reported: back to the test's own context."""
        if self.context.endswith(AFTER):
            self.switch(self.context[:-len(AFTER)])

    def record(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        seen = self.outcomes.get(nodeid)
        if seen in ("failed", "error"):
            return
        if report.failed:
            self.outcomes[nodeid] = "failed" if report.when == "call" else "error"
        elif report.when == "call" or (report.skipped and report.when == "setup"):
            if report.skipped:
                self.outcomes[nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
            else:
                self.outcomes[nodeid] = "xpassed" if hasattr(report, "wasxfail") else "passed"

    def relative(self, filename: str) -> str | None:
        real = os.path.realpath(filename)
        rel = os.path.relpath(real, self.root)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
            return None
        return rel.replace(os.sep, "/")

    def finish(self) -> None:
        self.pause()
        data = self.cov.get_data()
        contexts: dict[str, dict[str, list[int]]] = {}
        after: dict[str, dict[str, list[int]]] = {}
        for filename in sorted(data.measured_files()):
            rel = self.relative(filename)
            if rel is None:
                continue
            for lineno, names in data.contexts_by_lineno(filename).items():
                for name in names:
                    if name.endswith(AFTER):
                        after.setdefault(name[:-len(AFTER)], {}).setdefault(rel, []).append(lineno)
                    else:
                        contexts.setdefault(name, {}).setdefault(rel, []).append(lineno)
        for table in (contexts, after):
            for files in table.values():
                for lines in files.values():
                    lines.sort()
        _write(self.out, {
            "format": FORMAT,
            "root": self.root,
            "outcomes": self.outcomes,
            "test_files": sorted(self.test_files),
            "collect_errors": self.collect_errors,
            "exitstatus": self.exitstatus,
            "collected": self.collected,
            "start_s": round(self.start_s, 4),
            "contexts": contexts,
            "after": after,
        })


def _formatting_wrapper(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder
        if recorder is not None:
            recorder.formatting()
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


# Called only to make a failing assertion's message: pytest's assertion rewriting helpers
# (looked up on their module at each call) and unittest's message makers.
_PYTEST_HELPERS = ("_saferepr", "_format_assertmsg", "_format_boolop", "_call_reprcompare",
                   "_format_explanation", "_should_repr_global_name")
_UNITTEST_HELPERS = ("safe_repr", "_common_shorten_repr")


def _watch_formatting(recorder: _Recorder) -> None:
    import sys

    targets: list[tuple[object, str]] = []
    rewrite = sys.modules.get("_pytest.assertion.rewrite")
    if rewrite is not None:
        targets += [(rewrite, name) for name in _PYTEST_HELPERS]
    import unittest.case

    targets += [(unittest.case, name) for name in _UNITTEST_HELPERS]
    targets.append((unittest.case.TestCase, "_formatMessage"))
    for owner, name in targets:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if callable(original):
            recorder.restore.append((owner, name, original))
            setattr(owner, name, _formatting_wrapper(original))


def _unwatch_formatting(recorder: _Recorder) -> None:
    while recorder.restore:
        owner, name, original = recorder.restore.pop()
        setattr(owner, name, original)


def _start() -> _Recorder | None:
    raw = os.environ.get(ENV)
    if not raw:
        return None
    settings: dict[str, Any] = {}
    try:
        settings = json.loads(raw)
        return _Recorder(settings)
    except Exception as exc:  # never break the test run; tell the parent why instead
        out = settings.get("out") if isinstance(settings, dict) else None
        if out:
            try:
                _write(str(out), {"format": FORMAT, "error": f"{type(exc).__name__}: {exc}"})
            except OSError:
                pass
        return None


_recorder: _Recorder | None = None


def _active(config: pytest.Config) -> _Recorder | None:
    """The recorder, for hooks of the session it measures only.

    An in-process pytest session inside a measured test (pytester) may load this
    plugin too; its hooks must not touch the outer session's measurement.
    """
    recorder = _recorder
    return recorder if recorder is not None and recorder.config is config else None


@hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    global _recorder
    if _recorder is None:
        _recorder = _start()
        if _recorder is not None:
            _recorder.config = early_config


@hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    recorder = _active(config)
    if recorder is None:
        return
    for name, value in _XDIST_OFF.items():
        if hasattr(config.option, name):
            setattr(config.option, name, value)
    _watch_formatting(recorder)
    # Plugins configure themselves now (some import large libraries); measuring
    # that would make every run slower for nothing, so measuring pauses until
    # the session starts. Project code that runs only here is then unmeasured,
    # which the impact map treats as "run everything" when it changes.
    recorder.pause()


@hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    recorder = _active(session.config)
    if recorder is not None:
        recorder.resume()


@hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Any:
    # After the last test, plugins write reports and summaries (some import
    # large libraries only then): not the project's code, not worth measuring.
    try:
        return (yield)
    finally:
        recorder = _active(session.config)
        if recorder is not None:
            recorder.pause()


@hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    recorder = _active(item.config)
    if recorder is None:
        return (yield)
    try:
        rel = recorder.relative(str(item.path))
        if rel is not None:
            recorder.test_files.add(rel)
    except (AttributeError, ValueError):
        pass
    recorder.switch(item.nodeid)
    try:
        return (yield)
    finally:
        recorder.switch(SHARED)


@hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    recorder = _active(item.config)
    if recorder is None:
        return (yield)
    recorder.in_call = True
    try:
        return (yield)
    finally:
        recorder.in_call = False


@hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Rendering a failure (tracebacks, source, reprs) is pytest's own heavy code
    # and does not decide the outcome: not measured.
    recorder = _active(item.config)
    if recorder is None:
        return (yield)
    recorder.pause()
    try:
        report = yield
    finally:
        recorder.resume()
        if call.when == "call":  # the next subtest, or the teardown, is the test's own code again
            recorder.failure_reported()
    recorder.record(report)
    return report


@hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    # A class/module/session fixture is set up during the first test that needs
    # it, but every later test uses its value: record it as shared code.
    recorder = _active(request.config)
    if recorder is None or fixturedef.scope == "function":
        return (yield)
    previous = recorder.switch(SHARED)
    try:
        return (yield)
    finally:
        recorder.switch(previous)


@hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report = yield
    recorder = _active(collector.config)
    if recorder is not None and report is not None and report.failed:
        recorder.collect_errors.append(report.nodeid)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    recorder = _active(session.config)
    if recorder is not None:
        recorder.exitstatus = int(exitstatus)
        recorder.collected = getattr(session, "testscollected", None)


@hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    global _recorder
    recorder = _active(config)
    if recorder is None:
        return
    _recorder = None
    _unwatch_formatting(recorder)
    recorder.finish()

"""``pytest --loop-watch``: rerun the failing tests on each change, then the whole selection.

What pytest-xdist's ``--looponfail`` did. This process only watches: it never
collects, so it never imports the code under test; every run is a fresh pytest
process (:data:`~pytest_loops.core.checks.CHILD_ENV` set, so it starts no loops
itself) that notes its failures through :mod:`pytest_loops.pytest_plugin.watchreport`.
The first run is the whole selection. On each tick with new state (a settled change
under the rootdir, or ``--loop-watch-poll``'s command answering ready) the tests that
failed run again, alone, by node id; once they pass, the whole selection runs. The
ticks, idle ticks and the silence window are the watch driver's
(:mod:`pytest_loops.core.watch`, docs/watch.md).

Exit codes: pytest's, from the last run (0 when it was green, 1 when tests failed;
2 when interrupted before a run finished); with ``--loop-exitcode=verdict`` the watch's
verdict code (4 NO_PROGRESS after the silence window, 5 after three bad poll answers).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_loops.core.checks import CHILD_ENV, pytest_command
from pytest_loops.core.watch import (
    PollSource,
    Tick,
    WatchDriver,
    WatchPlan,
    artifact_excludes,
    file_source,
)
from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.options import ini_value
from pytest_loops.pytest_plugin.watchreport import REPORT_ENV
from pytest_loops.runtime.protect.tree import clear_stale_bytecode
from pytest_loops.settings import BY_NAME, Resolved
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import EXIT_USAGE, Verdict

WATCH_SETTINGS = ("watch", "watch_poll", "watch_interval", "silence")
NOTHING_FAILED = (0, 5)  # pytest: all passed, no tests collected
REPORTER = "pytest_loops.pytest_plugin.watchreport"


@dataclass
class _Outcome:
    verdict: Verdict
    reason: str
    iterations_run: int
    log_path: str | None = None


def child_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """The command line without the watch's own options (either form)."""
    flags = {o for name in WATCH_SETTINGS for o in BY_NAME[name].options}
    takes_value = {o for name in WATCH_SETTINGS if not BY_NAME[name].bare for o in BY_NAME[name].options}
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        head = arg.split("=", 1)[0]
        if head in flags:
            skip = head in takes_value and "=" not in arg
            continue
        out.append(arg)
    return out


class PytestWatch:
    """The controller: runs pytest processes for the watch driver's ticks."""

    def __init__(self, config: pytest.Config, settings: Resolved) -> None:
        from pytest_loops.runtime.process import ProcessRunner

        self.config = config
        self.root = Path(config.rootpath)
        self.cwd = Path(config.invocation_params.dir)
        artifacts = Path(settings.values.get("artifacts") or ".pytest-loops")
        self.artifacts = artifacts if artifacts.is_absolute() else self.root / artifacts
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.dir = self.artifacts / "watch" / f"pytest-{stamp}-{os.getpid()}"
        self.runner = ProcessRunner(output_cap=settings.values.get("output_cap", BY_NAME["output_cap"].default))
        self.args = child_args(config.invocation_params.args)
        self.base = [f"--rootdir={self.root}"] + (["-c", str(config.inipath)] if config.inipath else [])
        self.failing: list[str] = []
        self.runs = 0

    def say(self, text: str) -> None:
        from pytest_loops.redact import redact, strip_control

        try:
            print(strip_control(redact(text)), flush=True)
        except (OSError, ValueError):
            pass

    def pytest_run(self, targets: list[str], label: str, ids: Path | None = None) -> tuple[int | None, list[str]]:
        """One fresh pytest process: its exit code and the node ids that failed. With
        ``ids`` (a file of node ids) it is the fix-loop's rerun: those tests alone, with a
        cache of their own (:func:`~pytest_loops.core.checks.pytest_command`)."""
        self.runs += 1
        report = self.dir / f"{self.runs:03d}-{label}.failed.jsonl"
        output = self.dir / f"{self.runs:03d}-{label}.out"
        if ids is not None:
            command = pytest_command(f"@{ids}", str(self.dir / f"{self.runs:03d}-{label}.junit.xml"),
                                     [*targets, "-p", REPORTER])
        else:
            command = shlex.join([sys.executable, "-m", "pytest", "-p", REPORTER, *targets])
        env = {**os.environ, CHILD_ENV: "1", REPORT_ENV: str(report)}
        clear_stale_bytecode(str(self.cwd))  # an edit just now must not run as the old code
        done = self.runner.run(command, cwd=self.cwd, env=env, output_path=output)
        try:
            with open(output, "rb") as f:
                sys.stdout.write(f.read().decode("utf-8", "replace"))
                sys.stdout.flush()
        except OSError:
            pass
        failed: dict[str, None] = {}
        try:
            for line in report.read_text(encoding="utf-8").splitlines():
                failed[json.loads(line)["nodeid"]] = None
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if done.start_error:
            self.say(f"pytest --loop-watch: the test run could not start: {done.start_error}")
        return done.exit_code, list(failed)

    def run_once(self, spec: LoopSpec, number: int, tick: Tick | None) -> _Outcome:
        ran = 0
        if self.failing:
            ids = self.dir / f"tick-{number}.ids"
            ids.write_text("\n".join(self.failing) + "\n", encoding="utf-8")
            self.say(f"[watch] generation {number}: running the {len(self.failing)} failing test(s) again")
            code, failed = self.pytest_run(self.base, f"tick-{number}-failing", ids=ids)
            ran += 1
            if failed or code not in NOTHING_FAILED:
                self.failing = failed or self.failing
                return _Outcome(Verdict.NO_PROGRESS, f"{len(self.failing)} test(s) still failing", ran)
        self.say(f"[watch] generation {number}: running the whole selection")
        code, failed = self.pytest_run(self.args, f"tick-{number}-all")
        ran += 1
        if code not in NOTHING_FAILED and not failed:
            raise _RunBroken(code)
        self.failing = failed
        if failed:
            return _Outcome(Verdict.NO_PROGRESS, f"{len(failed)} test(s) failing", ran)
        return _Outcome(Verdict.SUCCESS, "every test passed", ran)


class _RunBroken(Exception):
    """A run that failed without a failing test (a usage error, an internal error)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(code)
        self.code = code


def _exit_code(config: pytest.Config, result: Any) -> int:
    if (config.getoption("loop_exitcode") or ini_value(config, "exitcode")) == "verdict":
        return int(result.exit_code)
    if result.last is None:
        return int(pytest.ExitCode.INTERRUPTED)
    return 0 if result.last.verdict is Verdict.SUCCESS else int(pytest.ExitCode.TESTS_FAILED)


def run_watch(config: pytest.Config, settings: Resolved) -> int:
    """The whole ``pytest --loop-watch`` session; its exit code."""
    from pytest_loops.runtime.process import TerminationGuard

    verdict_mode = (config.getoption("loop_exitcode") or ini_value(config, "exitcode")) == "verdict"
    values = {name: settings.values.get(name, BY_NAME[name].default) for name in WATCH_SETTINGS}
    try:
        plan = WatchPlan(poll=values["watch_poll"], interval=values["watch_interval"],
                         silence=values["silence"])
        plan.check(where="--loop-silence" if values["silence"] else "--loop-watch-interval")
        watch = PytestWatch(config, settings)
        watch.dir.mkdir(parents=True, exist_ok=True)
    except (LoopUsageError, OSError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_USAGE if verdict_mode else int(pytest.ExitCode.USAGE_ERROR)
    log = watch.dir / "watch.jsonl"

    def emit(event: dict[str, Any]) -> None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"at": round(time.time(), 3), **event}, default=str) + "\n")
        if event["event"] == "idle":
            watch.say(f"[watch] idle tick: state unchanged ({event['idle']} idle so far)")
        elif event["event"] == "poll_error":
            print(f"[watch] bad poll ({event['in_a_row']} in a row): {event['error']}", file=sys.stderr)

    source: Any
    if plan.poll:
        source = PollSource(plan.poll, runner=watch.runner, cwd=str(watch.root), env=dict(os.environ),
                            interval=plan.interval, output=watch.dir / "poll.out",
                            request={"loop": "pytest --loop-watch", "root": str(watch.root), "poll": plan.poll,
                                     "interval_s": plan.interval, "silence_s": plan.silence})
    else:
        source = file_source(watch.root, ["."], artifact_excludes([watch.artifacts]), interval=plan.interval,
                             debounce=plan.debounce)
    spec = LoopSpec(name="pytest --loop-watch", checks=(Check.command_passes("pytest"),),
                    guards=Guards(budget_seconds=0), cwd=str(watch.root))
    driver = WatchDriver(spec, plan, source, watch.run_once, emit=emit)
    watch.say(f"[watch] watching {'poll ' + repr(plan.poll) if plan.poll else watch.root}; "
              f"silence {plan.silence:g}s; log {log}")
    try:
        with TerminationGuard(watch.runner):
            result = driver.run()
    except _RunBroken as exc:
        watch.say(f"[watch] the test run ended {exc.code} without a failing test; stopping")
        return exc.code if exc.code is not None else int(pytest.ExitCode.INTERNAL_ERROR)
    code = _exit_code(config, result)
    watch.say(f"[watch] {result.summary(code)}")
    return code

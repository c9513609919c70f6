"""``pytest-loops watch FILE``: a loop file's loop as a watch (see docs/watch.md).

The loop runs once, then again on each tick with new state: a settled change in
its watched files (its ``watch:`` paths, else its ``look at:`` paths, else its
directory), or a poll command answering ready (``watch: poll "CMD" every 30s``).
Each run is an ordinary run of the engine with its own run log; the watch itself
writes an event log (``watch.jsonl``: ticks, idle ticks, runs, bad polls, the end)
and ends with one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pluggy

from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import BY_NAME, env_layer, resolve
from pytest_loops.spec import LoopSpec

WATCH_ROWS = ("watch_poll", "watch_interval", "silence")
"""The settings a watch reads; their ``watch`` flags are the pytest options without ``loop-``."""


def watch_flag(name: str) -> str:
    option = BY_NAME[name].option
    assert option is not None
    return "--" + option.removeprefix("--loop-")


def _typed(name: str, flag: str):
    def parse(text: str) -> Any:
        return BY_NAME[name].parse(text, flag)
    parse.__name__ = name
    return parse


def _max_iter(text: str) -> int:
    if not text.strip().isdigit():
        raise LoopUsageError(f"{text!r} is not a valid max_iter; valid: an integer >= 0 "
                             "(0: no cap, in watch mode only)", location="--max-iter")
    return int(text)


def add_watch_parser(sub: Any) -> None:
    """Register ``pytest-loops watch`` on the command line's subparsers."""
    watch = sub.add_parser(
        "watch", help="run a loop file's loop, then again whenever its files or its poll command change",
        description="Run the loop once, then wait for a change in its watched paths (or for its poll "
                    "command to report ready) and run it again; a tick with unchanged state is idle. "
                    "Ends on the silence window (4 NO_PROGRESS), the budget (3), the iteration cap (2), "
                    "an escalation (5) or Ctrl-C (the last run's code, 0 when it was green).")
    watch.add_argument("file", metavar="FILE", help="a .loop or *.loop.yaml file")
    watch.add_argument("--name", default=None, help="which loop of the file (default: its only loop)")
    for name in WATCH_ROWS:
        row = BY_NAME[name]
        flag = watch_flag(name)
        watch.add_argument(flag, dest=name, type=_typed(name, flag), metavar=row.metavar, default=None,
                           help=f"{row.help} (also {row.option}, {row.env})")
    watch.add_argument("--max-iter", dest="max_iter", type=_max_iter, metavar="N", default=None,
                       help="iterations of the whole watch when the file sets none; 0 = no cap "
                            "(watch mode only)")
    watch.add_argument("--budget-seconds", dest="budget_seconds", type=_typed("budget_seconds", "--budget-seconds"),
                       metavar="S", default=None,
                       help="wall-clock budget of the whole watch when the file sets none; 0 = off")
    watch.add_argument("--debounce", type=_typed("watch_interval", "--debounce"), metavar="S", default=0.1,
                       help="seconds the watched files must stay unchanged before a change is a tick "
                            "(default 0.1)")
    watch.add_argument("--artifacts", metavar="DIR", default=None,
                       help="directory for run logs and the watch log, relative to the loop file's directory "
                            "(default: .pytest-loops there)")
    watch.add_argument("--quiet", "-q", action="store_true", help="print only the summary line")


hookimpl = pluggy.HookimplMarker("pytest")


def _say(text: str, stream: Any) -> None:
    """Print masked, without escape sequences; a closed stream never stops the watch."""
    from pytest_loops.redact import redact, strip_control

    try:
        print(strip_control(redact(text)), file=stream, flush=True)
    except (OSError, ValueError):
        pass


class _IterationPrinter:
    def __init__(self, stream: Any) -> None:
        self.stream = stream

    @hookimpl
    def pytest_loop_iteration_finished(self, spec: LoopSpec, record: Any) -> None:
        from pytest_loops.core.watch import UNBOUNDED
        from pytest_loops.pytest_plugin.terminal import iteration_line

        line = iteration_line(spec, record)
        if spec.guards.max_iter == UNBOUNDED:  # the watch has no cap: say so, not the stand-in number
            line = line.replace(f"/{UNBOUNDED}", "/-", 1)
        _say(line, self.stream)


def pick_loop(path: str, name: str | None) -> LoopSpec:
    from pytest_loops.sources import is_loop_file, load_any

    if not is_loop_file(path):
        raise LoopUsageError("not a loop file", location=path, fix="give a .loop or *.loop.yaml file")
    loops = list(load_any(path).loops)
    if name is not None:
        chosen = [s for s in loops if s.name == name]
        if not chosen:
            raise LoopUsageError(f"no loop named {name!r}", location=path,
                                 fix=f"one of: {', '.join(s.name for s in loops) or '(none)'}")
        return chosen[0]
    if len(loops) != 1:
        raise LoopUsageError(f"the file has {len(loops)} loops; a watch runs one", location=path,
                             fix=f"give --name, one of: {', '.join(s.name for s in loops) or '(none)'}")
    return loops[0]


def watch_settings(spec: LoopSpec, args: argparse.Namespace,
                   environ: dict[str, str] | None = None) -> dict[str, Any]:
    """poll, interval, silence: defaults < environment < flags < the loop file's own line."""
    env = {k: v for k, v in env_layer(environ).items() if k in WATCH_ROWS}
    flags = {name: getattr(args, name) for name in WATCH_ROWS}
    values = resolve([("environment", env), ("command line", flags)],
                     defaults={name: BY_NAME[name].default for name in WATCH_ROWS}).values
    file_keys = {"watch_poll": "poll", "watch_interval": "interval", "silence": "silence"}
    for name, key in file_keys.items():
        if key in spec.watch:
            values[name] = spec.watch[key]
    return values


def cmd_watch(args: argparse.Namespace) -> int:
    from pytest_loops.artifacts.finishers import ArtifactOptions, make_engine
    from pytest_loops.core.pluginmanager import make_plugin_manager
    from pytest_loops.core.watch import (
        PollSource,
        Tick,
        WatchDriver,
        WatchPlan,
        artifact_excludes,
        file_source,
        watched_patterns,
    )
    from pytest_loops.runtime.outpaths import check_output_path
    from pytest_loops.runtime.process import ProcessRunner, TerminationGuard

    spec = pick_loop(args.file, args.name)
    values = watch_settings(spec, args)
    g = spec.guards
    changes: dict[str, Any] = {}
    if args.max_iter is not None and spec.origin.get("guards.max_iter", "default") == "default":
        changes["max_iter"] = args.max_iter
    if args.budget_seconds is not None and spec.origin.get("guards.budget_seconds", "default") == "default":
        changes["budget_seconds"] = args.budget_seconds
    max_iter = changes.get("max_iter", g.max_iter)
    if "budget_seconds" in changes:
        from pytest_loops.spec import Guards

        spec = spec.replace(guards=Guards(max_iter=g.max_iter, budget_seconds=changes["budget_seconds"],
                                          no_progress_k=g.no_progress_k, escalate_after=g.escalate_after))
    plan = WatchPlan(poll=values["watch_poll"], interval=values["watch_interval"], silence=values["silence"],
                     debounce=args.debounce, max_iter=max_iter)
    plan.check(where=spec.source or args.file)
    cwd = Path(spec.cwd)
    artifacts = Path(args.artifacts) if args.artifacts else cwd / ".pytest-loops"
    artifacts = artifacts if artifacts.is_absolute() else cwd / artifacts  # as `run` reads it
    check_output_path(str(artifacts), "--artifacts", directory=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    watch_dir = artifacts / "watch" / f"{spec.slug}-{stamp}-{os.getpid()}"
    watch_dir.mkdir(parents=True, exist_ok=True)
    log_path = watch_dir / "watch.jsonl"
    out = sys.stdout
    runner = ProcessRunner()
    quiet = args.quiet

    def emit(event: dict[str, Any]) -> None:
        event = {"at": round(time.time(), 3), **event}
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, default=str) + "\n")
        if quiet:
            return
        kind = event["event"]
        if kind == "idle":
            _say(f"[{spec.name}] idle tick: state unchanged ({event['idle']} idle so far)", out)
        elif kind == "tick":
            _say(f"[{spec.name}] tick {event['tick']}: running the loop", out)
        elif kind == "run":
            _say(f"[{spec.name}] tick {event['tick']}: {event['verdict']} after {event['iterations']} "
                 f"iteration(s){' (fixed)' if event['fixed'] else ''}: {event['reason']}", out)
        elif kind == "poll_error":
            _say(f"[{spec.name}] bad poll ({event['in_a_row']} in a row): {event['error']}", sys.stderr)

    def run_once(tick_spec: LoopSpec, number: int, tick: Tick | None):
        pm = make_plugin_manager([])
        if not quiet:
            pm.register(_IterationPrinter(out))
        env = dict(os.environ)
        env["LOOP_WATCH_TICK"] = str(number)
        if tick is not None and tick.payload is not None:
            payload = watch_dir / f"payload-{number}.json"
            payload.write_text(json.dumps(tick.payload), encoding="utf-8")
            env["LOOP_WATCH_PAYLOAD"] = str(payload)
        from pytest_loops.runtime.protect.tree import clear_stale_bytecode

        clear_stale_bytecode(str(cwd))  # an edit just now must not run as the old code
        engine = make_engine(runner=runner, plugin_manager=pm, artifacts=ArtifactOptions(),
                             artifacts_dir=str(artifacts), env=env)
        return engine.run(tick_spec, log_path=watch_dir / f"tick-{number}.json")

    source: Any
    if plan.poll:
        source = PollSource(plan.poll, runner=runner, cwd=str(cwd), env=dict(os.environ), interval=plan.interval,
                            output=watch_dir / "poll.out")
    else:
        page = cwd / spec.memory_page if spec.reflexion and spec.memory_page else None
        source = file_source(cwd, watched_patterns(spec), artifact_excludes([artifacts, watch_dir, page]),
                             interval=plan.interval, debounce=plan.debounce)
    if not quiet:
        how = "the change journal" if getattr(source, "wake", None) else f"sampled every {plan.interval:g}s"
        what = f"poll {plan.poll!r} every {plan.interval:g}s" if plan.poll else \
            f"files {', '.join(watched_patterns(spec))} ({how})"
        _say(f"[{spec.name}] watching {what}; silence {plan.silence:g}s; "
             f"max_iter {plan.max_iter or 'unbounded'}; log {log_path}", out)
    driver = WatchDriver(spec, plan, source, run_once, emit=emit)
    with TerminationGuard(runner):
        result = driver.run()
    _say(f"[{spec.name}] {result.summary()}", out)
    return result.exit_code

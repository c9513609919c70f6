"""``pytest-loops watch FILE``: a loop file's loop as a watch (see docs/watch.md).

The loop runs once, then again on each tick with new state: a settled change in
its watched files (its ``watch:`` paths, else its ``look at:`` paths, else its
directory), or a poll command answering ready (``watch: poll "CMD" every 30s``).
Each run (a *generation*) is an ordinary run of the engine, bounded by the loop's
own guards, with its own run log; the watch itself has no cap (∞) and writes an
event log (``watch.jsonl``: generations, idle ticks, runs, bad polls, the end) and
ends with one summary line.
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
    if not text.strip().isdigit() or int(text) < 1:
        raise LoopUsageError(f"{text!r} is not a valid max_iter; valid: an integer >= 1, the cap of each "
                             "generation (a watch itself has no cap: it ends on its silence window, an "
                             "escalation or Ctrl-C)", location="--max-iter")
    return int(text)


def add_watch_parser(sub: Any) -> None:
    """Register ``pytest-loops watch`` on the command line's subparsers."""
    watch = sub.add_parser(
        "watch", help="run a loop file's loop, then again whenever its files or its poll command change",
        description="Run the loop once, then wait for a change in its watched paths (or for its poll "
                    "command to report ready) and run it again; a tick with unchanged state is idle. "
                    "Each run (a generation) is bounded by the loop's own guards; the watch has no cap. "
                    "It ends on the silence window (4 NO_PROGRESS), an escalation (5) or Ctrl-C "
                    "(the last generation's code, 0 when it was green).")
    watch.add_argument("file", metavar="FILE", help="a .loop or *.loop.yaml file")
    watch.add_argument("--name", default=None, help="which loop of the file (default: its only loop)")
    for name in WATCH_ROWS:
        row = BY_NAME[name]
        flag = watch_flag(name)
        watch.add_argument(flag, dest=name, type=_typed(name, flag), metavar=row.metavar, default=None,
                           help=f"{row.help} (also {row.option}, {row.env})")
    watch.add_argument("--max-iter", dest="max_iter", type=_max_iter, metavar="N", default=None,
                       help="iteration cap of each generation when the file sets none (>= 1)")
    watch.add_argument("--budget-seconds", dest="budget_seconds", type=_typed("budget_seconds", "--budget-seconds"),
                       metavar="S", default=None,
                       help="wall-clock budget of each generation when the file sets none; 0 = off")
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
    def __init__(self, stream: Any, generation: int) -> None:
        self.stream = stream
        self.generation = generation

    @hookimpl
    def pytest_loop_iteration_finished(self, spec: LoopSpec, record: Any) -> None:
        from pytest_loops.pytest_plugin.terminal import iteration_line

        line = iteration_line(spec, record)
        head = f"[{spec.name}] "
        rest = line[len(head):] if line.startswith(head) else line
        _say(f"{head}gen {self.generation} {rest}", self.stream)


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
        UNBOUNDED_MARK,
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
    if changes:  # the guards of each generation; the loop file's own lines win
        from pytest_loops.spec import Guards

        spec = spec.replace(guards=Guards(max_iter=changes.get("max_iter", g.max_iter),
                                          budget_seconds=changes.get("budget_seconds", g.budget_seconds),
                                          no_progress_k=g.no_progress_k, escalate_after=g.escalate_after))
        g = spec.guards
    plan = WatchPlan(poll=values["watch_poll"], interval=values["watch_interval"], silence=values["silence"],
                     debounce=args.debounce)
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
            what = "the start-up run" if event["generation"] == 1 else "new state"
            _say(f"[{spec.name}] generation {event['generation']}: {what}, running the loop", out)
        elif kind == "run":
            _say(f"[{spec.name}] generation {event['generation']}: {event['verdict']} after "
                 f"{event['iterations']} iteration(s){' (fixed)' if event['fixed'] else ''}: {event['reason']}", out)
        elif kind == "poll_error":
            _say(f"[{spec.name}] bad poll ({event['in_a_row']} in a row): {event['error']}", sys.stderr)

    def run_once(tick_spec: LoopSpec, number: int, tick: Tick | None):
        pm = make_plugin_manager([])
        if not quiet:
            pm.register(_IterationPrinter(out, number))
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
        return engine.run(tick_spec, log_path=watch_dir / f"gen-{number}.json")

    source: Any
    if plan.poll:
        source = PollSource(plan.poll, runner=runner, cwd=str(cwd), env=dict(os.environ), interval=plan.interval,
                            output=watch_dir / "poll.out",
                            request={"loop": spec.name, "goal": spec.goal, "source": spec.source,
                                     "poll": plan.poll, "interval_s": plan.interval, "silence_s": plan.silence})
    else:
        page = cwd / spec.memory_page if spec.reflexion and spec.memory_page else None
        source = file_source(cwd, watched_patterns(spec), artifact_excludes([artifacts, watch_dir, page]),
                             interval=plan.interval, debounce=plan.debounce)
    if not quiet:
        how = "the change journal" if getattr(source, "wake", None) else f"sampled every {plan.interval:g}s"
        what = f"poll {plan.poll!r} every {plan.interval:g}s" if plan.poll else \
            f"files {', '.join(watched_patterns(spec))} ({how})"
        budget = f"{g.budget_seconds:g}s" if g.budget_seconds else "off"
        _say(f"[{spec.name}] watching {what}; silence {plan.silence:g}s; generations {UNBOUNDED_MARK}, "
             f"each bounded by max_iter {g.max_iter}, budget {budget}, no-progress {g.no_progress_k or 'off'}; "
             f"log {log_path}", out)
    driver = WatchDriver(spec, plan, source, run_once, emit=emit)
    with TerminationGuard(runner):
        result = driver.run()
    _say(f"[{spec.name}] {result.summary()}", out)
    return result.exit_code


def is_watch_log(path: str) -> bool:
    """A watch's event log (``watch.jsonl``), or a watch directory holding one."""
    p = Path(path)
    return p.name == "watch.jsonl" or (p.is_dir() and (p / "watch.jsonl").is_file())


def format_watch_log(path: str) -> str:
    """`pytest-loops show` of a watch log: one row per generation (what started it, its
    verdict, iterations and run log), the idle ticks after each, and how the watch ended."""
    from pytest_loops.limits import open_regular
    from pytest_loops.redact import strip_control

    p = Path(path)
    if p.is_dir():
        p = p / "watch.jsonl"
    try:
        with open_regular(p, "a watch log") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise LoopUsageError(f"cannot read: {exc.strerror or exc}", location=str(p)) from None
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise LoopUsageError("not a watch event (one JSON object a line)", location=f"{p}:{number}",
                                 fix="pass the watch.jsonl a watch wrote")
        events.append(event)
    out: list[str] = []
    rows: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    current = 0
    for e in events:
        kind = e["event"]
        if kind == "watch_started":
            per = e.get("per_generation") or {}
            source = f"poll {e['poll']!r}" if e.get("poll") else "files"
            out.append(f"watch {e.get('loop')}: {source} every {e.get('interval_s')}s; silence "
                       f"{e.get('silence_s')}s; generations {e.get('generations', '?')}, each bounded by "
                       f"max_iter {per.get('max_iter', '?')}, budget {per.get('budget_s', '?')}s, "
                       f"no-progress {per.get('no_progress_k', '?')}")
        elif kind == "tick":
            current = int(e.get("generation") or e.get("tick") or 0)
            trigger = "start-up run" if e.get("digest") is None else f"new state {str(e['digest'])[:16]}"
            if e.get("settled_at") is not None:
                trigger += f" (settled {e['settled_at']})"
            rows[current] = {"trigger": trigger, "idle": 0}
            order.append(current)
        elif kind == "run":
            rows.setdefault(current, {"trigger": "?", "idle": 0}).update(
                verdict=e.get("verdict"), iterations=e.get("iterations"), fixed=e.get("fixed"),
                log=Path(e["log"]).name if e.get("log") else "-", reason=e.get("reason") or "")
        elif kind == "idle" and current in rows:
            rows[current]["idle"] += 1
        elif kind == "poll_error":
            out.append(f"  bad poll ({e.get('in_a_row')} in a row): {e.get('error')}")
        elif kind == "watch_ended":
            order.append(-1)
            rows[-1] = e
    table = [f"{'gen':>4}  {'started by':<34} {'verdict':<12} {'iter':>4}  {'fixed':<5}  {'idle after':>10}  run log"]
    ended = None
    for number in order:
        if number == -1:
            ended = rows[-1]
            continue
        r = rows[number]
        table.append(f"{number:>4}  {r['trigger'][:34]:<34} {str(r.get('verdict', 'running')):<12} "
                     f"{r.get('iterations', '-')!s:>4}  {'yes' if r.get('fixed') else '':<5}  {r['idle']:>10}  "
                     f"{r.get('log', '-')}")
    out += table
    if ended is not None:
        out.append(f"ended {ended.get('verdict')} (exit {ended.get('exit_code')}): {ended.get('reason')}; "
                   f"{ended.get('generations', ended.get('ticks'))} generation(s), {ended.get('idle')} idle, "
                   f"{ended.get('fixes')} fix(es), {ended.get('iterations')} iteration(s)")
    else:
        out.append("still running (or killed): no watch_ended event")
    return strip_control("\n".join(out))

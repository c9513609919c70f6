"""``pytest-loops show FILE``: the parsed shape of a loop file, and where each value came from."""

from __future__ import annotations

from pytest_loops.sources.model import LoopFile
from pytest_loops.spec import Check, CheckKind, IgnoredLine, LoopSpec

_GUARDS = ("max_iter", "budget_seconds", "no_progress_k", "escalate_after")
_OFF_WHEN_ZERO = ("budget_seconds", "no_progress_k", "escalate_after")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _check_detail(check: Check) -> str:
    times = f", {check.times} times in a row (the first failure stops)" if check.times > 1 else ""
    if check.kind is CheckKind.COMMAND:
        return f"command exits 0{times}: {check.command}"
    if check.kind is CheckKind.FINDS_NOTHING:
        return f"command exits 0 and prints nothing{times}: {check.command}"
    if check.kind is CheckKind.PYTEST:
        return f"pytest node id, in a fresh pytest process{times}: {check.node_id}"
    if check.kind is CheckKind.HUMAN:
        return f"a human must confirm (never passes by machine: ESCALATE): {check.text}"
    opts = check.options
    verdict = f"scores {opts['min_score']} or more" if opts.get("min_score") is not None else "approves"
    parts = [f"skill \"{opts.get('skill')}\" {verdict}"]
    if (opts.get("judges") or 1) > 1:
        parts.append(f"majority of {opts['judges']} judges")
    if opts.get("on"):
        parts.append(f"on the {opts['on']}")
    if opts.get("bar"):
        parts.append(f"bar: {opts['bar']}")
    return "delegated to the pytest_loop_run_check hook (cannot pass without one): " + ", ".join(parts)


def _guard_value(spec: LoopSpec, key: str) -> str:
    value = getattr(spec.guards, key)
    text = f"{value:g}s" if key == "budget_seconds" else str(value)
    if key in _OFF_WHEN_ZERO and not value:
        text += " (off)"
    return text


def _ignored_lines(lines: tuple[IgnoredLine, ...], indent: str, verbose: bool) -> list[str]:
    out = []
    for item in lines:
        out.append(f"{indent}line {item.line}: {item.text}")
        if verbose:
            out.append(f"{indent}  -> {item.why}")
    return out


def _format_loop(spec: LoopSpec, title: str, verbose: bool) -> list[str]:
    origin = spec.origin
    out = [f'{title} "{spec.name}"   ({spec.source})']
    out.append(f"  goal: {spec.goal or '-'}")
    out.append(f"  checks ({len(spec.checks)}, all must pass):")
    for n, check in enumerate(spec.checks, 1):
        out.append(f"    {n}. {check.name}   ({check.source})")
        out.append(f"       {_check_detail(check)}")
    rows = [(f"guards.{key}", _guard_value(spec, key), origin.get(f"guards.{key}", "default"))
            for key in _GUARDS]
    rows.append(("no_progress_signal", spec.no_progress_signal, origin.get("no_progress_signal", "default")))
    rows.append(("revise", spec.revise or "-", origin.get("revise", "default")))
    if spec.branches != 1 or spec.max_parallel:  # fan-out
        rows.append(("branches", str(spec.branches), origin.get("branches", "default")))
        rows.append(("max_parallel", str(spec.max_parallel or "CPU count"), origin.get("max_parallel", "default")))
    rows.append(("state_paths", ", ".join(spec.state_paths) or "-", origin.get("state_paths", "default")))
    rows.append(("lessons_page", spec.memory_page or "-", origin.get("memory_page", "default")))
    for key, name, unit in (("poll", "watch_poll", ""), ("interval", "watch_interval", "s"),
                            ("silence", "silence", "s")):
        if key in spec.watch:  # read by `pytest-loops watch`
            value = spec.watch[key]
            rows.append((name, f"{value:g}{unit}" if unit else str(value), origin.get(name, "default")))
    if spec.stop_message:
        rows.append(("stop_message", f'"{spec.stop_message}"', origin.get("stop_message", "default")))
    if spec.escalate_when_blocked:
        rows.append(("when blocked", "ESCALATE", origin.get("escalate_when_blocked", "default")))
    for key in ("look_at", "protect", "scope", "grants"):
        values = getattr(spec, key)
        if values:
            rows.append((key, ", ".join(values), origin.get(key, "default")))
    if verbose:
        rows.append(("cwd", spec.cwd, origin.get("cwd", "the file's directory")))
        rows.append(("lessons", "on" if spec.reflexion else "off", origin.get("reflexion", "default")))
        rows.append(("digest", spec.digest(), "-"))
    width = max(len(key) for key, _, _ in rows)
    vwidth = min(40, max(len(value) for _, value, _ in rows))
    out.append("  settings (value, from):")
    for key, value, where in rows:
        out.append(f"    {key:<{width}}  {value:<{vwidth}}  {where}")
    if spec.ignored:
        out.append(f"  not acted on ({_plural(len(spec.ignored), 'line')}):")
        out.extend(_ignored_lines(spec.ignored, "    ", verbose))
    return out


def format_loop_file(lf: LoopFile, *, verbose: bool = False) -> str:
    """The parsed shape of a loop file as text: loops, stages, checks, guards with the
    origin of each value ("file:line" or "default"), flows, config and ignored lines.

    ``verbose`` adds why each line is not acted on, the working directory and the
    loop digest.
    """
    stages = sum(len(p.stages) for p in lf.pipelines)
    counts = [_plural(len(lf.loops), "loop"), _plural(len(lf.pipelines), "pipeline")
              + (f" ({_plural(stages, 'stage')})" if lf.pipelines else "")]
    if lf.flows:
        counts.append(_plural(len(lf.flows), "flow"))
    out = [f"{lf.path}: {', '.join(counts)}"]
    for spec in lf.loops:
        out.append("")
        out.extend(_format_loop(spec, "loop", verbose))
    for pipeline in lf.pipelines:
        out.append("")
        out.append(f'pipeline "{pipeline.name}"   ({pipeline.source}): '
                   f"{_plural(len(pipeline.stages), 'stage')}, in order; the first that does not "
                   "succeed stops the rest")
        for n, stage in enumerate(pipeline.stages, 1):
            out.extend("  " + line for line in _format_loop(stage, f"{n}. stage", verbose))
    for flow in lf.flows:
        out.append("")
        out.append(f'flow "{flow.name}"   ({flow.source}): not run as a unit; each file is collected '
                   "on its own")
        out.append("  steps: " + (" -> ".join(flow.steps) or "-"))
        if flow.notes:
            out.extend(_ignored_lines(flow.notes, "  ", verbose))
    if lf.config:
        out.append("")
        out.append(f"config tier ({_plural(len(lf.config), 'line')}):")
        out.extend(_ignored_lines(lf.config, "  ", verbose))
    if lf.ignored:
        out.append("")
        out.append(f"not acted on ({_plural(len(lf.ignored), 'line')}):")
        out.extend(_ignored_lines(lf.ignored, "  ", verbose))
    return "\n".join(out) + "\n"

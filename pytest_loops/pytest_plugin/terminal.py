"""Text a human reads about loops: live lines, failure reports, the summary table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from pytest_loops.redact import (
    MIN_SECRET_LENGTH,
    anything_to_mask,
    current_redactor,
    make_redactor,
    redact,
    strip_control,
)

if TYPE_CHECKING:
    from pytest_loops.results import IterationRecord, LoopResult
    from pytest_loops.spec import LoopSpec

hookimpl = pluggy.HookimplMarker("pytest")

# JUnit properties (report.user_properties) every loop item carries.
LOOP_PROPERTY = "loop"
SETTINGS_PROPERTY = "settings"  # the loop's settings line (printed by an xdist controller)
TAIL_LINES = 30


def live_write(config: Any, write: Any) -> None:
    """Call ``write(reporter)`` on pytest's terminal reporter, on a fresh line, with output
    capture lifted (a loop from a loop file runs inside its item's test call, where
    the terminal is captured: without this its live lines show only under ``-s``)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        _fresh(reporter, write)
        return
    with capman.global_and_fixture_disabled():
        _fresh(reporter, write)


def _fresh(reporter: Any, write: Any) -> None:
    # xdist leaves its progress line ("[100%]") open: a banner must not be glued to it
    tw = getattr(reporter, "_tw", None)
    if tw is not None and getattr(tw, "width_of_current_line", None):
        reporter.write_line("")
    else:
        reporter.ensure_newline()
    write(reporter)


def iteration_line(spec: LoopSpec, record: IterationRecord) -> str:
    """One line per iteration: loop, i/N, each check's result, elapsed, the guards."""
    checks = "  ".join(f"{'PASS' if c.passed else 'FAIL'} {c.name} ({c.duration_s:.2f}s)"
                       for c in record.checks)
    seen = record.guards_seen
    extras = [f"elapsed {seen.get('elapsed_s', 0):.1f}s"]
    if "budget_left_s" in seen:
        extras.append(f"budget left {seen['budget_left_s']:.0f}s")
    if "unchanged" in seen:
        extras.append(f"unchanged {seen['unchanged']}")
    if "escalate_after" in seen:
        extras.append(f"escalate {seen['escalate_after']}")
    if record.revise_exit is not None:
        extras.append(f"revise exit {record.revise_exit}")
    if "cost_usd" in seen:
        extras.append(f"cost {_of_cap(seen['cost_usd'], _money)}")
    if "tokens" in seen:
        extras.append(f"tokens {_of_cap(seen['tokens'], lambda n: f'{int(n):,}')}")
    if record.guard:
        extras.append(f"stop: {record.guard}")
    return shown(f"[{spec.name}] iter {seen.get('iteration', record.iter)}  {checks}  | " + ", ".join(extras))


def adapter_lines(spec: LoopSpec, record: IterationRecord) -> list[str]:
    """What the context adapter's call before this iteration's revise step says a user should
    see: a bad answer (one line), what was withheld, and a harness to install (suggested,
    never run)."""
    seen = getattr(record, "context_adapter", None) or {}
    lines = []
    if seen.get("error"):
        lines.append(f"[{spec.name}] context adapter: {seen['error']}; the revise step ran without it")
    lines += [f"[{spec.name}] context adapter: {note}" for note in seen.get("notes") or ()]
    if seen.get("harness_install"):
        lines.append(f"[{spec.name}] context adapter suggests (not run; run it yourself if you want it): "
                     f"{seen['harness_install']}")
    return [shown(line) for line in lines]
def _money(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def _of_cap(value: Any, shown: Any) -> str:
    """``$1.50`` or, beside a cap (the run log's ``"1.5/5"``), ``$1.50 of $5.00``."""
    try:
        if isinstance(value, str) and "/" in value:
            spent, cap = value.split("/", 1)
            return f"{shown(float(spent))} of {shown(float(cap))}"
        return str(shown(float(value)))
    except (TypeError, ValueError):
        return str(value)


def verify_line(spec: LoopSpec, record: IterationRecord) -> str:
    """The iteration's checks, printed when they are done and before the revise step starts."""
    checks = "  ".join(f"{'PASS' if c.passed else 'FAIL'} {c.name} ({c.duration_s:.2f}s)" for c in record.checks)
    return shown(f"[{spec.name}] checks of iteration {record.iter}: {checks}  | revising...")


class ReviseView:
    """What a terminal shows of a running revise step, by ``revise_output``: ``status`` (a line
    rewritten in place on a terminal, else a heartbeat line at least every
    :data:`pytest_loops.core.live.HEARTBEAT_SECONDS`), ``stream`` (the output's lines as they
    come) or ``quiet``. ``line(text)`` prints a line; ``rewrite(text)`` rewrites the current
    one (a terminal; None: none)."""

    def __init__(self, mode: str, line: Any, rewrite: Any = None) -> None:
        self.mode = mode
        self.line = line
        self.rewrite = rewrite
        self.beats: dict[tuple[str, int], float] = {}  # (loop, iteration) -> elapsed at the last line

    def show(self, spec: LoopSpec, progress: Any) -> None:
        if self.mode == "quiet":
            return
        if self.mode == "stream":
            for text in progress.new_lines:
                self.line(shown(f"[{spec.name}] revise| {text}"))
            return
        from pytest_loops.core import live

        key = (spec.name, progress.iteration)
        if self.rewrite is not None:
            if progress.final:
                self.beats.pop(key, None)
                self.rewrite("")
            elif progress.elapsed_s - self.beats.get(key, -1.0) >= 1.0:
                self.beats[key] = progress.elapsed_s
                self.rewrite(shown(progress.status(spec.name)))
            return
        if progress.final:
            self.beats.pop(key, None)
        elif progress.elapsed_s - self.beats.get(key, 0.0) >= live.HEARTBEAT_SECONDS:
            self.beats[key] = progress.elapsed_s
            self.line(shown(progress.status(spec.name)))


def settings_line(spec: LoopSpec) -> str:
    """The settings one loop runs with (a marker or a loop file may set its own), one line."""
    g = spec.guards
    budget = f"{format(g.budget_seconds, '.15g')}s" if g.budget_seconds else "off"
    return shown(f"[{spec.name}] settings: max_iter={g.max_iter} budget={budget} "
                 f"no_progress_k={g.no_progress_k} no_progress_signal={spec.no_progress_signal} "
                 f"escalate_after={g.escalate_after} revise={spec.revise or '(none)'}")


def shown(text: str) -> str:
    """Text fit for a terminal or a report: secrets masked, escape sequences removed."""
    return strip_control(redact(text))


def format_iterations(records: Sequence[IterationRecord]) -> str:
    """The iteration table a human reads."""
    rows = [("iter", "checks", "verify", "state", "streak", "revise", "guard")]
    for r in records:
        checks = " ".join(("PASS" if c.passed else "FAIL") for c in r.checks) or "-"
        state = {True: "changed", False: "same", None: "-"}[r.state_changed]  # None: first or untracked
        rows.append((str(r.iter), checks, str(r.verify_exit), state, str(r.unchanged_streak),
                     "-" if r.revise_exit is None else str(r.revise_exit), r.guard or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def iteration_summary(record: IterationRecord) -> str:
    """One iteration as a JUnit property value."""
    checks = ", ".join(f"{'PASS' if c.passed else 'FAIL'} {c.name} ({c.reason})" for c in record.checks)
    state = {True: "state changed", False: "state unchanged", None: "state not compared"}[record.state_changed]
    revise = "" if record.revise_exit is None else f"; revise exit {record.revise_exit}"
    guard = f"; stop: {record.guard}" if record.guard else ""
    return f"{checks}; {record.duration_s:.2f}s; {state}{revise}{guard}"


def loop_properties(result: LoopResult) -> list[tuple[str, str]]:
    """Properties for JUnit XML and xdist: the verdict, and every iteration."""
    props = [
        (LOOP_PROPERTY, result.spec.name),
        ("verdict", result.verdict.value),
        ("exit_code", str(result.exit_code)),
        ("iterations", str(result.iterations_run)),
        ("reason", result.reason),
        ("elapsed_s", f"{result.elapsed_s:.2f}"),
        (SETTINGS_PROPERTY, settings_line(result.spec)),
    ]
    props += [(f"artifact_{key}", path) for key, path in result.artifacts.items() if key != "run_dir"]
    props += [(f"iteration_{r.iter}", iteration_summary(r)) for r in result.iterations]
    scrub = make_redactor()
    return [(name, strip_control(scrub(value))) for name, value in props]


def is_loop_report(props: dict[str, Any]) -> bool:
    return LOOP_PROPERTY in props and "verdict" in props


def last_failure_tail(result: LoopResult, lines: int = TAIL_LINES) -> str:
    for record in reversed(result.iterations):
        failed = [c for c in record.checks if not c.passed]
        if failed:
            text = "\n".join(f"--- {c.name}: {c.reason}\n{c.output_tail}" for c in failed)
            return "\n".join(text.rstrip().splitlines()[-lines:])
    return ""


def failure_text(result: LoopResult) -> str:
    """The report of a loop that did not reach SUCCESS: verdict, reason, table, tail."""
    parts = [
        f"loop {result.spec.name!r} ended {result.verdict.value} (exit {result.exit_code}) after "
        f"{result.iterations_run} iteration(s) in {result.elapsed_s:.1f}s",
        f"reason: {result.reason}",
        "",
        format_iterations(result.iterations),
    ]
    tail = last_failure_tail(result)
    if tail:
        parts += ["", "last failure (tail):", tail]
    artifacts = [f"  {'lessons' if key == 'memory' else key}: {path}"  # the run log's "memory" key
                 for key, path in result.artifacts.items() if key != "run_dir"]
    if artifacts:
        parts += ["", "artifacts:", *artifacts]
    return shown("\n".join(parts))


def summary_rows(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The `loops` terminal summary section: loop, verdict, iterations, time, reason, artifacts."""
    out = []
    for row in rows:
        out.append(f"{row.get('verdict', '?'):<11} {row.get(LOOP_PROPERTY, '?')}: "
                   f"{row.get('iterations', '?')} iteration(s), {row.get('elapsed_s', '?')}s: "
                   f"{row.get('reason', '')}")
        for key, value in row.items():
            if key.startswith("artifact_"):  # artifact_memory (the JUnit property) is the lessons page
                name = key[len("artifact_"):]
                out.append(f"    {'lessons' if name == 'memory' else name}: {value}")
    return [shown(line) for line in out]


def mask_report(report: Any) -> None:
    """Secret values out of a test or collect report: its failure text, captured
    output and properties (what the terminal, JUnit XML and xdist carry). A failure
    text that held a secret becomes plain text. A report carrying none of them (a
    passing test that printed nothing) is not looked at further."""
    longrepr = getattr(report, "longrepr", None)
    sections = getattr(report, "sections", None)
    props = getattr(report, "user_properties", None)
    if (longrepr is None and not sections and not props) or not anything_to_mask():
        return
    scrub = current_redactor()
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        report.longrepr = tuple(scrub(x) if isinstance(x, str) else x for x in longrepr)
    elif longrepr is not None:
        text = longrepr if isinstance(longrepr, str) else str(longrepr)
        clean = scrub(text)
        if clean != text:
            report.longrepr = clean
    sections = getattr(report, "sections", None)
    if sections:
        report.sections = [(scrub(title), scrub(content)) for title, content in sections]
    if props:
        report.user_properties = [(name, scrub(value) if isinstance(value, str) else value)
                                  for name, value in props]


class _MaskedStream:
    """The terminal's stream with secret values masked in whatever is written to it:
    test ids (a parametrize id can hold a value), headers, summaries."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        # a text shorter than the shortest value masked (a progress letter) holds no secret
        if len(text) >= MIN_SECRET_LENGTH and anything_to_mask():
            text = current_redactor()(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def mask_terminal(config: Any) -> None:
    """Everything pytest's terminal reporter writes goes through :class:`_MaskedStream`."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    tw = getattr(reporter, "_tw", None)
    stream = getattr(tw, "_file", None)
    if tw is not None and stream is not None and not isinstance(stream, _MaskedStream):
        tw._file = _MaskedStream(stream)


class ReportMasking:
    """Registered only under ``--loop``: every test and collect report is masked before
    anything else reads it (terminal, JUnit XML, xdist, the loop session), whatever
    wrote its secrets (the test, a loop). Done when the report is logged, ahead of every
    other reader: a plain call per report, not a wrapper around its making."""

    @hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: Any) -> None:
        mask_terminal(session.config)

    @hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        mask_report(report)

    @hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: Any) -> None:
        mask_report(report)

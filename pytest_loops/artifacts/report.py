"""One self-contained HTML report of many loop runs: `pytest-loops report DIR`.

No network and nothing external: inline CSS, inline SVG, no scripts, fonts or
images, and a Content-Security-Policy that forbids loading anything. Loop names
and outputs are untrusted; every piece of text is redacted and escaped.

A run that is not verified (its run log's MACs fail, it has none, or its `.tine`
disagrees with it) shows "unverified" next to its verdict, with why.
"""

from __future__ import annotations

import html
import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.provenance import pytest_loops_version, tail_text
from pytest_loops.artifacts.runlog import SCHEMA, assess, atomic_write_text, load_runlog, trust_note
from pytest_loops.errors import LoopUsageError
from pytest_loops.redact import make_redactor, strip_control

VERDICT_COLOURS = {
    "SUCCESS": "#1a7f37",
    "MAX_ITER": "#bc4c00",
    "TIMEOUT": "#8250df",
    "NO_PROGRESS": "#9a6700",
    "ESCALATE": "#cf222e",
    None: "#6e7781",
}
INCOMPLETE = "INCOMPLETE"  # a killed run: its log has no verdict
SOURCE_KEY = "_file"
"""``collect_runs`` records where each run log was found under this key."""

_PASS, _FAIL, _IDLE = "#2da44e", "#cf222e", "#8c959f"
_MAX_CHECK_ROWS = 12  # more checks are summed up in one row
_MAX_TAIL_LINES = 30
# Short labels that fit an iteration's column; the full name is in the tooltip.
_GUARD_LABELS = {"max_iter": "cap", "budget": "time", "no_progress": "stall",
                 "escalate": "esc", "human": "human", "revise": "rev"}


def collect_runs(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every pytest-loops run log (``*.json`` with our schema) under ``directory``,
    oldest first, each checked (MACs, its `.tine`). Other JSON files and unreadable
    logs are skipped."""
    root = Path(directory)
    if not root.is_dir():
        raise LoopUsageError("not a directory", location=str(root),
                             fix="pass the directory holding the run logs (e.g. .pytest-loops)")
    runs = []
    for path in sorted(root.rglob("*.json")):
        if not path.is_file() or not _may_be_runlog(path):
            continue
        try:
            run = load_runlog(path)
        except LoopUsageError:
            continue
        if not str(run.get("schema", "")).startswith(SCHEMA.split("/")[0] + "/"):
            continue
        run[SOURCE_KEY] = str(path)
        runs.append(assess(run))
    runs.sort(key=lambda r: (str(r.get("started_at") or ""), r[SOURCE_KEY]))
    return runs


def _may_be_runlog(path: Path) -> bool:
    # Read the ends only: a directory may hold big JSON files that are not ours.
    # The engine writes "schema" first; a writer that sorts keys puts it near the end.
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read()
    except OSError:
        return False
    marker = SCHEMA.split("/")[0].encode()
    return marker in head or marker in tail


def write_html_report(runs: Sequence[Mapping[str, Any]], out_path: str | os.PathLike, *,
                      title: str = "pytest-loops report") -> str:
    """Write the report of ``runs`` (run-log dicts) to ``out_path``; return the path.

    Links to each run's log, .tine and hand-off are relative to the report, so the
    directory can be moved or archived as a whole.
    """
    out = Path(out_path)
    page = _Page(out.resolve().parent, make_redactor())
    atomic_write_text(out, page.render(list(runs), title))
    return str(out)


class _Page:
    def __init__(self, base: Path, scrub: Any) -> None:
        self.base = base
        self.scrub = scrub

    def text(self, value: Any) -> str:
        """Untrusted text: secrets redacted, then escaped for HTML and attributes."""
        return html.escape(strip_control(self.scrub("" if value is None else str(value))), quote=True)

    def render(self, runs: list[Mapping[str, Any]], title: str) -> str:
        counts: dict[str, int] = {}
        for run in runs:
            label = _verdict(run) + (" (unverified)" if trust_note(dict(run)) else "")
            counts[label] = counts.get(label, 0) + 1
        tally = ", ".join(f"{n} {self.text(v)}" for v, n in sorted(counts.items())) or "no runs"
        generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        body = [
            f"<h1>{self.text(title)}</h1>",
            f'<p class="meta">{len(runs)} loop run{"s" if len(runs) != 1 else ""}: {tally}. '
            f"Generated {generated} by pytest-loops {self.text(pytest_loops_version())}.</p>",
            self.overview(runs),
            *(self.loop(i, run) for i, run in enumerate(runs, 1)),
        ]
        return _DOCUMENT.format(title=self.text(title), css=_CSS, body="\n".join(body))

    def overview(self, runs: list[Mapping[str, Any]]) -> str:
        if not runs:
            return '<section id="overview"><p>No loop runs were found.</p></section>'
        rows = []
        spent = [_spent(_iterations(run)) for run in runs]
        with_spent = any(spent)  # a column only when a revise step reported spending
        for i, run in enumerate(runs, 1):
            verdict = _verdict(run)
            cost = f'<td class="num spent">{self.text(spent[i - 1] or "-")}</td>' if with_spent else ""
            rows.append(
                f'<tr class="run" data-verdict="{self.text(verdict)}">'
                f'<td class="name"><a href="#loop-{i}">{self.text(_name(run))}</a></td>'
                f"<td>{self.badge(verdict)}{self.trust(run)}</td>"
                f'<td class="num">{len(_iterations(run))}</td>'
                f'<td class="num">{_duration(run.get("elapsed_s"))}</td>{cost}'
                f'<td class="reason">{self.text(run.get("reason") or "")}</td></tr>')
        spent_head = "<th>Spent</th>" if with_spent else ""
        return ('<section id="overview"><h2>Verdicts</h2><table class="overview">'
                f"<thead><tr><th>Loop</th><th>Verdict</th><th>Iterations</th><th>Time</th>{spent_head}"
                "<th>Reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")

    def trust(self, run: Mapping[str, Any]) -> str:
        """"unverified", with why, beside the verdict of a run not known to be authentic."""
        note = trust_note(dict(run))
        if not note:
            return ""
        return f' <span class="unverified" title="{self.text(note)}">unverified</span>'

    def badge(self, verdict: str) -> str:
        colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS[None])
        return f'<span class="verdict" style="background:{colour}">{self.text(verdict)}</span>'

    def loop(self, index: int, run: Mapping[str, Any]) -> str:
        verdict = _verdict(run)
        iterations = _iterations(run)
        parts = [
            f'<section class="loop" id="loop-{index}" data-verdict="{self.text(verdict)}">',
            f"<h2>{self.text(_name(run))} {self.badge(verdict)}{self.trust(run)}</h2>",
            '<dl class="facts">',
            f"<dt>Goal</dt><dd>{self.text(run.get('goal') or '(none given)')}</dd>",
            f'<dt>Reason</dt><dd class="reason">{self.text(run.get("reason") or "")}</dd>',
            f"<dt>Ran</dt><dd>{len(iterations)} iteration{'s' if len(iterations) != 1 else ''} "
            f"in {_duration(run.get('elapsed_s'))}, started {self.text(run.get('started_at') or '?')}"
            "</dd>",
        ]
        if run.get("source"):
            parts.append(f"<dt>Loop file</dt><dd>{self.text(run['source'])}</dd>")
        note = trust_note(dict(run))
        if note:
            parts.append(f'<dt>Trust</dt><dd class="unverified">{self.text(note)}</dd>')
        parts.append("</dl>")
        parts.append(self.timeline(iterations, _check_names(run, iterations)))
        parts.append(self.table(iterations))
        parts.append(self.branches(iterations))
        parts.append(self.failures(iterations))
        # Lesson lines from the lessons page are list items already: "- ...".
        lessons = [str(x).removeprefix("- ") for x in run.get("lessons") or [] if x]
        if lessons:
            opened = " open" if len(lessons) <= 8 else ""
            parts.append(f'<details class="lessons"{opened}><summary>Lessons ({len(lessons)})'
                         '</summary><ul class="lessons">'
                         + "".join(f"<li>{self.text(x)}</li>" for x in lessons) + "</ul></details>")
        parts.append(self.links(run))
        parts.append("</section>")
        return "\n".join(parts)

    # -- the SVG timeline ---------------------------------------------------

    def timeline(self, iterations: list[Mapping[str, Any]], names: list[str]) -> str:
        if not iterations:
            return '<p class="empty">No iteration finished.</p>'
        shown = names[:_MAX_CHECK_ROWS]
        col, label_w, top = 34, 92, 22
        check_h, bar_h, row_h = 16, 40, 18
        checks_y = top
        bar_y = checks_y + check_h * (len(shown) + (1 if len(names) > len(shown) else 0)) + 6
        state_y = bar_y + bar_h + 6
        guard_y = state_y + row_h
        width = label_w + col * len(iterations) + 8
        height = guard_y + row_h + 4
        longest = max((_number(it.get("duration_s")) for it in iterations), default=0.0) or 1.0
        out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" role="img" '
               f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
               f"<title>{len(iterations)} iterations: checks, duration, state, guard</title>"]
        for r, name in enumerate(shown):
            out.append(f'<text class="lbl" x="4" y="{checks_y + r * check_h + 12}">'
                       f"c{r + 1}<title>{self.text(name)}</title></text>")
        if len(names) > len(shown):
            out.append(f'<text class="lbl" x="4" y="{checks_y + len(shown) * check_h + 12}">'
                       f"+{len(names) - len(shown)} more</text>")
        for y, label in ((bar_y + bar_h - 4, "duration"), (state_y + 13, "state"),
                         (guard_y + 13, "guard")):
            out.append(f'<text class="lbl" x="4" y="{y}">{label}</text>')
        for n, it in enumerate(iterations):
            x = label_w + n * col
            number = self.text(it.get("iter", n + 1))
            out.append(f'<text class="num" x="{x + col / 2}" y="14" text-anchor="middle">{number}</text>')
            by_name = {str(c.get("name")): c for c in _checks(it)}
            for r, name in enumerate(shown):
                out.append(self.mark(x + col / 2, checks_y + r * check_h + 8, by_name.get(name),
                                     name, number))
            if len(names) > len(shown):
                rest = [by_name[m] for m in names[len(shown):] if m in by_name]
                failed = sum(1 for c in rest if not c.get("passed"))
                out.append(f'<text class="num" x="{x + col / 2}" '
                           f'y="{checks_y + len(shown) * check_h + 12}" text-anchor="middle" '
                           f'fill="{_FAIL if failed else _PASS}">{failed}✗</text>')
            seconds = _number(it.get("duration_s"))
            h = max(1.0, bar_h * seconds / longest)
            colour = _PASS if it.get("passed") else _FAIL
            out.append(f'<rect class="bar" x="{x + 8}" y="{bar_y + bar_h - h:.1f}" width="{col - 16}" '
                       f'height="{h:.1f}" fill="{colour}"><title>iteration {number}: '
                       f"{_duration(seconds)}</title></rect>")
            out.append(self.state(x + col / 2, state_y + 9, it.get("state_changed"),
                                  it.get("unchanged_streak"), number))
            guard = it.get("guard")
            if guard:
                out.append(f'<g class="guard"><rect x="{x + 3}" y="{guard_y + 1}" width="{col - 6}" '
                           f'height="{row_h - 2}" rx="3" fill="#24292f"/>'
                           f'<text x="{x + col / 2}" y="{guard_y + 13}" text-anchor="middle" '
                           f'fill="#fff">{self.text(_GUARD_LABELS.get(str(guard), str(guard)[:5]))}</text>'
                           f"<title>guard {self.text(guard)} stopped the loop in iteration {number}"
                           f"</title></g>")
        out.append("</svg>")
        out.append(_LEGEND)
        return "\n".join(out)

    def mark(self, cx: float, cy: float, check: Mapping[str, Any] | None, name: str, number: str) -> str:
        if check is None:
            return (f'<circle cx="{cx}" cy="{cy}" r="3" fill="{_IDLE}"><title>{self.text(name)}: '
                    f"not run in iteration {number}</title></circle>")
        passed = bool(check.get("passed"))
        word = "passed" if passed else "failed"
        tip = f"{self.text(name)}: {word} in iteration {number} (exit {self.text(check.get('exit_code'))})"
        if passed:
            return (f'<circle class="pass" cx="{cx}" cy="{cy}" r="6" fill="{_PASS}">'
                    f"<title>{tip}</title></circle>")
        return (f'<g class="fail"><rect x="{cx - 6}" y="{cy - 6}" width="12" height="12" rx="2" '
                f'fill="{_FAIL}"/><path d="M{cx - 3} {cy - 3}L{cx + 3} {cy + 3}M{cx + 3} {cy - 3}'
                f'L{cx - 3} {cy + 3}" stroke="#fff" stroke-width="1.6"/><title>{tip}</title></g>')

    def state(self, cx: float, cy: float, changed: Any, streak: Any, number: str) -> str:
        if changed is True:
            return (f'<circle class="changed" cx="{cx}" cy="{cy}" r="5" fill="#0969da">'
                    f"<title>iteration {number}: state changed</title></circle>")
        if changed is False:
            return (f'<circle class="same" cx="{cx}" cy="{cy}" r="5" fill="none" stroke="#0969da" '
                    f'stroke-width="1.5"><title>iteration {number}: state unchanged '
                    f"({self.text(streak)} in a row)</title></circle>")
        return (f'<line x1="{cx - 4}" y1="{cy}" x2="{cx + 4}" y2="{cy}" stroke="{_IDLE}">'
                f"<title>iteration {number}: state not compared</title></line>")

    # -- tables and lists ---------------------------------------------------

    def table(self, iterations: list[Mapping[str, Any]]) -> str:
        if not iterations:
            return ""
        rows = []
        with_spent = any(_spent([it]) for it in iterations)
        for it in iterations:
            checks = _checks(it)
            marks = " ".join(("✓" if c.get("passed") else "✗") for c in checks)
            changed = it.get("state_changed")
            state = ("changed" if changed else "same") if isinstance(changed, bool) else "-"
            rows.append(
                "<tr>" + "".join(f"<td>{self.text(v)}</td>" for v in (
                    it.get("iter", "?"), marks, _dash(it.get("verify_exit")),
                    _duration(it.get("duration_s")), state, _dash(it.get("unchanged_streak")),
                    _dash(it.get("revise_exit")), *([_spent([it]) or "-"] if with_spent else []),
                    it.get("guard") or "-")) + "</tr>")
        opened = " open" if len(iterations) <= 10 else ""
        spent_head = "<th>spent</th>" if with_spent else ""
        return (f"<details class=\"iterations\"{opened}><summary>Iterations</summary>"
                "<table><thead><tr><th>iter</th><th>checks</th><th>exit</th><th>duration</th>"
                f"<th>state</th><th>streak</th><th>revise</th>{spent_head}<th>guard</th></tr></thead><tbody>"
                + "".join(rows) + "</tbody></table></details>")

    def branches(self, iterations: list[Mapping[str, Any]]) -> str:
        """Fan-out: per iteration, each revise candidate as a node off the iteration,
        the chosen one filled, a discarded one struck through, and why."""
        rows = []
        for it in iterations:
            candidates = [b for b in it.get("branches") or [] if isinstance(b, Mapping)]
            if not candidates:
                continue
            chips = []
            for b in candidates:
                why = str(b.get("why") or "")
                kind = "chosen" if b.get("chosen") else "discarded" if why.startswith("discarded") else "other"
                mark = {"chosen": "●", "discarded": "✗", "other": "○"}[kind]
                chips.append(f'<li class="branch {kind}" title="{self.text(why)}">{mark} b{self.text(b.get("branch"))}'
                             f' · {self.text(b.get("passed"))}/{self.text(b.get("of"))} checks'
                             f' · {self.text(_dash(b.get("changed_files")))} file(s) changed'
                             f' · diff {self.text(b.get("diff_size"))} · revise exit '
                             f'{self.text(_dash(b.get("revise_exit")))}<br><small>{self.text(why)}</small></li>')
            rows.append(f'<div class="fanout"><span class="it">iteration {self.text(it.get("iter", "?"))}</span>'
                        f'<ul class="branches">{"".join(chips)}</ul></div>')
        if not rows:
            return ""
        return ('<details class="branches" open><summary>Branches (best-of-N revise)</summary>'
                + "".join(rows) + "</details>")

    def failures(self, iterations: list[Mapping[str, Any]]) -> str:
        if not iterations:
            return ""
        failed = [c for c in _checks(iterations[-1]) if not c.get("passed")]
        if not failed:
            return ""
        items = []
        for check in failed:
            tail = tail_text(str(check.get("output_tail") or ""), max_lines=_MAX_TAIL_LINES,
                             max_chars=4000, scrub=self.scrub)
            items.append(f"<h4>{self.text(check.get('name', '?'))} "
                         f"(exit {self.text(_dash(check.get('exit_code')))})</h4>"
                         f"<pre>{self.text(tail) or '(no output)'}</pre>")
        return (f"<details class=\"failures\"><summary>Failing checks in iteration "
                f"{self.text(iterations[-1].get('iter', '?'))}</summary>" + "".join(items) + "</details>")

    def links(self, run: Mapping[str, Any]) -> str:
        artifacts = dict(run.get("artifacts") or {})
        if run.get(SOURCE_KEY):
            artifacts["log"] = run[SOURCE_KEY]
        labels = {"log": "run log", "tine": "provenance (.tine)", "handoff": "hand-off",
                  "memory": "lessons page", "run_dir": "run directory"}
        items = []
        for key in ("log", "tine", "handoff", "memory", "run_dir",
                    *sorted(k for k in artifacts if k not in labels)):
            target = artifacts.get(key)
            if not target or not isinstance(target, str):
                continue
            href = self.href(target, run)
            items.append(f'<li><a href="{self.text(href)}">{self.text(labels.get(key, key))}</a> '
                         f"<code>{self.text(href)}</code></li>")
        if not items:
            return ""
        return '<h3>Artifacts</h3><ul class="links">' + "".join(items) + "</ul>"

    def href(self, target: str, run: Mapping[str, Any]) -> str:
        """A relative link to a local file, which never reads as a URL scheme."""
        path = Path(target)
        if not path.is_absolute():
            candidates = [Path(str(run.get("cwd") or ".")) / path]
            if run.get(SOURCE_KEY):
                candidates.insert(0, Path(run[SOURCE_KEY]).parent / path)
            path = next((c for c in candidates if c.exists()), candidates[-1])
        relative = os.path.relpath(path.resolve(), self.base)
        link = urllib.parse.quote(Path(relative).as_posix(), safe="/._-~")
        return link if link.startswith("../") else "./" + link


def _verdict(run: Mapping[str, Any]) -> str:
    verdict = run.get("verdict")
    return str(verdict) if verdict else INCOMPLETE


def _name(run: Mapping[str, Any]) -> str:
    return str(run.get("loop") or (run.get("spec") or {}).get("name") or "(unnamed loop)")


def _iterations(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [it for it in run.get("iterations") or [] if isinstance(it, Mapping)]


def _checks(iteration: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in iteration.get("checks") or [] if isinstance(c, Mapping)]


def _check_names(run: Mapping[str, Any], iterations: list[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    spec_checks = (run.get("spec") or {}).get("checks") or []
    for check in [*spec_checks, *(c for it in iterations for c in _checks(it))]:
        if isinstance(check, Mapping) and str(check.get("name")) not in names:
            names.append(str(check.get("name")))
    return names


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0.0
    return max(0.0, min(float(value), 1e9))


def _duration(value: Any) -> str:
    seconds = _number(value)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m {rest:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


_LEGEND = (
    '<p class="legend"><span style="color:#2da44e">●</span> check passed '
    '<span style="color:#cf222e">■</span> check failed · bar: iteration time '
    '(green when every check passed) · <span style="color:#0969da">●</span> state changed '
    '<span style="color:#0969da">○</span> unchanged · dark label: the guard that stopped the loop</p>'
)

_DOCUMENT = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="pytest-loops">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{body}
</body>
</html>
"""

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;
margin:0 auto;max-width:1100px;padding:16px 24px;background:#fff}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:0 0 8px}h3{font-size:15px;margin:14px 0 6px}
h4{font-size:13px;margin:10px 0 4px}
.meta{color:#59636e}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #d1d9e0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num{text-align:right;white-space:nowrap}
td.reason,dd.reason{overflow-wrap:anywhere}
.unverified{color:#cf222e;font-weight:600;font-size:12px}
.verdict{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;
font-weight:600;letter-spacing:.02em;vertical-align:middle}
section.loop{border:1px solid #d1d9e0;border-radius:8px;padding:12px 16px;margin:18px 0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0 0 10px}
dt{color:#59636e}dd{margin:0;overflow-wrap:anywhere}
svg.timeline{display:block;max-width:100%;height:auto;margin:6px 0 10px}
svg .lbl{font-size:11px;fill:#59636e}svg .num{font-size:10px;fill:#59636e}
svg .guard text{font-size:9px;font-weight:600}
pre{background:#f6f8fa;border-radius:6px;padding:8px;overflow:auto;max-height:24em;font-size:12px}
details{margin:6px 0}summary{cursor:pointer;color:#0969da}
code{font-size:12px;color:#59636e}
.legend{font-size:12px;color:#59636e;margin:0 0 8px}
ul.lessons li{font-family:ui-monospace,monospace;font-size:12px}
div.fanout{display:flex;gap:10px;align-items:flex-start;margin:4px 0}
div.fanout .it{white-space:nowrap;color:#59636e;padding-top:4px}
ul.branches{list-style:none;margin:0;padding:0 0 0 12px;border-left:2px solid #d1d9e0;
display:flex;flex-wrap:wrap;gap:6px}
li.branch{border:1px solid #d1d9e0;border-radius:6px;padding:2px 8px;font-size:12px}
li.branch.chosen{border-color:#1a7f37;background:#dafbe1}
li.branch.discarded{color:#59636e;text-decoration:line-through}
li.branch small{text-decoration:none;display:inline-block}
"""


def _spent(iterations: list[Mapping[str, Any]]) -> str:
    """What these iterations' revise steps reported spending (``$1.50, 2,400 tokens``), "" if nothing."""
    from pytest_loops.core.usage import describe, of_record, total

    return describe(total(of_record(it) for it in iterations))

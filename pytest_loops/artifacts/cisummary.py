"""CI in its own words: a GitHub job summary and workflow-command annotations.

Both are built from run logs (dicts from ``load_runlog``), so a ``--loop`` session
and ``pytest-loops merge`` write the same shape. Nothing here talks to a service:
the summary is appended to the file ``GITHUB_STEP_SUMMARY`` names, and an
annotation is one ``::error file=...,line=...::message`` line on stdout, which the
runner turns into a note on that line of the pull request.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_loops.redact import make_redactor, strip_control

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
ACTIONS_ENV = "GITHUB_ACTIONS"
WORKSPACE_ENV = "GITHUB_WORKSPACE"
MAX_ANNOTATIONS = 50  # GitHub shows only so many per step; the rest would be noise
MAX_SUSPECTS = 3  # top suspects annotated per loop
MAX_TESTS = 10  # failing tests annotated per check


def _cell(value: Any) -> str:
    text = " ".join(strip_control(make_redactor()(str(value))).split())
    return text.replace("|", "\\|").replace("`", "'")


def _seconds(value: Any) -> str:
    return f"{float(value):.1f}s" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _cost(run: Mapping[str, Any]) -> str | None:
    cost = run.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        return f"${cost:.2f}"
    return None


def summary_markdown(runs: Sequence[Mapping[str, Any]], *, title: str = "pytest-loops",
                     artifacts: Sequence[str] = (), note: str = "") -> str:
    """The Markdown of a job summary: one row per loop (verdict, iterations, time, cost
    when a run log records one), then the artifacts' paths (plain text, no links)."""
    verdicts: dict[str, int] = {}
    for run in runs:
        key = str(run.get("verdict") or "INCOMPLETE")
        verdicts[key] = verdicts.get(key, 0) + 1
    counts = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no loops"
    show_cost = any(_cost(run) for run in runs)
    lines = [f"### {_cell(title)}", "", f"{len(runs)} loop(s): {counts}" + (f" ({_cell(note)})" if note else ""), ""]
    if runs:
        head = ["loop", "verdict", "iterations", "time"] + (["cost"] if show_cost else []) + ["run log"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run in runs:
            verdict = str(run.get("verdict") or "INCOMPLETE")
            if run.get("verified") is False:
                verdict += " (unverified)"
            shard = run.get("shard")
            name = _cell(run.get("loop") or (run.get("spec") or {}).get("name") or "?")
            cells = [name + (f" (shard {_cell(shard)})" if shard else ""), verdict,
                     str(run.get("iterations_run", "-")), _seconds(run.get("elapsed_s"))]
            if show_cost:
                cells.append(_cost(run) or "-")
            log = run.get("log_path") or run.get("_file") or ""
            cells.append(f"`{_cell(log)}`" if log else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if artifacts:
        lines += ["Artifacts:", ""] + [f"- `{_cell(path)}`" for path in artifacts] + [""]
    return "\n".join(lines) + "\n"


def append_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append to the file ``GITHUB_STEP_SUMMARY`` names (None when it is not set).

    Under a file lock: xdist workers and several steps may write one job's summary."""
    environ = os.environ if environ is None else environ
    target = environ.get(SUMMARY_ENV)
    if not target:
        return None
    path = Path(target)
    from filelock import FileLock  # only when there is a summary to write

    with FileLock(str(path) + ".lock"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown)
    return path


# -- annotations ------------------------------------------------------------------------------

def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, message: str, *, file: str | None = None, line: int | None = None,
               title: str | None = None) -> str:
    """One workflow command: ``::error file=F,line=L,title=T::message`` (escaped)."""
    props = []
    if file:
        props.append(f"file={_prop(file)}")
        if line:
            props.append(f"line={line}")
    if title:
        props.append(f"title={_prop(title)}")
    scrub = make_redactor()
    message = strip_control(scrub(message).replace("\n", " "))
    return f"::{level} {','.join(props)}::{_data(message)}" if props else f"::{level}::{_data(message)}"


def _relative(path: str, root: Path) -> str:
    candidate = Path(path)
    if candidate.is_absolute():
        try:
            return candidate.resolve().relative_to(root.resolve()).as_posix()
        except (OSError, ValueError):
            return candidate.as_posix()
    return candidate.as_posix()


def _file_line(source: Any, root: Path) -> tuple[str | None, int | None]:
    """``path:line`` (a check's source) as (path relative to root, line)."""
    if not isinstance(source, str) or not source:
        return None, None
    path, sep, tail = source.rpartition(":")
    if sep and tail.isdigit():
        return _relative(path, root), int(tail)
    return _relative(source, root), None


def _suspects(path: Any) -> list[Mapping[str, Any]]:
    if not isinstance(path, str) or not path:
        return []
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    found: list[Mapping[str, Any]] = [s for s in data if isinstance(s, dict)]
    return found[:MAX_SUSPECTS]


def annotation_lines(runs: Sequence[Mapping[str, Any]], root: str | os.PathLike) -> list[str]:
    """Annotations for the loops that did not succeed: an error on each failing check
    (on its loop-file line, and on each failing test's file) and a warning on each of
    the latest ranking's top suspect lines."""
    base = Path(root)
    found: list[str] = []
    for run in runs:
        verdict = run.get("verdict")
        if verdict == "SUCCESS":
            continue
        given = run.get("spec")
        spec: Mapping[str, Any] = given if isinstance(given, dict) else {}
        name = str(run.get("loop") or spec.get("name") or "?")
        sources = {c.get("name"): c.get("source") for c in spec.get("checks", []) if isinstance(c, dict)}
        iterations = [i for i in run.get("iterations") or [] if isinstance(i, dict)]
        last = iterations[-1] if iterations else {}
        title = f"loop {name}: {verdict or 'INCOMPLETE'}"
        for check in last.get("checks") or []:
            if not isinstance(check, dict) or check.get("passed"):
                continue
            message = f"check {check.get('name')!s} failed: {check.get('reason') or 'failed'}"
            file, line = _file_line(sources.get(check.get("name")), base)
            found.append(annotation("error", message, file=file, line=line, title=title))
            for nodeid in list(check.get("failing_tests") or [])[:MAX_TESTS]:
                test_file = str(nodeid).split("::", 1)[0]
                found.append(annotation("error", f"{nodeid} still fails ({message})", file=test_file, title=title))
        ranked = next((i.get("suspects_file") for i in reversed(iterations) if i.get("suspects_file")), None)
        for suspect in _suspects(ranked):  # the latest ranking (localization runs when a test fails anew)
            file = suspect.get("file")
            line = suspect.get("line") if isinstance(suspect.get("line"), int) else None
            score = suspect.get("score")
            shown = f" (score {score:.2f})" if isinstance(score, (int, float)) else ""
            found.append(annotation("warning", f"suspect line for loop {name}{shown}: {suspect.get('source', '')}",
                                    file=_relative(str(file), base) if file else None, line=line,
                                    title=f"loop {name}: suspect"))
    return found[:MAX_ANNOTATIONS]


def annotations_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Annotations mean something to GitHub's runner only."""
    environ = os.environ if environ is None else environ
    return environ.get(ACTIONS_ENV) == "true"

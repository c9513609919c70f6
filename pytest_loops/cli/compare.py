"""Two runs of a loop side by side: `pytest-loops compare A B`.

Where `diff` names what differs, `compare` lays both trajectories out iteration by
iteration: each side's check results, the first iteration where they diverge,
where each first reached its best (most checks passing) and how each ended. The
same data is the ``--json`` output and the MCP server's ``compare_runs`` answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_loops.artifacts.runlog import spec_differences
from pytest_loops.cli.runview import (
    FAIL,
    HUMAN,
    NOT_RUN,
    PASS,
    branch_line,
    branch_summary,
    branches_of,
    cell,
    check_names,
    checks_of,
    iterations_of,
)

SCHEMA = "pytest-loops.compare/1"
PASSED, FAILED, TIMED_OUT, NEEDS_HUMAN, NOT_RUN_WORD = "passed", "failed", "timed_out", "needs_human", "not_run"
_MARKS = {PASSED: PASS, FAILED: FAIL, TIMED_OUT: FAIL + "t", NEEDS_HUMAN: HUMAN, NOT_RUN_WORD: NOT_RUN}


def check_status(check: Mapping[str, Any] | None) -> str:
    """One word for a check's result in one iteration."""
    if check is None:
        return NOT_RUN_WORD
    if check.get("passed"):
        return PASSED
    if check.get("timed_out"):
        return TIMED_OUT
    return NEEDS_HUMAN if check.get("needs_human") else FAILED


def _statuses(iteration: Mapping[str, Any], names: Sequence[str]) -> dict[str, str]:
    by_name = {str(c.get("name")): c for c in checks_of(iteration)}
    return {name: check_status(by_name.get(name)) for name in names}


def _best(rows: Sequence[dict[str, str]], numbers: Sequence[Any], total: int) -> dict[str, Any] | None:
    """The first iteration with the most checks passing."""
    best: dict[str, Any] | None = None
    for row, number in zip(rows, numbers, strict=True):
        passed = sum(1 for status in row.values() if status == PASSED)
        if best is None or passed > best["passed"]:
            best = {"iteration": number, "passed": passed, "of": total}
    return best


def _side(run: Mapping[str, Any], names: Sequence[str]) -> tuple[dict[str, Any], list[dict[str, str]], list[Any]]:
    iterations = iterations_of(run)
    own = check_names(run, iterations)  # this loop's checks: its denominator, not the union's
    rows = [_statuses(it, names) for it in iterations]
    numbers = [it.get("iter", index + 1) for index, it in enumerate(iterations)]
    summary = {
        "checks": own,
        "source": None,  # the caller's label for the run (its file)
        "loop": run.get("loop"),
        "verdict": run.get("verdict"),
        "exit_code": run.get("exit_code"),
        "reason": run.get("reason") or "",
        "iterations": len(iterations),
        "verified": bool(run.get("verified")),
        "unverified_why": None if run.get("verified") else run.get("unverified_why"),
        "spec_digest": run.get("spec_digest"),
        "best": _best(rows, numbers, len(own)),
        "branches": {str(n): [branch_summary(b) for b in branches_of(it)]
                     for n, it in zip(numbers, iterations, strict=True) if branches_of(it)},
    }
    return summary, rows, numbers


def compare_runs(a: Mapping[str, Any], b: Mapping[str, Any], *,
                 labels: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    """Both runs' trajectories and how they relate, as plain JSON data.

    ``first_divergence`` is the first iteration whose check results differ (or
    that only one side reached), None when the trajectories agree throughout.
    Durations, timestamps and output are ignored: two runs of one loop compare
    equal when their checks went the same way."""
    names = check_names(a, iterations_of(a))
    for name in check_names(b, iterations_of(b)):
        if name not in names:
            names.append(name)
    side_a, rows_a, numbers_a = _side(a, names)
    side_b, rows_b, numbers_b = _side(b, names)
    for side, label in zip((side_a, side_b), labels, strict=True):
        if label is not None:
            side["source"] = label
    iterations = []
    divergence: dict[str, Any] | None = None
    for index in range(max(len(rows_a), len(rows_b))):
        row_a = rows_a[index] if index < len(rows_a) else None
        row_b = rows_b[index] if index < len(rows_b) else None
        number = numbers_a[index] if index < len(numbers_a) else numbers_b[index]
        iterations.append({"iteration": number, "a": row_a, "b": row_b})
        if divergence is None and row_a != row_b:
            divergence = {"iteration": number, "differences": _differences(row_a, row_b)}
    return {
        "schema": SCHEMA,
        "checks": names,
        "a": side_a,
        "b": side_b,
        "same_loop": bool(side_a["spec_digest"]) and side_a["spec_digest"] == side_b["spec_digest"],
        "spec_differences": _spec_differences(a, b),
        "iterations": iterations,
        "first_divergence": divergence,
    }


def _spec_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The loop spec fields the two runs differ in (revise, guards, checks, ...), when
    both logs carry their spec; a `.tine` read on its own carries none."""
    spec_a, spec_b = a.get("spec"), b.get("spec")
    if not isinstance(spec_a, dict) or not isinstance(spec_b, dict):
        return []
    return spec_differences(spec_a, spec_b, fields=sorted({*spec_a, *spec_b} - {"cwd", "source", "origin"}))


def _differences(row_a: dict[str, str] | None, row_b: dict[str, str] | None) -> list[str]:
    if row_a is None:
        return ["only B ran this iteration"]
    if row_b is None:
        return ["only A ran this iteration"]
    return [f"{name}: {row_a[name]} in A, {row_b[name]} in B" for name in row_a if row_a[name] != row_b[name]]


def format_compare(data: Mapping[str, Any]) -> str:
    """The comparison as a table a human reads."""
    names = data["checks"]
    lines = [f"A: {_describe(data['a'])}", f"B: {_describe(data['b'])}"]
    if data["spec_differences"]:
        lines.append("note: the loops differ in " + ", ".join(data["spec_differences"]))
    elif not data["same_loop"]:
        lines.append("note: the runs may be of different loops (their spec digests differ or are missing)")
    for index, name in enumerate(names, 1):
        lines.append(f"  c{index} = {cell(name)}")
    lines.append("")
    first = (data["first_divergence"] or {}).get("iteration")
    rows = [["iter", "A", "B"]]
    notes = [""]
    own_a, own_b = data["a"].get("checks", names), data["b"].get("checks", names)
    for entry in data["iterations"]:
        rows.append([str(entry["iteration"]), _marks(entry["a"], names, own_a), _marks(entry["b"], names, own_b)])
        notes.append("  <- first divergence" if data["first_divergence"] and entry["iteration"] == first else "")
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for index, (row, note) in enumerate(zip(rows, notes, strict=True)):
        cells = [c.rjust(w) if i == 0 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append((" | ".join(cells) + note).rstrip())
        if index:  # the candidates of a fan-out iteration, under its row
            for label in ("a", "b"):
                for branch in (data[label].get("branches") or {}).get(row[0], []):
                    lines.append(f"{'':>{widths[0]}}   {label.upper()} {branch_line(branch)}")
    if not data["iterations"]:
        lines.append("(neither run finished an iteration)")
    lines.append("")
    divergence = data["first_divergence"]
    if divergence is None:
        lines.append("the trajectories agree in every iteration")
    else:
        lines.append(f"first divergence: iteration {divergence['iteration']}: "
                     + "; ".join(cell(d) for d in divergence["differences"]))
    for label in ("a", "b"):
        best = data[label]["best"]
        where = (f"{best['passed']}/{best['of']} checks first at iteration {best['iteration']}"
                 if best else "no iteration")
        lines.append(f"best {label.upper()}: {where}")
    for label in ("a", "b"):
        side = data[label]
        verdict = side["verdict"] or "none (the run did not finish)"
        code = f" (exit {side['exit_code']})" if side["exit_code"] is not None else ""
        reason = f": {cell(side['reason'])}" if side["reason"] else ""
        lines.append(f"ended {label.upper()}: {cell(verdict)}{code} after {side['iterations']} iteration(s){reason}")
    return "\n".join(lines) + "\n"


def _marks(row: dict[str, str] | None, names: Sequence[str], own: Sequence[str]) -> str:
    """A side's marks for every check of either loop (· for one its loop lacks), and how
    many of its own loop's checks passed, over its own count."""
    if row is None:
        return "-"
    passed = sum(1 for name in own if row.get(name) == PASSED)
    return " ".join(_MARKS[row[name]] for name in names) + f" ({passed}/{len(own)})"


def _describe(side: Mapping[str, Any]) -> str:
    trust = "" if side["verified"] else " (unverified)"
    source = f" [{cell(side['source'])}]" if side.get("source") else ""
    return (f"{cell(side['loop'] or '?')}, verdict {cell(side['verdict'])}{trust}, "
            f"{side['iterations']} iteration(s){source}")

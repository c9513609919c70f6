"""Reading finished runs: the logic behind `pytest-loops show | diff | verify`.

A run is the run log's dict shape (``artifacts/runlog.py``), read from a run log
or from a `.tine` file. Nothing here imports opentine until a `.tine` is read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.runlog import assess, check_shape, load_runlog, trust_note
from pytest_loops.artifacts.tineread import load_tine_summary, looks_like_tine, verify_tine
from pytest_loops.core.usage import Usage, money, of_record, total
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import open_regular
from pytest_loops.redact import strip_control

PASS, FAIL, HUMAN, NOT_RUN = "✓", "✗", "?", "·"
_TAIL_LINES = 5


def load_run(path: str | os.PathLike) -> dict[str, Any]:
    """A run log or `.tine` file (told apart by suffix and content) as a run dict.

    A directory holding exactly one run log is read as that log. Anything else
    raises LoopUsageError with one line naming the file and what is wrong.

    ``verified`` says whether the run can be trusted: a run log whose MACs hold
    and whose `.tine` agrees with it, or a `.tine` read on its own that is intact
    and vouched by this machine's key (its integrity digest alone is no proof
    against a forger; a signature is checked by `pytest-loops verify` with a key).
    """
    p = Path(path)
    if not p.exists():
        raise LoopUsageError("no such file", location=str(p),
                             fix="pass a run log (.json) or a .tine file")
    if p.is_dir():
        return assess(load_runlog(_only_log_in(p)))
    try:  # a named pipe or a device is refused here, before anything reads (or waits on) it
        open_regular(p, "a run log or .tine file").close()
    except OSError as exc:
        raise LoopUsageError(f"cannot read: {exc.strerror or exc}", location=str(p)) from None
    if looks_like_tine(p):
        try:
            run = load_tine_summary(p)
        except ValueError as exc:
            raise LoopUsageError(str(exc), location=str(p)) from None
        check_shape(run, p)
        run["verified"] = bool(run.get("integrity_ok") and run.get("authenticated"))
        if not run.get("integrity_ok"):
            run["unverified_why"] = "its .tine integrity check failed"
        elif not run["verified"]:
            run["unverified_why"] = f"its .tine is not authenticated: {run.get('authenticated_why')}"
        return run
    return assess(load_runlog(p))


def _only_log_in(directory: Path) -> Path:
    """The one run log in ``directory``; an artifacts directory (``.pytest-loops``) is read
    through its ``runs/``. Several logs are refused, naming the newest as the fix."""
    if not list(directory.glob("*.json")) and (directory / "runs").is_dir():
        directory = directory / "runs"
    logs = []
    for candidate in sorted(directory.glob("*.json")):
        try:
            load_runlog(candidate)
        except LoopUsageError:
            continue
        logs.append(candidate)
    if len(logs) == 1:
        return logs[0]
    if not logs:
        raise LoopUsageError("no run log in this directory", location=str(directory),
                             fix="pass a run log (.json) or a .tine file")
    newest = max(logs, key=lambda log: (log.stat().st_mtime_ns, log.name))
    raise LoopUsageError(f"{len(logs)} run logs in this directory", location=str(directory),
                         fix=f"pass one of them; the newest is {newest}")


# --------------------------------------------------------------------------- show


def format_run(run: Mapping[str, Any]) -> str:
    """The iteration table a human reads, then the verdict and the reason."""
    iterations = iterations_of(run)
    names = check_names(run, iterations)
    lines = [f"loop {cell(run.get('loop') or '?')!s}" + (f": {cell(run['goal'])}" if run.get("goal") else "")]
    facts = [f"started {run['started_at']}" if run.get("started_at") else None,
             f"{len(iterations)} iteration{'s' if len(iterations) != 1 else ''}",
             _seconds(run.get("elapsed_s")) if run.get("elapsed_s") is not None else None,
             f"spec {str(run['spec_digest'])[:19]}" if run.get("spec_digest") else None]
    lines.append(" · ".join(f for f in facts if f))
    for index, name in enumerate(names, 1):
        lines.append(f"  c{index} = {cell(name)}")
    lines.append("")
    header = ["iter", *(f"c{i}" for i in range(1, len(names) + 1)),
              "exit", "duration", "state", "streak", "revise", "guard"]
    rows = [header] + [_row(it, names) for it in iterations]
    if any(_spent(it) != "-" for it in iterations):  # a column only when a revise step reported spending
        rows = [[*row[:-1], _spent(it) if it is not None else "cost/tokens", row[-1]]
                for row, it in zip(rows, [None, *iterations], strict=True)]
    lines.extend(_table(rows))
    if not iterations:
        lines.append("(no iteration finished)")
    lines.extend(format_branches(iterations))
    lines.append("")
    lines.append(_verdict_line(run))
    spent = _spent_total(iterations)
    if spent:
        lines.append(f"spent: {spent}")
    lines.extend(_last_failures(iterations))
    lessons = [str(x) for x in run.get("lessons") or []]
    if lessons:
        lines.append("lessons:")
        lines.extend(f"  {cell(x)}" for x in lessons)
    return "\n".join(lines) + "\n"


# -- fan-out: each iteration's revise candidates --------------------------------------------

BRANCH_MARKS = {"chosen": "●", "discarded": "✗", "not chosen": "○"}


def branches_of(iteration: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An iteration's revise candidates (fan-out), as the run log and the `.tine` hold them."""
    return [b for b in iteration.get("branches") or [] if isinstance(b, Mapping)]


def branch_summary(branch: Mapping[str, Any]) -> dict[str, Any]:
    """One candidate in plain data: which branch, what it changed, how its checks went,
    and whether it was chosen, discarded (it broke a rule) or not chosen, and why."""
    if "outcome" in branch:  # already one
        return dict(branch)
    why = str(branch.get("why") or "")
    outcome = "chosen" if branch.get("chosen") else "discarded" if why.startswith("discarded") else "not chosen"
    return {"branch": branch.get("branch"), "outcome": outcome, "passed": branch.get("passed"),
            "of": branch.get("of"), "changed_files": branch.get("changed_files"),
            "diff_size": branch.get("diff_size"), "revise_exit": branch.get("revise_exit"), "why": why}


def branch_line(branch: Mapping[str, Any]) -> str:
    """One candidate as a line: ``● b1  1/1 checks · 1 file(s) changed, diff 12 · revise exit 0 · why``."""
    b = branch_summary(branch)
    return (f"{BRANCH_MARKS[b['outcome']]} b{cell(_dash(b['branch']))}  {cell(_dash(b['passed']))}/"
            f"{cell(_dash(b['of']))} checks · {cell(_dash(b['changed_files']))} file(s) changed, diff "
            f"{cell(_dash(b['diff_size']))} · revise exit {cell(_dash(b['revise_exit']))} · {b['outcome']}"
            + (f": {cell(b['why'])}" if b["why"] and b["outcome"] != "discarded" else
               f" ({cell(b['why'][len('discarded'):].lstrip(': '))})" if b["why"] else ""))


def format_branches(iterations: Sequence[Mapping[str, Any]], indent: str = "") -> list[str]:
    """The candidates of every fan-out iteration, one line each; nothing without fan-out."""
    lines: list[str] = []
    for index, it in enumerate(iterations):
        candidates = branches_of(it)
        if not candidates:
            continue
        if not lines:
            lines += ["", f"{indent}branches (best-of-N revise: ● chosen, ○ not chosen, ✗ discarded):"]
        lines.append(f"{indent}  iteration {cell(it.get('iter', index + 1))}:")
        lines.extend(f"{indent}    {branch_line(b)}" for b in candidates)
    return lines
def _spent(iteration: Mapping[str, Any]) -> str:
    """One iteration's reported cost and tokens: ``$0.5000 190t``, or ``-``."""
    return describe_spent(of_record(iteration), short=True) or "-"


def _spent_total(iterations: Sequence[Mapping[str, Any]]) -> str:
    """The loop's spend, summed over its iterations."""
    return describe_spent(total(of_record(it) for it in iterations))


def describe_spent(usage: Usage, short: bool = False) -> str:
    parts = []
    if usage.cost_usd is not None:
        parts.append(money(usage.cost_usd))
    if usage.tokens is not None:
        parts.append(f"{usage.tokens:,}t" if short else f"{usage.tokens:,} tokens "
                     f"({usage.input_tokens or 0:,} in, {usage.output_tokens or 0:,} out)")
    return " ".join(parts) if short else ", ".join(parts)


def iterations_of(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = run.get("iterations") or []
    return [it for it in items if isinstance(it, Mapping)]


def checks_of(iteration: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in iteration.get("checks") or [] if isinstance(c, Mapping)]


def check_names(run: Mapping[str, Any], iterations: Sequence[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    spec_checks = (run.get("spec") or {}).get("checks") or []
    for check in [*spec_checks, *(c for it in iterations for c in checks_of(it))]:
        name = str(check.get("name", "?")) if isinstance(check, Mapping) else "?"
        if name not in names:
            names.append(name)
    return names


def _mark(check: Mapping[str, Any] | None) -> str:
    if check is None:
        return NOT_RUN
    if check.get("passed"):
        return PASS
    return HUMAN if check.get("needs_human") else FAIL


def _row(iteration: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    by_name = {str(c.get("name")): c for c in checks_of(iteration)}
    return [
        str(iteration.get("iter", "?")),
        *(_mark(by_name.get(name)) for name in names),
        _dash(iteration.get("verify_exit")),
        _seconds(iteration.get("duration_s")),
        _state(iteration.get("state_changed")),
        _dash(iteration.get("unchanged_streak")),
        _dash(iteration.get("revise_exit")),
        cell(iteration.get("guard") or "-"),
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [" | ".join(cell.rjust(w) if i == 0 else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def _verdict_line(run: Mapping[str, Any]) -> str:
    verdict = run.get("verdict")
    reason = cell(run.get("reason") or "")
    note = trust_note(dict(run))
    trust = f" [{cell(note)}]" if note else ""
    if verdict is None:
        return f"verdict: none{trust}, the run did not finish ({reason or 'killed or interrupted'})"
    code = run.get("exit_code")
    return f"verdict: {cell(verdict)}{trust}" + (f" (exit {code})" if code is not None else "") + (
        f": {reason}" if reason else "")


def _last_failures(iterations: Sequence[Mapping[str, Any]]) -> list[str]:
    if not iterations:
        return []
    lines = []
    for check in checks_of(iterations[-1]):
        if check.get("passed"):
            continue
        lines.append(f"failed in iteration {iterations[-1].get('iter', '?')}: {cell(check.get('name', '?'))}"
                     + (f" ({cell(check['reason'])})" if check.get("reason") else ""))
        tail = str(check.get("output_tail") or "").rstrip("\n").split("\n")[-_TAIL_LINES:]
        lines.extend(f"    {cell(line)}" for line in tail if line.strip())
    return lines


def cell(value: Any) -> str:
    """Untrusted text, safe to print: no terminal escapes, one line."""
    return strip_control(str(value)).replace("\n", " ").strip()


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _seconds(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.1f}s"


def _state(changed: Any) -> str:
    return {True: "changed", False: "same"}.get(changed, "-") if isinstance(changed, bool) else "-"


# --------------------------------------------------------------------------- diff


def diff_runs(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """How two runs differ at loop level: verdicts, iteration counts, and the first
    iteration where they diverge (check results, state, revise outcome, guard).
    Durations and timestamps are ignored."""
    its_a, its_b = iterations_of(a), iterations_of(b)
    lines = [f"A: {_describe(a)}", f"B: {_describe(b)}"]
    differences = []
    if a.get("verdict") != b.get("verdict"):
        differences.append(f"verdict: {a.get('verdict')} -> {b.get('verdict')}")
    if len(its_a) != len(its_b):
        differences.append(f"iterations: {len(its_a)} -> {len(its_b)}")
    if a.get("spec_digest") and b.get("spec_digest") and a["spec_digest"] != b["spec_digest"]:
        differences.append("spec: the loops differ (spec digests are not equal)")
    if cell(a.get("reason") or "") != cell(b.get("reason") or ""):
        differences.append(f"reason: {cell(a.get('reason') or '')!r} -> {cell(b.get('reason') or '')!r}")
    first = _first_divergence(its_a, its_b)
    if first:
        differences.append(first)
    if not differences:
        lines.append("runs are identical at loop level")
    else:
        lines.extend(differences)
    return "\n".join(lines) + "\n"


def _describe(run: Mapping[str, Any]) -> str:
    trust = " (unverified)" if trust_note(dict(run)) else ""
    return (f"{cell(run.get('loop') or '?')}, verdict {cell(run.get('verdict'))}{trust}, "
            f"{len(iterations_of(run))} iterations")


def _first_divergence(its_a: Sequence[Mapping[str, Any]], its_b: Sequence[Mapping[str, Any]]) -> str:
    for index in range(max(len(its_a), len(its_b))):
        if index >= len(its_a):
            return f"first divergence: iteration {_number(its_b[index], index)} is only in B"
        if index >= len(its_b):
            return f"first divergence: iteration {_number(its_a[index], index)} is only in A"
        how = _iteration_changes(its_a[index], its_b[index])
        if how:
            return (f"first divergence: iteration {_number(its_a[index], index)}:\n  "
                    + "\n  ".join(how))
    return ""


def _number(iteration: Mapping[str, Any], index: int) -> Any:
    return iteration.get("iter", index + 1)


def _iteration_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    how = []
    checks_a = {str(c.get("name")): c for c in checks_of(a)}
    checks_b = {str(c.get("name")): c for c in checks_of(b)}
    for name in [*checks_a, *(n for n in checks_b if n not in checks_a)]:
        ca, cb = checks_a.get(name), checks_b.get(name)
        if _check_outcome(ca) != _check_outcome(cb):
            how.append(f"check {cell(name)!r}: {_describe_check(ca)} -> {_describe_check(cb)}")
    if a.get("state_changed") != b.get("state_changed") or \
            a.get("unchanged_streak") != b.get("unchanged_streak"):
        how.append(f"state: {_state(a.get('state_changed'))} (streak {_dash(a.get('unchanged_streak'))})"
                   f" -> {_state(b.get('state_changed'))} (streak {_dash(b.get('unchanged_streak'))})")
    if a.get("revise_exit") != b.get("revise_exit"):
        how.append(f"revise: {_revise(a)} -> {_revise(b)}")
    if a.get("guard") != b.get("guard"):
        how.append(f"guard: {cell(a.get('guard') or '-')} -> {cell(b.get('guard') or '-')}")
    return how


def _check_outcome(check: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    if check is None:
        return None
    return (bool(check.get("passed")), check.get("exit_code"), bool(check.get("timed_out")))


def _describe_check(check: Mapping[str, Any] | None) -> str:
    if check is None:
        return "not run"
    word = "passed" if check.get("passed") else "failed"
    extra = " (timed out)" if check.get("timed_out") else ""
    return f"{word}, exit {_dash(check.get('exit_code'))}{extra}"


def _revise(iteration: Mapping[str, Any]) -> str:
    code = iteration.get("revise_exit")
    return "not run" if code is None else f"exit {code}"


# --------------------------------------------------------------------------- verify


def verify_command(path: str | os.PathLike, key_env: str | None = None,
                   pubkey: str | None = None, integrity_only: bool = False) -> tuple[int, str]:
    """``(0, why)`` for an intact and authentic `.tine`: given a key, signed with it;
    without one, vouched by this machine's key. ``(1, why)`` when it is tampered,
    mismatched, unreadable or not authenticated; with ``integrity_only`` an intact
    file that is not authenticated is ``(0, why)``, and ``why`` says so.

    The HMAC key is read from the environment variable named ``key_env`` and is
    never printed. A missing or short key is bad input: LoopUsageError.
    """
    key = None
    if key_env is not None:
        value = os.environ.get(key_env)
        if value is None:
            raise LoopUsageError(f"environment variable {key_env} is not set", location="--key-env",
                                 fix="export the HMAC key in it, or pass --pubkey for Ed25519")
        key = value.encode()
        if len(key) < 16:
            raise LoopUsageError(
                f"the HMAC key in {key_env} is {len(key)} bytes; it must be at least 16",
                location="--key-env", fix="make one with `tine keygen --hmac --out FILE`")
    if key is not None and pubkey is not None:
        raise LoopUsageError("pass --key-env or --pubkey, not both", location="--pubkey")
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        from pytest_loops.limits import open_regular

        open_regular(p, "a .tine file").close()  # a pipe or device: one line, exit 64
    if p.is_file() and not looks_like_tine(p):
        return 1, f"{p}: not a .tine file (verify checks .tine provenance files, not run logs)"
    ok, message = verify_tine(p, hmac_key=key, pubkey_path=pubkey, integrity_only=integrity_only)
    if key:
        message = message.replace(key.decode(errors="replace"), "[key]")
    return (0 if ok else 1), message

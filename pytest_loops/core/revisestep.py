"""The steps around a revise step that are not the loop's order: the context adapter
asked before it, the diff audit after it, and the first iteration's check that can
never start (bad input, before any revise step is paid for). Used by
:class:`~pytest_loops.core.engine.Engine`; ``loop`` is its per-loop state."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_loops.core import ctxadapter
from pytest_loops.core.context import LoopContext, loop_env
from pytest_loops.core.revise import CANNOT_START_EXIT_CODES
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import write_fresh
from pytest_loops.results import CheckResult, CommandResult, IterationRecord
from pytest_loops.spec import CheckKind
from pytest_loops.verdict import Verdict


def ask_adapter(loop: Any, ctx: LoopContext, record: IterationRecord, *, options: Any, env: Mapping[str, str],
            scrub: Callable[[str], str] | None,
            write: Callable[[Path, Callable[[], Any]], bool]) -> ctxadapter.AdapterAnswer:
    """Run the loop's context adapter (:mod:`pytest_loops.core.ctxadapter`) before this
    revise step: its answer, and what follows from it in ``ctx.revise_env`` (LOOP_MCP_CONFIG)
    and the run log. A bad answer is one line there, or (``on_failure == "stop"``) bad input."""
    spec = loop.spec
    command = str(spec.context_adapter)
    permissions, notes = ctxadapter.granted(spec.grants, options.own_model)
    answer = ctxadapter.AdapterAnswer(command=command, notes=notes)
    request = ctxadapter.build_request(spec, iteration=ctx.iteration, failure_file=ctx.failure_file,
                                       permissions=permissions, own_model=options.own_model)
    env = {**env, **loop_env(spec, ctx), "LOOP_FAILURE_FILE": str(ctx.failure_file)}
    left = ctx.time_left()
    timeout = options.timeout if left is None else max(0.01, min(options.timeout, left))
    try:
        answer.payload = ctxadapter.call(command, request, cwd=loop.workdir, env=env, timeout=timeout)
    except ctxadapter.AdapterFailed as exc:
        line = f"the context adapter {command!r} gave no usable answer: {exc}"
        if scrub is not None:
            line = scrub(line)
        if options.on_failure == "stop":
            raise LoopUsageError(line, location=spec.origin.get("context_adapter") or spec.source,
                                 fix="fix the adapter, or let the loop go on without it "
                                     "(context_adapter_failure=skip)") from None
        answer.error = line
    servers, more = ctxadapter.mcp_servers(answer.payload, permissions, options)
    answer.notes += more
    if servers:
        path = ctx.iteration_dir / ctxadapter.MCP_CONFIG_NAME
        text = json.dumps({"mcpServers": servers}, indent=2) + "\n"
        if write(path, lambda: write_fresh(path, scrub(text) if scrub else text)):
            answer.mcp_config = path
            ctx.revise_env["LOOP_MCP_CONFIG"] = str(path)
    answer.harness_install = ctxadapter.harness_install(answer.payload, permissions)
    record.context_adapter = {
        "command": command, "error": answer.error, "notes": list(answer.notes),
        "mcp_config": str(answer.mcp_config) if answer.mcp_config else None,
        "mcp_servers": sorted(servers), "harness_install": answer.harness_install,
        "version": (answer.payload or {}).get("version"),
    }
    return answer


def audit(loop: Any, ctx: LoopContext, record: IterationRecord, failed: list[CheckResult], *, pm: Any,
      mode: str, allow: Any) -> tuple[Verdict | None, str]:
    """The diff audit over every in-scope file changed since the loop started."""
    from pytest_loops.runtime.audit import FileChange, failing_literals
    from pytest_loops.runtime.audit.binary import binary_findings
    from pytest_loops.runtime.audit.encoding import decode_source, encoding_finding
    from pytest_loops.runtime.audit.model import Finding
    from pytest_loops.runtime.protect.rules import AUDIT_MAX_BYTES, matches

    watch = loop.watch
    for check in failed:
        loop.literals |= failing_literals(read_text(check.output_file) or check.output_tail)
    ctx.audit_literals = frozenset(loop.literals)
    changes = watch.changes_since_start()
    diff: list[FileChange] = []
    found: list[Any] = []
    for rel, how in changes:
        if not rel.endswith(".py"):
            continue
        # sources are read as Python reads them (their coding line), not as UTF-8
        before = watch.loop_start_bytes(rel)
        after = None if how == "deleted" else read_bytes(str(watch.root) + "/" + rel, AUDIT_MAX_BYTES + 1) or b""
        if after is not None and len(after) > AUDIT_MAX_BYTES and not matches(rel, allow or ()):
            found.append(Finding(rel, 1, "too-large",
                                 f"the revise step made a Python file of over {AUDIT_MAX_BYTES >> 20} MiB: "
                                 f"the audit reads no further, and Python imports all of it (--audit-allow GLOB, "
                                 f"under pytest --loop-audit-allow GLOB, allows it)",
                                 f"<over {AUDIT_MAX_BYTES} bytes>"))
            continue
        diff.append(FileChange(rel, None if before is None else decode_source(before),
                               None if after is None else decode_source(after)))
        odd = None if after is None else encoding_finding(rel, after, before)
        if odd is not None:
            found.append(odd)
    hook = pm.hook.pytest_loop_audit(diff=diff, context=ctx) if diff else []
    found += [f for batch in hook or [] for f in batch or []]
    found += binary_findings(str(watch.root), [c for c in changes if c[0] in loop.revised], allow)
    if not found:
        return None, ""
    from pytest_loops.runtime.protect import printable

    lines = [printable(f.describe() if hasattr(f, "describe") else str(f)) for f in found]
    record.audit_findings = lines
    if mode == "warn":
        return None, ""
    record.guard = "audit"
    shown = "; ".join(lines[:3]) + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")
    return Verdict.ESCALATE, f"the diff audit flagged the revise step's changes: {shown}"


_CHECK_ORIGINS = {"command line": "--verify", "environment": "PYTEST_LOOPS_VERIFY"}


def verify_cannot_start(loop: Any, record: IterationRecord) -> None:
    """A check command the shell could not start (126 not executable, 127 not found) in
    the first iteration, before any revise step: bad input (LoopUsageError, exit 64), so
    no revise step is paid for against a check that can never pass. Later (after a
    revise step ran, or in a resumed run) it is an ordinary failed check."""
    if record.iter != 1 or loop.state.records or loop.plan.revise is not None:
        return
    kinds = (CheckKind.COMMAND, CheckKind.FINDS_NOTHING)
    seeded = set(loop.first_results or ())  # the caller ran those: not a command of ours
    by_name = {c.name: c for c in loop.spec.checks if c.kind in kinds and not c.hidden and c.name not in seeded}
    for result in record.checks:
        check = by_name.get(result.name)
        if check is None or result.passed or result.timed_out or result.exit_code not in CANNOT_START_EXIT_CODES:
            continue
        origin = loop.spec.origin.get("verify", "")
        what = "not found" if result.exit_code == 127 else "found but not executable"
        said = [ln.strip() for ln in result.output_tail.splitlines() if ln.strip()]
        shown = f" ({said[-1][:160]})" if said else ""
        raise LoopUsageError(
            f"the check {check.command or check.name!r} cannot run: its shell exited {result.exit_code} "
            f"({what}){shown} in the first iteration, before any revise step",
            location=check.source or _CHECK_ORIGINS.get(origin, origin) or loop.spec.source,
            fix="install the program, give its full path, make it executable, or fix the command")


def read_text(path: str | None, limit: int = 1 << 20) -> str:
    data = read_bytes(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")


def read_bytes(path: str | None, limit: int = 1 << 20) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def exit_of(outcome: Any) -> int | None:
    if isinstance(outcome, CommandResult):
        return outcome.exit_code
    return outcome if isinstance(outcome, int) and not isinstance(outcome, bool) else None

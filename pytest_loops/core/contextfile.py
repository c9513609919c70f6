"""The context file: a read-only JSON contract the revise step gets before it plans.

Before each revise step the harness writes ``context.json`` in the iteration
directory and passes its path as ``LOOP_CONTEXT_FILE``: the loop's name and goal,
the iteration and the cap, the budget left, every visible check with its last
result and output tail, the last failure, suspects, lessons, what the loop
protects and scopes, and its ``grants``. Plugins add sections through
``pytest_loop_context(spec, context, payload)``; a section is kept only under a
name the loop grants (fail closed), and the core keys are never a plugin's.

The file is output only: it is built from the harness's own memory each time and
never read back, so a revise step that rewrites it changes nothing the harness
decides. Secret values are masked like in the prompt file, and the file is
capped at :data:`CONTEXT_FILE_CAP` bytes.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from pytest_loops.core.context import LoopContext
from pytest_loops.core.ctxadapter import AdapterAnswer
from pytest_loops.core.revise import PROMPT_TAIL_CHARS, output_tail
from pytest_loops.limits import create_fresh
from pytest_loops.results import CheckResult, IterationRecord
from pytest_loops.spec import GRANT_NAMES, LoopSpec

SCHEMA = "pytest-loops.context/1"
SCHEMA_RESOURCE = "schemas/context-1.schema.json"  # in the package: the JSON Schema of the file
CONTEXT_FILE_CAP = 256 * 1024  # bytes of the whole file
SECTION_CAP = 32 * 1024  # bytes of one plugin section, as JSON
LAST_FAILURE_CHARS = 8000
MAX_CHECK_TESTS = 40
MAX_LESSONS = 20
MAX_DROPPED = 50  # lines of context_dropped per iteration; past it, one line counts the rest
CORE_KEYS = ("schema", "loop", "goal", "iteration", "max_iter", "budget", "checks", "last_failure",
             "suspects", "lessons", "look_at", "protect", "scope", "grants", "files", "sections", "adapter")


@dataclass
class ContextFile:
    """What was written: the payload, and each plugin section dropped (one line each)."""

    payload: dict[str, Any]
    dropped: list[str] = field(default_factory=list)


def schema_path() -> Path:
    """The shipped JSON Schema of the context file."""
    return Path(__file__).resolve().parent.parent / SCHEMA_RESOURCE


def _check_entry(check: CheckResult | None, name: str, kind: str, tail_chars: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "kind": kind}
    if check is None:
        entry.update(status="not_run", reason="not run in this iteration", exit_code=None,
                     output_tail="", output_cut=False, failing_tests=[])
        return entry
    tail, cut = output_tail(check, tail_chars) if not check.passed else ("", False)
    tests = list(check.failing_tests) if not check.passed else []
    entry.update(status="passed" if check.passed else "failed", reason=check.reason,
                 exit_code=check.exit_code, output_tail=tail, output_cut=cut,
                 failing_tests=tests[:MAX_CHECK_TESTS])
    if len(tests) > MAX_CHECK_TESTS:
        entry["failing_tests_more"] = len(tests) - MAX_CHECK_TESTS
    return entry


def build_payload(spec: LoopSpec, context: LoopContext, results: list[CheckResult],
                  tail_chars: int = PROMPT_TAIL_CHARS) -> dict[str, Any]:
    """The core of the contract, from the harness's own state (never from the run dir's files
    a revise step could have written). Hidden checks are not in it, as in the prompt."""
    by_name = {c.name: c for c in results}
    checks = []
    for check in spec.checks:
        if check.hidden:
            continue
        entry = _check_entry(by_name.get(check.name), check.name, check.kind.value, tail_chars)
        if check.command:
            entry["command"] = check.command
        if check.node_id:
            entry["node_id"] = check.node_id
        checks.append(entry)
    failed = [c for c in results if not c.passed and c.name in {e["name"] for e in checks}]
    last_failure = None
    if failed:
        parts = [f"===== {c.name} ({c.reason}) =====\n" + output_tail(c, LAST_FAILURE_CHARS)[0] for c in failed]
        text = "\n".join(parts)
        cut = len(text) > LAST_FAILURE_CHARS
        last_failure = {"check": failed[0].name, "reason": failed[0].reason,
                        "text": text[-LAST_FAILURE_CHARS:] if cut else text, "cut": cut}
    left = context.time_left()
    return {
        "schema": SCHEMA,
        "loop": spec.name,
        "goal": spec.goal,
        "iteration": context.iteration,
        "max_iter": spec.guards.max_iter,
        "budget": {"seconds": spec.guards.budget_seconds or None,
                   "left_s": None if left is None else round(left, 3)},
        "checks": checks,
        "last_failure": last_failure,
        "suspects": list(context.suspects),
        "lessons": [lesson.removeprefix("- ") for lesson in context.lessons[-MAX_LESSONS:]],
        "look_at": list(spec.look_at),
        "protect": list(spec.protect),
        "scope": list(spec.scope),
        "grants": list(spec.grants),
        "files": {"prompt": str(context.prompt_file), "failure": str(context.failure_file),
                  "context": str(context.context_file)},
        "sections": {},
    }


def _impls(pm: pluggy.PluginManager) -> list[Any]:
    """The ``pytest_loop_context`` implementations in pluggy's call order (wrappers skipped)."""
    caller = getattr(pm.hook, "pytest_loop_context", None)
    if caller is None:
        return []
    impls = [i for i in caller.get_hookimpls()
             if not (getattr(i, "hookwrapper", False) or getattr(i, "wrapper", False))]
    return list(reversed(impls))


def collect_sections(pm: pluggy.PluginManager, spec: LoopSpec, context: LoopContext,
                     payload: dict[str, Any]) -> list[str]:
    """Ask each plugin for its sections; keep the granted ones in ``payload["sections"]``.

    Each implementation is called on its own with a copy of the payload (what it
    changes there is not kept) and returns ``{name: data}`` or None. A section is
    kept only under a granted name, as JSON, within :data:`SECTION_CAP`; the first
    plugin to give a name keeps it. An implementation that raises loses its sections,
    never the loop. Returns one line per section dropped (or plugin that failed)."""
    dropped: list[str] = []
    granted = set(spec.grants)
    sections: dict[str, Any] = {}
    for impl in _impls(pm):
        plugin = impl.plugin_name
        args = {"spec": spec, "context": context, "payload": copy.deepcopy(payload)}
        try:
            answer = impl.function(**{name: args[name] for name in impl.argnames})
        except Exception as exc:  # noqa: BLE001 - a plugin's section never costs the loop
            dropped.append(f"{plugin}: pytest_loop_context raised {type(exc).__name__}: {exc}"[:300])
            continue
        if answer is None:
            continue
        if not isinstance(answer, Mapping):
            dropped.append(f"{plugin}: pytest_loop_context returned {type(answer).__name__}, "
                           "not a mapping of section name to data")
            continue
        for name, data in answer.items():
            shown = repr(name)[:60]
            if name in CORE_KEYS:
                dropped.append(f"{plugin}: section {shown} dropped: a core key of the context file, "
                               "never a plugin's")
            elif name not in GRANT_NAMES:
                dropped.append(f"{plugin}: section {shown} dropped: not a grant name "
                               f"({', '.join(GRANT_NAMES)})")
            elif name not in granted:
                dropped.append(f"{plugin}: section {shown} dropped: the loop does not grant it "
                               f"(grants: {', '.join(spec.grants) or 'none'})")
            elif name in sections:
                dropped.append(f"{plugin}: section {shown} dropped: already given by "
                               f"{sections[name]['plugin']}")
            else:
                try:
                    size = len(json.dumps(data, allow_nan=False, ensure_ascii=False).encode())
                except (TypeError, ValueError, RecursionError) as exc:
                    dropped.append(f"{plugin}: section {shown} dropped: not JSON data ({exc})"[:300])
                    continue
                if size > SECTION_CAP:
                    dropped.append(f"{plugin}: section {shown} dropped: {size} bytes, over the cap "
                                   f"of {SECTION_CAP}")
                    continue
                sections[name] = {"plugin": plugin, "data": json.loads(json.dumps(data))}
    payload["sections"] = sections
    if len(dropped) > MAX_DROPPED:
        dropped[MAX_DROPPED - 1:] = [f"... and {len(dropped) - MAX_DROPPED + 1} more sections dropped"]
    return dropped


def _scrubbed(value: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrubbed(v, scrub) for v in value]
    if isinstance(value, dict):
        return {scrub(str(k)): _scrubbed(v, scrub) for k, v in value.items()}
    return value


def _encode(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, indent=2, ensure_ascii=False) + "\n").encode()


def _fit(payload: dict[str, Any], dropped: list[str]) -> bytes:
    """The file's bytes within :data:`CONTEXT_FILE_CAP`: plugin sections go first, then the
    output tails shrink, then the lessons and the last failure."""
    data = _encode(payload)
    if len(data) <= CONTEXT_FILE_CAP:
        return data
    for name in list(payload["sections"]):
        plugin = payload["sections"].pop(name)["plugin"]
        dropped.append(f"{plugin}: section {name!r} dropped: the context file would be over its cap "
                       f"of {CONTEXT_FILE_CAP} bytes")
        data = _encode(payload)
        if len(data) <= CONTEXT_FILE_CAP:
            return data
    if (payload.get("adapter") or {}).get("payload") is not None:
        payload["adapter"]["payload"] = None
        payload["adapter"]["error"] = (f"the answer was left out: the context file would be over its cap of "
                                       f"{CONTEXT_FILE_CAP} bytes")
        dropped.append(f"context adapter: answer dropped: the context file would be over its cap of "
                       f"{CONTEXT_FILE_CAP} bytes")
        data = _encode(payload)
        if len(data) <= CONTEXT_FILE_CAP:
            return data
    for entry in payload["checks"]:
        if entry["output_tail"]:
            entry["output_tail"], entry["output_cut"] = entry["output_tail"][-500:], True
        entry["failing_tests"] = entry["failing_tests"][:5]
    payload["lessons"] = payload["lessons"][-5:]
    if payload["last_failure"]:
        payload["last_failure"]["text"] = payload["last_failure"]["text"][-2000:]
        payload["last_failure"]["cut"] = True
    data = _encode(payload)
    while len(data) > CONTEXT_FILE_CAP and len(payload["checks"]) > 1:
        payload["checks"] = payload["checks"][: len(payload["checks"]) // 2]
        payload["checks_cut"] = True
        data = _encode(payload)
    return data


def _write_fresh(path: Path, data: bytes) -> None:
    """Write a new file: a file or link a revise step left at this path is removed first,
    never written through (``O_EXCL | O_NOFOLLOW``: a link planted in between is refused)."""
    with os.fdopen(create_fresh(path), "wb") as f:
        f.write(data)


def write_context_file(pm: pluggy.PluginManager, spec: LoopSpec, context: LoopContext,
                       record: IterationRecord, adapter: AdapterAnswer | None = None) -> ContextFile:
    """Build the contract from ``record.checks``, add the plugins' granted sections, mask
    secrets, cap it and write ``context.context_file``; each section dropped goes to
    ``record.context_dropped`` (the run log). Output only: built from the harness's
    state each time, never read back. An OSError is the caller's (an artifact error)."""
    payload = build_payload(spec, context, record.checks)
    dropped = collect_sections(pm, spec, context, payload)
    if adapter is not None:  # its own key: a plugin section can never stand in for it
        payload["adapter"] = adapter.section()
    if context.scrub is not None:
        payload = _scrubbed(payload, context.scrub)
        dropped = [context.scrub(line) for line in dropped]
    try:
        _write_fresh(context.context_file, _fit(payload, dropped))
    finally:
        record.context_dropped.extend(dropped)
    return ContextFile(payload, dropped)

"""Reading a run log: a finished log's summary, or a running (or killed) log's events
turned into the same shape, its MACs checked on the way (:mod:`runlogsign
<pytest_loops.artifacts.runlogsign>`), and the shape every reader relies on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.runlogsign import EVENT_DOMAIN, FROM_STATE, SCHEMA, Verifier, reader_key
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import MAX_LINE_CHARS, MAX_RUN_BYTES, load_json, read_text
from pytest_loops.runtime.trust import KeyFileError, MacChain, runlog_key


def _from_events(lines: list[str], path: Path, verifier: Verifier) -> dict[str, Any]:
    run: dict[str, Any] | None = None
    iterations: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # revise_start without its iteration
    decided: dict[str, Any] | None = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise LoopUsageError(f"line {number} is longer than {MAX_LINE_CHARS} characters", location=str(path),
                                 fix="is this a pytest-loops run log?")
        try:
            event = load_json(line, str(path), f"line {number}")
        except json.JSONDecodeError:
            if number == len(lines):  # a last line cut short by a kill: ignore it
                break
            raise LoopUsageError(f"line {number} is not JSON", location=str(path),
                                 fix="is this a pytest-loops run log?") from None
        if not isinstance(event, dict):
            raise LoopUsageError(f"line {number} is not a JSON object", location=str(path))
        verifier.event(event, number)
        kind = event.get("event")
        if kind == "start":
            run = {k: v for k, v in event.items() if k != "event"}
        elif kind == "iteration" and isinstance(event.get("record"), dict):
            iterations.append(event["record"])
            pending = None
            decided = ({"iter": event["record"].get("iter"), "verdict": event["verdict"],
                        "reason": event.get("reason", "")} if isinstance(event.get("verdict"), str) else None)
        elif kind == "revise_start" and isinstance(event.get("record"), dict):
            pending = event["record"]
        elif kind == "aborted":
            if run is not None:
                run["reason"] = str(event.get("reason", ""))
    if run is None:
        raise LoopUsageError("no start event: not a pytest-loops run log", location=str(path))
    run.setdefault("reason", "killed or interrupted")
    run.update(verdict=None, exit_code=None, ended_at=None, iterations=iterations,
               iterations_run=len(iterations), incomplete=True)
    if iterations:
        run["elapsed_s"] = iterations[-1].get("elapsed_s", 0.0)
    if pending is not None:
        run["revise_interrupted"] = pending
    if decided is not None:
        run["decided"] = decided
    return run


def load_runlog(path: str | os.PathLike, *, key: bytes | None = FROM_STATE) -> dict[str, Any]:
    """Read a run log, finished or not. Bad input raises LoopUsageError (one line).

    Its MACs are checked under ``key`` (default: the per-user run-log key):
    ``verified`` is True when every one held, else False with ``unverified_why``
    saying why. The ``mac`` fields themselves are left out of the result.
    """
    p = Path(path)
    verifier = Verifier(*reader_key(key))
    text = read_text(p, "a pytest-loops run log", MAX_RUN_BYTES, missing="no such run log")
    stripped = text.strip()
    if not stripped:
        raise LoopUsageError("empty file: not a pytest-loops run log", location=str(p))
    try:
        data = load_json(stripped, str(p), "the log")
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "event" not in data:
        schema = data.get("schema")
        if not isinstance(schema, str) or not schema.startswith("pytest-loops.runlog/"):
            raise LoopUsageError(f"unknown schema {schema!r}; expected {SCHEMA!r}", location=str(p))
        if not isinstance(data.get("iterations"), list):
            raise LoopUsageError("'iterations' is missing or not a list", location=str(p))
        verifier.summary(data)
    else:
        data = _from_events(text.splitlines(), p, verifier)
    check_shape(data, p)
    data["log_path"] = str(p)  # where it was read from (for --resume links)
    why = verifier.why()  # set last: a log cannot claim it for itself
    data["verified"], data["unverified_why"] = why is None, why
    return data


# Top-level keys the readers (show, diff, report, --resume) use, with the JSON type
# each must have when present and not null.
_SHAPE: dict[str, tuple[type | tuple[type, ...], str]] = {
    "spec": (dict, "an object"), "guards": (dict, "an object"), "artifacts": (dict, "an object"),
    "lessons": (list, "a list"), "lessons_read": (list, "a list"), "state_paths": (list, "a list"),
    "verdict": (str, "a string"), "exit_code": (int, "an integer"), "elapsed_s": ((int, float), "a number"),
}


def check_shape(data: dict[str, Any], path: str | os.PathLike) -> None:
    """A top-level key of the wrong type is bad input (LoopUsageError, one line),
    not a crash in a reader. Also applied to runs read from a `.tine`."""
    for key, (kind, what) in _SHAPE.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise LoopUsageError(f"{key!r} is not {what} (got {type(value).__name__})", location=str(path),
                                 fix="is this a pytest-loops run log?")
    checks = (data.get("spec") or {}).get("checks")
    if checks is not None and not isinstance(checks, list):
        raise LoopUsageError(f"'spec.checks' is not a list (got {type(checks).__name__})", location=str(path))
    iterations = data.get("iterations")
    if iterations is not None and not isinstance(iterations, list):
        raise LoopUsageError(f"'iterations' is not a list (got {type(iterations).__name__})", location=str(path),
                             fix="is this a pytest-loops run log?")
    for number, iteration in enumerate(iterations or []):
        listed = iteration.get("checks") if isinstance(iteration, dict) else None
        if listed is not None and not isinstance(listed, list):
            raise LoopUsageError(f"'iterations[{number}].checks' is not a list (got {type(listed).__name__})",
                                 location=str(path), fix="is this a pytest-loops run log?")


def recorded_source_file(log_path: str | os.PathLike | None) -> dict[str, str] | None:
    """The loop file and digest a running (or killed) log's start event recorded,
    when that line's MAC holds; None otherwise. Read by the hand-off, which is
    written before the summary replaces the events."""
    if not log_path:
        return None
    try:
        with open(log_path, encoding="utf-8") as f:
            first = f.readline(MAX_LINE_CHARS)
        event = load_json(first, str(log_path))
        key = runlog_key(create=False)
    except (OSError, ValueError, UnicodeDecodeError, KeyFileError, LoopUsageError):
        return None
    if not isinstance(event, dict) or event.get("event") != "start" or not key:
        return None
    given = event.pop("mac", None)
    if not MacChain(key, EVENT_DOMAIN).verify(event, given):
        return None
    record = event.get("source_file")
    if isinstance(record, dict) and isinstance(record.get("path"), str) and isinstance(record.get("sha256"), str):
        return {"path": record["path"], "sha256": record["sha256"]}
    return None

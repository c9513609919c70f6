"""The run log: JSON lines while the loop runs, one JSON summary at the end.

A run killed with SIGKILL leaves its JSON-lines events, which `load_runlog`
turns into the same shape as a finished log (with ``verdict`` None). The final
summary replaces the events file by atomic rename, so a reader never sees half.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import LoopUsageError, read_user_text

SCHEMA = "pytest-loops.runlog/1"
INDEX_SCHEMA = "pytest-loops.index/1"


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str, allow_nan=False)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so readers see the old or the new content, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunLogWriter:
    """Appends events while the loop runs; writes the summary at the end."""

    def __init__(self, path: str | os.PathLike, scrub: Callable[[str], str] | None = None) -> None:
        self.path = Path(path)
        self.scrub = scrub  # masks secret values in everything written

    def _text(self, text: str) -> str:
        return self.scrub(text) if self.scrub is not None else text

    def _append(self, event: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(self._text(_dump(event)) + "\n")

    def start(self, header: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")
        self._append({"event": "start", "schema": SCHEMA, **header})

    def iteration(self, record: dict[str, Any]) -> None:
        self._append({"event": "iteration", "record": record})

    def aborted(self, reason: str) -> None:
        self._append({"event": "aborted", "reason": reason})

    def finish(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.path, self._text(json.dumps(summary, ensure_ascii=False, indent=2,
                                                           default=str, allow_nan=False)) + "\n")


def _from_events(lines: list[str], path: Path) -> dict[str, Any]:
    run: dict[str, Any] | None = None
    iterations: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # a last line cut short by a kill: ignore it
                break
            raise LoopUsageError(f"line {number} is not JSON", location=str(path),
                                 fix="is this a pytest-loops run log?") from None
        if not isinstance(event, dict):
            raise LoopUsageError(f"line {number} is not a JSON object", location=str(path))
        kind = event.get("event")
        if kind == "start":
            run = {k: v for k, v in event.items() if k != "event"}
        elif kind == "iteration" and isinstance(event.get("record"), dict):
            iterations.append(event["record"])
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
    return run


def load_runlog(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run log, finished or not. Bad input raises LoopUsageError (one line)."""
    p = Path(path)
    text = read_user_text(p, "a pytest-loops run log", missing="no such run log")
    stripped = text.strip()
    if not stripped:
        raise LoopUsageError("empty file: not a pytest-loops run log", location=str(p))
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "event" not in data:
        schema = data.get("schema")
        if not isinstance(schema, str) or not schema.startswith("pytest-loops.runlog/"):
            raise LoopUsageError(f"unknown schema {schema!r}; expected {SCHEMA!r}", location=str(p))
        if not isinstance(data.get("iterations"), list):
            raise LoopUsageError("'iterations' is missing or not a list", location=str(p))
    else:
        data = _from_events(text.splitlines(), p)
    check_shape(data, p)
    data["log_path"] = str(p)  # where it was read from (for --resume links)
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


def check_resumable(data: dict[str, Any], where: str) -> None:
    """What a resumed run takes over from a loaded run log must be sound: spent time,
    and per iteration its checks, streaks, state hash and failure signature.

    Raises LoopUsageError naming ``where`` (e.g. ``--resume run.json``).
    """
    def bad(what: str) -> LoopUsageError:
        return LoopUsageError(f"cannot resume: {what}", location=where,
                              fix="resume from an unedited run log, or start the loop afresh")

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def seconds(value: Any) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and value >= 0)

    if data.get("elapsed_s") is not None and not seconds(data["elapsed_s"]):
        raise bad(f"elapsed_s {data['elapsed_s']!r} is not a number of seconds")
    for index, record in enumerate(data.get("iterations") or [], 1):
        if not isinstance(record, dict):
            raise bad(f"iteration record {index} is not an object")
        for key in ("unchanged_streak", "same_failure_streak"):
            if key in record and not count(record[key]):
                raise bad(f"iteration record {index}: {key} {record[key]!r} is not a count")
        for key in ("state_hash", "failure_signature"):
            if record.get(key) is not None and not isinstance(record[key], str):
                raise bad(f"iteration record {index}: {key} {record[key]!r} is not a string")
        if record.get("elapsed_s") is not None and not seconds(record["elapsed_s"]):
            raise bad(f"iteration record {index}: elapsed_s {record['elapsed_s']!r} is not a number of seconds")
        checks = record.get("checks") or []
        if not isinstance(checks, list) or not all(
                isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("passed"), bool)
                for c in checks):
            raise bad(f"iteration record {index}: its checks are not objects with a name and passed")
        try:  # the records are written into the new log as they are
            _dump(record)
        except ValueError:
            raise bad(f"iteration record {index} holds NaN or an infinite number") from None


def append_index(index_path: str | os.PathLike, entry: dict[str, Any]) -> None:
    """One line per finished run in the artifacts directory's index, under a file lock."""
    path = Path(index_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = _dump({"schema": INDEX_SCHEMA, **entry}) + "\n"
    with FileLock(str(path) + ".lock"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)

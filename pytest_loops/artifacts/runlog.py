"""The run log: JSON lines while the loop runs, one JSON summary at the end.

A run killed with SIGKILL leaves its JSON-lines events, which `load_runlog`
turns into the same shape as a finished log (with ``verdict`` None). The final
summary replaces the events file by atomic rename, so a reader never sees half.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..errors import LoopUsageError

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
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoopUsageError("no such run log", location=str(p)) from None
    except IsADirectoryError:
        raise LoopUsageError("is a directory, not a run log", location=str(p)) from None
    except UnicodeDecodeError:
        raise LoopUsageError("not UTF-8 text: not a pytest-loops run log", location=str(p)) from None
    except OSError as exc:
        raise LoopUsageError(f"cannot read: {exc.strerror}", location=str(p)) from None
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
    data["log_path"] = str(p)  # where it was read from (for --resume links)
    return data


def append_index(index_path: str | os.PathLike, entry: dict[str, Any]) -> None:
    """One line per finished run in the artifacts directory's index, under a file lock."""
    path = Path(index_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = _dump({"schema": INDEX_SCHEMA, **entry}) + "\n"
    with FileLock(str(path) + ".lock"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)

"""The compact forms of a `.tine` iteration step's values, and what they stand for.

opentine's save-time redaction scans every distinct string, at a cost per
character, so an iteration step writes what repeats or what a number can say
in a form that is the same from one iteration to the next: the iteration's
start time as epoch milliseconds, a lesson line as its words and its time in
seconds, an output file in the iteration's own directory as its file name.
Each compact form is written only when expanding it gives back the original
exactly; else the value is recorded as it is. Written by
:mod:`pytest_loops.artifacts.provenance`, expanded by
:mod:`pytest_loops.artifacts.tineread`.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Mapping
from typing import Any

# The run directory's layout as the engine writes it: each iteration's outputs in
# `iter-NNN/`. An output file there is recorded by its name alone (`output_name`),
# any other by its whole path (`output_file`).
ITERATION_DIR = "iter-{iteration:03d}"


def iteration_folder(run_dir: str | None, iteration: int) -> str | None:
    """The directory of an iteration's outputs, in the run directory."""
    return os.path.join(run_dir, ITERATION_DIR.format(iteration=iteration)) if run_dir else None


def compact_output(output_file: str | None, folder: str | None) -> dict[str, str]:
    """``{"output_name": name}`` for a file in ``folder`` (the iteration's directory),
    else ``{"output_file": path}``; nothing for no file."""
    if not output_file:
        return {}
    output_file = os.fspath(output_file)
    if folder is not None:
        name = os.path.basename(output_file)
        if name and os.path.join(folder, name) == output_file:
            return {"output_name": name}
    return {"output_file": output_file}


def output_path(outputs: Mapping[str, Any], run_dir: Any, iteration: int,
                iteration_dir: Any = ITERATION_DIR) -> str | None:
    """The output file a step's ``output_name`` / ``output_file`` stands for."""
    name = outputs.get("output_name")
    if isinstance(name, str) and name and isinstance(run_dir, str) and run_dir:
        folder = iteration_dir if isinstance(iteration_dir, str) else ITERATION_DIR
        try:
            return os.path.join(run_dir, folder.format(iteration=iteration), name)
        except (ValueError, KeyError, IndexError, AttributeError):
            return None
    path = outputs.get("output_file")
    return path if isinstance(path, str) else None


_ISO_MS = re.compile(r"\A(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z\Z")
_LESSON = re.compile(r"\A- (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z (.*) iter (\d+): ", re.DOTALL)


def _epoch(stamp: str) -> int | None:
    """Seconds since the epoch of a UTC `YYYY-MM-DDTHH:MM:SS` (a day that does not
    exist gives a wrong number, which the caller's round trip then refuses)."""
    try:
        date, clock = stamp.split("T")
        return calendar.timegm((*map(int, date.split("-")), *map(int, clock.split(":")), 0, 0, 0))
    except (ValueError, OverflowError, TypeError):
        return None


def compact_started(text: Any) -> dict[str, Any]:
    """``{"started_at_ms": epoch milliseconds}`` when that gives back ``text``
    exactly (the engine's `...T12:00:00.123Z`), else ``{"started_at": text}``."""
    match = _ISO_MS.match(text) if isinstance(text, str) else None
    seconds = _epoch(match.group(1)) if match else None
    if match and seconds is not None:
        ms = seconds * 1000 + int(match.group(2))
        if expand_time_ms(ms) == text:
            return {"started_at_ms": ms}
    return {"started_at": text}


def expand_time_ms(ms: Any) -> str | None:
    """The UTC time stamp (`...T12:00:00.123Z`) a ``started_at_ms`` field stands for."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        return None
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    except (ValueError, OverflowError, OSError):
        return None


def compact_lesson(lesson: str, loop_name: str, iteration: int) -> dict[str, Any]:
    """A lesson line (`- TIME LOOP iter N: words`) as its words and its time in
    seconds, when those give it back exactly; else the line as it is."""
    match = _LESSON.match(lesson)
    if match and match.group(2) == loop_name and match.group(3) == str(iteration):
        seconds = _epoch(match.group(1))
        if seconds is not None:
            words = lesson[match.end():]
            if expand_lesson(words, seconds, loop_name, iteration) == lesson:
                return {"lesson": words, "lesson_at_s": seconds}
    return {"lesson": lesson}


def expand_lesson(words: str, seconds: Any, loop_name: Any, iteration: int) -> str:
    """The lesson line an iteration step's ``lesson`` and ``lesson_at_s`` stand for."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        return words
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (ValueError, OverflowError, OSError):
        return words
    return f"- {stamp} {loop_name} iter {iteration}: {words}"

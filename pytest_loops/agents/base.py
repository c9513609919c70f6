"""What an agent preset is: how its CLI is called, continued and read.

A preset turns ``--revise NAME`` into the command line of one agent CLI: how it
takes the prompt, runs without a human, continues its own session from the
previous iteration, where its transcript goes, and how its documented
machine-readable output reports cost and tokens. Presets are plugins: the
built-in ones (:mod:`pytest_loops.agents.presets`) and any installed under the
``pytest_loops.agents`` entry-point group.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

from pytest_loops.core.usage import Usage, from_mapping

# the prompt, as the shell reads it from the file the harness wrote (no quoting of its text)
PROMPT_ARG = '"$(cat "$LOOP_PROMPT_FILE")"'


class Agent:
    """One agent CLI. Subclass it (or give an object with the same attributes) and
    register it under the ``pytest_loops.agents`` entry-point group."""

    name: str = ""  # what --revise selects it by
    program: str = ""  # the executable looked up on PATH
    docs: str = ""  # where its non-interactive interface is documented
    transcript: str = ""  # where the agent's own transcript of a session goes (one line, for the docs)

    def command(self, session: str | None) -> str:
        """The shell command of one revise step; ``session``: the one to continue (None: a new one).
        The prompt is in ``$LOOP_PROMPT_FILE``."""
        raise NotImplementedError

    def usage(self, output: str) -> Usage | None:
        """Cost, tokens and the session id from one step's output (stdout and stderr), or None."""
        return None

    def progress(self, line: str) -> str | None:
        """A short human line for one line of its output (the live status); None: not worth showing."""
        text = line.strip()
        return text or None

    def describe(self) -> str:
        return f"{self.name}: {self.program}"


def json_lines(output: str) -> Iterator[dict[str, Any]]:
    """Each line of ``output`` that is a JSON object (agents print banners and logs beside them)."""
    for line in output.splitlines():
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, dict):
            yield data


def whole_json(output: str) -> dict[str, Any] | None:
    """The output as one JSON object (pretty-printed over many lines), or None."""
    start, end = output.find("{"), output.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(output[start:end + 1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def count(value: Any) -> int | None:
    """A token count as an int (None when absent or not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        return None
    return int(value)


def checked(values: dict[str, Any]) -> Usage | None:
    """A Usage from figures an agent printed; None when nothing (or nothing valid) is there."""
    kept = {k: v for k, v in values.items() if v is not None}
    if not kept:
        return None
    try:
        usage = from_mapping(kept)
    except ValueError:
        return None
    return None if usage.empty else usage


def quoted(session: str) -> str:
    return shlex.quote(session)


def first_line(text: Any, limit: int = 160) -> str | None:
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[:limit - 1] + "…"
    return None

"""Failure signatures: is the loop failing the same way as before?

A normalized fingerprint of a failed check's output: for pytest, the failing
node ids with their exception types and messages; for other commands, the last
lines. Line numbers, addresses, temp paths, timings, PIDs and seeds are
stripped, so the same failure gives the same signature in another run, another
temp directory, another second. Also the one line a lesson quotes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable

from pytest_loops.redact import strip_control

__all__ = ["failure_signature", "first_meaningful_line", "normalize_failure"]

_SEP = r"[/\\]"
_PATH_CHAR = r"[^\s'\"()\[\]<>,;:]"
_NAME_CHAR = r"[^\s'\"()\[\]<>,;:/\\]"  # one path component
# pytest's tmp_path: <basetemp>/pytest-of-<user>/pytest-<n>/[popen-gw<k>/]<test name><n>
# Every pattern below may start only where a token starts or at a fixed literal,
# so a long line without spaces (a blob, a minified file) costs linear time.
_PYTEST_TMP = re.compile(
    rf"(?<!{_PATH_CHAR})(?:{_PATH_CHAR}*{_SEP})?pytest-of-[^\s/\\'\"]+{_SEP}pytest-(?:\d+|current)"
    rf"(?:{_SEP}popen-gw\d+)?(?:{_SEP}{_NAME_CHAR}*\d(?={_SEP}|[^\w.-]|$))?"
)


def _temp_roots() -> list[str]:
    roots = {"/tmp", "/var/tmp", "/dev/shm", "/private/tmp", "/private/var/tmp"}
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and len(value) > 1:
            roots.add(value.rstrip("/\\"))
    try:
        import tempfile

        roots.add(tempfile.gettempdir().rstrip("/\\"))
    except Exception:  # pragma: no cover - no usable temp dir at all
        pass
    return sorted((r for r in roots if r), key=len, reverse=True)


# <temp root>/<one random component>: mkdtemp names, /tmp/<anything> alike.
_TEMP_PATH = re.compile(
    r"(?<![\w.])(?:(?:/private)?/var/folders/[^/\s]+/[^/\s]+/[TC]"
    r"|" + "|".join(re.escape(r) for r in _temp_roots()) + r")(?![\w.-])"
    rf"(?:{_SEP}{_NAME_CHAR}+)?"
)
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\b"
)
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b")
_EPOCH = re.compile(r"\b1[5-9]\d{8}(?:\.\d+)?\b")
_FILE_LINE = re.compile(r"(?<![\w.\-])([\w.\-]*\.[A-Za-z]\w*):\d+(?::\d+)?")
_TRACEBACK_LINE = re.compile(r"(\", line )\d+")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_DURATION = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:s|secs?|seconds?|ms|msecs?|milliseconds?|us|µs|μs|ns"
    r"|mins?|minutes?)\b"
)
_PID = re.compile(r"\b(pid|PID|Pid|process)([\s=:#]*)\d+")
_SEED = re.compile(r"(seed[\s=:(]*)\d+", re.IGNORECASE)
_WORKER = re.compile(r"\bgw\d+\b")

_PYTEST_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S.*)$")
_PYTEST_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_PYTEST_BANNER = re.compile(r"^={3,}")
_PYTEST_E = re.compile(r"^E   (.*)$")
_COMMAND_TAIL_LINES = 40


def _clean(output: str | bytes) -> str:
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    return strip_control(output or "")


def _normalize_line(line: str) -> str:
    """Strip what varies between two runs of the same failure."""
    line = _PYTEST_TMP.sub("<tmp>", line)
    line = _TEMP_PATH.sub("<tmp>", line)
    line = _TIMESTAMP.sub("<time>", line)
    line = _CLOCK.sub("<time>", line)
    line = _EPOCH.sub("<time>", line)
    line = _FILE_LINE.sub(r"\1:N", line)
    line = _TRACEBACK_LINE.sub(r"\1N", line)
    line = _HEX.sub("0x?", line)
    line = _DURATION.sub("<duration>", line)
    line = _PID.sub(r"\1\2<pid>", line)
    line = _SEED.sub(r"\1<seed>", line)
    line = _WORKER.sub("gw?", line)
    return line.strip()


def _pytest_items(lines: Iterable[str]) -> list[str]:
    """Failing node ids (short summary) and each failure section's ``E`` lines."""
    items: set[str] = set()
    section: str | None = None
    e_lines: list[str] = []

    def close() -> None:
        if section is not None and e_lines:
            items.add(f"{section}: " + " | ".join(e_lines))

    for raw in lines:
        line = raw.rstrip()
        header = _PYTEST_SECTION.match(line)
        if header or _PYTEST_BANNER.match(line):
            close()
            section = _normalize_line(header.group(1)) if header else None
            e_lines = []
            continue
        summary = _PYTEST_SUMMARY.match(line)
        if summary:
            items.add(f"{summary.group(1)} {_normalize_line(summary.group(2))}")
            continue
        e_line = _PYTEST_E.match(line)
        if e_line and section is not None:
            text = _normalize_line(e_line.group(1))
            if text:
                e_lines.append(text)
    close()
    return sorted(items)


def normalize_failure(output: str, *, kind: str = "command") -> str:
    """The text a failure signature is computed from.

    ``kind="pytest"``: the failing node ids from pytest's short summary
    (``FAILED node - Exc: msg``, ``ERROR ...``) and the ``E`` lines of each failure
    section, normalized and sorted, one per line. If there are none (a crash
    before any test ran) it falls back to the rule for other commands.

    Any other kind: the last 40 non-empty lines, normalized.

    Normalizing removes line numbers (``file.py:123``, ``", line 12``), hex
    addresses, temp paths (``/tmp/<dir>``, pytest's ``pytest-of-*/pytest-N/name0``),
    durations and timestamps, PIDs, random seeds and xdist worker ids.
    """
    lines = _clean(output).split("\n")
    if str(kind) == "pytest":
        items = _pytest_items(lines)
        if items:
            return "\n".join(items)
    tail = [line for line in lines if line.strip()][-_COMMAND_TAIL_LINES:]
    return "\n".join(_normalize_line(line) for line in tail)


def failure_signature(output: str, *, kind: str = "command") -> str:
    """``"sha256:<hex>"`` of :func:`normalize_failure`: equal for the same failure.

    Two runs of one failure at different times in different temp directories give
    the same signature; a different assertion message gives a different one.
    """
    text = normalize_failure(output, kind=kind)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


_MAX_LINE = 200
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR)\s+\S")
_ERROR_LINE = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Failure)\b(?::|$)"
    r"|^\s*(?:error|fatal|ERROR|FATAL)(?:\[[^\]]*\])?:"
)


def first_meaningful_line(output: str) -> str:
    """The line that best says what failed, for a lesson; at most 200 characters.

    In order of preference: the first pytest ``E`` line (without the ``E``
    marker), the first ``FAILED``/``ERROR`` short-summary line, the first line
    naming an error (``ValueError: ...``, ``AssertionError``, ``error: ...``), else
    the last non-empty line. ``""`` for empty output.
    """
    lines = [line.strip() for line in _clean(output).split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    e_lines = (m.group(1).strip() for m in map(_PYTEST_E.match, lines) if m)
    found = (
        next((text for text in e_lines if text), None)
        or next((line for line in lines if _FAILED_LINE.match(line)), None)
        or next((line for line in lines if _ERROR_LINE.search(line)), None)
        or lines[-1]
    )
    if len(found) > _MAX_LINE:
        found = found[: _MAX_LINE - 3] + "..."
    return found

"""The run log's format and its MACs: the schema and MAC domain names, the line
and summary encodings, and signing and verifying them.

:mod:`pytest_loops.artifacts.runlog` writes the log with these,
:mod:`pytest_loops.artifacts.runlogread` reads and verifies it. The MACs are
HMACs under the per-user run-log key (:mod:`pytest_loops.runtime.trust`): each
event's chained over the one before, the summary's over its canonical form.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

from pytest_loops.runtime.trust import (
    KeyFileError,
    MacChain,
    canonical_json,
    json_mac,
    mac_matches,
    mac_of_stream,
    runlog_key,
    runlog_key_path,
)

SCHEMA = "pytest-loops.runlog/1"
INDEX_SCHEMA = "pytest-loops.index/1"
EVENT_DOMAIN = SCHEMA + " event"
SUMMARY_DOMAIN = SCHEMA + " summary"
NO_MACS = "it carries no MACs (written by an older pytest-loops, without a run-log key, or edited)"
FROM_STATE: Any = object()  # the key argument's default: the per-user key file


def dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str, allow_nan=False)


def _pretty(value: Any, level: int) -> str:
    """``value`` as ``json.dumps(..., indent=2)`` renders it at nesting ``level``."""
    return json.dumps(value, ensure_ascii=False, indent=2, default=str, allow_nan=False).replace(
        "\n", "\n" + "  " * level)


_STREAMED = ("iterations", "lessons")  # the summary's lists that grow with the run: one item at a time


class SummaryPieces:
    """The summary's text (``json.dumps(summary, indent=2)`` to the byte, scrubbed piece
    by piece) and its canonical form (the MAC's body: every piece as parsed back from
    the text, keys sorted) written to ``canonical`` as they are made."""

    def __init__(self, scrub: Callable[[str], str], canonical: BinaryIO | None) -> None:
        self.scrub = scrub
        self.canonical = canonical
        self.parts: dict[str, tuple[int, int]] = {}  # key -> (offset, length) in ``canonical``
        self.valid = True  # every piece read back as JSON with a canonical form

    def _keep(self, key: str, pieces: list[str]) -> None:
        if self.canonical is None or not self.valid:
            return
        start = self.canonical.tell()
        for number, piece in enumerate(pieces):
            try:
                body = canonical_json(json.loads(piece))
            except (TypeError, ValueError):
                self.valid = False
                return
            self.canonical.write(body if not number else b"," + body)
        self.parts[key] = (start, self.canonical.tell() - start)

    def text(self, summary: dict[str, Any]) -> Iterator[str]:
        if not summary:
            yield "{}"
            return
        yield "{"
        for number, (key, value) in enumerate(summary.items()):
            yield ("\n  " if not number else ",\n  ") + json.dumps(key, ensure_ascii=False) + ": "
            if key in _STREAMED and isinstance(value, Iterable) and not isinstance(value, (dict, str, bytes)):
                dicts = getattr(value, "dicts", None)  # a spill hands its records' dicts as stored
                yield from self._records(key, dicts() if callable(dicts) else value)
                continue
            piece = self.scrub(_pretty(value, 1))
            self._keep(key, [piece])
            yield piece

    def _records(self, key: str, records: Iterable[Any]) -> Iterator[str]:
        start = self.canonical.tell() if self.canonical is not None else 0
        if self.canonical is not None:
            self.canonical.write(b"[")
        count = 0
        for record in records:
            data = record.to_dict() if hasattr(record, "to_dict") else record
            piece = self.scrub(_pretty(data, 2))
            if self.canonical is not None and self.valid:
                try:
                    body = canonical_json(json.loads(piece))
                    self.canonical.write(body if not count else b"," + body)
                except (TypeError, ValueError):
                    self.valid = False
            yield ("[\n    " if not count else ",\n    ") + piece
            count += 1
        yield "\n  ]" if count else "[]"
        if self.canonical is not None:
            self.canonical.write(b"]")
            self.parts[key] = (start, self.canonical.tell() - start)

    def mac(self, key: bytes, domain: str) -> str | None:
        """The MAC of the canonical summary, None when a piece has no canonical form."""
        canonical = self.canonical
        if canonical is None or not self.valid:
            return None
        # the canonical object: keys sorted, each value as kept above, in one more file
        with tempfile.TemporaryFile() as whole:
            whole.write(b"{")
            for number, name in enumerate(sorted(self.parts)):
                offset, length = self.parts[name]
                whole.write((b"," if number else b"") + canonical_json(name) + b":")
                canonical.seek(offset)
                left = length
                while left > 0:
                    block = canonical.read(min(left, 1 << 16))
                    if not block:
                        break
                    whole.write(block)
                    left -= len(block)
            whole.write(b"}")
            size = whole.tell()
            whole.seek(0)
            return mac_of_stream(key, domain, "", whole, size)


def string_keys(obj: Any) -> bool:
    """Whether every dict in ``obj`` has string keys only (JSON turns others into
    strings, and sorts them otherwise: then a MAC of ``obj`` is not the MAC of its text
    parsed back)."""
    todo = [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if type(key) is not str:
                    return False
                if isinstance(value, (dict, list, tuple)):
                    todo.append(value)
        elif isinstance(item, (list, tuple)):
            todo.extend(v for v in item if isinstance(v, (dict, list, tuple)))
    return True


def _plain_json(obj: Any) -> bool:
    """Whether ``obj`` reads back from its JSON text as itself: dicts with string keys,
    lists, tuples, strings, numbers, booleans and None only. Then a MAC over it is the
    MAC of the text parsed back (int keys, which JSON turns into strings and sorts
    otherwise, and anything written through ``default=str`` are not)."""
    todo = [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str):
                    return False
                todo.append(value)
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif not (item is None or isinstance(item, (str, int, float))):
            return False
    return True


def sign_summary(text: str, key: bytes | None) -> str:
    """A summary's JSON text with its ``mac`` as the last key (unchanged without a
    key, or for JSON that has no canonical form: NaN, infinities)."""
    body = text.rstrip()
    if not key or not body.endswith("}"):
        return body
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    if not isinstance(obj, dict) or not obj or "mac" in obj:
        return body
    value = json_mac(key, SUMMARY_DOMAIN, obj)
    if value is None:
        return body
    return body[:-1].rstrip() + f',\n  "mac": "{value}"\n}}'


def sign_events(events: Sequence[dict[str, Any]], key: bytes) -> list[str]:
    """Event objects as run-log lines, each with its chained ``mac`` (as RunLogWriter
    writes them). For tools and tests that build a log by hand."""
    chain = MacChain(key, EVENT_DOMAIN)
    lines = []
    for event in events:
        body = {k: v for k, v in event.items() if k != "mac"}
        try:
            text = dump(body)
        except ValueError:  # NaN or an infinity: no MAC for it
            lines.append(json.dumps(body, ensure_ascii=False, default=str))
            continue
        value = chain.next(json.loads(text))
        lines.append(text if value is None else text[:-1] + (", " if body else "") + f'"mac": "{value}"}}')
    return lines


class Verifier:
    """Checks the MACs of one log as it is read; ``why()`` is None when all held."""

    def __init__(self, key: bytes | None, key_error: str | None) -> None:
        self.key = key
        self.key_error = key_error
        self.chain = MacChain(key, EVENT_DOMAIN) if key else None
        self.seen_mac = False
        self.failure: str | None = None

    def event(self, event: dict[str, Any], number: int) -> None:
        given = event.pop("mac", None)
        if given is not None:
            self.seen_mac = True
        if self.failure is None:
            if given is None:
                self.failure = f"line {number} has no MAC"
            elif self.chain is not None and not self.chain.verify(event, given):
                self.failure = f"line {number} fails its MAC check (edited, dropped, reordered or inserted lines)"

    def summary(self, data: dict[str, Any]) -> None:
        given = data.pop("mac", None)
        self.seen_mac = given is not None
        if given is None:
            self.failure = "no MAC"
        elif self.key is not None:
            expected = json_mac(self.key, SUMMARY_DOMAIN, data)
            if expected is None or not mac_matches(expected, given):
                self.failure = "its MAC does not match (the log was edited)"

    def why(self) -> str | None:
        if not self.seen_mac:
            return NO_MACS
        if self.key is None:
            return self.key_error or f"the run-log key {runlog_key_path()} is missing on this machine"
        return self.failure


def reader_key(key: Any) -> tuple[bytes | None, str | None]:
    if key is not FROM_STATE:
        return key, None if key else "no run-log key was given"
    try:
        found = runlog_key(create=False)
    except KeyFileError as exc:
        return None, str(exc)
    return found, None if found else f"the run-log key {runlog_key_path()} is missing on this machine"

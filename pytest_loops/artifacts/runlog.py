"""The run log: JSON lines while the loop runs, one JSON summary at the end.

A run killed with SIGKILL leaves its JSON-lines events, which `load_runlog`
turns into the same shape as a finished log (with ``verdict`` None). The final
summary replaces the events file by atomic rename, so a reader never sees half.

Every line, and the summary, carries a ``mac``: an HMAC under the per-user
run-log key (:mod:`pytest_loops.runtime.trust`), each event's chained over the one
before. `load_runlog` checks them and says so in ``verified`` /
``unverified_why``; `--resume` refuses a log that does not verify, and `show`
and `report` print "unverified" next to its verdict.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import (
    MAX_LINE_CHARS,
    MAX_RUN_BYTES,
    artifact_mode,
    load_json,
    open_append,
    read_text,
    write_fresh,
)
from pytest_loops.redact import redact_obj
from pytest_loops.runtime.trust import (
    KeyFileError,
    MacChain,
    canonical_json,
    json_mac,
    mac_matches,
    mac_of_stream,
    runlog_key,
    runlog_key_path,
    source_file_record,
)

SCHEMA = "pytest-loops.runlog/1"
INDEX_SCHEMA = "pytest-loops.index/1"
EVENT_DOMAIN = SCHEMA + " event"
SUMMARY_DOMAIN = SCHEMA + " summary"
NO_MACS = "it carries no MACs (written by an older pytest-loops, without a run-log key, or edited)"
_FROM_STATE: Any = object()  # the key argument's default: the per-user key file


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str, allow_nan=False)


def atomic_write_text(path: Path, text: str, *, private: bool = False) -> None:
    """Write a file so readers see the old or the new content, never a part (mode: artifact_mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, artifact_mode(private))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunLogWriter:
    """Appends events while the loop runs; writes the summary at the end.

    Each line gets a ``mac`` chained over the line before, and the summary one of
    its own, under ``key`` (default: the per-user run-log key, made on first use).
    When there is no usable key the log is written without MACs, never lost for
    it; readers then call it unverified. ``key_error`` says why.

    With ``on_error`` an OSError while writing (a full disk, a read-only mount) is
    passed to it as ``(path, error)`` instead of raised: the loop and its verdict
    go on. After a failed event no more events are appended (the chain would have
    a hole); the summary, a whole-file replacement, is still tried at the end.
    """

    def __init__(self, path: str | os.PathLike, scrub: Callable[[str], str] | None = None,
                 key: bytes | None = _FROM_STATE,
                 on_error: Callable[[str, OSError], None] | None = None, private: bool = False) -> None:
        self.path = Path(path)
        self.private = private  # 0600 (the private_artifacts setting); else the user's umask
        self.on_error = on_error
        self.broken = False  # an event could not be written
        self.scrub = scrub  # masks secret values in everything written
        self._key_arg = key
        self._chain: MacChain | None = None
        self._key_loaded = False
        self.key: bytes | None = None
        self.key_error: str | None = None
        self.source_file: dict[str, str] | None = None  # the loop file and its digest at the start
        self._events: BinaryIO | None = None  # the events file, open while the loop runs

    def _load_key(self) -> None:
        if self._key_loaded:
            return
        self._key_loaded = True
        if self._key_arg is _FROM_STATE:
            try:
                self.key = runlog_key(create=True)
            except KeyFileError as exc:
                self.key, self.key_error = None, str(exc)
        else:
            self.key = self._key_arg
        self._chain = MacChain(self.key, EVENT_DOMAIN) if self.key else None

    def _text(self, text: str) -> str:
        return self.scrub(text) if self.scrub is not None else text

    def _signed_line(self, text: str) -> str:
        """``text`` (one JSON object) with its chained ``mac`` as the last key."""
        self._load_key()
        if self._chain is None or not text.endswith("}"):
            return text
        try:
            obj = json.loads(text)
        except ValueError:
            return text
        if not isinstance(obj, dict) or "mac" in obj:
            return text
        value = self._chain.next(obj)
        if value is None:
            return text
        return text[:-1] + (", " if obj else "") + f'"mac": "{value}"}}'

    def _signed_event(self, event: dict[str, Any], text: str) -> str:
        """``text`` (``event`` as dumped, unscrubbed) signed from ``event`` in memory: an
        event whose keys are all strings and whose values JSON holds as they are reads
        back from its text as itself, so its canonical form needs no parse of the text."""
        self._load_key()
        if self._chain is None or not event or "mac" in event or not text.endswith("}") \
                or not _string_keys(event):
            return self._signed_line(text)
        value = self._chain.next(event)  # None: a value JSON cannot hold as it is
        if value is None:
            return self._signed_line(text)
        return text[:-1] + f', "mac": "{value}"}}'

    def _failed(self, exc: OSError) -> None:
        if self.on_error is None:
            raise exc
        self.on_error(str(self.path), exc)

    def _append(self, event: dict[str, Any], *, sync: bool = False) -> None:
        """One line, one write(2) to the events file opened once per run (the kernel
        keeps it across a kill -9); ``sync`` flushes it to the disk as well."""
        if self.broken:
            return
        text = _dump(event)
        line = self._signed_event(event, text) if self.scrub is None else self._signed_line(self._text(text))
        try:
            if self._events is None or self._events.closed:
                self._events = os.fdopen(open_append(self.path, artifact_mode(self.private)), "ab",  # noqa: SIM115
                                         buffering=0)  # closed in close()
            data = (line + "\n").encode("utf-8")
            written = self._events.write(data)
            if written is not None and written < len(data):  # a short write: the rest, in order
                view = memoryview(data)[written:]
                while view:
                    view = view[self._events.write(view) or 0:]
            if sync:
                os.fsync(self._events.fileno())
        except OSError as exc:
            self.broken = True
            self.close()
            self._failed(exc)

    def __del__(self) -> None:  # a writer dropped without finish() or close()
        events = getattr(self, "_events", None)
        if events is not None:
            try:
                events.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass

    def close(self) -> None:
        """Close the events file (events appended after this reopen it)."""
        events, self._events = self._events, None
        if events is not None:
            with contextlib.suppress(OSError):
                events.close()

    def start(self, header: dict[str, Any]) -> None:
        self._load_key()
        self.close()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_fresh(self.path, "")
        except OSError as exc:
            self.broken = True
            self._failed(exc)
        if self._chain is not None:
            self._chain.last = ""  # a new log starts a new chain
        header = dict(header)
        if "source_file" not in header:
            record = source_file_of(header)
            if record is not None:
                header["source_file"] = record
        self.source_file = header.get("source_file")
        self._append({"event": "start", "schema": SCHEMA, **header})

    def iteration(self, record: dict[str, Any], *, verdict: str | None = None, reason: str = "") -> None:
        """One finished iteration; ``verdict`` when it ended the loop (written in the
        same line, so a run killed after it resumes to that verdict)."""
        event: dict[str, Any] = {"event": "iteration", "record": record}
        if verdict is not None:
            event.update(verdict=verdict, reason=reason)
        # the verdict is on disk before anything else is done about it
        self._append(event, sync=verdict is not None)

    def revise_start(self, record: dict[str, Any]) -> None:
        """The iteration so far (verify, progress, guards), before its revise step runs."""
        self._append({"event": "revise_start", "record": record})

    def revise_end(self, iteration: int, exit_code: int | None) -> None:
        self._append({"event": "revise_end", "iter": iteration, "revise_exit": exit_code})

    def aborted(self, reason: str) -> None:
        self._append({"event": "aborted", "reason": reason}, sync=True)
        self.close()

    def finish(self, summary: dict[str, Any]) -> bool:
        """Replace the events by the summary (atomic rename); False when it could not
        be written (reported to ``on_error``): the events stay as they were.

        The summary is written piece by piece: its ``iterations`` may be any iterable
        of record dicts (a loop's spilled records), read once to write the text and
        its canonical form, so a run of any length is summarized in flat memory. The
        MAC covers the summary as a reader parses it back."""
        self._load_key()
        self.close()  # the summary replaces the events file
        if self.source_file is not None and "source_file" not in summary:
            summary = {**summary, "source_file": self.source_file}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, artifact_mode(self.private))
            with os.fdopen(fd, "w", encoding="utf-8") as out, tempfile.TemporaryFile() as canonical:
                pieces = _SummaryPieces(self._text, canonical if self.key else None)
                for piece in pieces.text(summary):
                    out.write(piece)
                value = pieces.mac(self.key, SUMMARY_DOMAIN) if self.key and summary else None
                out.write(f',\n  "mac": "{value}"\n}}\n' if value is not None else
                          ("\n}\n" if summary else "\n"))
                out.flush()
                os.fsync(out.fileno())
            publish(self.path, tmp)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            self._failed(exc)
            return False
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True


def publish(path: Path, written: str) -> None:
    """Put the complete file ``written`` (in the same directory) in place of ``path``:
    readers see the old file or the new one, never a part."""
    os.replace(written, path)


def _pretty(value: Any, level: int) -> str:
    """``value`` as ``json.dumps(..., indent=2)`` renders it at nesting ``level``."""
    return json.dumps(value, ensure_ascii=False, indent=2, default=str, allow_nan=False).replace(
        "\n", "\n" + "  " * level)


_STREAMED = ("iterations", "lessons")  # the summary's lists that grow with the run: one item at a time


class _SummaryPieces:
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


def _string_keys(obj: Any) -> bool:
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


def source_file_of(header: dict[str, Any]) -> dict[str, str] | None:
    """The file a run's loop came from (a `.loop` file, a config file) and its sha256
    now, from the header's spec: ``{"path": ..., "sha256": ...}`` or None.

    `RunLogWriter.start` records it in the start event and the summary, so
    `--resume` and the hand-off can tell the file was edited after the run
    started. An engine may also put it in the header itself (``header["source_file"]
    = source_file_of(header)``) before the spec is written.
    """
    spec = header.get("spec")
    if not isinstance(spec, dict):
        return None
    return source_file_record(spec.get("source"), spec.get("cwd"))


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
            text = _dump(body)
        except ValueError:  # NaN or an infinity: no MAC for it
            lines.append(json.dumps(body, ensure_ascii=False, default=str))
            continue
        value = chain.next(json.loads(text))
        lines.append(text if value is None else text[:-1] + (", " if body else "") + f'"mac": "{value}"}}')
    return lines


class _Verifier:
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


def _reader_key(key: Any) -> tuple[bytes | None, str | None]:
    if key is not _FROM_STATE:
        return key, None if key else "no run-log key was given"
    try:
        found = runlog_key(create=False)
    except KeyFileError as exc:
        return None, str(exc)
    return found, None if found else f"the run-log key {runlog_key_path()} is missing on this machine"


def _from_events(lines: list[str], path: Path, verifier: _Verifier) -> dict[str, Any]:
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


def load_runlog(path: str | os.PathLike, *, key: bytes | None = _FROM_STATE) -> dict[str, Any]:
    """Read a run log, finished or not. Bad input raises LoopUsageError (one line).

    Its MACs are checked under ``key`` (default: the per-user run-log key):
    ``verified`` is True when every one held, else False with ``unverified_why``
    saying why. The ``mac`` fields themselves are left out of the result.
    """
    p = Path(path)
    verifier = _Verifier(*_reader_key(key))
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
        if record.get("iter", index) != index:  # two writers, or an edit: never count twice
            raise bad(f"iteration record {index} is numbered {record.get('iter')!r} "
                      "(duplicate or missing iterations)")
        for key in ("unchanged_streak", "same_failure_streak"):
            if key in record and not count(record[key]):
                raise bad(f"iteration record {index}: {key} {record[key]!r} is not a count")
        for key in ("state_hash", "failure_signature"):
            if record.get(key) is not None and not isinstance(record[key], str):
                raise bad(f"iteration record {index}: {key} {record[key]!r} is not a string")
        if "elapsed_s" in record and not seconds(record["elapsed_s"]):  # the engine counts on it
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


# What a resumed run may change about the loop it continues: the limits and the
# revise step (`--max-iter`, `--revise`, ...); origin bookkeeping is not behaviour.
RESUME_MAY_CHANGE = ("guards", "revise", "no_progress_signal", "origin", "source", "ignored", "branches",
                     "max_parallel")


def check_verified(data: dict[str, Any], where: str) -> None:
    """A log whose MACs do not hold is not resumed: LoopUsageError naming ``where``."""
    if data.get("verified") is True:
        return
    why = data.get("unverified_why") or "it was not checked"
    raise LoopUsageError(f"cannot resume an unverified run log: {why}", location=where,
                         fix="start the loop afresh")


def check_spec_digest(data: dict[str, Any], where: str) -> None:
    """The log's ``spec_digest`` must be the digest of its own ``spec``."""
    from pytest_loops.spec import LoopSpec

    spec, digest = data.get("spec"), data.get("spec_digest")
    if not isinstance(spec, dict) or not isinstance(digest, str) or not digest:
        raise LoopUsageError("cannot resume: the run log has no spec and spec_digest", location=where,
                             fix="start the loop afresh")
    try:
        actual = LoopSpec.from_dict(spec).digest()
    except LoopUsageError as exc:
        raise LoopUsageError(f"cannot resume: its spec is not valid ({exc.message})", location=where,
                             fix="start the loop afresh") from None
    if actual != digest:
        raise LoopUsageError(f"cannot resume: its spec_digest {digest[:19]}... is not the digest of its "
                             f"spec ({actual[:19]}...)", location=where,
                             fix="the log was edited; start the loop afresh")


def spec_differences(logged: dict[str, Any], current: dict[str, Any],
                     fields: Sequence[str] | None = None) -> list[str]:
    """The top-level spec fields (of ``fields``, default all but RESUME_MAY_CHANGE)
    in which two spec dicts differ; checks are compared without their origin."""
    def normal(spec: dict[str, Any], key: str) -> Any:
        value = spec.get(key)
        if key == "checks" and isinstance(value, list):
            return [{k: v for k, v in c.items() if k != "source"} if isinstance(c, dict) else c for c in value]
        return value

    keys = list(fields) if fields is not None else sorted(
        k for k in {*logged, *current} if k not in RESUME_MAY_CHANGE)
    return [k for k in keys if normal(logged, k) != normal(current, k)]


def check_same_loop(data: dict[str, Any], spec: Any, where: str, *, what: str = "the loop being run",
                    fields: Sequence[str] | None = None) -> None:
    """The log's spec must be the loop being resumed (``spec``: a LoopSpec or its dict),
    apart from what a resumed run may change (its limits and revise step)."""
    current = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
    found = data.get("spec")
    logged: dict[str, Any] = found if isinstance(found, dict) else {}
    differ = spec_differences(logged, current, fields)
    if differ:
        raise LoopUsageError(f"cannot resume: {what} differs from the run log's loop "
                             f"({', '.join(differ)})", location=where,
                             fix="resume with the same loop, or start a new run")


def check_source_unchanged(data: dict[str, Any], where: str) -> None:
    """The loop file the run came from must be as it was when the run started."""
    record = data.get("source_file")
    if not isinstance(record, dict):
        return
    path, recorded = record.get("path"), record.get("sha256")
    if not isinstance(path, str) or not isinstance(recorded, str):
        raise LoopUsageError("cannot resume: its source_file record is not valid", location=where,
                             fix="start the loop afresh")
    from pytest_loops.runtime.trust import sha256_file

    try:
        now = sha256_file(path)
    except OSError:
        now = None
    if now != recorded:
        gone = "" if now is not None else " (it is gone)"
        log = data.get("log_path") or where
        raise LoopUsageError(f"{path} changed since the run {log}{gone}",
                             fix="review it and start a new run")


def check_trusted(data: dict[str, Any], where: str, *, spec: Any = None, what: str = "the loop being run",
                  fields: Sequence[str] | None = None) -> None:
    """Everything `--resume` must know before it takes over a run log: its MACs hold,
    its spec digest is its spec's, it is the loop being resumed (when ``spec`` is
    given), and its loop file is unchanged. LoopUsageError (one line) otherwise."""
    check_verified(data, where)
    check_spec_digest(data, where)
    if spec is not None:
        check_same_loop(data, spec, where, what=what, fields=fields)
    check_source_unchanged(data, where)


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


def cross_check_tine(run: dict[str, Any]) -> str | None:
    """Why a finished run log and the `.tine` its summary names disagree (verdict,
    iteration count) or the `.tine` is not intact and vouched by this machine's key;
    None when they agree or it names none. Imports opentine only when needed."""
    found = run.get("artifacts")
    artifacts: dict[str, Any] = found if isinstance(found, dict) else {}
    named = artifacts.get("tine")
    if not named or run.get("verdict") is None:
        return None
    if not isinstance(named, str):
        return "its artifacts.tine is not a path"
    path = Path(named)
    log = Path(str(run.get("log_path") or "."))
    if not path.is_absolute():
        path = log.parent / path
    if not path.is_file():
        beside = log.with_suffix(".tine")  # the directory was moved as a whole
        if run.get("log_path") and beside.is_file():
            path = beside
        else:
            return f"its .tine {named} is missing"
    from pytest_loops.artifacts.tineread import load_tine_summary, verify_tine

    ok, message = verify_tine(path)
    if not ok:
        return f"its .tine fails verification ({message})"
    try:
        tine = load_tine_summary(path)
    except ValueError as exc:
        return f"its .tine cannot be read ({exc})"
    mine = (run.get("verdict"), run.get("iterations_run"))
    theirs = (tine.get("verdict"), tine.get("iterations_run"))
    if mine != theirs:
        return (f"the log says {mine[0]} after {mine[1]} iteration(s), its .tine says "
                f"{theirs[0]} after {theirs[1]}")
    if run.get("spec_digest") and tine.get("spec_digest") and run["spec_digest"] != tine["spec_digest"]:
        return "the log's spec digest is not its .tine's"
    return None


def assess(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` (from `load_runlog`) with its `.tine` cross-checked: a verified log whose
    `.tine` disagrees becomes unverified. For `show` and `report`."""
    if run.get("verified") is True:
        why = cross_check_tine(run)
        if why is not None:
            run["verified"], run["unverified_why"] = False, why
    return run


def trust_note(run: dict[str, Any]) -> str | None:
    """"unverified: <why>" for a run not known to be authentic, None for one that is.

    A run dict that did not come through `load_runlog` (or `inspect.load_run`)
    carries no verification and is unverified."""
    if run.get("verified") is True:
        return None
    why = run.get("unverified_why")
    if not isinstance(why, str) or not why:
        why = "not read from a run log, so not checked"
    return f"unverified: {why}"


def append_index(index_path: str | os.PathLike, entry: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
    """One line per finished run in the artifacts directory's index, under a file lock
    (several lines in one write when given a list: ``pytest-loops merge``)."""
    path = Path(index_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [entry] if isinstance(entry, dict) else list(entry)
    # the loop's name may hold a secret
    line = "".join(_dump(redact_obj({"schema": INDEX_SCHEMA, **e})) + "\n" for e in entries)
    with FileLock(str(path) + ".lock"):
        with os.fdopen(open_append(path), "ab") as f:
            f.write(line.encode("utf-8"))

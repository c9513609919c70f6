"""The run log: JSON lines while the loop runs, one JSON summary at the end.

A run killed with SIGKILL leaves its JSON-lines events, which `load_runlog`
turns into the same shape as a finished log (with ``verdict`` None). The final
summary replaces the events file by atomic rename, so a reader never sees half.

Every line, and the summary, carries a ``mac``: an HMAC under the per-user
run-log key (:mod:`pytest_loops.runtime.trust`), each event's chained over the one
before. `load_runlog` checks them and says so in ``verified`` /
``unverified_why``; `--resume` refuses a log that does not verify, and `show`
and `report` print "unverified" next to its verdict.

This module writes the log. Its format and MACs are :mod:`runlogsign
<pytest_loops.artifacts.runlogsign>`, reading it :mod:`runlogread
<pytest_loops.artifacts.runlogread>`, what `--resume`, `show` and `report` check
of a read log :mod:`runlogtrust <pytest_loops.artifacts.runlogtrust>`; their
public names are importable from here as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from pytest_loops.artifacts.runlogread import (  # noqa: F401  (re-exported)
    check_shape,
    load_runlog,
    recorded_source_file,
)
from pytest_loops.artifacts.runlogsign import (  # noqa: F401  (re-exported)
    EVENT_DOMAIN,
    FROM_STATE,
    INDEX_SCHEMA,
    NO_MACS,
    SCHEMA,
    SUMMARY_DOMAIN,
    SummaryPieces,
    dump,
    sign_events,
    sign_summary,
    string_keys,
)
from pytest_loops.artifacts.runlogtrust import (  # noqa: F401  (re-exported)
    RESUME_MAY_CHANGE,
    assess,
    check_resumable,
    check_same_loop,
    check_source_unchanged,
    check_spec_digest,
    check_trusted,
    check_verified,
    cross_check_tine,
    spec_differences,
    trust_note,
)
from pytest_loops.limits import artifact_mode, open_append, write_fresh
from pytest_loops.redact import redact_obj
from pytest_loops.runtime.trust import KeyFileError, MacChain, runlog_key, source_file_record


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
                 key: bytes | None = FROM_STATE,
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
        if self._key_arg is FROM_STATE:
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
                or not string_keys(event):
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
        text = dump(event)
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
                pieces = SummaryPieces(self._text, canonical if self.key else None)
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


def append_index(index_path: str | os.PathLike, entry: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
    """One line per finished run in the artifacts directory's index, under a file lock
    (several lines in one write when given a list: ``pytest-loops merge``)."""
    path = Path(index_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [entry] if isinstance(entry, dict) else list(entry)
    # the loop's name may hold a secret
    line = "".join(dump(redact_obj({"schema": INDEX_SCHEMA, **e})) + "\n" for e in entries)
    with FileLock(str(path) + ".lock"):
        with os.fdopen(open_append(path), "ab") as f:
            f.write(line.encode("utf-8"))

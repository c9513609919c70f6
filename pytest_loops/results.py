"""What running a loop produces: command, check, iteration and loop results."""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, overload

from pytest_loops.spec import LoopSpec
from pytest_loops.verdict import Verdict


@dataclass(frozen=True)
class CommandResult:
    """One finished (or killed) subprocess.

    ``exit_code`` is None when the command could not be started at all (then
    ``start_error`` says why). ``timed_out`` is True when it was killed at its
    deadline. ``output_file`` holds the full combined stdout+stderr; ``tail`` is
    its last part, decoded.
    """

    command: str
    exit_code: int | None
    duration_s: float
    tail: str = ""
    output_file: str | None = None
    output_bytes: int = 0
    timed_out: bool = False
    start_error: str | None = None
    output_sha256: str | None = None  # hex digest of output_file's bytes, taken as they were written

    @property
    def started(self) -> bool:
        return self.start_error is None


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check in one iteration."""

    name: str
    kind: str
    passed: bool
    exit_code: int | None
    duration_s: float
    output_tail: str = ""
    output_file: str | None = None
    reason: str = ""
    runs: int = 1
    timed_out: bool = False
    needs_human: bool = False  # can never pass by machine: human / unimplemented hook
    output_digest: str | None = None
    command: str | None = None
    failing_tests: tuple[str, ...] = ()  # pytest node ids that failed, when known (for localization)

    def to_dict(self) -> dict[str, Any]:
        # field by field: dataclasses.asdict deep-copies every value, once per event
        return {
            "name": self.name, "kind": self.kind, "passed": self.passed, "exit_code": self.exit_code,
            "duration_s": self.duration_s, "output_tail": self.output_tail,
            "output_file": self.output_file, "reason": self.reason, "runs": self.runs,
            "timed_out": self.timed_out, "needs_human": self.needs_human,
            "output_digest": self.output_digest, "command": self.command,
            "failing_tests": tuple(self.failing_tests),
        }


def _nested(values: dict[str, Any]) -> bool:
    return any(isinstance(v, (dict, list, set, tuple)) for v in values.values())


@dataclass
class IterationRecord:
    """One propose -> verify -> guards -> reflect -> revise round.

    Keeps the loop-runner per-iteration keys (iter, verify_exit, duration_s,
    output_tail, state_hash, unchanged_streak, revise_exit) and adds ours.
    """

    iter: int
    started_at: str
    checks: list[CheckResult] = field(default_factory=list)
    verify_exit: int | None = None
    passed: bool = False
    duration_s: float = 0.0
    verify_duration_s: float = 0.0
    output_tail: str = ""
    state_hash: str | None = None
    state_changed: bool | None = None
    unchanged_streak: int = 0
    failure_signature: str | None = None
    same_failure_streak: int = 0
    lesson: str | None = None
    revise_exit: int | None = None
    revise_duration_s: float | None = None
    revise_output_file: str | None = None
    revise_tail: str = ""
    suspects_file: str | None = None  # suspects.json of this iteration (fault localization)
    suspects_note: str | None = None  # localization's cost, or why it was skipped (one line)
    protected_changes: list[str] = field(default_factory=list)  # undone: "path (modified)"
    scope_reverted: list[str] = field(default_factory=list)  # (older logs) edits outside scope, undone
    clean_room: list[CheckResult] = field(default_factory=list)  # the checks re-run before SUCCESS
    clean_room_s: float | None = None  # the clean-room confirmation, building the tree included
    audit_findings: list[str] = field(default_factory=list)  # what the diff audit flagged
    context_dropped: list[str] = field(default_factory=list)  # plugin sections left out of context.json, why
    caches_cleared: int = 0  # bytecode files the revise step wrote into the tree, removed after it
    guard: str | None = None  # the guard that ended the loop in this iteration
    guards_seen: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0  # loop time when this iteration ended
    # what the revise step reported spending (LOOP_USAGE_FILE or its agent preset); None: not reported
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    session_id: str | None = None  # the agent's session, continued by the next iteration
    usage_warning: str | None = None  # the usage file was not the documented shape (one line)
    # fan-out: per revise candidate, what it did and why it was chosen or not (empty: one revise)
    branches: list[dict[str, Any]] = field(default_factory=list)
    # the context adapter's call before this revise step: command, error, notes, mcp_config,
    # harness_install (empty: no adapter)
    context_adapter: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = self._to_dict()
        if self.branches:  # only with fan-out: other run logs keep their shape
            data["branches"] = copy.deepcopy(self.branches)
        if self.context_adapter:  # only with an adapter
            data["context_adapter"] = copy.deepcopy(self.context_adapter)
        return data

    def _to_dict(self) -> dict[str, Any]:
        # field by field, in field order (what dataclasses.asdict gave, without its deep copies)
        return {
            "iter": self.iter, "started_at": self.started_at,
            "checks": [c.to_dict() for c in self.checks],
            "verify_exit": self.verify_exit, "passed": self.passed, "duration_s": self.duration_s,
            "verify_duration_s": self.verify_duration_s, "output_tail": self.output_tail,
            "state_hash": self.state_hash, "state_changed": self.state_changed,
            "unchanged_streak": self.unchanged_streak, "failure_signature": self.failure_signature,
            "same_failure_streak": self.same_failure_streak, "lesson": self.lesson,
            "revise_exit": self.revise_exit, "revise_duration_s": self.revise_duration_s,
            "revise_output_file": self.revise_output_file, "revise_tail": self.revise_tail,
            "suspects_file": self.suspects_file, "suspects_note": self.suspects_note,
            "protected_changes": list(self.protected_changes),
            "scope_reverted": list(self.scope_reverted),
            "clean_room": [c.to_dict() for c in self.clean_room],
            "clean_room_s": self.clean_room_s, "audit_findings": list(self.audit_findings),
            "context_dropped": list(self.context_dropped),
            "caches_cleared": self.caches_cleared, "guard": self.guard,
            "guards_seen": copy.deepcopy(self.guards_seen) if _nested(self.guards_seen)
            else dict(self.guards_seen),
            "elapsed_s": self.elapsed_s,
            "cost_usd": self.cost_usd, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "session_id": self.session_id,
            "usage_warning": self.usage_warning,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IterationRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("protected_changes", "scope_reverted", "audit_findings", "context_dropped"):
            if key in kwargs and not isinstance(kwargs[key], list):
                raise TypeError(f"{key} is {type(kwargs[key]).__name__}, not a list")
        if "branches" in kwargs and not (isinstance(kwargs["branches"], list)
                                         and all(isinstance(b, dict) for b in kwargs["branches"])):
            raise TypeError("branches is not a list of objects")
        if "context_adapter" in kwargs and not isinstance(kwargs["context_adapter"], dict):
            raise TypeError(f"context_adapter is {type(kwargs['context_adapter']).__name__}, not an object")
        if "guards_seen" in kwargs and not isinstance(kwargs["guards_seen"], dict):
            raise TypeError(f"guards_seen is {type(kwargs['guards_seen']).__name__}, not an object")
        check_fields = {f.name for f in dataclasses.fields(CheckResult)}
        for key in ("checks", "clean_room"):
            kwargs[key] = [CheckResult(**_check_fields(c, check_fields))
                           for c in data.get(key) or [] if isinstance(c, dict)]
        return cls(**kwargs)


def _check_fields(data: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """A stored check's known fields; its failing tests a tuple again (JSON made it a list)."""
    fields: dict[str, Any] = {k: v for k, v in data.items() if k in known}
    if isinstance(fields.get("failing_tests"), list):
        fields["failing_tests"] = tuple(fields["failing_tests"])
    return fields


class IterationSpill(Sequence[IterationRecord]):
    """A loop's finished iterations in flat memory: the last ``keep`` as they are, the
    ones before as JSON lines in an unlinked temporary file, read back when asked for.

    A loop can run for days (a watch loop) or thousands of iterations; its records
    are written to the run log as they finish, so nothing needs them all in memory.
    A record goes to the file only when ``keep`` newer ones follow it, so one that
    is changed while its iteration's writers run is kept as changed. Equal to a list
    of the same records; ``list(spill)`` reads them all.
    """

    def __init__(self, records: Iterable[IterationRecord] = (), keep: int = 8) -> None:
        self._keep = max(1, keep)
        self._recent: deque[IterationRecord] = deque()
        self._offsets = array("q")  # where each spilled record's line starts
        self._file: IO[bytes] | None = None
        self._end = 0
        for record in records:
            self.append(record)

    def append(self, record: IterationRecord) -> None:
        self._recent.append(record)
        if len(self._recent) > self._keep:
            self._spill(self._recent.popleft())

    def _spill(self, record: IterationRecord) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="pytest-loops-iterations-")  # noqa: SIM115 - closed in close()
        line = (json.dumps(record.to_dict(), ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass")
        self._file.seek(self._end)
        self._file.write(line)
        self._offsets.append(self._end)
        self._end += len(line)

    def _load(self, index: int) -> IterationRecord:
        assert self._file is not None
        self._file.flush()
        self._file.seek(self._offsets[index])
        data = json.loads(self._file.readline().decode("utf-8", "surrogatepass"))
        return IterationRecord.from_dict(data)

    def __len__(self) -> int:
        return len(self._offsets) + len(self._recent)

    @overload
    def __getitem__(self, index: int) -> IterationRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[IterationRecord]: ...

    def __getitem__(self, index: int | slice) -> IterationRecord | list[IterationRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("iteration index out of range")
        spilled = len(self._offsets)
        return self._recent[index - spilled] if index >= spilled else self._load(index)

    def dicts(self) -> Iterator[dict[str, Any]]:
        """Each record as ``to_dict()`` gives it (a JSON round trip: tuples are lists),
        read from the file as it is, without making the records."""
        if self._file is not None and self._offsets:
            self._file.flush()
            self._file.seek(0)
            for _ in range(len(self._offsets)):
                yield json.loads(self._file.readline().decode("utf-8", "surrogatepass"))
        for record in list(self._recent):
            yield json.loads(json.dumps(record.to_dict(), ensure_ascii=False, default=str))

    def __iter__(self) -> Iterator[IterationRecord]:
        if self._file is not None and self._offsets:
            self._file.flush()
            self._file.seek(0)
            for _ in range(len(self._offsets)):
                line = self._file.readline()
                yield IterationRecord.from_dict(json.loads(line.decode("utf-8", "surrogatepass")))
        yield from list(self._recent)

    def __reversed__(self) -> Iterator[IterationRecord]:
        for i in range(len(self) - 1, -1, -1):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (IterationSpill, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IterationSpill({len(self)} iterations)"

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __del__(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            try:
                file.close()
            except Exception:  # noqa: BLE001 - nothing to report to at collection time
                pass


@dataclass
class LoopResult:
    """The verdict of one loop and everything that led to it."""

    spec: LoopSpec
    verdict: Verdict
    reason: str
    iterations: Sequence[IterationRecord]  # a list, or the loop's IterationSpill
    started_at: str
    ended_at: str
    elapsed_s: float
    log_path: str | None = None
    run_dir: str | None = None
    memory_page: str | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    sandbox: dict[str, str] = field(default_factory=dict)  # the isolation tier it ran in

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def iterations_run(self) -> int:
        return len(self.iterations)

    @property
    def succeeded(self) -> bool:
        return self.verdict is Verdict.SUCCESS

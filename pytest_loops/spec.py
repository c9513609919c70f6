"""LoopSpec, Check and Guards: the frozen, validated shape every loop source produces.

Nothing downstream of a LoopSpec knows whether it came from a `.loop` file, YAML,
a marker or the command line.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_loops.defaults import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_MAX_ITER,
    DEFAULT_NO_PROGRESS_K,
    NO_PROGRESS_SIGNALS,
    validate_guard_values,
)
from pytest_loops.errors import LoopUsageError

# What a loop may grant its revise step (LoopFlow's ctx capability groups): a plugin's
# section of the context file is kept only under a granted name.
GRANT_NAMES = ("skills", "agents", "mcps", "harnesses")


class CheckKind(enum.StrEnum):
    """What a `done when` check is."""

    COMMAND = "command"  # a shell command passes (exit 0), `times` runs in a row
    FINDS_NOTHING = "finds_nothing"  # exit 0 and empty output
    PYTEST = "pytest"  # a pytest node id passes in a fresh subprocess
    HUMAN = "human"  # a human confirms: never passes by machine -> ESCALATE
    HOOK = "hook"  # skill / judge checks: delegated to pytest_loop_run_check

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Check:
    """One `done when` condition. All checks of a loop must pass."""

    kind: CheckKind
    name: str
    command: str | None = None
    times: int = 1
    node_id: str | None = None
    text: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    source: str | None = None  # "file:line" where it was written
    hidden: bool = False  # never run in the working tree, never shown: run only in the clean room

    def __post_init__(self) -> None:
        kind = CheckKind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", dict(self.options))
        where = self.source or self.name
        if kind in (CheckKind.COMMAND, CheckKind.FINDS_NOTHING) and not (self.command or "").strip():
            raise LoopUsageError("a command check needs a non-empty command", location=where)
        if kind is CheckKind.PYTEST and not (self.node_id or "").strip():
            raise LoopUsageError("a test check needs a pytest node id", location=where)
        if not isinstance(self.times, int) or isinstance(self.times, bool) or self.times < 1:
            raise LoopUsageError(
                f"passes N times needs a positive integer, got {self.times!r}", location=where
            )
        if self.timeout is not None and not (
            isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout) and self.timeout > 0
        ):
            raise LoopUsageError(
                f"a check timeout must be a positive number of seconds, got {self.timeout!r}",
                location=where,
            )

    @classmethod
    def command_passes(cls, command: str, times: int = 1, **kw: Any) -> Check:
        name = f'"{command}" passes' + (f" {times} times" if times > 1 else "")
        return cls(CheckKind.COMMAND, kw.pop("name", name), command=command, times=times, **kw)

    @classmethod
    def finds_nothing(cls, command: str, **kw: Any) -> Check:
        return cls(CheckKind.FINDS_NOTHING, kw.pop("name", f'"{command}" finds nothing'),
                   command=command, **kw)

    @classmethod
    def test_passes(cls, node_id: str, **kw: Any) -> Check:
        return cls(CheckKind.PYTEST, kw.pop("name", f'the test "{node_id}" passes'),
                   node_id=node_id, **kw)

    @classmethod
    def human_confirms(cls, text: str, **kw: Any) -> Check:
        return cls(CheckKind.HUMAN, kw.pop("name", f'a human confirms "{text}"'), text=text, **kw)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        data["options"] = dict(self.options)
        if not self.hidden:
            del data["hidden"]  # specs (and their digests) without hidden checks are as before
        return data


@dataclass(frozen=True)
class Guards:
    """The stop rules. 0 turns a guard off, except max_iter, which is always on."""

    max_iter: int = DEFAULT_MAX_ITER
    budget_seconds: float = DEFAULT_BUDGET_SECONDS
    no_progress_k: int = DEFAULT_NO_PROGRESS_K
    escalate_after: int = DEFAULT_ESCALATE_AFTER
    max_cost: float = 0.0  # US dollars the revise steps may spend in one loop; 0: no cap
    max_tokens: int = 0  # tokens (in + out) the revise steps may use in one loop; 0: no cap

    def __post_init__(self) -> None:
        problems = validate_guard_values(
            max_iter=self.max_iter,
            budget_seconds=self.budget_seconds,
            no_progress_k=self.no_progress_k,
            escalate_after=self.escalate_after,
            max_cost=self.max_cost,
            max_tokens=self.max_tokens,
        )
        if problems:
            name, message = problems[0]
            raise LoopUsageError(message, location=name)
        object.__setattr__(self, "budget_seconds", float(self.budget_seconds))
        object.__setattr__(self, "max_cost", float(self.max_cost))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("max_cost", "max_tokens"):  # only when set: other loops keep their digests
            if not data[key]:
                del data[key]
        return data


@dataclass(frozen=True)
class IgnoredLine:
    """A line of a loop file that LoopFlow accepts but this project does not act on."""

    line: int
    text: str
    why: str = "not acted on by pytest-loops"

    SHOWN_CHARS = 200  # a line is quoted back to the user: a minified blob is cut, not printed

    def __post_init__(self) -> None:
        if len(self.text) > self.SHOWN_CHARS:
            cut = self.text[:self.SHOWN_CHARS] + f"... (+{len(self.text) - self.SHOWN_CHARS} characters)"
            object.__setattr__(self, "text", cut)


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def slugify(name: str) -> str:
    """A file-name-safe form of a loop name."""
    slug = _SLUG.sub("-", name).strip("-.")
    return slug[:80] or "loop"


@dataclass(frozen=True)
class LoopSpec:
    """A loop: goal, checks, revise step, guards and what to watch."""

    name: str
    checks: tuple[Check, ...]
    goal: str = ""
    revise: str | None = None
    guards: Guards = field(default_factory=Guards)
    state_paths: tuple[str, ...] = ()
    memory_page: str | None = None
    reflexion: bool = True
    cwd: str = "."
    stop_message: str | None = None
    escalate_when_blocked: bool = False
    no_progress_signal: str = "state"  # state | failure | both: what counts as no progress
    look_at: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    grants: tuple[str, ...] = ()  # of GRANT_NAMES: the plugin sections the context file may carry
    ignored: tuple[IgnoredLine, ...] = ()
    branches: int = 1  # revise candidates per iteration (fan-out), each in its own copy of the tree
    max_parallel: int = 0  # candidates run at once; 0: the CPU count
    origin: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None
    # how the loop is watched (`watch: poll "CMD" every 30s`, `silence: 10 minutes`):
    # poll, interval, silence; used by `pytest-loops watch` only, empty otherwise
    watch: Mapping[str, Any] = field(default_factory=dict)
    # a loop nobody named (`pytest-loops run` without --name, the session fix-loop): its
    # name is a placeholder, and its identity (lessons page, run logs) comes from what it does
    anonymous: bool = False
    context_adapter: str | None = None  # a command run before each revise step (the ctx adapter contract)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise LoopUsageError("a loop needs a non-empty name", location=self.source)
        for attr in ("checks", "state_paths", "look_at", "protect", "scope", "grants", "ignored"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        unknown = [g for g in self.grants if g not in GRANT_NAMES]
        if unknown:
            raise LoopUsageError(f"{unknown[0]!r} is not a grant; valid: {', '.join(GRANT_NAMES)}",
                                 location=self.source, fix="grant only those names (or none)")
        object.__setattr__(self, "grants", tuple(dict.fromkeys(self.grants)))
        object.__setattr__(self, "origin", dict(self.origin))
        object.__setattr__(self, "watch", dict(self.watch))
        if self.checks and all(c.hidden for c in self.checks):
            raise LoopUsageError(f"loop {self.name!r} has only hidden checks; at least one check must be "
                                 "visible, so the revise step has something to work towards",
                                 location=self.source, fix="make one check visible (drop hidden: true)")
        if not self.checks:
            raise LoopUsageError(
                f"loop {self.name!r} has no checks", location=self.source,
                fix="add at least one `done when` check (or --verify CMD)",
            )
        if self.revise is not None and not self.revise.strip():
            object.__setattr__(self, "revise", None)
        if self.context_adapter is not None and not self.context_adapter.strip():
            object.__setattr__(self, "context_adapter", None)
        for key, low in (("branches", 1), ("max_parallel", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoopUsageError(f"{key} must be an integer >= {low}, got {value!r}", location=self.source)
        if self.no_progress_signal not in NO_PROGRESS_SIGNALS:
            raise LoopUsageError(
                f"{self.no_progress_signal!r} is not a valid no_progress_signal; valid: "
                f"{', '.join(NO_PROGRESS_SIGNALS)}", location=self.source)

    @property
    def identity(self) -> str:
        """Who this loop is for its lessons and run logs: its name, or for a loop nobody
        named, the name and a digest of its checks, revise command and goal (``loop#3f2a91c0``):
        two unnamed loops that do different things never share lessons, and the same
        loop run again finds its own."""
        if not self.anonymous:
            return self.name
        what = {"checks": [{k: v for k, v in c.to_dict().items() if k not in ("source", "timeout")}
                           for c in self.checks],
                "revise": self.revise, "goal": self.goal}
        blob = json.dumps(what, sort_keys=True, separators=(",", ":"), default=str).encode()
        return f"{self.name}#{hashlib.sha256(blob).hexdigest()[:8]}"

    @property
    def slug(self) -> str:
        """The file-name form of the identity (run logs, lessons page): unique per identity,
        no secret in it."""
        from pytest_loops.redact import name_slug

        return name_slug(self.identity)

    def replace(self, **changes: Any) -> LoopSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = self._to_dict()
        # only when set: a loop without fan-out keeps the digest it always had
        if self.branches != 1:
            data["branches"] = self.branches
        if self.max_parallel:
            data["max_parallel"] = self.max_parallel
        return data

    def _to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "goal": self.goal,
            "checks": [c.to_dict() for c in self.checks],
            "revise": self.revise,
            "guards": self.guards.to_dict(),
            "state_paths": list(self.state_paths),
            "memory_page": self.memory_page,
            "reflexion": self.reflexion,
            "cwd": self.cwd,
            "stop_message": self.stop_message,
            "escalate_when_blocked": self.escalate_when_blocked,
            "no_progress_signal": self.no_progress_signal,
            "look_at": list(self.look_at),
            "protect": list(self.protect),
            "scope": list(self.scope),
            **({"grants": list(self.grants)} if self.grants else {}),  # specs without grants digest as before
            "ignored": [dataclasses.asdict(i) for i in self.ignored],
            "origin": dict(self.origin),
            "source": self.source,
            **({"watch": dict(self.watch)} if self.watch else {}),
            **({"anonymous": True} if self.anonymous else {}),  # named loops digest as before
            **({"context_adapter": self.context_adapter} if self.context_adapter else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoopSpec:
        """The inverse of :meth:`to_dict` (a run log's ``spec``). Bad data raises LoopUsageError."""
        if not isinstance(data, Mapping):
            raise LoopUsageError(f"a loop spec must be a mapping, got {type(data).__name__}")
        _check_field_types(data)
        try:
            checks = tuple(
                Check(**{k: v for k, v in c.items() if k in _CHECK_FIELDS}) for c in data.get("checks", ())
            )
            guards = Guards(**{k: v for k, v in (data.get("guards") or {}).items() if k in _GUARD_FIELDS})
            ignored = tuple(IgnoredLine(**i) for i in data.get("ignored", ()))
            kwargs = {k: v for k, v in data.items() if k in _SPEC_FIELDS}
            kwargs.update(checks=checks, guards=guards, ignored=ignored)
            return cls(**kwargs)
        except (TypeError, ValueError, AttributeError) as exc:
            raise LoopUsageError(f"not a valid loop spec: {exc}") from None

    def shown_dict(self) -> dict[str, Any]:
        """The spec as the run log shows it while the loop runs (a revise step can read
        the log): what a hidden check runs is not in it."""
        data = self.to_dict()
        for i, check in enumerate(data["checks"]):
            if check.get("hidden"):
                data["checks"][i] = {"kind": check["kind"], "name": f"hidden check {i + 1}", "hidden": True,
                                     "command": "(hidden)" if check.get("command") else None,
                                     "node_id": "(hidden)" if check.get("node_id") else None}
        return data

    def digest(self) -> str:
        """sha256 of the loop's behaviour-relevant fields (not its origin bookkeeping)."""
        data = self.to_dict()
        for key in ("origin", "source", "ignored"):
            data.pop(key)
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class Pipeline:
    """Stages run in order, fail-fast: a stage that does not reach SUCCESS stops the rest."""

    name: str
    stages: tuple[LoopSpec, ...]
    source: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))


def parse_grants(text: str, where: str) -> tuple[str, ...]:
    """``skills, mcps`` (or ``none``) as grant names; anything else is one LoopUsageError line."""
    names = [n.strip().lower() for n in text.replace(" ", ",").split(",") if n.strip()]
    if names == ["none"]:
        return ()
    for name in names:
        if name not in GRANT_NAMES:
            raise LoopUsageError(f"{name!r} is not a grant", location=where,
                                 fix=f"grant only {', '.join(GRANT_NAMES)} (or none)")
    if not names:
        raise LoopUsageError("no grant given", location=where, fix=f"list {', '.join(GRANT_NAMES)}, or none")
    return tuple(dict.fromkeys(names))


def _check_field_types(data: Mapping[str, Any]) -> None:
    """Wrong JSON types in a stored spec are bad input here, not a TypeError when the
    loop runs (a path that is a number, a revise command that is a list)."""
    def wrong(key: str, value: Any, what: str) -> LoopUsageError:
        return LoopUsageError(f"not a valid loop spec: {key} must be {what}, got {type(value).__name__} {value!r}")

    for key, optional in (("name", False), ("goal", False), ("cwd", False), ("no_progress_signal", False),
                          ("revise", True), ("context_adapter", True), ("memory_page", True),
                          ("stop_message", True), ("source", True)):
        value = data.get(key)
        if key in data and not (isinstance(value, str) or (optional and value is None)):
            raise wrong(key, value, "a string" + (" or null" if optional else ""))
    for key in ("reflexion", "escalate_when_blocked", "anonymous"):
        if key in data and not isinstance(data[key], bool):
            raise wrong(key, data[key], "true or false")
    for key in ("branches", "max_parallel"):
        if key in data and (isinstance(data[key], bool) or not isinstance(data[key], int)):
            raise wrong(key, data[key], "an integer")
    for key in ("state_paths", "look_at", "protect", "scope", "grants"):
        value = data.get(key, [])
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise wrong(key, value, "a list of strings")
    for key in ("checks", "ignored"):
        value = data.get(key, [])
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, Mapping) for v in value):
            raise wrong(key, value, "a list of objects")
    for check in data.get("checks", ()):
        for key in ("name", "command", "node_id", "text", "source"):
            value = check.get(key)
            if (value is not None or key == "name") and not isinstance(value, str):
                raise wrong(f"checks.{key}", value, "a string")
        if not isinstance(check.get("options", {}), Mapping):
            raise wrong("checks.options", check["options"], "an object")
        if not isinstance(check.get("hidden", False), bool):
            raise wrong("checks.hidden", check["hidden"], "true or false")
    origin = data.get("origin", {})
    if not isinstance(origin, Mapping) or not all(isinstance(v, str) for v in origin.values()):
        raise wrong("origin", origin, "an object of strings")


_CHECK_FIELDS = {f.name for f in dataclasses.fields(Check)}
_GUARD_FIELDS = {f.name for f in dataclasses.fields(Guards)}
_SPEC_FIELDS = {f.name for f in dataclasses.fields(LoopSpec)}

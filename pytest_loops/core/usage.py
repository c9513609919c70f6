"""What a revise step spent: money, tokens and the agent's session.

Any revise command may report it: the harness names a file in ``LOOP_USAGE_FILE``
(outside the working tree, writable in every isolation tier) and reads it after the
step. Its shape is one small JSON object, every key optional::

    {"cost_usd": 0.0123, "input_tokens": 5120, "output_tokens": 830, "session_id": "abc"}

The figures are what this revise step spent (not a running total of the session);
the file may be rewritten while the step runs (the live progress line shows the
latest). A file that is not that shape is one warning line on the iteration, never
a crash; a missing file means the step reported nothing. The agent presets
(:mod:`pytest_loops.agents`) write the same file from their CLI's own output.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.verdict import Verdict

USAGE_VARIABLE = "LOOP_USAGE_FILE"
MAX_USAGE_BYTES = 64 << 10  # a usage file is a few lines: past this it is not one
SHAPE = '{"cost_usd": 0.01, "input_tokens": 100, "output_tokens": 20, "session_id": "..."}'


@dataclass(frozen=True)
class Usage:
    """What one revise step (or a whole loop, summed) spent; None: not reported."""

    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    session_id: str | None = None

    @property
    def tokens(self) -> int | None:
        """Input and output tokens together (None when neither was reported)."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    @property
    def empty(self) -> bool:
        return self.cost_usd is None and self.tokens is None and self.session_id is None

    def plus(self, other: Usage) -> Usage:
        """Both summed; the later session id wins."""
        return Usage(cost_usd=_add(self.cost_usd, other.cost_usd),
                     input_tokens=_add(self.input_tokens, other.input_tokens),
                     output_tokens=_add(self.output_tokens, other.output_tokens),
                     session_id=other.session_id or self.session_id)

    def to_dict(self) -> dict[str, Any]:
        """The reported keys only (the file's shape)."""
        data: dict[str, Any] = {"cost_usd": self.cost_usd, "input_tokens": self.input_tokens,
                                "output_tokens": self.output_tokens, "session_id": self.session_id}
        return {k: v for k, v in data.items() if v is not None}


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    total = a + b
    return round(total, 6) if isinstance(total, float) else total


def from_mapping(data: Any) -> Usage:
    """A usage object from parsed JSON; ValueError (one line) when it is not the shape."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object like {SHAPE}")
    values: dict[str, Any] = {}
    for key in ("cost_usd", "input_tokens", "output_tokens"):
        value = data.get(key)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(f"{key} is {json.dumps(value)[:40]}; expected a number >= 0")
        if key != "cost_usd":
            if value != int(value):
                raise ValueError(f"{key} is {value!r}; expected a whole number")
            value = int(value)
        values[key] = float(value) if key == "cost_usd" else value
    session = data.get("session_id")
    if session is not None:
        if not isinstance(session, str) or not session.strip() or len(session) > 200 or "\n" in session:
            raise ValueError("session_id is not a one-line string of at most 200 characters")
        values["session_id"] = session.strip()
    return Usage(**values)


def read_usage(path: str | os.PathLike[str]) -> tuple[Usage | None, str | None]:
    """(the usage the file reports, None) or (None, a one-line warning); (None, None)
    when there is no file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_USAGE_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot read it ({exc.strerror or exc})"
    if len(raw) > MAX_USAGE_BYTES:
        return None, f"{path}: over {MAX_USAGE_BYTES} bytes; expected {SHAPE}"
    if not raw.strip():
        return None, None  # made and not written (yet): nothing reported
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, f"{path}: not UTF-8 text; expected {SHAPE}"
    except ValueError as exc:
        return None, f"{path}: not JSON ({exc}); expected {SHAPE}"
    try:
        return from_mapping(data), None
    except ValueError as exc:
        return None, f"{path}: {exc}"


def write_usage(path: str | os.PathLike[str], usage: Usage) -> None:
    """Write ``usage`` in the file's shape (by rename: a reader never sees half of it)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(usage.to_dict()) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def total(usages: Iterable[Usage | None]) -> Usage:
    """Every usage summed."""
    out = Usage()
    for usage in usages:
        if usage is not None:
            out = out.plus(usage)
    return out


def of_record(record: Any) -> Usage:
    """The usage an iteration record (or its run-log dict) holds."""
    get = record.get if isinstance(record, Mapping) else (lambda key: getattr(record, key, None))
    try:
        return from_mapping({k: get(k) for k in ("cost_usd", "input_tokens", "output_tokens", "session_id")})
    except ValueError:
        return Usage()  # an edited log's bad figure counts as not reported


def describe(usage: Usage) -> str:
    """``$0.0123, 5,950 tokens`` (what was reported), "" when nothing was."""
    parts = []
    if usage.cost_usd is not None:
        parts.append(money(usage.cost_usd))
    if usage.tokens is not None:
        parts.append(f"{usage.tokens:,} tokens")
    return ", ".join(parts)


def money(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def usage_summary(iterations: Iterable[Any]) -> dict[str, Any]:
    """``{"usage": {cost_usd, input_tokens, output_tokens, tokens}}``: what a loop's revise
    steps reported spending, summed (the run log's summary, the ``.tine``'s done step);
    {} when none reported anything."""
    spent = total(of_record(r) for r in iterations)
    if spent.cost_usd is None and spent.tokens is None:
        return {}
    data: dict[str, Any] = {k: v for k, v in spent.to_dict().items() if k != "session_id"}
    data["tokens"] = spent.tokens
    return {"usage": data}


# -- what the engine does with it ------------------------------------------------------------


def record_usage(usage_dir: Path | None, record: Any) -> None:
    """What one iteration's revise step (and its fan-out candidates) reported, into ``record``."""
    if usage_dir is None:
        return
    found: list[Usage] = []
    for path in sorted(usage_dir.glob(f"*iter-{record.iter:03d}.json")):
        usage, warning = read_usage(path)
        if warning:
            record.usage_warning = warning
        if usage is not None:
            found.append(usage)
    spent = total(found)
    record.cost_usd, record.input_tokens, record.output_tokens = spent.cost_usd, spent.input_tokens, spent.output_tokens
    record.session_id = spent.session_id


def spent_seen(guards: Any, records: Iterable[Any]) -> dict[str, Any]:
    """The run log's ``guards_seen`` entries: the loop's spend so far (``spent/cap`` with a cap)."""
    spent = total(of_record(r) for r in records)
    seen: dict[str, Any] = {}
    if spent.cost_usd is not None or guards.max_cost:
        seen["cost_usd"] = (f"{spent.cost_usd or 0:.6g}/{guards.max_cost:g}" if guards.max_cost
                            else round(spent.cost_usd or 0, 6))
    if spent.tokens is not None or guards.max_tokens:
        seen["tokens"] = f"{spent.tokens or 0}/{guards.max_tokens}" if guards.max_tokens else spent.tokens
    return seen


def spent_guard(guards: Any, records: Iterable[Any], record: Any) -> tuple[Any, str]:
    """max_cost and max_tokens over everything the loop's revise steps reported (a resumed
    run's iterations too): (TIMEOUT, its reason) once one is reached, else (None, "")."""
    if not guards.max_cost and not guards.max_tokens:
        return None, ""
    spent = total(of_record(r) for r in records)
    if guards.max_cost and spent.cost_usd is not None and spent.cost_usd >= guards.max_cost:
        record.guard = "max_cost"
        return Verdict.TIMEOUT, (f"max_cost of {money(guards.max_cost)} reached: the revise steps have spent "
                                 f"{money(spent.cost_usd)} after iteration {record.iter}")
    if guards.max_tokens and spent.tokens is not None and spent.tokens >= guards.max_tokens:
        record.guard = "max_tokens"
        return Verdict.TIMEOUT, (f"max_tokens of {guards.max_tokens:,} reached: the revise steps have used "
                                 f"{spent.tokens:,} tokens after iteration {record.iter}")
    return None, ""

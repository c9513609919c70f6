"""Shards: which loops one CI job of N runs (``--loop-shard=I/N``), and its record.

A *unit* is what must stay in one job: a loop file's loop (a pipeline as a whole),
a test with a loop marker, or a group of the session fix-loop's failing tests that
fail in the same code. Units are assigned greedily, longest first, each onto the
shard with the least time so far; a unit's time is its loops' last known duration
in ``index.jsonl`` (the mean of the known ones when it has none, 1 s when none is
known), and ties are broken by a sha256 of the unit's identity. Every job given the
same units and the same index computes the same split, without talking to the
others; ``pytest-loops merge`` checks the record each job leaves (``shard.json``)
for shards missing or claimed twice.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.runlog import atomic_write_text
from pytest_loops.limits import MiB

SHARD_FILE = "shard.json"
SHARD_SCHEMA = "pytest-loops.shard/1"
MAX_INDEX_BYTES = 64 * MiB  # an index bigger than this is not read for durations
DEFAULT_WEIGHT = 1.0


@dataclass(frozen=True)
class Unit:
    """What one job runs whole: its identity and the loop names its time is read under."""

    identity: str
    names: tuple[str, ...]


def identity_hash(identity: str) -> int:
    """A stable number for an identity: the same on every machine and Python."""
    return int.from_bytes(hashlib.sha256(identity.encode("utf-8", "surrogatepass")).digest()[:8], "big")


def read_durations(index: str | os.PathLike) -> dict[str, float]:
    """Loop name -> its last recorded ``elapsed_s`` in an ``index.jsonl`` (later lines win).

    A missing, unreadable or oversized index, and lines that are not index lines,
    give nothing: durations only weigh the split, they never fail a run."""
    path = Path(index)
    found: dict[str, float] = {}
    try:
        if not path.is_file() or path.stat().st_size > MAX_INDEX_BYTES:
            return found
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        name, elapsed = entry.get("loop"), entry.get("elapsed_s")
        if isinstance(name, str) and isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) \
                and elapsed >= 0 and elapsed == elapsed and elapsed != float("inf"):
            found[name] = float(elapsed)
    return found


def unit_weights(units: Sequence[Unit], durations: Mapping[str, float]) -> dict[str, float]:
    """Each unit's expected time: the sum of its loops' known durations; a unit with none
    known weighs the mean of the known units (1 s when nothing is known)."""
    known: dict[str, float] = {}
    for unit in units:
        times = [durations[name] for name in unit.names if name in durations]
        if times:
            known[unit.identity] = sum(times)
    fallback = (sum(known.values()) / len(known)) if known else DEFAULT_WEIGHT
    return {unit.identity: known.get(unit.identity, fallback) for unit in units}


def assign(units: Sequence[Unit], total: int, durations: Mapping[str, float] | None = None) -> dict[str, int]:
    """Unit identity -> its shard (1..total): longest first onto the lightest shard."""
    weights = unit_weights(units, durations or {})
    order = sorted({u.identity for u in units}, key=lambda i: (-weights[i], identity_hash(i), i))
    heap = [(0.0, shard) for shard in range(1, total + 1)]  # (time so far, shard): lightest, then lowest
    chosen: dict[str, int] = {}
    for identity in order:
        load, shard = heapq.heappop(heap)
        chosen[identity] = shard
        heapq.heappush(heap, (load + weights[identity], shard))
    return chosen


def shard_loads(units: Sequence[Unit], total: int, durations: Mapping[str, float] | None = None) -> list[float]:
    """The expected time of each shard (1..total, as a list) under :func:`assign`."""
    weights = unit_weights(units, durations or {})
    loads = [0.0] * total
    for identity, shard in assign(units, total, durations).items():
        loads[shard - 1] += weights[identity]
    return loads


def mine(units: Sequence[Unit], index: int, total: int, durations: Mapping[str, float] | None = None) -> set[str]:
    """The identities of the units shard ``index`` of ``total`` runs."""
    return {identity for identity, shard in assign(units, total, durations).items() if shard == index}


# -- the session fix-loop's failing tests: grouped by the code they fail in ----------------

def failure_site(report: Any, rootdir: Path, is_test_file: Any) -> str:
    """Where a failed test fails, as a path relative to the rootdir: the innermost frame
    of its traceback in the project that is not a test file; else the test's own file.

    Tests that fail in the same module share a site, so one bug's tests stay in one shard.
    """
    test_file = str(getattr(report, "nodeid", "")).split("::", 1)[0]
    entries = getattr(getattr(getattr(report, "longrepr", None), "reprtraceback", None), "reprentries", None)
    chain = getattr(getattr(report, "longrepr", None), "chain", None)
    if chain:  # an exception raised while handling another: the last one in the chain
        try:
            entries = chain[-1][0].reprentries
        except (AttributeError, IndexError, TypeError):
            pass
    root = rootdir.resolve()
    for entry in reversed(list(entries or ())):
        location = getattr(entry, "reprfileloc", None)
        path = getattr(location, "path", None)
        if not isinstance(path, str) or not path:
            continue
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = root / candidate
        try:
            relative = candidate.resolve().relative_to(root).as_posix()
        except (OSError, ValueError):
            continue  # outside the project: a library's frame
        if not is_test_file(relative):
            return relative
    return test_file


def failure_units(sites: Mapping[str, str]) -> list[Unit]:
    """The fix-loop's units: one per failure site, identity ``failing tests in SITE``."""
    return [Unit(f"failing tests in {site}", ()) for site in sorted(set(sites.values()))]


# -- the job's record ----------------------------------------------------------------------

def write_record(artifacts_dir: Path, shard: str, units: Iterable[tuple[str, str]], run_id: str,
                 logs: Iterable[str] = ()) -> Path:
    """``shard.json``: which shard this job was, which units (kind, identity) it ran and
    the run logs (names in ``runs/``) this run wrote: an index restored from a cache
    also holds the lines of earlier runs, which the merge leaves out."""
    path = artifacts_dir / SHARD_FILE
    body = {"schema": SHARD_SCHEMA, "shard": shard, "run": run_id,
            "units": [{"kind": kind, "id": identity} for kind, identity in sorted(set(units))],
            "logs": sorted({Path(log).name for log in logs})}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    return path


def read_record(artifacts_dir: Path) -> dict[str, Any] | None:
    """A job's ``shard.json`` (None when it has none); ValueError naming what is wrong."""
    path = artifacts_dir / SHARD_FILE
    if not path.exists():
        return None
    from pytest_loops.settings import parse_shard

    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{path}: bigger than {MAX_INDEX_BYTES // MiB} MiB")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    except ValueError:
        raise ValueError(f"{path}: not JSON") from None
    if not isinstance(data, dict) or data.get("schema") != SHARD_SCHEMA:
        raise ValueError(f"{path}: not a pytest-loops shard record (schema {SHARD_SCHEMA!r})")
    try:
        data["index"], data["total"] = parse_shard(data.get("shard"))
    except ValueError:
        raise ValueError(f"{path}: 'shard' is {data.get('shard')!r}, not I/N") from None
    units = data.get("units")
    if not isinstance(units, list) or not all(isinstance(u, dict) and isinstance(u.get("id"), str) for u in units):
        raise ValueError(f"{path}: 'units' is not a list of {{kind, id}}")
    logs = data.setdefault("logs", [])
    if not isinstance(logs, list) or not all(isinstance(name, str) for name in logs):
        raise ValueError(f"{path}: 'logs' is not a list of file names")
    return data

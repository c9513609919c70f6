"""What is checked of a run log once it is read: that `--resume` may take it over
(sound records, MACs that hold, its own spec digest, the same loop, an unchanged
loop file), and, for `show` and `report`, that its `.tine` agrees with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.runlogsign import dump
from pytest_loops.errors import LoopUsageError


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
            dump(record)
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

"""Reading a `.tine` file back: verifying its integrity digest and signature,
summarizing its steps as a run log would, and telling a `.tine` file from others.

Written by :mod:`pytest_loops.artifacts.provenance`. opentine is imported inside
the functions that need it, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.provenance import (
    BRANCH_TOOL,
    CHECK_TOOL,
    ITERATION_TOOL,
    MIN_HMAC_KEY_BYTES,
    REVISE_TOOL,
    SCHEMA_V1,
    one_line,
)
from pytest_loops.artifacts.tineshape import ITERATION_DIR, expand_lesson, expand_time_ms, output_path
from pytest_loops.limits import MAX_RUN_BYTES, MiB

# --------------------------------------------------------------------------- verifying


def verify_tine(
    path: str | os.PathLike,
    *,
    hmac_key: bytes | None = None,
    pubkey_path: str | None = None,
    integrity_only: bool = False,
) -> tuple[bool, str]:
    """Check that a `.tine` file is intact and authentic.

    Returns ``(ok, message)`` with a one-line message. Never raises: a missing,
    empty, truncated or foreign file is ``(False, why)``.

    Intact is opentine's integrity digest, which anyone can recompute; so ok also
    needs the file to be authentic: given a key, signed with it; without one,
    vouched by this machine's local key (:mod:`pytest_loops.artifacts.tinevouch`).
    An intact file that is neither is ``(False, "... integrity ok, not
    authenticated: why")``; with ``integrity_only`` it is ok, and the message
    still says it is not authenticated.
    """
    where = str(path)
    if isinstance(hmac_key, str):
        hmac_key = hmac_key.encode()
    try:
        return _verify(Path(path), hmac_key, pubkey_path, integrity_only)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
        return False, f"{where}: cannot verify: {one_line(exc)}"


def verify_and_summarize(path: str | os.PathLike, *, hmac_key: bytes | None = None,
                         pubkey_path: str | None = None) -> tuple[bool, str, dict[str, Any] | None]:
    """:func:`verify_tine` and :func:`load_tine_summary` of one file, read once for
    both (``pytest-loops merge`` checks thousands): ``(ok, message, summary)``; the
    summary is None when the file could not be loaded. Never raises."""
    loaded: list[Any] = []
    try:
        ok, message = _verify(Path(path), hmac_key, pubkey_path, loaded=loaded)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
        return False, f"{path}: cannot verify: {one_line(exc)}", None
    if not loaded:
        return ok, message, None
    run = loaded[0]
    try:
        summary = _summary_from_steps(run.steps, dict(run.metadata), integrity_ok=True)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        return False, f"{path}: not a pytest-loops run file ({one_line(exc)})", None
    return ok, message, summary


def _verify(path: Path, hmac_key: bytes | None, pubkey_path: str | None,
            integrity_only: bool = False, loaded: list[Any] | None = None) -> tuple[bool, str]:
    where = str(path)
    if hmac_key is not None and pubkey_path is not None:
        return False, "pass an HMAC key or a public key, not both"
    if not path.exists():
        return False, f"{where}: no such file"
    if path.is_dir():
        return False, f"{where}: is a directory, not a .tine file"
    if path.stat().st_size == 0:
        return False, f"{where}: empty file, not a .tine file"
    if path.stat().st_size > MAX_RUN_BYTES:
        return False, f"{where}: larger than {MAX_RUN_BYTES // MiB} MB, not a pytest-loops .tine file"
    if hmac_key is not None and len(hmac_key) < MIN_HMAC_KEY_BYTES:
        return False, f"HMAC key is {len(hmac_key)} bytes; it must be at least {MIN_HMAC_KEY_BYTES}"
    from opentine import Run

    data, run = _read_once(path)
    integrity = Run.verify_integrity(path if data is None else data)
    if not integrity.ok:
        return False, f"{where}: integrity check failed: {one_line(integrity.reason)}"
    if run is None:
        run = Run.load(path)
    if loaded is not None:
        loaded.append(run)
    done = [s for s in run.steps if _kind(s) == "done"]
    if not done:
        return False, f"{where}: not a pytest-loops run file (no verdict step)"
    verdict = (done[-1].outputs or {}).get("verdict", "?")
    steps = len(run.steps)
    public_key = None
    if pubkey_path is not None:
        from opentine.signing import SignatureError, ed25519_public_from_file

        try:
            public_key = ed25519_public_from_file(pubkey_path)
        except FileNotFoundError:
            return False, f"{pubkey_path}: no such public key file"
        except (OSError, SignatureError, ValueError) as exc:
            return False, f"{pubkey_path}: not an Ed25519 public key ({one_line(exc)})"
    signature = Run.verify_signature(path if data is None else data, hmac_key=hmac_key, public_key=public_key)
    summary = f"{where}: integrity ok ({steps} steps, verdict {verdict})"
    if hmac_key is not None or public_key is not None:
        if signature.ok:
            return True, summary + f"; signature verified ({signature.algorithm})"
        if signature.state == "unsigned":
            return False, f"{where}: not signed, but a key was given to check a signature"
        if signature.state == "mismatch":
            return False, f"{where}: signature mismatch: tampered, or signed with another key"
        if signature.state == "no-key":
            return False, (f"{where}: signed with {signature.algorithm}; "
                           "the key given is for another algorithm")
        return False, f"{where}: signature {signature.state}: {one_line(signature.reason)}"
    vouched, why = vouch_of(run)
    signed = "" if signature.state == "unsigned" else (
        f"signed ({signature.algorithm}), signature not checked: no key given")
    if vouched:
        return True, summary + f"; {why}" + (f"; {signed}" if signed else "")
    why = f"{signed or 'not signed'}, and {why}"
    if integrity_only:
        return True, summary + f"; not authenticated (integrity only): {why}"
    return False, f"{where}: integrity ok, not authenticated: {why} ({steps} steps, claims verdict {verdict})"


def _read_once(path: Path) -> tuple[dict[str, Any] | None, Any]:
    """The file read once by opentine's own bounded reader, and its run: ``(data,
    run)``, or ``(None, None)`` to fall back on the public verbs, which read the path
    once each (three reads; ``pytest-loops merge`` checks thousands of files, and the
    reading is most of its time). The reader and the decoder are opentine's private
    names: when they move, this falls back, never guesses. Only a file already at the
    current format is decoded here (an older one is migrated by ``Run.load``); a file
    the reader refuses falls back too, so its error is the public verb's."""
    try:
        from opentine import FORMAT_VERSION, Run
        from opentine._artifact_io import read_artifact_json
        from opentine._graph_serde import run_from_dict
    except ImportError:
        return None, None
    try:
        data = read_artifact_json(path)
    except Exception:  # noqa: BLE001 - the public verb says why, in its own words
        return None, None
    if not isinstance(data, dict):
        return None, None
    if data.get("format_version") != FORMAT_VERSION:
        return data, None
    try:
        return data, run_from_dict(data, Run)
    except Exception:  # noqa: BLE001 - Run.load says why, as before
        return data, None


def vouch_of(run: Any) -> tuple[bool, str]:
    """Whether a loaded opentine run carries this machine's vouch, and why not."""
    from pytest_loops.artifacts.tinevouch import check_vouch, reader_key

    return check_vouch(run.to_dict(), *reader_key())


def _kind(step: Any) -> str:
    kind = step.kind
    return getattr(kind, "value", str(kind))


# --------------------------------------------------------------------------- reading


def load_tine_summary(path: str | os.PathLike) -> dict[str, Any]:
    """Read a `.tine` written by ``write_tine`` into the run log's dict shape.

    Keys the file cannot supply are present with empty values (``lessons_read``
    is always []). Raises ValueError (one line) when the file is not a readable
    pytest-loops `.tine`.
    """
    from opentine import Run

    with contextlib.suppress(OSError):
        if os.stat(path).st_size > MAX_RUN_BYTES:
            raise ValueError(f"larger than {MAX_RUN_BYTES // MiB} MB: too big for a pytest-loops .tine file")
    try:
        run = Run.load(Path(path))
    except FileNotFoundError:
        raise ValueError("no such file") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        raise ValueError(f"not a readable .tine file ({one_line(exc)})") from None
    steps = run.steps
    integrity = Run.verify_integrity(Path(path))
    try:
        summary = _summary_from_steps(steps, dict(run.metadata), integrity_ok=bool(integrity.ok))
        summary["authenticated"], summary["authenticated_why"] = vouch_of(run)
        return summary
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # opentine loads a file whose steps were edited (only verify tells): values
        # of the wrong type are this file's problem, one line, not a crash
        raise ValueError(f"not a pytest-loops run file ({one_line(exc)})") from None


def _summary_from_steps(steps: list[Any], metadata: Mapping[str, Any], *,
                       integrity_ok: bool) -> dict[str, Any]:
    """Both shapes: one step per iteration (`pytest-loops.tine/2`), and the first
    one, a step per check, per guard decision and per revise (`/1`)."""
    start: dict[str, Any] = {}
    done: dict[str, Any] | None = None
    iterations: dict[int, dict[str, Any]] = {}
    lessons: list[str] = []

    def iteration(number: int) -> dict[str, Any]:
        return iterations.setdefault(number, _empty_iteration(number))

    for step in steps:
        kind = _kind(step)
        inputs, outputs = step.inputs or {}, step.outputs or {}
        if kind == "think" and "spec" in outputs and not start:
            start = outputs
        elif kind == "tool" and (step.tool_info or {}).get("name") == ITERATION_TOOL:
            record = _iteration_from_step(inputs.get("arguments") or {},
                                          {"duration_s": step.duration, **outputs}, start)
            iterations[record["iter"]] = record
            if record["lesson"]:
                lessons.append(record["lesson"])
        elif kind == "think" and "iteration" in outputs:
            record = iteration(int(outputs["iteration"]))
            record.update({k: v for k, v in outputs.items() if k != "iteration"})
        elif kind == "tool" and (step.tool_info or {}).get("name") == CHECK_TOOL:
            arguments = inputs.get("arguments") or {}
            record = iteration(int(arguments.get("iteration", 0)))
            record["checks"].append(_check_from_step(inputs, arguments, outputs))
        elif kind == "tool" and (step.tool_info or {}).get("name") == REVISE_TOOL:
            arguments = inputs.get("arguments") or {}
            record = iteration(int(arguments.get("iteration", 0)))
            record.update(revise_exit=outputs.get("exit_code"),
                          revise_duration_s=outputs.get("duration_s"),
                          revise_output_file=outputs.get("output_file"),
                          revise_tail=outputs.get("tail", ""))
        elif kind == "tool" and (step.tool_info or {}).get("name") == BRANCH_TOOL:
            arguments = inputs.get("arguments") or {}
            record = iteration(int(arguments.get("iteration", 0)))
            record.setdefault("branches", []).append({"branch": arguments.get("branch"), **outputs})
        elif kind == "done":
            done = outputs
    if done is None or not start:
        raise ValueError("not a pytest-loops run file (no start or verdict step)")
    spec = start.get("spec") or {}
    records = [iterations[k] for k in sorted(iterations)]
    for record in records:
        if record.get("verify_exit") is None and record["checks"]:
            record["verify_exit"] = 0 if all(c["passed"] for c in record["checks"]) else 1
        record["output_tail"] = "\n".join(c["output_tail"] for c in record["checks"]
                                          if not c["passed"] and c["output_tail"])
    return {
        "schema": start.get("schema", SCHEMA_V1),
        "format": "tine",
        "integrity_ok": integrity_ok,
        "loop": spec.get("name", metadata.get("loop")),
        "goal": spec.get("goal", metadata.get("goal", "")),
        "source": spec.get("source"),
        "verdict": done.get("verdict"),
        "exit_code": done.get("exit_code"),
        "reason": done.get("reason", ""),
        "iterations_run": done.get("iterations_run", len(records)),
        **({"usage": done["usage"]} if isinstance(done.get("usage"), Mapping) else {}),
        "guards": spec.get("guards") or {},
        "state_paths": spec.get("state_paths") or [],
        "started_at": done.get("started_at") or start.get("started_at"),
        "ended_at": done.get("ended_at"),
        "elapsed_s": done.get("elapsed_s", 0.0),
        "cwd": spec.get("cwd"),
        "revise": spec.get("revise"),
        "spec": spec,
        "spec_digest": start.get("spec_digest"),
        "memory_page": start.get("memory_page") or spec.get("memory_page"),
        "lessons_read": [],
        # the first shape listed them in the verdict step; now each is in its iteration's step
        "lessons": list(done["lessons"]) if "lessons" in done else lessons,
        "run_dir": start.get("run_dir"),
        "artifacts": dict(start.get("artifacts") or {}),
        "iterations": records,
        "pytest_loops_version": start.get("pytest_loops_version",
                                          metadata.get("pytest_loops_version")),
    }


def _empty_iteration(number: int) -> dict[str, Any]:
    return {
        "iter": number, "started_at": None, "checks": [], "verify_exit": None, "passed": False,
        "duration_s": 0.0, "verify_duration_s": 0.0, "output_tail": "", "state_hash": None,
        "state_changed": None, "unchanged_streak": 0, "lesson": None, "revise_exit": None,
        "revise_duration_s": None, "revise_output_file": None, "revise_tail": "",
        "guard": None, "guards_seen": {}, "elapsed_s": 0.0,
    }


_ITERATION_KEYS = ("passed", "verify_exit", "duration_s", "verify_duration_s", "state_hash",
                   "state_changed", "unchanged_streak", "guard", "guards_seen", "elapsed_s")


def _iteration_from_step(arguments: Mapping[str, Any], outputs: Mapping[str, Any],
                         start: Mapping[str, Any]) -> dict[str, Any]:
    """An iteration step (`pytest-loops.tine/2`) in the run log's iteration shape."""
    number = int(arguments["iteration"])
    names = arguments.get("checks") or []
    entries = outputs.get("checks") or []
    if not isinstance(names, list) or not isinstance(entries, list) or len(names) != len(entries):
        raise ValueError(f"iteration {number}: its checks' names and results do not pair up")
    record = _empty_iteration(number)
    record.update({k: outputs[k] for k in _ITERATION_KEYS if k in outputs})
    record["passed"] = bool(record["passed"])
    if outputs.get("guards_saw_iteration") is True:  # `N/MAX`, left out of the file
        guards = (start.get("spec") or {}).get("guards") or {}
        record["guards_seen"] = {**record["guards_seen"], "iteration": f"{number}/{guards.get('max_iter')}"}
    record["started_at"] = (expand_time_ms(outputs["started_at_ms"]) if "started_at_ms" in outputs
                            else outputs.get("started_at"))
    lesson = outputs.get("lesson")
    if isinstance(lesson, str) and "lesson_at_s" in outputs:
        lesson = expand_lesson(lesson, outputs["lesson_at_s"], (start.get("spec") or {}).get("name"),
                               number)
    record["lesson"] = lesson if isinstance(lesson, str) and lesson else None
    run_dir, layout = start.get("run_dir"), start.get("iteration_dir", ITERATION_DIR)
    # a check's kind and command are left out where they are what the spec declares
    declared = {c.get("name"): c for c in (start.get("spec") or {}).get("checks") or []}
    for name, entry in zip(names, entries, strict=True):
        if not isinstance(entry, Mapping):
            raise TypeError(f"iteration {number}: a check is {type(entry).__name__}, not an object")
        spec_check = declared.get(name) or {}
        check = _check_from_step({"name": name}, {"kind": spec_check.get("kind", "command"),
                                                  "command": spec_check.get("command"), **entry}, entry)
        check["output_file"] = output_path(entry, run_dir, number, layout)
        if "reason" not in entry:
            check["reason"] = "" if check["passed"] else f"exit {check['exit_code']}"
        record["checks"].append(check)
    revise = outputs.get("revise")
    if isinstance(revise, Mapping):
        record.update(revise_exit=revise.get("exit_code"), revise_duration_s=revise.get("duration_s"),
                      revise_output_file=output_path(revise, run_dir, number, layout),
                      revise_tail=revise.get("tail", ""))
        record.update({k: revise[k] for k in ("cost_usd", "input_tokens", "output_tokens", "session_id")
                       if k in revise})
    return record


def _check_from_step(inputs: Mapping[str, Any], arguments: Mapping[str, Any],
                     outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": inputs.get("name", "?"),
        "kind": arguments.get("kind", "command"),
        "passed": bool(outputs.get("passed")),
        "exit_code": outputs.get("exit_code"),
        "duration_s": outputs.get("duration_s", 0.0),
        "output_tail": outputs.get("tail", ""),
        "output_file": outputs.get("output_file"),
        "reason": outputs.get("reason", ""),
        "runs": outputs.get("runs", 1),
        "timed_out": bool(outputs.get("timed_out")),
        "needs_human": bool(outputs.get("needs_human")),
        "output_digest": outputs.get("output_digest"),
        "command": arguments.get("command"),
    }


_TINE_MAGIC = b"TINEZ1\0"


def looks_like_tine(path: str | os.PathLike) -> bool:
    """Whether a file is a `.tine` artifact, by suffix or by its first bytes."""
    p = Path(path)
    if p.suffix == ".tine":
        return True
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head.startswith(_TINE_MAGIC):
        return True
    return bool(re.search(rb'"format_version"\s*:', head)) and b'"graph"' in head

"""The `.tine` provenance file of a finished loop, and reading it back.

One opentine run per loop: a start step (the spec), one step per iteration (its
checks, the guards' decision, its revise step) and a done step with the verdict
and reason. Steps are covered by opentine's integrity digest; run metadata is
not, so everything a reader must trust lives in steps. Files of the first shape
(`pytest-loops.tine/1`: a step per check, per guard decision and per revise) are
still read (:mod:`pytest_loops.artifacts.tineread`).

opentine costs 150-250 ms to import, so it is imported inside the functions that
need it, never when this module is imported.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.tinememo import RedactionMemo
from pytest_loops.artifacts.tineshape import (
    ITERATION_DIR,
    compact_lesson,
    compact_output,
    compact_started,
    iteration_folder,
)
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import open_own, set_artifact_mode
from pytest_loops.redact import make_redactor, strip_control
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import LoopSpec

Scrub = Callable[[str], str]

SCHEMA = "pytest-loops.tine/2"
SCHEMA_V1 = "pytest-loops.tine/1"  # a step per check, guard decision and revise
MIN_HMAC_KEY_BYTES = 16
ITERATION_TOOL = "iteration"
USAGE_KEYS = ("cost_usd", "input_tokens", "output_tokens", "session_id")
CHECK_TOOL = "check"  # the first shape's steps
REVISE_TOOL = "revise"
BRANCH_TOOL = "branch"  # fan-out: one fork of an iteration's step per revise candidate
_REFITS = 2  # re-saves allowed when opentine's redaction changed what was written


def pytest_loops_version() -> str:
    """The installed pytest-loops version, or "0+unknown" from a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-loops")
    except PackageNotFoundError:
        return "0+unknown"


# --------------------------------------------------------------------------- sanitizing

TAIL_LINES = 20
TAIL_CHARS = 1200

# `NAME: value` / `NAME=value` where NAME looks like a credential. Masked as
# `NAME [REDACTED]`, without the separator, so opentine's save-time redaction
# finds no assignment left to rewrite (it would drop everything after it).
# Short words (key, pw, dsn, ...) only as a whole word or after `_`/`-`, so
# `KeyError: ...` and `monkey: ...` stay readable.
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)(?<![\w-])("
    r"-{0,2}[\w.-]*?(?:token|secret|passw(?:or)?d|passwd|passphrase|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|credentials?|authorization|cookie|webhook[_-]?url|connection[_-]?string"
    r"|conn[_-]?str)[\w-]*"
    r"|-{0,2}(?:[\w.-]*?[_-])?(?:pwd|pw|key|keys|dsn|jwt|key[_-]data)"
    r")[\"']?[ \t]*(?::(?!:)|=(?!=))[ \t]*"
    # the value as opentine reads it: quoted, or words up to a `,` `;` or quote
    r"(?:\"[^\"\r\n]*\"?|'[^'\r\n]*'?|[^\s,;\"']+(?:[ \t]+[^\s,;\"']+)*)?"
)
_BEARER = re.compile(r"(?i)\b(bearer)[ \t]+[A-Za-z0-9._~+/=-]{8,}")
# A PEM private key: the BEGIN line, its header and base64 lines, the END line.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
    r"(?:\n(?:[\w-]+: [^\n]*|[A-Za-z0-9+/=]*)(?=\n|\Z))*"
    r"(?:\n-----END [A-Z0-9 ]*PRIVATE KEY-----)?"
)
_SEPARATED_MARKER = re.compile(r"[ \t]*[:=][ \t]*\[REDACTED")


def premask(text: str) -> str:
    """Mask private keys, credential-looking assignments and bearer tokens."""
    text = _PEM.sub("[REDACTED PRIVATE KEY]", text)
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)} [REDACTED]", text)
    return _BEARER.sub(lambda m: f"{m.group(1)} [REDACTED]", text)


def _printable(text: str) -> str:
    # Lone surrogates (a stream cut mid-character) make opentine refuse the run.
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    return strip_control(text)


def clean_text(text: Any, scrub: Scrub | None = None) -> str:
    """A string safe to write anywhere: env secrets redacted, credentials masked.

    ``scrub`` is a ``make_redactor()`` result, passed by callers cleaning many strings.
    """
    if text is None:
        return ""
    scrub = scrub or make_redactor()
    return premask(scrub(_printable(str(text))))


def tail_text(text: str | None, *, max_lines: int = TAIL_LINES, max_chars: int = TAIL_CHARS,
              scrub: Scrub | None = None) -> str:
    """The last lines of an output, cleaned: what a step or a report shows.

    Redacted before it is cut, so a secret is never cut in half and half-kept.
    The full output stays in the project's own output files.
    """
    scrub = scrub or make_redactor()
    text = scrub(_printable(text or "")).rstrip("\n")
    lines = text.split("\n")
    if len(lines) > max_lines:
        text = "\n".join(lines[-max_lines:])
    if len(text) > max_chars:
        cut = text[-max_chars:]
        newline = cut.find("\n")
        text = cut[newline + 1:] if 0 <= newline < len(cut) - 1 else "..." + cut
    return premask(text)


def file_tail(path: str | None, fallback: str, *, read_bytes: int = 64 * 1024,
              max_lines: int = TAIL_LINES, max_chars: int = TAIL_CHARS,
              scrub: Scrub | None = None) -> str:
    """The cleaned tail of an output file, or of ``fallback`` when it cannot be read."""
    if path:
        try:
            with open_own(path) as f:  # in the run directory: never a file a check linked there
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - read_bytes))
                data = f.read()
            text = data.decode("utf-8", "replace")
            if size > read_bytes:  # started mid-file: drop the partial first line
                text = text.partition("\n")[2]
            return tail_text(text, max_lines=max_lines, max_chars=max_chars, scrub=scrub)
        except OSError:
            pass
    return tail_text(fallback, max_lines=max_lines, max_chars=max_chars, scrub=scrub)


def nonneg_seconds(value: Any) -> float:
    """A duration opentine accepts: finite and >= 0, else 0.0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else 0.0


def jsonable(obj: Any, scrub: Scrub | None = None) -> Any:
    """A JSON-safe copy: NaN/inf become None, paths and sets become str/list,
    every string is cleaned (``clean_text``)."""
    return _jsonable(obj, scrub or make_redactor())


def _jsonable(obj: Any, scrub: Scrub, memo: dict[str, str] | None = None) -> Any:
    """``memo`` maps strings already cleaned to their clean form (one write's keys,
    commands and repeated tails are cleaned once)."""
    if obj is None or isinstance(obj, bool) or isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return _clean(obj, scrub, memo)
    if isinstance(obj, Mapping):
        return {_clean(str(k), scrub, memo): _jsonable(v, scrub, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, scrub, memo) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_jsonable(v, scrub, memo) for v in obj), key=str)
    if isinstance(obj, bytes):
        return _clean(obj.decode("utf-8", "replace"), scrub, memo)
    value = getattr(obj, "value", None)  # enums
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return _jsonable(value, scrub, memo)
    return _clean(str(obj), scrub, memo)


def _clean(text: str, scrub: Scrub, memo: dict[str, str] | None) -> str:
    if memo is None:
        return clean_text(text, scrub)
    try:
        return memo[text]
    except KeyError:
        clean = memo[text] = clean_text(text, scrub)
        return clean


# --------------------------------------------------------------------------- writing


LOCAL_KEY: Any = object()
"""``write_tine``'s ``vouch_key`` default: this machine's per-user key."""


def write_tine(
    result: LoopResult,
    path: str | os.PathLike,
    *,
    hmac_key: bytes | None = None,
    ed25519_key_path: str | None = None,
    vouch_key: bytes | None = LOCAL_KEY,
    on_unvouched: Callable[[str], None] | None = None,
    private: bool = False,
) -> str:
    """Record ``result`` as a `.tine` file at ``path`` and return the path.

    The file gets the user's umask (opentine writes 0600), or 0600 when ``private``.

    Sign it with ``hmac_key`` (at least 16 bytes) or the Ed25519 private key in
    ``ed25519_key_path`` (as written by ``tine keygen --out FILE``), not both.
    A bad key raises LoopUsageError before anything is written. Saved once, at
    the end, never per step: opentine's save is the slow part (its redaction).

    Signed or not, the file is vouched by ``vouch_key``, by default this
    machine's local key (:mod:`pytest_loops.artifacts.tinevouch`); ``None`` writes
    no vouch. A key that cannot be read or made never costs the file: it is
    written without a vouch and ``on_unvouched`` is told why.
    """
    sign_key, algorithm = _signing_key(hmac_key, ed25519_key_path)
    from opentine import Run

    if vouch_key is LOCAL_KEY:
        from pytest_loops.artifacts.tinevouch import writer_key

        vouch_key, why = writer_key()
        if vouch_key is None and on_unvouched is not None:
            on_unvouched(why or "no local key")

    scrub = make_redactor()
    payloads = _payloads(result, scrub)
    metadata = _metadata(result, scrub)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # written whole or not at all: a temporary file in the same directory, renamed
    # over the target only once it is complete (a full disk leaves no half file)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tine")
    os.close(fd)
    tmp = Path(name)
    try:
        # opentine redacts on save and cannot be told not to; it may drop the rest of
        # a multi-line string after a `token:`. Its scan is memoized for this write
        # (each distinct string scanned once: step keys, exit codes and repeated
        # tails are most of a run), and the memo tells whether it changed anything.
        # Only then is the file read back and re-saved with the changed strings
        # masked line by line, so nothing else is lost.
        with RedactionMemo() as memo:
            _save(payloads, metadata, result.succeeded, tmp, sign_key, algorithm, memo, vouch_key)
            for _ in range(_REFITS):
                if memo.unchanged():
                    break
                stored = _bodies_of(Run.load(tmp).steps)
                if stored == _bodies(payloads):
                    break
                payloads = _refit(payloads, stored, Run)
                memo.reset_changes()
                _save(payloads, metadata, result.succeeded, tmp, sign_key, algorithm, memo, vouch_key)
            # the vouch covers the run as it was before opentine's redaction: when
            # that changed anything, it is made again over the file as read back
            if vouch_key is not None and not memo.unchanged():
                why = _revouch(tmp, vouch_key, sign_key, algorithm)
                if why is not None and on_unvouched is not None:
                    on_unvouched(why)
        set_artifact_mode(tmp, private)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return str(target)


def _signing_key(hmac_key: bytes | None, ed25519_key_path: str | None) -> tuple[Any, str]:
    if hmac_key is not None and ed25519_key_path is not None:
        raise LoopUsageError(
            "pass an HMAC key or an Ed25519 key file, not both", location="signing key"
        )
    if hmac_key is not None:
        if isinstance(hmac_key, str):
            hmac_key = hmac_key.encode()
        if not isinstance(hmac_key, (bytes, bytearray)) or len(hmac_key) < MIN_HMAC_KEY_BYTES:
            size = len(hmac_key) if isinstance(hmac_key, (bytes, bytearray)) else 0
            raise LoopUsageError(
                f"the HMAC key is {size} bytes; it must be at least {MIN_HMAC_KEY_BYTES}",
                location="HMAC key",
                fix="make one with `tine keygen --hmac --out FILE`",
            )
        return bytes(hmac_key), "hmac-sha256"
    if ed25519_key_path is not None:
        from opentine.signing import SignatureError, ed25519_private_from_file

        try:
            return ed25519_private_from_file(ed25519_key_path), "ed25519"
        except FileNotFoundError:
            raise LoopUsageError(
                "no such Ed25519 key file", location=str(ed25519_key_path),
                fix="make one with `tine keygen --out FILE`",
            ) from None
        except (OSError, SignatureError, ValueError) as exc:
            raise LoopUsageError(
                f"not an Ed25519 private key ({one_line(exc)})", location=str(ed25519_key_path),
                fix="make one with `tine keygen --out FILE`",
            ) from None
    return None, ""


def _add_step(run: Any, kind: str, inputs: dict, outputs: dict, duration: float,
              tool_info: dict | None, **where: Any) -> Any:
    from opentine import StepKind

    # opentine accepts a non-dict output here and only fails later, in save().
    if not isinstance(outputs, dict) or not isinstance(inputs, dict):
        raise TypeError("step inputs and outputs must be dicts")
    return run.add_step(StepKind(kind), inputs=inputs, outputs=outputs,
                        tool_info=tool_info, duration=nonneg_seconds(duration), **where)


def _metadata(result: LoopResult, scrub: Scrub) -> dict[str, Any]:
    # Convenience only: metadata is outside the integrity digest, so the same
    # facts are repeated in the start and done steps.
    spec = result.spec
    return jsonable({
        "schema": SCHEMA,
        "loop": spec.name,
        "goal": spec.goal,
        "spec_digest": spec.digest(),
        "pytest_loops_version": pytest_loops_version(),
        "verdict": result.verdict.value,
        "reason": result.reason,
        "sandbox": dict(result.sandbox),
        "started_at": result.started_at,
        "ended_at": result.ended_at,
    }, scrub)


Payload = tuple[str, dict[str, Any], dict[str, Any], float, "dict[str, Any] | None"]


def _payloads(result: LoopResult, scrub: Scrub) -> list[Payload]:
    """Every step of the run, as plain JSON-safe, env-redacted dicts: a start step,
    one step per iteration, the verdict step."""
    spec = result.spec
    declared = {c.name: (c.kind.value, c.command) for c in spec.checks}
    run_dir = os.fspath(result.run_dir) if result.run_dir else None
    steps: list[Payload] = [_start_step(result)]
    for record in result.iterations:
        steps.append(_iteration_step(record, spec, declared, run_dir, scrub))
        steps.extend(_branch_step(record.iter, branch) for branch in record.branches)
    steps.append(_done_step(result))
    memo: dict[str, str] = {}
    return [(kind, _jsonable(i, scrub, memo), _jsonable(o, scrub, memo), d, t)
            for kind, i, o, d, t in steps]


def _start_step(result: LoopResult) -> Payload:
    spec = result.spec
    text = f"loop {spec.name!r} starts: {spec.goal or '(no goal given)'}"
    outputs = {
        "schema": SCHEMA,
        "spec": spec.to_dict(),
        "spec_digest": spec.digest(),
        "pytest_loops_version": pytest_loops_version(),
        "sandbox": dict(result.sandbox),  # the isolation tier, in the digest
        "started_at": result.started_at,
        "log_path": result.log_path,
        "run_dir": result.run_dir,
        "iteration_dir": ITERATION_DIR,
        "memory_page": result.memory_page,
        "artifacts": dict(result.artifacts),
    }
    return ("think", {"text": text}, outputs, 0.0, None)


def _iteration_step(record: IterationRecord, spec: LoopSpec,
                    declared: Mapping[str, tuple[str, str | None]], run_dir: str | None,
                    scrub: Scrub) -> Payload:
    """One iteration in one tool step: its checks and its revise step (arguments:
    the checks' names and the revise command; outputs: what each gave), and the
    guards' decision.

    Only what differs from one iteration to the next is a new string (digests,
    tails, the state hash): the iteration's time is a number, a lesson keeps its
    words and loses its time stamp to a number, an output file in the iteration's
    own directory is its file name. opentine's save-time redaction costs per
    character of each distinct string, so that is most of what a .tine costs;
    the rest is per value, so a value the reader knows otherwise is left out: a
    field at its default, a check's kind and command as the spec declares them
    (its node id is in the spec), the verify exit that the checks imply.
    """
    n = record.iter
    folder = iteration_folder(run_dir, n)
    outputs: dict[str, Any] = {
        "decision": guard_text(record),
        "checks": [_check_entry(check, declared.get(check.name), folder, scrub) for check in record.checks],
        "passed": bool(record.passed),
        "verify_exit": record.verify_exit,
        # the iteration's duration is the step's own
        "verify_duration_s": nonneg_seconds(record.verify_duration_s),
        "elapsed_s": nonneg_seconds(record.elapsed_s),
        "state_hash": record.state_hash,
        "state_changed": record.state_changed,
        "unchanged_streak": record.unchanged_streak,
        "guard": record.guard,
        "guards_seen": dict(record.guards_seen),
    }
    if outputs["guards_seen"].get("iteration") == f"{n}/{spec.guards.max_iter}":
        # the guards' `iteration: N/MAX`, a new string each iteration, as a flag
        del outputs["guards_seen"]["iteration"]
        outputs["guards_saw_iteration"] = True
    outputs.update(compact_started(record.started_at))
    if record.lesson:
        outputs.update(compact_lesson(record.lesson, spec.name, n))
    if record.revise_exit is not None or record.revise_duration_s is not None:
        revise: dict[str, Any] = {
            "exit_code": record.revise_exit,
            "duration_s": nonneg_seconds(record.revise_duration_s),
            "output_digest": output_digest(record.revise_output_file, record.revise_tail, None),
            "tail": file_tail(record.revise_output_file, record.revise_tail, scrub=scrub),
        }
        revise.update(compact_output(record.revise_output_file, folder))
        _drop_empty(revise, "tail")
        for key in USAGE_KEYS:  # what the step reported spending (LOOP_USAGE_FILE, an agent preset)
            value = getattr(record, key, None)
            if value is not None:
                revise[key] = value
        outputs["revise"] = revise
    _drop_empty(outputs, "passed", "verify_duration_s", "state_hash", "unchanged_streak", "guard",
                "guards_seen")
    if outputs["state_changed"] is None:
        del outputs["state_changed"]
    if record.checks and record.verify_exit == (0 if all(c.passed for c in record.checks) else 1):
        del outputs["verify_exit"]  # what the checks imply
    arguments: dict[str, Any] = {"iteration": n, "checks": [check.name for check in record.checks]}
    if "revise" in outputs:
        arguments["revise"] = spec.revise
    return ("tool", {"name": ITERATION_TOOL, "arguments": arguments}, outputs,
            record.duration_s, {"name": ITERATION_TOOL})


def _branch_step(iteration: int, branch: Mapping[str, Any]) -> Payload:
    """One revise candidate of a fan-out iteration: a fork of the iteration's step
    (its own ref, so the loop's main line goes on from the iteration), the chosen
    one marked ``chosen``."""
    outputs = {k: v for k, v in branch.items() if k != "branch"}
    arguments = {"iteration": iteration, "branch": branch.get("branch")}
    return ("tool", {"name": BRANCH_TOOL, "arguments": arguments}, outputs, 0.0, {"name": BRANCH_TOOL})


def _check_entry(check: CheckResult, declared: tuple[str, str | None] | None, folder: str | None,
                 scrub: Scrub) -> dict[str, Any]:
    entry: dict[str, Any] = {  # its name is in the step's arguments
        "exit_code": check.exit_code,
        "passed": bool(check.passed),
        "duration_s": nonneg_seconds(check.duration_s),
        "output_digest": output_digest(check.output_file, check.output_tail, check.output_digest),
        # a passing check's output is its digest alone: no reader shows it, and each
        # distinct tail costs opentine's redaction about a millisecond
        "tail": "" if check.passed else file_tail(check.output_file, check.output_tail, scrub=scrub),
        "runs": check.runs if check.runs != 1 else None,
        "timed_out": bool(check.timed_out),
        "needs_human": bool(check.needs_human),
    }
    entry.update(compact_output(check.output_file, folder))
    _drop_empty(entry, "tail", "runs", "timed_out", "needs_human")
    if check.reason != ("" if check.passed else f"exit {check.exit_code}"):  # else the reader's default
        entry["reason"] = check.reason
    kind, command = declared or ("", None)
    if check.kind != kind or declared is None:
        entry["kind"] = check.kind
    if check.command != command or declared is None and check.command is not None:
        entry["command"] = check.command
    return entry


def _drop_empty(outputs: dict[str, Any], *keys: str) -> None:
    """Leave out fields at their default: opentine's save redacts every string,
    keys included, and that pass is most of the cost of a .tine."""
    for key in keys:
        if outputs.get(key) in (None, "", {}, [], False, 0.0):
            outputs.pop(key, None)


def guard_text(record: IterationRecord) -> str:
    """One sentence: what the guards decided after this iteration's checks.

    The same words from one iteration to the next where nothing differs (the
    iteration number, times and what the guards saw are fields of the step), so
    a long loop gives opentine's redaction few distinct strings to scan.
    """
    total = len(record.checks)
    passed = sum(1 for c in record.checks if c.passed)
    if record.state_changed is None:
        state = "state not tracked"
    elif record.state_changed:
        state = "state changed"
    else:
        state = f"state unchanged ({record.unchanged_streak} in a row)"
    decision = f"guard {record.guard} stops the loop" if record.guard else (
        "all checks pass" if record.passed else "no guard fired, loop goes on")
    # The decision first: `tine show` cuts long text.
    revised = "" if record.revise_exit is None else f"; revise exit {record.revise_exit}"
    return f"{decision}; {passed}/{total} checks pass; {state}{revised}"


def _spend(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """opentine's own cost and usage fields of an iteration step (``tine cost`` sums them),
    from its revise step's figures."""
    revise = outputs.get("revise") if isinstance(outputs.get("revise"), dict) else None
    if not revise:
        return {}
    where: dict[str, Any] = {}
    cost = revise.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0:
        where["cost"] = float(cost)
    usage = {k: revise[k] for k in ("input_tokens", "output_tokens")
             if isinstance(revise.get(k), int) and not isinstance(revise.get(k), bool) and revise[k] >= 0}
    if usage:
        where["usage"] = usage
    return where


def _done_step(result: LoopResult) -> Payload:
    outputs = {
        "verdict": result.verdict.value,
        "exit_code": result.exit_code,
        "reason": result.reason,
        "iterations_run": result.iterations_run,
        "started_at": result.started_at,
        "ended_at": result.ended_at,
        "elapsed_s": nonneg_seconds(result.elapsed_s),
    }
    from pytest_loops.core.usage import usage_summary

    outputs.update(usage_summary(result.iterations))  # the loop's spend, inside the integrity digest
    text = f"verdict {result.verdict.value} after {result.iterations_run} iterations: {result.reason}"
    return ("done", {"text": text}, outputs, 0.0, None)


def output_digest(output_file: str | None, tail: str, known: str | None) -> str:
    """sha256 of a command's full output: its output file, else the digest already
    known, else the tail (all that is left)."""
    if output_file:
        try:
            digest = hashlib.sha256()
            with open_own(output_file) as f:  # never a file a check linked there
                for block in iter(lambda: f.read(1 << 16), b""):
                    digest.update(block)
            return "sha256:" + digest.hexdigest()
        except OSError:
            pass
    if known:
        return known if known.startswith("sha256:") else "sha256:" + known
    return "sha256:" + hashlib.sha256((tail or "").encode("utf-8", "replace")).hexdigest()


def _save(payloads: list[Payload], metadata: dict[str, Any], succeeded: bool, target: Path,
          sign_key: Any, algorithm: str, memo: RedactionMemo | None = None,
          vouch_key: bytes | None = None) -> None:
    from opentine import Run, RunStatus

    run = Run(metadata=dict(metadata), tags=["pytest-loops", str(metadata.get("verdict", "")).lower()])
    fork_from: str | None = None  # the last iteration step: candidates fork from it
    for index, (kind, inputs, outputs, duration, tool_info) in enumerate(payloads):
        name = (tool_info or {}).get("name")
        if name == BRANCH_TOOL and fork_from is not None:
            arguments = inputs.get("arguments") or {}
            step = _add_step(run, kind, inputs, outputs, duration, tool_info, parent_id=fork_from,
                             ref=f"branch-{arguments.get('iteration')}-{arguments.get('branch')}")
        else:
            step = _add_step(run, kind, inputs, outputs, duration, tool_info, **_spend(outputs))
            if name == ITERATION_TOOL and step is not None:
                fork_from = step.id
        # the step holds its own copy: the payload shares it, so only one is kept
        if step is not None and step.inputs == inputs and step.outputs == outputs:
            payloads[index] = (kind, step.inputs, step.outputs, duration, tool_info)
    if memo is not None:
        memo.known_clean([run.id, *(step.id for step in run.steps)])
        memo.known_clean(_digests(payloads))
    run.status = RunStatus.completed if succeeded else RunStatus.failed
    if vouch_key is not None:
        _vouch(run, vouch_key, memo)
    _save_run(run, target, sign_key, algorithm)


def _save_run(run: Any, target: Path, sign_key: Any, algorithm: str) -> None:
    if sign_key is None:
        run.save(target)
    else:
        run.save(target, sign_key=sign_key, sign_algorithm=algorithm)


def _vouch(run: Any, key: bytes, memo: RedactionMemo | None = None) -> bool:
    """Put the vouch of ``run`` as it stands into its metadata (replacing one it had)."""
    from pytest_loops.artifacts.tinevouch import VOUCH_FIELD, make_vouch

    run.metadata.pop(VOUCH_FIELD, None)
    vouch = make_vouch(key, run.to_dict())
    if vouch is None:  # pragma: no cover - payloads are JSON-safe by construction
        return False
    if memo is not None:
        memo.known_clean([vouch["mac"]])
    run.metadata[VOUCH_FIELD] = vouch
    return True


def _revouch(path: Path, key: bytes, sign_key: Any, algorithm: str) -> str | None:
    """Vouch for the file at ``path`` as opentine reads it back, and check that the
    vouch holds; None when it does, else why the file is left without one."""
    from opentine import Run

    from pytest_loops.artifacts.tinevouch import VOUCH_FIELD, check_vouch

    run = Run.load(path)
    if _vouch(run, key):
        _save_run(run, path, sign_key, algorithm)
        if check_vouch(Run.load(path).to_dict(), key)[0]:
            return None
        run.metadata.pop(VOUCH_FIELD, None)
        _save_run(run, path, sign_key, algorithm)
    return "opentine's redaction changed the file as it was saved, so it could not be vouched"


def _digests(payloads: list[Payload]) -> list[Any]:
    """The digests the steps hold: the spec's, and per iteration its checks' and
    revise step's output digests and its state hash."""
    found = []
    for _, _, outputs, _, tool_info in payloads:
        found.append(outputs.get("spec_digest"))  # the start step's
        if (tool_info or {}).get("name") != ITERATION_TOOL:
            continue
        found.append(outputs.get("state_hash"))
        for part in [*outputs.get("checks", ()), outputs.get("revise") or {}]:
            found.append(part.get("output_digest"))
    return found


def _bodies(payloads: list[Payload]) -> list[dict[str, Any]]:
    return [{"i": p[1], "o": p[2]} for p in payloads]


def _bodies_of(steps: list[Any]) -> list[dict[str, Any]]:
    return [{"i": s.inputs, "o": s.outputs} for s in steps]


def _refit(payloads: list[Payload], stored: list[dict[str, Any]], run_class: Any) -> list[Payload]:
    """Payloads that opentine's redaction leaves as they are."""
    oracle = _oracle(run_class)
    bodies = _bodies(payloads)
    if len(stored) != len(bodies):  # pragma: no cover - opentine never drops steps
        return payloads
    fixed = [_fix(b, r, oracle) for b, r in zip(bodies, stored, strict=True)]
    return [(p[0], b["i"], b["o"], p[3], p[4]) for p, b in zip(payloads, fixed, strict=True)]


def _oracle(run_class: Any):
    def redacted(value: Any) -> Any:
        # The public to_dict(redact=True) runs the same passes as save().
        probe = run_class(metadata={"probe": value})
        return probe.to_dict(redact=True)["metadata"]["probe"]
    return redacted


def _fix(original: Any, redacted: Any, oracle: Any) -> Any:
    if original == redacted:
        return original
    if isinstance(original, dict) and isinstance(redacted, dict) and original.keys() == redacted.keys():
        return {k: _fix(original[k], redacted[k], oracle) for k in original}
    if isinstance(original, list) and isinstance(redacted, list) and len(original) == len(redacted):
        return [_fix(a, b, oracle) for a, b in zip(original, redacted, strict=True)]
    if isinstance(original, str):
        # Line by line, so a secret costs its own line and never the ones after
        # it. opentine's `name: [REDACTED]` loses its separator: a whole-string
        # pass would read `name:` as a label and replace everything after it.
        lines = original.split("\n")
        masked = [item["t"] for item in oracle([{"t": line} for line in lines])]
        return "\n".join(
            line if line == new else _SEPARATED_MARKER.sub(" [REDACTED", new)
            for line, new in zip(lines, masked, strict=True)
        )
    return redacted


def one_line(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__

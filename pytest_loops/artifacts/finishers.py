"""What a finished loop leaves besides its run log: `.tine` provenance and a hand-off.

Both are written after the verdict and before the run-log summary, so the
summary lists them. A failure to write either is recorded in the summary
(``tine_error`` / ``handoff_error``: the file and the errno) and never loses the
run log or the verdict.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_loops.artifacts.provenance import MIN_HMAC_KEY_BYTES
from pytest_loops.core.engine import RunPaths
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import LoopResult


@dataclass(frozen=True)
class ArtifactOptions:
    """How a loop's provenance and hand-off are written."""

    tine: bool = True
    tine_path: str | None = None  # default: beside the run log, suffix .tine
    hmac_key_env: str | None = None  # name of the variable holding the HMAC key
    ed25519_key: str | None = None  # path of an Ed25519 private key file
    handoff: bool = True
    resume_command: Callable[[LoopResult], str] | None = None
    flags: tuple[str, str] = ("--sign-key-env", "--sign-key-file")  # named in errors

    def signing_key(self) -> bytes | None:
        """The HMAC key, read from its variable now (never stored); an Ed25519 key file
        is loaded once to check it. Bad input: LoopUsageError naming the flag."""
        env_flag, file_flag = self.flags
        if self.hmac_key_env is not None and self.ed25519_key is not None:
            raise LoopUsageError("give an HMAC key variable or an Ed25519 key file, not both",
                                 location=f"{env_flag} / {file_flag}")
        if self.ed25519_key is not None:
            from pytest_loops.artifacts.provenance import _signing_key

            try:
                _signing_key(None, self.ed25519_key)
            except LoopUsageError as exc:
                raise LoopUsageError(exc.message, location=f"{file_flag} {self.ed25519_key}",
                                     fix=exc.fix) from None
            return None
        if self.hmac_key_env is None:
            return None
        value = os.environ.get(self.hmac_key_env)
        if not value:
            raise LoopUsageError(f"environment variable {self.hmac_key_env} is not set or empty",
                                 location=env_flag, fix="export the HMAC key (>= 16 bytes) in it")
        key = value.encode()
        if len(key) < MIN_HMAC_KEY_BYTES:
            raise LoopUsageError(f"the HMAC key in {self.hmac_key_env} is {len(key)} bytes; it must be "
                                 f"at least {MIN_HMAC_KEY_BYTES}", location=env_flag,
                                 fix="make one with `tine keygen --hmac --out FILE`")
        return key


def make_finishers(options: ArtifactOptions) -> list[Callable[[LoopResult, RunPaths], None]]:
    """Engine finishers for these options. Validates the signing key first."""
    key = options.signing_key()
    finishers: list[Callable[[LoopResult, RunPaths], None]] = []

    if options.tine:
        def tine(result: LoopResult, paths: RunPaths) -> None:
            from pytest_loops.artifacts.provenance import write_tine

            target = Path(options.tine_path) if options.tine_path else paths.log.with_suffix(".tine")
            try:
                result.artifacts["tine"] = write_tine(result, target, hmac_key=key,
                                                      ed25519_key_path=options.ed25519_key)
            except Exception as exc:  # noqa: BLE001 - provenance must never cost the run log
                result.artifacts["tine_error"] = artifact_error(target, exc)

        finishers.append(tine)

    if options.handoff:
        def handoff(result: LoopResult, paths: RunPaths) -> None:
            if result.succeeded:
                return
            from pytest_loops.artifacts.handoff import write_handoff

            command = options.resume_command(result) if options.resume_command else ""
            target = paths.log.with_name(paths.log.stem + ".handoff.md")
            try:
                result.artifacts["handoff"] = write_handoff(result, target, resume_command=command)
            except Exception as exc:  # noqa: BLE001 - same: the run log comes first
                result.artifacts["handoff_error"] = artifact_error(target, exc)

        finishers.append(handoff)
    return finishers


def artifact_error(path: str | os.PathLike, exc: BaseException) -> str:
    """One line naming the file and the errno: "PATH: [Errno 28] No space left on device"."""
    if isinstance(exc, OSError) and exc.errno:
        return f"{getattr(exc, 'filename', None) or path}: [Errno {exc.errno}] {exc.strerror}"
    return f"{path}: {type(exc).__name__}: {exc}"


def artifact_errors_line(errors: Sequence[str]) -> str | None:
    """The one stderr line for the artifacts a run could not write (None: all written)."""
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"pytest-loops: could not write {errors[0]}{more}; the verdict stands"

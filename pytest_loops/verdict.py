"""Verdicts and process exit codes: the contract CI scripts rely on."""

from __future__ import annotations

import enum

EXIT_USAGE = 64
"""Bad command line, config or loop file (sysexits EX_USAGE)."""

EXIT_INTERNAL = 70
"""An internal error of the harness (sysexits EX_SOFTWARE)."""


WATCH_SOURCE_SILENCE = "watch_source_silence"
"""The reason a watch ends NO_PROGRESS: no tick with new state arrived within its silence window."""


class Verdict(enum.StrEnum):
    """How a loop ended. Exactly one per loop."""

    SUCCESS = "SUCCESS"
    MAX_ITER = "MAX_ITER"
    TIMEOUT = "TIMEOUT"
    NO_PROGRESS = "NO_PROGRESS"
    ESCALATE = "ESCALATE"

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]

    @classmethod
    def from_exit_code(cls, code: int) -> Verdict:
        for verdict, value in _EXIT_CODES.items():
            if value == code:
                return verdict
        raise ValueError(f"{code} is not a verdict exit code; valid: 0, 2, 3, 4, 5")

    def __str__(self) -> str:
        return self.value


_EXIT_CODES = {
    Verdict.SUCCESS: 0,
    Verdict.MAX_ITER: 2,
    Verdict.TIMEOUT: 3,
    Verdict.NO_PROGRESS: 4,
    Verdict.ESCALATE: 5,
}

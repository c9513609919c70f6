"""The guards' defaults and the one rule set every source checks their values with.

A module of its own, below :mod:`pytest_loops.spec`: the settings table (which pytest
imports with the plugin, loop or not) needs these and none of the loop's data classes.
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_MAX_ITER = 6
DEFAULT_BUDGET_SECONDS = 900.0
DEFAULT_NO_PROGRESS_K = 2
DEFAULT_ESCALATE_AFTER = 0
DEFAULT_OUTPUT_CAP = 16 << 20  # bytes of a command's output kept: the first and last halves
NO_PROGRESS_SIGNALS = ("state", "failure", "both")
"""What the no-progress guard watches: the state fingerprint (default), the
failure signature (the same failure K times in a row, even when files changed),
or both (either one stops the loop)."""

CLOSURE_ENV = "PYTEST_LOOPS_CLOSURE"
"""A directory: the pytest runs of a loop's first verify record what the tests read
there (:mod:`pytest_loops.pytest_plugin.closure`). Here, not with the checks: the
plugin looks it up in every run, loop or not."""

__all__ = ["CLOSURE_ENV", "DEFAULT_BUDGET_SECONDS", "DEFAULT_ESCALATE_AFTER", "DEFAULT_MAX_ITER",
           "DEFAULT_NO_PROGRESS_K", "DEFAULT_OUTPUT_CAP", "NO_PROGRESS_SIGNALS", "validate_guard_values"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_guard_values(**values: Any) -> list[tuple[str, str]]:
    """Return (name, message) for each invalid guard value given; [] when all are valid.

    One rule set shared by every source (flags, config files, ini, markers, loop files).
    """
    problems: list[tuple[str, str]] = []
    for name, value in values.items():
        if value is None:
            continue
        if name == "budget_seconds":
            if not _is_number(value) or value < 0:
                problems.append(
                    (name, f"{value!r} is not a valid budget_seconds; "
                           "valid: a number of seconds >= 0 (0 turns the budget off)")
                )
            continue
        if name == "max_cost":
            if not _is_number(value) or value < 0:
                problems.append((name, f"{value!r} is not a valid max_cost; "
                                       "valid: an amount in US dollars >= 0 (0 turns it off)"))
            continue
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if name == "max_iter":
            if not is_int or value < 1:
                problems.append(
                    (name, f"{value!r} is not a valid max_iter; valid: an integer >= 1 (the cap is always on)")
                )
        elif name in ("no_progress_k", "escalate_after", "max_tokens"):
            if not is_int or value < 0:
                problems.append(
                    (name, f"{value!r} is not a valid {name}; valid: an integer >= 0 (0 turns it off)")
                )
        else:  # pragma: no cover - programming error
            raise KeyError(name)
    return problems

"""Pure stop rules. Each takes plain values and answers one question."""

from __future__ import annotations


def budget_exhausted(elapsed_s: float, budget_seconds: float) -> bool:
    """The wall-clock budget is used up (0 = no budget)."""
    return budget_seconds > 0 and elapsed_s >= budget_seconds


def cap_reached(iteration: int, max_iter: int) -> bool:
    """`iteration` was the last one the cap allows. The cap is always on."""
    return iteration >= max_iter


def next_unchanged_streak(previous_hash: str | None, current_hash: str | None, streak: int) -> int:
    """How many iterations in a row the state fingerprint has not moved.

    The first measured iteration has nothing to compare with: streak 0.
    """
    if previous_hash is None or current_hash is None:
        return 0
    return streak + 1 if current_hash == previous_hash else 0


def no_progress(streak: int, k: int, measurable: bool) -> bool:
    """The state did not move for K iterations in a row.

    Off when K is 0, and off when there are no state paths to measure: a loop
    must never stop on a signal it cannot measure.
    """
    return measurable and k > 0 and streak >= k


def should_escalate(iteration: int, escalate_after: int) -> bool:
    """`escalate_after` failed iterations have run (0 = never)."""
    return escalate_after > 0 and iteration >= escalate_after


def flapping(history: list[bool], k: int) -> bool:
    """A check alternated pass/fail for its last 2K results (at least 4): the revise
    step is undoing its own fixes. Off when K is 0."""
    window = max(4, 2 * k)
    if k <= 0 or len(history) < window:
        return False
    last = history[-window:]
    return all(a != b for a, b in zip(last, last[1:], strict=False))

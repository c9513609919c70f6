"""Pure stop rules. Each takes plain values and answers one question; :func:`rule`
asks them in order for one failed iteration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_loops.results import CheckResult, IterationRecord
from pytest_loops.spec import LoopSpec
from pytest_loops.verdict import Verdict


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


def rule(spec: LoopSpec, record: IterationRecord, failed: list[CheckResult],
         iteration: int, streak: int, *, measurable: bool,
         machine_ok: bool, history: Mapping[str, list[bool]]) -> tuple[Verdict | None, str]:
    """The guards after a failed iteration: a verdict and its reason, or (None, "")."""
    g = spec.guards
    why = ""
    signal = spec.no_progress_signal
    if signal in ("state", "both") and no_progress(streak, g.no_progress_k, measurable):
        why = (f"state unchanged for {streak} iteration(s) in a row "
               f"(no_progress_k={g.no_progress_k}; watched: {', '.join(spec.state_paths)})")
    elif signal in ("failure", "both") and no_progress(record.same_failure_streak,
                                                             g.no_progress_k, True):
        why = (f"the same failure {record.same_failure_streak + 1} iterations in a row "
               f"(no_progress_k={g.no_progress_k}, signal={signal}): {failed_names(failed)}")
    else:
        flappers = [name for name, seen in history.items() if flapping(seen, g.no_progress_k)]
        if flappers:
            why = (f"flapping: {', '.join(flappers[:3])} alternated pass/fail for the last "
                   f"{max(4, 2 * g.no_progress_k)} iterations; the revise step undoes its own fixes")
    if why:
        record.guard = "no_progress"
        if spec.escalate_when_blocked:
            return Verdict.ESCALATE, f"blocked, asking a human: {why}"
        return Verdict.NO_PROGRESS, why
    if machine_ok:
        record.guard = "human"
        return Verdict.ESCALATE, "; ".join(c.reason for c in failed)
    if should_escalate(iteration, g.escalate_after):
        record.guard = "escalate"
        return Verdict.ESCALATE, (f"escalate_after={g.escalate_after} reached: still failing after "
                                  f"{iteration} iteration(s) ({failed_names(failed)})")
    if cap_reached(iteration, g.max_iter):
        record.guard = "max_iter"
        if spec.stop_message:
            return Verdict.MAX_ITER, spec.stop_message
        return Verdict.MAX_ITER, (f"max_iter={g.max_iter} reached without passing "
                                  f"({failed_names(failed)})")
    return None, ""


def seen(spec: LoopSpec, record: IterationRecord, iteration: int, elapsed: float,
         measurable: bool) -> dict[str, Any]:
    """What the guards saw at the end of an iteration (the run log's guards_seen)."""
    g = spec.guards
    seen: dict[str, Any] = {"iteration": f"{iteration}/{g.max_iter}", "elapsed_s": round(elapsed, 3)}
    if g.budget_seconds > 0:
        seen["budget_left_s"] = round(max(0.0, g.budget_seconds - elapsed), 3)
    if measurable and g.no_progress_k > 0:
        seen["unchanged"] = f"{record.unchanged_streak}/{g.no_progress_k}"
    if g.escalate_after > 0:
        seen["escalate_after"] = f"{iteration}/{g.escalate_after}"
    return seen


def failed_names(failed: list[CheckResult]) -> str:
    names = ", ".join(f"{c.name}: {c.reason}" if c.reason else c.name for c in failed[:3])
    more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    return f"failing: {names}{more}" if names else "no check passed"

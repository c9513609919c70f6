"""One iteration's state and its transitions, and what a resumed run does first.

A loop's iteration goes ``verify -> guards -> reflect -> revise -> next`` or, from
any step that decides, to ``verdict``. :class:`LoopState` carries the iteration
and what the guards measure across iterations (the unchanged streak, the same
failure, each check's pass/fail history); the engine drives it, and a step taken
out of order raises :class:`IllegalTransition`.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_loops.core import guards
from pytest_loops.results import CheckResult, IterationRecord, IterationSpill
from pytest_loops.spec import LoopSpec
from pytest_loops.verdict import Verdict


class Step(enum.Enum):
    START = "start"  # before the first iteration
    VERIFY = "verify"  # the checks ran
    GUARDS = "guards"  # progress measured, the guards asked
    REFLECT = "reflect"  # the lesson (if any) written
    REVISE = "revise"  # the revise step ran
    NEXT = "next"  # the iteration is recorded; another one follows
    VERDICT = "verdict"  # the loop is decided


# from -> the steps allowed next. A resumed run whose revise step was cut off goes
# from NEXT (or START) straight to REVISE; a verdict can be reached from any step.
TRANSITIONS: dict[Step, frozenset[Step]] = {
    Step.START: frozenset({Step.VERIFY, Step.REVISE, Step.VERDICT}),
    Step.VERIFY: frozenset({Step.GUARDS, Step.NEXT, Step.VERDICT}),
    Step.GUARDS: frozenset({Step.REFLECT, Step.VERDICT}),
    Step.REFLECT: frozenset({Step.REVISE, Step.VERDICT}),
    Step.REVISE: frozenset({Step.NEXT, Step.VERDICT}),
    Step.NEXT: frozenset({Step.VERIFY, Step.REVISE, Step.VERDICT}),
    Step.VERDICT: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A step taken out of order (an engine bug, never bad input)."""


@dataclass
class LoopState:
    """The loop between two steps: the iteration now, and what carries across iterations."""

    iteration: int = 0
    step: Step = Step.START
    record: IterationRecord | None = None
    failed: list[CheckResult] = field(default_factory=list)
    verdict: Verdict | None = None
    reason: str = ""
    records: IterationSpill = field(default_factory=IterationSpill)  # flat memory however long the loop
    previous_hash: str | None = None
    streak: int = 0  # iterations in a row with the watched state unchanged
    previous_signature: str | None = None
    same_failure: int = 0  # iterations in a row with the same failure signature
    history: dict[str, list[bool]] = field(default_factory=dict)  # check name -> pass/fail (flapping)

    @classmethod
    def resumed(cls, prior: Sequence[IterationRecord]) -> LoopState:
        """The state after ``prior`` (a resumed run's iterations; none: a new loop)."""
        last = prior[-1] if prior else None
        state = cls(iteration=len(prior), records=IterationSpill(prior),
                    previous_hash=last.state_hash if last else None,
                    streak=last.unchanged_streak if last else 0,
                    previous_signature=last.failure_signature if last else None,
                    same_failure=last.same_failure_streak if last else 0)
        for old in prior:
            state.observe(old)
        return state

    def to(self, step: Step) -> None:
        """Take ``step`` next; IllegalTransition when it may not follow the one before."""
        if step not in TRANSITIONS[self.step]:
            raise IllegalTransition(f"{self.step.value} -> {step.value} is not a step of the loop")
        self.step = step

    def begin(self, record: IterationRecord) -> None:
        """A new iteration (or the one whose revise step a killed run left) starts."""
        if self.step not in (Step.START, Step.NEXT):
            raise IllegalTransition(f"a new iteration cannot start after {self.step.value}")
        self.record, self.failed = record, []

    def decide(self, verdict: Verdict | None, reason: str = "") -> bool:
        """Record a step's outcome; True (and step VERDICT) when it decided the loop."""
        if verdict is None:
            return False
        self.to(Step.VERDICT)
        self.verdict, self.reason = verdict, reason
        return True

    def observe(self, record: IterationRecord) -> None:
        """Each check's pass/fail into the history the flapping guard reads."""
        for c in record.checks:
            self.history.setdefault(c.name, []).append(c.passed)

    def measure(self, record: IterationRecord, current: str | None, measured: bool) -> None:
        """Progress: the state hash (when ``measured``) and the failure signature of
        this iteration, and the streaks they extend."""
        if measured:
            self.streak = guards.next_unchanged_streak(self.previous_hash, current, self.streak)
            record.state_hash = current
            # the first measurement has nothing to compare with: None
            record.state_changed = None if self.previous_hash is None else current != self.previous_hash
            self.previous_hash = current
        record.unchanged_streak = self.streak
        record.failure_signature = iteration_signature(self.failed)
        same = self.previous_signature == record.failure_signature and self.previous_signature is not None
        self.same_failure = self.same_failure + 1 if same else 0
        record.same_failure_streak = self.same_failure
        self.previous_signature = record.failure_signature
        self.observe(record)

    def resume_revise(self, record: IterationRecord) -> None:
        """The iteration a killed run cut off in its revise step: verify, progress,
        lesson and guards ran before the kill; its streaks are the state now."""
        self.failed = [c for c in record.checks if not c.passed]
        self.previous_hash = record.state_hash or self.previous_hash
        self.streak = record.unchanged_streak
        self.previous_signature = record.failure_signature
        self.same_failure = record.same_failure_streak
        self.observe(record)


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed run does first: run an interrupted revise step again, or write
    out a verdict the killed run had decided; neither (the default): verify next."""

    revise: IterationRecord | None = None
    decided: tuple[str, str] | None = None  # (verdict, reason)


def resume_plan(resume_from: Mapping[str, Any] | None, spec: LoopSpec,
                prior: Sequence[IterationRecord]) -> ResumePlan:
    """The plan for resuming from ``resume_from`` (a loaded run log) with ``spec``.

    A verdict the killed run had decided (its last iteration line names it) is
    kept, unless it is MAX_ITER or TIMEOUT and the resumed run raised that limit.
    """
    if not resume_from:
        return ResumePlan()
    pending = resume_from.get("revise_interrupted")
    if isinstance(pending, dict):
        try:
            record = IterationRecord.from_dict(pending)
        except (TypeError, ValueError, AttributeError):
            return ResumePlan()  # not a record: verify that iteration afresh
        if record.iter == len(prior) + 1:
            return ResumePlan(revise=record)
    decided = resume_from.get("decided")
    if not isinstance(decided, dict) or not prior or decided.get("iter") != prior[-1].iter:
        return ResumePlan()
    try:
        verdict = Verdict(str(decided.get("verdict")))
    except ValueError:
        return ResumePlan()
    found = resume_from.get("guards")
    logged: dict[str, Any] = found if isinstance(found, dict) else {}
    raised = {Verdict.MAX_ITER: "max_iter", Verdict.TIMEOUT: "budget_seconds"}.get(verdict)
    if raised and logged.get(raised) != getattr(spec.guards, raised):
        return ResumePlan()
    return ResumePlan(decided=(verdict.value, str(decided.get("reason") or "")))


def stop_leftovers(run_dir: Any, *, wait_s: float = 10.0) -> list[int]:
    """Kill the processes a killed run left behind: those whose environment names its
    run directory (``LOOP_RUN_DIR``). Linux (/proc) only; returns their pids."""
    import signal

    if not isinstance(run_dir, str) or not run_dir or not os.path.isdir("/proc"):
        return []
    needle = f"LOOP_RUN_DIR={run_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
            found.append(int(entry))
        except OSError:
            continue
    end = time.monotonic() + wait_s
    while found and time.monotonic() < end and any(_alive(pid) for pid in found):
        time.sleep(0.02)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"  # a zombie is gone
    except OSError:
        return False


def iteration_signature(failed: list[CheckResult]) -> str | None:
    """One fingerprint of what failed this iteration: each failed check's name and
    normalized failure (line numbers, addresses, temp paths and timings stripped)."""
    if not failed:
        return None
    import hashlib

    from pytest_loops.progress.signature import failure_signature

    parts = []
    for c in sorted(failed, key=lambda c: c.name):
        kind = "pytest" if c.kind == "pytest" or "pytest" in (c.command or "") else "command"
        parts.append(f"{c.name}\0{c.exit_code}\0{failure_signature(c.output_tail, kind=kind)}")
    return "sha256:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()



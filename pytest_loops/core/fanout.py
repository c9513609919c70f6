"""Best-of-N revise: N candidates per iteration, each in its own copy of the tree.

With ``branches`` > 1 the revise step of an iteration runs N times in parallel,
each run in an isolated copy of the working tree (:mod:`~pytest_loops.runtime.treecopy`;
all copies made before the first candidate starts) with ``LOOP_BRANCH`` (0..N-1) and
``LOOP_BRANCHES`` set. What each candidate
changed is read right after its revise step and judged by the tree guard's rules
exactly as a single revise step's changes are: a candidate that touched a
read-only path or left the scope is discarded, with the reason recorded. The
others are verified with the loop's visible checks in their copies (hidden checks
never run there), and the best one's changes are written into the real tree:

    all checks pass > more checks pass > fewer failing tests > smaller diff
    > lower branch number

The real tree's guard then sees those changes as the revise step's, and the next
iteration's verify (the clean room, the audit) judges them: a candidate's own
verification only ranks candidates, it never decides a verdict. The copies are
removed before the iteration goes on, on an error, Ctrl-C or SIGTERM too.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.core.context import LoopContext
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import CheckResult, CommandResult, IterationRecord
from pytest_loops.runtime.threads import leave_signals_to_the_main_thread
from pytest_loops.runtime.treecopy import Change, TreeCopy, git_top, new_parent
from pytest_loops.spec import LoopSpec

POOL_OPTIONS: dict[str, Any] = {"thread_name_prefix": "pytest-loops-branch",
                                "initializer": leave_signals_to_the_main_thread}
"""How the candidates' threads are made: Ctrl-C and SIGTERM reach the main thread at once."""

BRANCH_VARIABLE = "LOOP_BRANCH"
BRANCHES_VARIABLE = "LOOP_BRANCHES"


@dataclass
class Candidate:
    """One revise candidate of one iteration."""

    branch: int
    outcome: Any = None  # what the revise hook returned
    checks: list[CheckResult] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    diff_size: int = 0
    discarded: str = ""  # why it cannot be chosen ("" : it can)
    chosen: bool = False
    why: str = ""  # why chosen, or why not
    copy_seconds: float = 0.0
    copy_kind: str = ""  # overlay (an upper layer over the tree), git-worktree or copy
    budget_hit: bool = False

    @property
    def passed(self) -> int:
        return sum(1 for c in self.checks if c.passed)

    @property
    def failing_tests(self) -> int:
        return sum(len(c.failing_tests) for c in self.checks if not c.passed)

    def rank(self, total: int) -> tuple[bool, int, int, int, int]:
        return (self.passed == total and total > 0, self.passed, -self.failing_tests, -self.diff_size, -self.branch)

    def revise_exit(self) -> int | None:
        if isinstance(self.outcome, CommandResult):
            return self.outcome.exit_code
        return self.outcome if isinstance(self.outcome, int) and not isinstance(self.outcome, bool) else None

    def to_dict(self, total: int) -> dict[str, Any]:
        return {
            "branch": self.branch,
            "revise_exit": self.revise_exit(),
            "checks": [{"name": c.name, "passed": c.passed, "exit_code": c.exit_code} for c in self.checks],
            "passed": self.passed,
            "of": total,
            "failing_tests": self.failing_tests,
            "changed_files": len(self.changes),
            "diff_size": self.diff_size,
            "chosen": self.chosen,
            "why": self.why,
            "copy_s": round(self.copy_seconds, 4),
            "copy": self.copy_kind,
        }


@dataclass
class FanOut:
    """Runs one iteration's candidates; see the module docstring.

    ``revise(ctx)`` is the revise hook, ``run_check(check, ctx)`` the check hook,
    ``readonly_reason(rel, entry, new)`` the real tree guard's rule for a changed path
    (``new``: not there at loop start), ``ignored(rel)`` its never-tracked paths."""

    branches: int
    max_parallel: int
    revise: Callable[[LoopContext], Any]
    run_check: Callable[[Any, LoopContext], CheckResult]
    readonly_reason: Callable[[str, Any, bool], str | None]
    is_new: Callable[[str], bool]
    ignored: Callable[[str], bool]
    clock: Callable[[], float] = time.monotonic

    def run(self, ctx: LoopContext) -> tuple[Any, list[Candidate]]:
        """The chosen candidate's revise outcome (its changes now in the real tree)
        and every candidate, in branch order."""
        parent = new_parent()
        mounted = bool(getattr(ctx.confine, "mounts_copies", False))
        copies: list[TreeCopy]
        if getattr(ctx.confine, "layers_candidates", False):  # no copy: an upper layer each
            from pytest_loops.runtime.overlaycopy import OverlayCopy

            copies = [OverlayCopy(ctx.workdir, parent, f"b{i}", ignored=self._ignored) for i in range(self.branches)]
        else:
            top = git_top(os.fspath(ctx.workdir))
            copies = [TreeCopy(ctx.workdir, parent, f"b{i}", ignored=self._ignored, use_git=top is not None,
                               top=top, venv_mounts=mounted) for i in range(self.branches)]
        candidates = [Candidate(branch=i) for i in range(self.branches)]
        try:
            workers = max(1, min(self.branches, self.max_parallel))
            with ThreadPoolExecutor(max_workers=workers, **POOL_OPTIONS) as pool:
                # every copy is made before any revise step starts: no git process of the
                # harness runs beside a candidate's command (whose reaper could take it for
                # an escaped descendant), and a candidate's change to the repository's git
                # files reaches no git call that makes another copy
                list(pool.map(lambda i: self._copy(copies[i], candidates[i]), range(self.branches)))
                list(pool.map(lambda i: self._candidate(ctx, copies[i], candidates[i]), range(self.branches)))
            if any(c.budget_hit for c in candidates):
                ctx.budget_hit = True
            chosen = self._choose(ctx, candidates)
            if chosen is not None:
                copies[chosen.branch].apply(chosen.changes, ctx.workdir)
                return chosen.outcome, candidates
            return candidates[0].outcome, candidates
        finally:
            for copy in copies:
                copy.remove()
            shutil.rmtree(parent, ignore_errors=True)

    def _ignored(self, rel: str) -> bool:
        parts = rel.split("/")
        return self.ignored(rel) or "__pycache__" in parts or rel.endswith((".pyc", ".pyo"))

    def _copy(self, copy: TreeCopy, candidate: Candidate) -> None:
        t0 = self.clock()
        try:
            copy.create()
        except OSError as exc:
            candidate.discarded = f"its copy of the tree could not be made: {exc}"
            return
        candidate.copy_seconds = self.clock() - t0
        candidate.copy_kind = copy.kind

    def _candidate(self, ctx: LoopContext, copy: TreeCopy, candidate: Candidate) -> None:
        if candidate.discarded:
            return
        env = {**ctx.base_env, BRANCH_VARIABLE: str(candidate.branch), BRANCHES_VARIABLE: str(self.branches)}
        mine = dataclasses.replace(ctx, workdir=type(ctx.workdir)(copy.view), base_env=env,
                                   layer=getattr(copy, "layer", None),
                                   label_prefix=f"branch-{candidate.branch}-", localizer=None, clean_room=None,
                                   branch=candidate.branch, real_workdir=ctx.workdir,
                                   budget_hit=False, failed_tests_seen={}, suspects=list(ctx.suspects))
        candidate.outcome = self.revise(mine)
        candidate.budget_hit = mine.budget_hit
        candidate.changes = copy.changes()
        why = self._rule_breaks(candidate.changes)
        if why:
            candidate.discarded = why
            return
        candidate.diff_size = copy.diff_size(candidate.changes)
        for check in ctx.spec.checks:
            if check.hidden or mine.budget_hit:
                continue
            candidate.checks.append(self.run_check(check, mine))
        candidate.budget_hit = candidate.budget_hit or mine.budget_hit

    def _rule_breaks(self, changes: list[Change]) -> str:
        broken = []
        for change in changes:
            new = self.is_new(change.rel)
            reason = self.readonly_reason(change.rel, change.entry, new)
            if reason is not None:
                broken.append(f"{change.rel} ({change.how}: {reason})")
        if not broken:
            return ""
        more = f" and {len(broken) - 4} more" if len(broken) > 4 else ""
        return "changed read-only paths: " + ", ".join(broken[:4]) + more

    def _choose(self, ctx: LoopContext, candidates: list[Candidate]) -> Candidate | None:
        total = sum(1 for c in ctx.spec.checks if not c.hidden)
        for c in candidates:
            if not c.discarded and isinstance(c.outcome, CommandResult) and c.outcome.start_error:
                c.discarded = f"its revise step could not start: {c.outcome.start_error}"
        usable = [c for c in candidates if not c.discarded]
        if not usable:
            for c in candidates:
                c.why = f"discarded: {c.discarded}"
            return None
        best = max(usable, key=lambda c: c.rank(total))
        best.chosen = True
        best.why = _why_best(best, usable, total)
        for c in candidates:
            if c is best:
                continue
            c.why = f"discarded: {c.discarded}" if c.discarded else _why_not(c, best, total)
        return best


def _why_best(best: Candidate, usable: list[Candidate], total: int) -> str:
    if len(usable) == 1:
        return f"the only candidate left ({best.passed}/{total} checks pass)"
    return f"best of {len(usable)}: {best.passed}/{total} checks pass, {best.failing_tests} failing test(s), " \
           f"diff {best.diff_size}"


def _why_not(c: Candidate, best: Candidate, total: int) -> str:
    if c.passed != best.passed:
        return f"fewer checks pass ({c.passed}/{total} against {best.passed}/{total})"
    if c.failing_tests != best.failing_tests:
        return f"more failing tests ({c.failing_tests} against {best.failing_tests})"
    if c.diff_size != best.diff_size:
        return f"a bigger diff ({c.diff_size} against {best.diff_size})"
    return f"a tie, broken by the lower branch number ({best.branch})"


def check_fan_out(spec: LoopSpec) -> None:
    """Bad input (LoopUsageError) before anything runs: fan-out outside a git
    repository without a scope. A worktree copy is bounded by what git tracks; a plain
    copy of an arbitrary directory (a home directory, a mount) is not, so it is made
    only for a loop that names what it may change."""
    if spec.branches <= 1 or spec.scope:
        return
    if git_top(os.fspath(Path(spec.cwd).resolve())) is None:
        raise LoopUsageError(
            f"branches {spec.branches}: {spec.cwd} is not in a git repository with a commit and the loop has "
            "no scope", fix="run it in a git repository (git init && git add -A && git commit -m base), or give "
                            "the loop a scope (--scope GLOB, `scope:` in the loop file)")


def parallel_limit(max_parallel: int, environ: Mapping[str, str] | None = None) -> int:
    """Candidates run at once: ``max_parallel`` (0: the CPU count) shared by the
    pytest-xdist workers of this session, at least one each."""
    environ = os.environ if environ is None else environ
    limit = max_parallel or os.cpu_count() or 1
    try:
        workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        workers = 1
    return max(1, limit // max(1, workers))


def revise_outcome(pm: Any, spec: LoopSpec, ctx: LoopContext, record: IterationRecord, watch: Any,
                   run_check: Callable[[Any, LoopContext], CheckResult]) -> Any:
    """The revise step of one iteration: the hook once, or ``spec.branches``
    candidates with the best one's changes written into the tree."""
    def revise(context: LoopContext) -> Any:
        return pm.hook.pytest_loop_revise(spec=spec, iteration=record.iter, context=context)

    if spec.branches <= 1:
        return revise(ctx)
    fan = FanOut(branches=spec.branches, max_parallel=parallel_limit(spec.max_parallel), revise=revise,
                 run_check=run_check,
                 readonly_reason=lambda rel, entry, new: watch.readonly_reason(rel, entry, new=new),
                 is_new=lambda rel: rel not in watch.start, ignored=watch.ignored)
    outcome, candidates = fan.run(ctx)
    total = sum(1 for c in spec.checks if not c.hidden)
    record.branches = [c.to_dict(total) for c in candidates]
    return outcome

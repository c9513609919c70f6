"""The clean-room confirmation: every check once more before a SUCCESS.

The room holds the tree as it was at loop start with only the in-scope changes
(:meth:`~pytest_loops.runtime.protect.TreeGuard.build_clean_room`). In the
namespaces tier it is mounted at the project's own path, so paths, editable
installs and the working directory are those of a plain run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_loops.core.context import LoopContext
from pytest_loops.results import CheckResult, IterationRecord
from pytest_loops.spec import Check, LoopSpec
from pytest_loops.verdict import Verdict

if TYPE_CHECKING:
    from pytest_loops.runtime.protect import TreeGuard


def confirm(spec: LoopSpec, ctx: LoopContext, record: IterationRecord, watch: TreeGuard, *,
            run_check: Callable[[Check, LoopContext], Any], env: Mapping[str, str],
            scrub: Callable[[str], str] | None, localizer: Any, mounted: bool) -> tuple[Verdict | None, str]:
    """A verdict other than SUCCESS, or None. A clean room that cannot be made or filled
    (the temp directory gone, a full disk) confirms nothing: ESCALATE, never a lost verdict."""
    try:
        return _in_room(spec, ctx, record, watch, run_check, env, scrub, localizer, mounted)
    except OSError as exc:
        record.guard = "clean_room"
        where = f" ({exc.filename})" if exc.filename else ""
        return Verdict.ESCALATE, (f"the clean room could not be built to confirm the pass: "
                                  f"{exc.strerror or exc}{where}")


def _in_room(spec: LoopSpec, ctx: LoopContext, record: IterationRecord, watch: TreeGuard,
             run_check: Callable[[Check, LoopContext], Any], env: Mapping[str, str],
             scrub: Callable[[str], str] | None, localizer: Any, mounted: bool) -> tuple[Verdict | None, str]:
    from pytest_loops.runtime.cleanroom import CleanRoom

    with CleanRoom(str(ctx.workdir), env) as room:
        tampered = watch.verify_store()
        if tampered:
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the loop-start copies of read-only files were changed "
                                      f"behind the harness: {', '.join(tampered[:5])}")
        outside = watch.ancestor_changes()
        if outside:
            record.guard = "clean_room"
            return Verdict.ESCALATE, f"configuration outside the tree (or on its sys.path) changed: {outside[0]}"
        # what the checks left in the working tree is put back first: a read-only file the
        # code under test rewrote or deleted ends ESCALATE; a new file it made where the
        # revise step could not (a conftest.py, a file in a test directory) is removed
        undone = watch.before_revise()
        record.protected_changes += [v.describe() for v in undone]
        rewritten = [v.describe() for v in undone if v.how != "added"]
        if rewritten:
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the code under test changed read-only files of the working tree "
                                      f"while it was checked: {', '.join(rewritten[:5])}")
        drifted = _drifted(watch, record)
        if drifted:
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the code under test changed in-scope sources while it was checked "
                                      "(the diff audit saw other bytes; the room would judge unaudited code): "
                                      f"{drifted}")
        overlay = mounted and bool(getattr(ctx.confine, "overlays_room", False))
        if overlay:  # no copy: the working tree itself under a throw-away layer
            room.overlay_of(watch.root)
        else:
            if mounted:  # the room's tree is seen at the project's own path
                room.mount(watch.root)
            watch.build_clean_room(room.root, link_venvs=not mounted)
        cwd = ctx.workdir if mounted else Path(room.root) / os.path.relpath(ctx.workdir, watch.root)
        clean = LoopContext(spec=spec, iteration=ctx.iteration, workdir=cwd, run_dir=ctx.run_dir,
                            runner=ctx.runner, clock=ctx.clock, deadline=ctx.deadline,
                            base_env=dict(room.env), scrub=scrub, clean_room=room, localizer=localizer,
                            label_prefix="cleanroom-", failed_tests_seen=ctx.failed_tests_seen,
                            confine=ctx.confine)
        for check in spec.checks:
            result = run_check(check, clean)
            if not isinstance(result, CheckResult):
                raise TypeError(f"pytest_loop_run_check returned {type(result).__name__} for "
                                f"{check.name!r} in the clean room; expected a CheckResult")
            record.clean_room.append(result)
            if clean.budget_hit:
                record.guard = "budget"
                return Verdict.TIMEOUT, (f"budget of {spec.guards.budget_seconds:g}s ran out "
                                         f"during the clean-room confirmation of iteration {record.iter}")
            if not result.passed and check.hidden:
                record.guard = "hidden_check"
                return Verdict.ESCALATE, (f"the hidden check {check.name} did not pass in the clean "
                                          f"room: {result.reason}")
            if not result.passed and check.options.get("session_fix"):
                # the session fix-loop's judged run is its confirm run: a test it finds
                # failing (a regression) is the next iteration's to repair, not an escalation
                record.checks = [result if c.name == check.name else c for c in record.checks]
                record.passed = False
                record.verify_exit = result.exit_code
                record.output_tail = result.output_tail
                return None, ""
            if not result.passed:
                record.guard = "clean_room"
                return Verdict.ESCALATE, (
                    f"{check.name} passed in the working tree but not in the clean room "
                    f"(the loop-start tests and configuration, only the in-scope changes, a fresh "
                    f"environment): {result.reason}")
        changed = [] if room.overlay else watch.readonly_digests(room.root)
        if changed:
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the code under test changed read-only files while it was "
                                      f"judged in the clean room: {', '.join(changed[:5])}")
        # what the judged code may have reached outside the room, where no kernel tier kept it
        # out: the interpreter that judges (a start-up file for the next run), the working tree
        outside = watch.ancestor_changes()
        if outside:
            record.guard = "clean_room"
            return Verdict.ESCALATE, f"the code under test changed files outside the clean room while it was judged: " \
                                     f"{outside[0]}"
        tree = [v.describe() for v in watch.before_revise()]
        if tree:
            record.protected_changes += tree
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the code under test changed read-only files of the working tree while it "
                                      f"was judged: {', '.join(tree[:5])}")
        drifted = _drifted(watch, record)
        if drifted:
            record.guard = "clean_room"
            return Verdict.ESCALATE, ("the code under test changed in-scope sources of the working tree "
                                      f"while it was judged (the tree is not what was judged): {drifted}")
    return None, ""



def _drifted(watch: TreeGuard, record: IterationRecord) -> str:
    """Sources changed since the audit, put back as audited, and bytecode written
    during the loop removed (never trusted over the audited source): what drifted,
    described, or ""."""
    drifted = watch.drift()
    failed = watch.undo_drift(drifted)
    record.caches_cleared += len(watch.clear_new_bytecode())
    if not drifted:
        return ""
    record.protected_changes += [f"{rel} ({how}: changed by a check, put back as audited)"
                                 for rel, how in drifted if rel not in failed]
    return _listed(drifted) + (f"; not put back: {', '.join(failed[:5])}" if failed else "; put back as audited")


def _listed(changes: list[tuple[str, str]]) -> str:
    from pytest_loops.runtime.protect import printable

    shown = ", ".join(f"{printable(rel)} ({how})" for rel, how in changes[:5])
    return shown + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")

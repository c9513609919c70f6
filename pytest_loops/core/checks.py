"""Running one check: command, passes N times, finds nothing, pytest node id, human, hook."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

from pytest_loops.defaults import CLOSURE_ENV  # noqa: F401  (re-exported)
from pytest_loops.limits import open_own
from pytest_loops.progress import treehash
from pytest_loops.results import CheckResult, CommandResult
from pytest_loops.spec import Check, CheckKind

if TYPE_CHECKING:
    from pytest_loops.core.context import LoopContext

hookimpl = pluggy.HookimplMarker("pytest")

CHILD_ENV = "PYTEST_LOOPS_CHILD"
"""Set in the pytest subprocesses a loop starts: `--loop` is ignored there, so a
re-run never starts loops of its own (even with `--loop` in addopts)."""

# pytest exit codes that mean "this named test did not pass" with a special reason
_PYTEST_REASONS = {
    1: "the test failed",
    2: "the test run was interrupted",
    3: "pytest hit an internal error",
    4: "pytest usage error (is the node id right?)",
    5: "collected no test: the node id matches nothing",
}


def digest_file(path: str | None, fallback: str = "") -> str:
    """sha256 of a command's full output file (or of the fallback text)."""
    if path and Path(path).is_file():
        return treehash.PREFIX + treehash.file_digest(path)
    return treehash.PREFIX + treehash.bytes_digest(fallback.encode("utf-8", "replace"))


def _result(check: Check, cmd: CommandResult, passed: bool, reason: str, runs: int = 1) -> CheckResult:
    return CheckResult(
        name=check.name,
        kind=check.kind.value,
        passed=passed,
        exit_code=cmd.exit_code,
        duration_s=cmd.duration_s,
        output_tail=cmd.tail,
        output_file=cmd.output_file,
        reason=reason,
        runs=runs,
        timed_out=cmd.timed_out,
        # the digest the runner took while it wrote the file: no second read of it
        output_digest=(treehash.PREFIX + cmd.output_sha256 if cmd.output_sha256 and cmd.output_file
                       else digest_file(cmd.output_file, cmd.tail)),
        command=cmd.command,
    )


def _failure_reason(cmd: CommandResult, check: Check) -> str:
    if cmd.start_error:
        return f"could not start: {cmd.start_error}"
    if cmd.timed_out:
        return "killed: timed out"
    return f"exit {cmd.exit_code}"


def _label(check: Check, context: LoopContext, run: int) -> str:
    base = context.check_label(check)
    return f"{base}-run{run}" if check.times > 1 else base


def run_repeated(check: Check, context: LoopContext,
                 once: Callable[[Check, LoopContext, str], CheckResult]) -> CheckResult:
    """`... passes N times`: every run must pass; the first failure stops (a flake guard)."""
    total = 0.0
    result: CheckResult | None = None
    for run in range(1, check.times + 1):
        result = once(check, context, _label(check, context, run))
        total += result.duration_s
        if not result.passed:
            reason = result.reason if check.times == 1 else f"run {run} of {check.times} failed ({result.reason})"
            return replace(result, reason=reason, runs=run, duration_s=total)
    assert result is not None
    reason = result.reason if check.times == 1 else f"passed {check.times} times"
    return replace(result, reason=reason, runs=check.times, duration_s=total)


def _judged_command(check: Check, context: LoopContext, label: str) -> tuple[CommandResult, str | None]:
    """Run a check's command; in the clean room every pytest it starts carries the
    harness's witness, and the second value says why the witness does not back a pass
    (it disagrees with the exit code, or a test that failed earlier was not seen passing)."""
    room = context.clean_room
    if room is None:
        return context.run_command(check.command or "", label=label, timeout=check.timeout), None
    channel = room.channel()
    try:
        cmd = context.run_command(check.command or "", label=label, timeout=check.timeout,
                                  extra_env=room.command_env(channel), pass_fds=channel.pass_fds)
        record = channel.read()
    finally:
        channel.close()
    disagreement = record.disagreement(cmd.exit_code)
    if disagreement:
        return cmd, f"the harness's witness disagrees with the exit code: {disagreement}"
    unearned = record.unearned(context.failed_tests_seen.get(check.name, ()))
    return cmd, f"the harness's witness did not see it repaired: {unearned}" if unearned else None


def _command_once(check: Check, context: LoopContext, label: str) -> CheckResult:
    narrowed = _narrowed_run(check, context, label)
    if narrowed is not None and not narrowed.passed:
        return narrowed
    cmd, disagreement = _judged_command(check, context, label)
    if disagreement:
        return _result(check, cmd, False, disagreement)
    if cmd.exit_code != 0:
        return _result(check, cmd, False, _failure_reason(cmd, check))
    if narrowed is not None:
        return _result(check, cmd, True, f"passed (confirm run after {narrowed.reason})")
    return _result(check, cmd, True, "passed")


def _narrowed_run(check: Check, context: LoopContext, label: str) -> CheckResult | None:
    """Affected reruns: when a plain `pytest ...` check failed last iteration, first run
    only its failing tests plus the tests whose executed code changed; the full
    command runs only when those pass (the confirm run). None: no narrowing."""
    previous = context.previous
    if previous is None or context.clean_room is not None or check.times != 1 \
            or "pytest" not in (check.command or ""):
        return None
    last = next((c for c in previous.checks if c.name == check.name), None)
    if last is None or last.passed or context.localizer is None:
        return None
    narrowed = context.localizer.narrowed_command(check.command or "", last, context)
    if narrowed is None:
        return None
    command, count = narrowed
    cmd = context.run_command(command, label=f"{label}-narrowed", timeout=check.timeout)
    what = f"a narrowed run of {count} test(s): the failing ones and those whose code changed"
    if cmd.exit_code != 0:
        return _result(check, cmd, False, f"{_failure_reason(cmd, check)} in {what}")
    return _result(check, cmd, True, what)


def _finds_nothing_once(check: Check, context: LoopContext, label: str) -> CheckResult:
    cmd, disagreement = _judged_command(check, context, label)
    if disagreement:
        return _result(check, cmd, False, disagreement)
    if cmd.exit_code != 0:
        return _result(check, cmd, False, _failure_reason(cmd, check))
    found = _output_lines(cmd)
    if found:
        return _result(check, cmd, False, f"found something ({found} line(s) of output)")
    return _result(check, cmd, True, "found nothing")


def _output_lines(cmd: CommandResult) -> int:
    """Non-blank lines in a command's whole output (not only its tail)."""
    if cmd.output_bytes <= 0:
        return 0
    if not cmd.output_file:
        return len([line for line in cmd.tail.splitlines() if line.strip()]) or (1 if cmd.output_bytes else 0)
    count = 0
    blank = True
    try:
        with open_own(cmd.output_file) as f:  # never a file a check linked there
            while piece := f.readline(1 << 16):  # pieces: a line may be as long as the output
                blank = blank and not piece.strip()
                if piece.endswith(b"\n"):
                    count += not blank
                    blank = True
    except OSError:
        return 1  # unreadable output is not "nothing"
    return count + (not blank)


def run_command_check(check: Check, context: LoopContext) -> CheckResult:
    """`"cmd" passes [N times]`: every run must exit 0."""
    return run_repeated(check, context, _command_once)


def run_finds_nothing_check(check: Check, context: LoopContext) -> CheckResult:
    """`"cmd" finds nothing [N times]`: exit 0 and empty output."""
    return run_repeated(check, context, _finds_nothing_once)


def pytest_command(node_ids: str | list[str], junit_path: str, extra_args: list[str] | tuple[str, ...] = ()) -> str:
    """A fresh pytest process for node ids (never in-process: the code changed).

    ``extra_args`` carries the parent session's ``--rootdir`` / ``-c`` so node ids
    resolve the same way.
    """
    ids = [node_ids] if isinstance(node_ids, str) else list(node_ids)
    # a cache of its own, so re-runs never overwrite the user's --lf data
    cache_dir = str(Path(junit_path).parent / ".pytest_cache")
    parts = [sys.executable, "-m", "pytest", "-q", "-o", f"cache_dir={cache_dir}",
             f"--junitxml={junit_path}", "-o", "junit_family=xunit2", *extra_args, *ids]
    return " ".join(shlex.quote(part) for part in parts)


def _junit_counts(path: Path) -> tuple[int, int] | None:
    """(testcases, testcases that passed outright) from a junit file, None if unreadable."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = root.iter("testcase")
    total = passed = 0
    for case in cases:
        total += 1
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            passed += 1
    return total, passed


def run_pytest_check(check: Check, context: LoopContext) -> CheckResult:
    """`the test "NODEID" passes [N times]`: a fresh pytest subprocess; the test must run and pass.

    Exit 0 is not enough: a run where the test was skipped or xfailed, or where
    nothing was collected, does not pass.
    """
    return run_repeated(check, context, _pytest_once)


def _pytest_once(check: Check, context: LoopContext, label: str) -> CheckResult:
    result = _pytest_run(check, context, label)
    return result if result.passed else replace(result, failing_tests=(check.node_id or "",))


def _pytest_run(check: Check, context: LoopContext, label: str) -> CheckResult:
    extra = [context.moved(str(a)) for a in check.options.get("pytest_args", ())]
    if context.clean_room is not None:
        return _pytest_judged(check, context, label, extra)
    junit = context.iteration_dir / f"{label}.junit.xml"
    junit.unlink(missing_ok=True)  # pytest writes it anew, not through a link left there
    cmd = context.run_command(pytest_command(check.node_id or "", str(junit), extra), label=label,
                              timeout=check.timeout, extra_env={CHILD_ENV: "1"})
    if cmd.exit_code != 0:
        reason = _PYTEST_REASONS.get(cmd.exit_code or -1) or _failure_reason(cmd, check)
        return _result(check, cmd, False, reason)
    counts = _junit_counts(junit)
    if counts is None:
        return _result(check, cmd, False, "pytest wrote no readable result; cannot confirm a pass")
    total, passed = counts
    if total == 0:
        return _result(check, cmd, False, _PYTEST_REASONS[5])
    if passed < total:
        return _result(check, cmd, False, f"{total - passed} of {total} test(s) skipped or xfailed, not passed")
    return _result(check, cmd, True, f"{passed} test(s) passed")


def _pytest_judged(check: Check, context: LoopContext, label: str, extra: list[str]) -> CheckResult:
    """The named test in the clean room: the witness, not the exit code, says it passed."""
    room = context.clean_room
    assert room is not None
    channel = room.channel()
    try:
        argv = room.pytest_command([check.node_id or ""], extra, channel)
        cmd = context.run_command(shlex.join(argv), label=label, timeout=check.timeout,
                                  extra_env=channel.extra_env(), pass_fds=channel.pass_fds)
        record = channel.read()
    finally:
        channel.close()
    disagreement = record.disagreement(cmd.exit_code)
    if disagreement:
        return _result(check, cmd, False, f"the harness's witness disagrees with the exit code: {disagreement}")
    if cmd.exit_code != 0:
        reason = _PYTEST_REASONS.get(cmd.exit_code or -1) or _failure_reason(cmd, check)
        return _result(check, cmd, False, reason)
    if record.starts == 0:
        return _result(check, cmd, False, "pytest never loaded the harness's witness; cannot confirm a pass")
    if not record.called:
        return _result(check, cmd, False, _PYTEST_REASONS[5])
    not_passed = sorted(record.called - record.passed)
    if not_passed:
        return _result(check, cmd, False, f"{len(not_passed)} of {len(record.called)} test(s) skipped, "
                                          "xfailed or failed, not passed")
    return _result(check, cmd, True, f"{len(record.called)} test(s) passed (witnessed)")


def needs_human_result(check: Check, reason: str) -> CheckResult:
    return CheckResult(name=check.name, kind=check.kind.value, passed=False, exit_code=None,
                       duration_s=0.0, reason=reason, needs_human=True)


class BuiltinChecks:
    """The built-in `pytest_loop_run_check`; `trylast`, so a conftest or plugin wins."""

    @hookimpl(trylast=True)
    def pytest_loop_run_check(self, check: Check, context: LoopContext) -> CheckResult:
        kind = check.kind
        if kind is CheckKind.COMMAND:
            return run_command_check(check, context)
        if kind is CheckKind.FINDS_NOTHING:
            return run_finds_nothing_check(check, context)
        if kind is CheckKind.PYTEST:
            return run_pytest_check(check, context)
        if kind is CheckKind.HUMAN:
            return needs_human_result(check, f"a human must confirm: {check.text}")
        what = check.options.get("skill") or check.text or check.name
        return needs_human_result(
            check,
            f"no plugin implements pytest_loop_run_check for {what!r}; "
            "this check cannot pass by machine",
        )

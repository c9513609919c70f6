"""`pytest --loop --loop-revise CMD`: the session's failing tests become one fix-loop.

Each iteration re-runs only the tests still failing (a fresh pytest process);
when they all pass, one confirm run of every test the session ran — the failing
ones and the green ones together — decides SUCCESS. A test that was green in the
session and fails in the confirm run is a regression: the loop goes on, and if
it ends before a revise repairs it, the reason names it.
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from .checks import CHILD_ENV, digest_file, pytest_command
from .engine import LoopContext
from .redact import redact, scrub_file, strip_control
from .reporting import shown
from .results import CheckResult, CommandResult, LoopResult
from .revise import name_list
from .spec import Check, CheckKind

if TYPE_CHECKING:
    from .session import LoopSession

hookimpl = pluggy.HookimplMarker("pytest")

CHECK_NAME = "the failing tests pass"


def passed_ids(output_file: str | None, tail: str) -> set[str]:
    """Node ids that passed, from pytest's `-rA` short summary (`PASSED nodeid`).

    The whole rest of the line is the node id (parametrize ids may hold spaces);
    colour codes (PY_COLORS / FORCE_COLOR in the environment) are ignored.
    """
    from .output import output_lines

    passed: set[str] = set()
    for line in output_lines(output_file, tail):
        line = strip_control(line).rstrip()
        if line.startswith("PASSED "):
            passed.add(line[len("PASSED "):])
    return passed


def junit_address(node_id: str) -> tuple[str, str]:
    """The (classname, name) pytest's JUnit XML gives a node id (as junitxml does)."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def junit_passed(path: Path, node_ids: list[str]) -> set[str] | None:
    """The node ids that ran and passed, from a JUnit XML file; None if it is unreadable.

    Preferred to the text summary, which user options (`--no-summary`, `-r`) can change.
    """
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    ok: dict[tuple[str, str], bool] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        clean = not any(child.tag in ("failure", "error", "skipped") for child in case)
        ok[key] = ok.get(key, True) and clean
    return {node for node in node_ids if ok.get(junit_address(node)) is True}


class SessionFixCheck:
    """Answers `pytest_loop_run_check` for the session fix-loop's one check."""

    def __init__(self, failing: list[str], green: list[str], first_output: str, pytest_args: list[str]) -> None:
        self.original_failing = list(failing)
        self.green = list(green)
        self.failing = list(failing)
        self.first_output = first_output
        self.pytest_args = pytest_args
        self.regressions: list[str] = []

    def _run(self, ids: list[str], context: LoopContext, label: str) -> tuple[CommandResult, set[str]]:
        args_file = context.iteration_dir / f"{label}.ids"
        args_file.write_text("\n".join(ids) + "\n", encoding="utf-8")
        junit = context.iteration_dir / f"{label}.junit.xml"
        command = pytest_command(f"@{args_file}", str(junit), [*self.pytest_args, "-rA", "-p", "no:randomly"])
        result = context.run_command(command, label=label, extra_env={CHILD_ENV: "1"})
        passed = junit_passed(junit, ids)
        if context.scrub is not None:  # read: now mask what the child wrote (failure messages)
            for path in (junit, args_file):
                scrub_file(path, context.scrub)
        return result, passed if passed is not None else passed_ids(result.output_file, result.tail)

    def _result(self, check: Check, cmd: CommandResult, passed: bool, reason: str) -> CheckResult:
        return CheckResult(name=check.name, kind=check.kind.value, passed=passed, exit_code=cmd.exit_code,
                           duration_s=cmd.duration_s, output_tail=cmd.tail, output_file=cmd.output_file,
                           reason=reason, timed_out=cmd.timed_out,
                           output_digest=digest_file(cmd.output_file, cmd.tail), command=cmd.command,
                           failing_tests=() if passed else tuple(self.failing))

    def _everything(self) -> list[str]:
        return self.original_failing + [n for n in self.green if n not in self.original_failing]

    def _judged(self, check: Check, context: LoopContext) -> CheckResult:
        """In the clean room: every test the session ran, witnessed by the harness's plugin."""
        room = context.clean_room
        assert room is not None
        everything = self._everything()
        args_file = Path(room.parent) / "session-ids.txt"
        args_file.write_text("\n".join(everything) + "\n", encoding="utf-8")
        channel = room.channel()
        argv = room.pytest_command([f"@{args_file}"], self.pytest_args)
        cmd = context.run_command(shlex.join(argv), label="confirm",
                                  extra_env={"PYTEST_LOOPS_JUDGE": channel.value})
        if context.budget_hit:
            return self._result(check, cmd, False, "killed during the clean-room run: the budget ran out")
        record = channel.read()
        disagreement = record.disagreement(cmd.exit_code)
        if disagreement:
            return self._result(check, cmd, False,
                                f"the harness's witness disagrees with the exit code: {disagreement}")
        failing = [node for node in everything if node not in record.passed]
        if failing or cmd.exit_code != 0:
            self.failing = failing or self.failing
            return self._result(check, cmd, False, f"clean room: {len(failing)} failing: " + ", ".join(failing[:5])
                                if failing else f"clean room: pytest exited {cmd.exit_code}")
        return self._result(check, cmd, True, f"clean room: all {len(everything)} test(s) passed (witnessed)")

    @hookimpl
    def pytest_loop_run_check(self, check: Check, context: LoopContext) -> CheckResult | None:
        if check.name != CHECK_NAME or check.kind is not CheckKind.HOOK:
            return None
        if context.clean_room is not None:
            return self._judged(check, context)
        if context.iteration == 1:  # the session itself was iteration 1
            return CheckResult(name=check.name, kind=check.kind.value, passed=False, exit_code=1,
                               duration_s=0.0, output_tail=self.first_output[-4000:],
                               reason=f"{len(self.failing)} test(s) failed in the session: "
                                      + ", ".join(self.failing[:5]), failing_tests=tuple(self.failing))
        from .localize import affected_tests

        # the failing tests, plus green ones whose executed code the revise changed
        affected = [t for t in affected_tests(context) if t not in self.failing]
        cmd, passed = self._run([*self.failing, *affected], context, "failing")
        if context.budget_hit:
            return self._result(check, cmd, False, "killed: the budget ran out")
        still = [node for node in [*self.failing, *affected] if node not in passed]
        if still:
            self.failing = still
            self.regressions = [node for node in still if node in self.green]
            return self._result(check, cmd, False, self._reason(f"{len(still)} still failing: " + ", ".join(still[:5])))
        everything = self._everything()
        cmd, passed = self._run(everything, context, "confirm")
        if context.budget_hit:
            return self._result(check, cmd, False, "killed during the confirm run: the budget ran out")
        failing = [node for node in everything if node not in passed]
        self.regressions = [node for node in failing if node in self.green]
        if failing:
            self.failing = failing
            return self._result(check, cmd, False, self._reason(
                f"confirm run: {len(failing)} failing: " + ", ".join(failing[:5])))
        return self._result(check, cmd, True, f"confirm run: all {len(everything)} test(s) passed together")

    def _reason(self, text: str) -> str:
        if self.regressions:
            return (f"regression: {', '.join(self.regressions[:5])} passed before the loop and fail now; "
                    + text)
        return text


def run_session_loop(session: LoopSession) -> LoopResult:
    """Run the session fix-loop over the tests that failed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    first_output = _failure_texts(reporter, session.failed_nodeids)
    values = session.settings
    check = Check(CheckKind.HOOK, CHECK_NAME, options={"session_fix": True})
    spec = session.spec_for("failing tests", "make the failing tests pass: " + name_list(session.failed_nodeids),
                            (check,), values)
    fixer = SessionFixCheck(session.failed_nodeids, session.passed_nodeids, first_output, session.child_args())
    pm = session.config.pluginmanager
    pm.register(fixer, "loop-session-fix")
    try:
        if reporter is not None:
            from .reporting import live_write

            banner = shown(f"loop: {len(session.failed_nodeids)} failing test(s), revise: {spec.revise}")
            live_write(session.config, lambda reporter: reporter.write_sep("=", banner))
        return session.run_loop(spec)
    finally:
        pm.unregister(fixer)


def _failure_texts(reporter: Any, nodeids: list[str]) -> str:
    if reporter is None:
        return ""
    wanted = set(nodeids)
    parts = []
    for key in ("failed", "error"):
        for rep in reporter.stats.get(key, []):
            if getattr(rep, "nodeid", None) in wanted:
                parts.append(f"___ {rep.nodeid} ___\n{rep.longreprtext[-3000:]}")
    return redact("\n".join(parts))  # the first iteration's output: failure file, prompt, lessons

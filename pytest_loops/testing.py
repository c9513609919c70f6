"""Contract-test kit: assert a loop's guard behaviour in a few lines.

    def test_stalls(loop_harness):
        r = loop_harness.run(verify=[1, 1, 1, 1], revise=None, max_iter=6, no_progress_k=2)
        r.assert_verdict("NO_PROGRESS", iterations=3)
        assert r.exit_code == 4

Scripted verify exit codes run no subprocess; time comes from a fake clock, so
budget tests never sleep. Each run gets its own workspace, the default state path.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.core.context import LoopContext
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.pytest_plugin.terminal import format_iterations
from pytest_loops.results import CheckResult, CommandResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, CheckKind, Guards, LoopSpec
from pytest_loops.verdict import Verdict

hookimpl = pluggy.HookimplMarker("pytest")

__all__ = ["FakeClock", "HarnessResult", "InstantRunner", "LoopHarness", "canned_result", "format_iterations"]


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds


@dataclass
class HarnessResult:
    """A finished contract-test run."""

    result: LoopResult
    workspace: Path

    @property
    def verdict(self) -> Verdict:
        return self.result.verdict

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def iterations(self) -> Sequence[IterationRecord]:
        return self.result.iterations

    @property
    def reason(self) -> str:
        return self.result.reason

    @property
    def log_path(self) -> Path:
        return Path(self.result.log_path or "")

    def table(self) -> str:
        return format_iterations(self.iterations)

    def assert_verdict(self, name: str | Verdict, iterations: int | None = None) -> None:
        """Fail with the whole iteration table unless the verdict (and count) match."""
        expected = Verdict(name.upper() if isinstance(name, str) else name)
        ok = self.verdict is expected and (iterations is None or len(self.iterations) == iterations)
        if not ok:
            want = f"{expected.value}" + (f" after {iterations} iteration(s)" if iterations is not None else "")
            raise AssertionError(
                f"expected {want}, got {self.verdict.value} after {len(self.iterations)} "
                f"iteration(s): {self.reason}\n{self.table()}"
            )


class _Scripted:
    """Answers `pytest_loop_run_check` for scripted checks and advances the clock."""

    def __init__(self, scripts: dict[str, list[int]], clock: FakeClock, per_iteration: float,
                 last_check: str) -> None:
        self.scripts = {name: itertools.chain(codes, itertools.repeat(codes[-1] if codes else 1))
                        for name, codes in scripts.items()}
        self.clock = clock
        self.per_iteration = per_iteration
        self.last_check = last_check

    @hookimpl
    def pytest_loop_run_check(self, check: Check, context: LoopContext) -> CheckResult | None:
        if check.name not in self.scripts:
            return None
        code = next(self.scripts[check.name])
        if check.name == self.last_check:
            self.clock.advance(self.per_iteration)
        return CheckResult(name=check.name, kind=check.kind.value, passed=code == 0, exit_code=code,
                           duration_s=0.0, output_tail=f"scripted exit {code}",
                           reason="passed" if code == 0 else f"exit {code}")


class _CallableRevise:
    def __init__(self, fn: Callable[[Path, int], Any], workspace: Path) -> None:
        self.fn = fn
        self.workspace = workspace

    @hookimpl
    def pytest_loop_revise(self, spec: LoopSpec, iteration: int, context: LoopContext) -> int:
        self.fn(self.workspace, iteration)  # its return value is ignored (write_text returns an int)
        return 0


class _AdvancingRunner:
    """Wraps the real runner so a command iteration also moves the fake clock."""

    def __init__(self, inner: Any, clock: FakeClock, per_iteration: float, last_check: str | None) -> None:
        self.inner = inner
        self.clock = clock
        self.per_iteration = per_iteration
        self.last_check = last_check

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        result = self.inner.run(command, **kwargs)
        out = str(kwargs.get("output_path") or "")
        if self.last_check is not None and Path(out).name.startswith(self.last_check):
            self.clock.advance(self.per_iteration)
        return result


def canned_result(command: str, exit_code: int, text: str, output_path: Any = None, *,
                  timed_out: bool = False) -> CommandResult:
    """A finished command's result without running it; writes `text` as its output file,
    as a real runner would. For fake runners in tests and benchmarks."""
    if output_path is not None:
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        Path(output_path).write_text(text, encoding="utf-8")
    return CommandResult(command=command, exit_code=exit_code, duration_s=0.0, tail=text,
                         output_file=str(output_path) if output_path else None,
                         output_bytes=len(text.encode()), timed_out=timed_out)


class InstantRunner:
    """A command runner that spawns nothing: `true` passes, any other command fails
    at once. For tests and fuzzing that drive the engine or the CLI in-process
    (patch it in for :class:`pytest_loops.runtime.process.ProcessRunner`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def run(self, command: str, *, cwd: Any, env: Any = None, timeout: float | None = None,
            output_path: Any = None, sandbox: Any = None, pass_fds: Any = ()) -> CommandResult:
        return canned_result(command, 0 if command == "true" else 1, f"ran {command}\n", output_path,
                             timed_out=timeout is not None and timeout <= 0)

    def terminate_all(self) -> None:
        pass


class LoopHarness:
    """Runs loops for contract tests. The ``loop_harness`` fixture gives you one."""

    def __init__(self, base_dir: str | os.PathLike | None = None) -> None:
        self.base_dir = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="loop-harness-"))
        self._count = 0

    def new_workspace(self) -> Path:
        self._count += 1
        path = self.base_dir / f"run-{self._count}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, verify: Sequence[int] | str | Sequence[Check | str], revise: Any = None, *,
            max_iter: int = 6, budget_seconds: float = 900.0, no_progress_k: int = 2,
            escalate_after: int = 0, no_progress_signal: str = "state", seconds_per_iteration: float = 0.0,
            state: Sequence[str] | None = None, name: str = "contract", goal: str = "",
            plugins: Sequence[object] = (), files: dict[str, str] | None = None) -> HarnessResult:
        """Run one loop and return its result.

        :param verify: scripted exit codes (one per iteration; the last repeats),
            a shell command, or a list of checks (Check objects or commands).
        :param revise: None (changes nothing), a callable ``(workspace, iteration)``
            (its return value is ignored; the revise exit is 0), or a shell command
            run in the workspace (its exit code is recorded).
        :param state: state paths (default: the whole workspace).
        :param files: files to create in the workspace first (path -> text).
        """
        workspace = self.new_workspace()
        for rel, text in (files or {}).items():
            target = workspace / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        clock = FakeClock()
        pm = make_plugin_manager(entry_points=False)
        scripted: dict[str, list[int]] = {}
        checks: list[Check] = []
        if isinstance(verify, str):
            checks.append(Check.command_passes(verify))
        elif verify and all(isinstance(v, int) and not isinstance(v, bool) for v in verify):
            scripted["scripted verify"] = [v for v in verify if isinstance(v, int)]
            checks.append(Check(CheckKind.COMMAND, "scripted verify", command="true"))
        else:
            for item in verify:
                if isinstance(item, int):
                    raise ValueError("verify mixes exit codes with commands or checks: give one kind")
                checks.append(Check.command_passes(item) if isinstance(item, str) else item)
        if not checks:
            raise ValueError("verify needs at least one exit code, command or check")
        last = checks[-1].name
        if scripted:
            pm.register(_Scripted(scripted, clock, seconds_per_iteration, last))
        revise_cmd: str | None = None
        if callable(revise):
            pm.register(_CallableRevise(revise, workspace))
        elif isinstance(revise, str):
            revise_cmd = revise
        elif revise is not None:
            raise TypeError("revise must be None, a callable (workspace, iteration) or a command string")
        for plugin in plugins:
            pm.register(plugin)
        spec = LoopSpec(
            name=name, goal=goal, checks=tuple(checks), revise=revise_cmd,
            guards=Guards(max_iter=max_iter, budget_seconds=budget_seconds,
                          no_progress_k=no_progress_k, escalate_after=escalate_after),
            state_paths=tuple(state) if state is not None else (".",),
            no_progress_signal=no_progress_signal,
            cwd=str(workspace),
        )
        from pytest_loops.runtime.process import ProcessRunner

        last_label = None if scripted else f"check-{len(checks)}"
        runner = _AdvancingRunner(ProcessRunner(), clock, seconds_per_iteration, last_label)
        engine = make_engine(runner=runner, clock=clock, plugin_manager=pm, write_index=False)
        return HarnessResult(engine.run(spec), workspace)

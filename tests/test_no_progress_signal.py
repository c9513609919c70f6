"""The no-progress signal (state | failure | both) and flapping detection."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pluggy
import pytest

from pytest_loops.core.guards import flapping
from pytest_loops.core.state import iteration_signature
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import CheckResult
from pytest_loops.spec import Check, CheckKind, LoopSpec

hookimpl = pluggy.HookimplMarker("pytest")


class Scripted:
    """Answers each named check with the next scripted (exit code, output)."""

    def __init__(self, scripts: dict[str, list[tuple[int, str]]]) -> None:
        self.scripts = {name: itertools.chain(s, itertools.repeat(s[-1])) for name, s in scripts.items()}

    @hookimpl
    def pytest_loop_run_check(self, check, context):
        code, out = next(self.scripts[check.name])
        return CheckResult(name=check.name, kind="command", passed=code == 0, exit_code=code,
                           duration_s=0.0, output_tail=out, reason=f"exit {code}")


def checks(*names: str) -> list[Check]:
    return [Check(CheckKind.COMMAND, name, command="true") for name in names]


def touch_each_iteration(ws, i):
    (ws / f"edit-{i}.txt").write_text(str(i))


def test_failure_signal_stops_an_agent_thrashing_in_place(loop_harness) -> None:
    same = [(1, "E   AssertionError: assert 3 == 4\ntests/test_x.py:12: in 0.01s")]
    r = loop_harness.run(verify=checks("t"), revise=touch_each_iteration, no_progress_signal="failure",
                         plugins=[Scripted({"t": same})])
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert "the same failure 3 iterations in a row" in r.reason
    assert [it.same_failure_streak for it in r.iterations] == [0, 1, 2]


def test_state_signal_ignores_a_repeated_failure_while_files_change(loop_harness) -> None:
    same = [(1, "E   AssertionError: assert 3 == 4")]
    r = loop_harness.run(verify=checks("t"), revise=touch_each_iteration, max_iter=4,
                         plugins=[Scripted({"t": same})])
    r.assert_verdict("MAX_ITER", iterations=4)


def test_signature_ignores_line_numbers_addresses_and_timings(loop_harness) -> None:
    outputs = [(1, f"E   ValueError at 0x7f{n}a3 in /tmp/pytest-of-root/pytest-{n}/x.py:{n}0 in 0.{n}s")
               for n in range(1, 9)]
    r = loop_harness.run(verify=checks("t"), revise=touch_each_iteration, no_progress_signal="failure",
                         plugins=[Scripted({"t": outputs})])
    r.assert_verdict("NO_PROGRESS", iterations=3)


def test_a_changing_failure_is_progress(loop_harness) -> None:
    outputs = [(1, f"E   AssertionError: assert {n} == 10") for n in range(1, 9)]
    r = loop_harness.run(verify=checks("t"), revise=touch_each_iteration, no_progress_signal="failure",
                         max_iter=5, plugins=[Scripted({"t": outputs})])
    r.assert_verdict("MAX_ITER", iterations=5)


def test_both_stops_on_either_signal(loop_harness) -> None:
    r = loop_harness.run(verify=checks("t"), revise=None, no_progress_signal="both",
                         plugins=[Scripted({"t": [(1, "a"), (1, "b"), (1, "c"), (1, "d")]})])
    r.assert_verdict("NO_PROGRESS", iterations=3)
    assert r.reason.startswith("state unchanged")


def test_flapping_is_its_own_reason(loop_harness) -> None:
    scripts = {"a": [(0, ""), (1, "a broke"), (0, ""), (1, "a broke"), (0, ""), (1, "a broke")],
               "b": [(1, "b broke"), (0, ""), (1, "b broke"), (0, ""), (1, "b broke"), (0, "")]}
    r = loop_harness.run(verify=checks("a", "b"), revise=touch_each_iteration, max_iter=10,
                         plugins=[Scripted(scripts)])
    r.assert_verdict("NO_PROGRESS", iterations=4)
    assert r.reason.startswith("flapping: a, b alternated pass/fail")


@pytest.mark.parametrize(("history", "k", "expected"), [
    ([True, False, True, False], 2, True),
    ([True, False, True], 2, False),
    ([True, False, False, True], 2, False),
    ([True, False, True, False], 0, False),
    ([False, True, False, True, False, True], 3, True),
    ([True, True, False, True, False, True], 3, False),
])
def test_flapping_rule(history, k, expected) -> None:
    assert flapping(history, k) is expected


def test_iteration_signature_is_order_independent_and_none_without_failures() -> None:
    a = CheckResult("a", "command", False, 1, 0.0, output_tail="x")
    b = CheckResult("b", "command", False, 2, 0.0, output_tail="y")
    assert iteration_signature([a, b]) == iteration_signature([b, a])
    assert iteration_signature([a]) != iteration_signature([b])
    assert iteration_signature([]) is None


def test_a_bad_signal_is_a_usage_error() -> None:
    with pytest.raises(LoopUsageError, match="'sometimes' is not a valid no_progress_signal"):
        LoopSpec(name="x", checks=tuple(checks("t")), no_progress_signal="sometimes")


def _cli(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_cli_flag_and_config_key(tmp_path) -> None:
    (tmp_path / "cfg.yaml").write_text("guards:\n  no_progress_signal: failure\n  max_iter: 5\n")
    # the revise changes a file every time, the failure stays: only the failure signal stops it
    done = _cli("run", "--config", "cfg.yaml", "--verify", "echo same failure; exit 1",
                "--revise", "date +%N > stamp.txt", "--state", "*.txt", "-q", cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "the same failure 3 iterations in a row" in done.stdout
    flag = _cli("run", "--config", "cfg.yaml", "--no-progress-signal", "state", "--verify",
                "echo same failure; exit 1", "--revise", "date +%N > stamp.txt", "--state", "*.txt", "-q",
                cwd=tmp_path)
    assert flag.returncode == 2, flag.stdout + flag.stderr


@pytest.mark.parametrize("args", [
    ["--no-progress-signal", "never"],
])
def test_cli_rejects_a_bad_signal(tmp_path, args) -> None:
    done = _cli("run", "--verify", "true", *args, cwd=tmp_path)
    assert done.returncode == 64
    assert "'never' is not a valid no_progress_signal" in done.stderr
    assert "Traceback" not in done.stderr


def test_config_rejects_a_bad_signal(tmp_path) -> None:
    (tmp_path / "cfg.yaml").write_text("guards:\n  no_progress_signal: 3\n")
    done = _cli("run", "--config", "cfg.yaml", "--verify", "true", cwd=tmp_path)
    assert done.returncode == 64
    assert "guards.no_progress_signal" in done.stderr

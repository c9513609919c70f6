"""The `pytest_loop_*` hooks implemented in a conftest, and by a `-p` module of the standalone runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from plugin_helpers import BUGGY_CALC, FIX_ADD, SUITE_SETTINGS, Project

PYTHON_REVISE = """\
from pathlib import Path


def pytest_loop_revise(spec, iteration, context):
    calc = Path(context.workdir) / "calc.py"
    calc.write_text(calc.read_text().replace("a - b  # BUG", "a + b"))
    with open(Path(context.workdir) / "revise_calls.txt", "a") as f:
        f.write(f"{spec.name} {iteration} {context.prompt_file.is_file()} {context.failure_file.is_file()}\\n")
    return {answer}
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


@pytest.mark.slow
def test_a_python_revise_step_in_conftest(project: Project) -> None:
    project.write("conftest.py", PYTHON_REVISE.replace("{answer}", "0"))
    project.marked_test(marker="max_iter=3")  # no shell revise at all
    result = project.run("--loop", "-v")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_calc.py::test_add REPAIRED*", "*1 passed, 1 repaired*"])
    # called once, after the failed iteration 1, with the prompt and failure files written
    assert project.read("revise_calls.txt").splitlines() == ["test_calc.py::test_add 1 True True"]
    (log,) = project.run_logs()
    assert log["iterations"][0]["revise_exit"] == 0


@pytest.mark.parametrize(("answer", "shell_runs"), [(0, False), (3, False), (None, True)],
                         ids=["conftest-answers", "conftest-answers-nonzero", "conftest-passes-on"])
@pytest.mark.slow
def test_conftest_wins_over_the_builtin_shell_revise(project: Project, answer: int | None,
                                                     shell_runs: bool) -> None:
    project.write("conftest.py", PYTHON_REVISE.replace("{answer}", str(answer)))
    project.marked_test(marker='revise="python note.py shell_ran.txt yes", max_iter=2')
    result = project.run("--loop")
    assert result.ret == 0
    assert project.exists("shell_ran.txt") is shell_runs
    (log,) = project.run_logs()
    assert log["iterations"][0]["revise_exit"] == (0 if answer is None else answer)


CUSTOM_CHECK = """\
from pytest_loops import CheckResult


def pytest_loop_run_check(check, context):
    if context.iteration < 2:
        return None  # the built-in runs it (iteration 1 is the session's own run)
    return CheckResult(name=check.name, kind=check.kind.value, passed={passed}, exit_code={code},
                       duration_s=0.0, reason="the custom check decided")
"""


@pytest.mark.parametrize(("passed", "verdict"), [(True, "SUCCESS"), (False, "MAX_ITER")])
@pytest.mark.slow
def test_a_custom_check_result_from_conftest(project: Project, passed: bool, verdict: str) -> None:
    project.write("conftest.py", CUSTOM_CHECK.format(passed=passed, code=0 if passed else 9))
    # the revise changes the state but never fixes the bug: only the hook can pass it
    project.marked_test(marker='revise="python note.py notes.txt tried", max_iter=2')
    result = project.run("--loop")
    (log,) = project.run_logs()
    assert log["verdict"] == verdict
    second = log["iterations"][1]["checks"][0]
    assert second["reason"] == "the custom check decided"
    assert second["exit_code"] == (0 if passed else 9)
    # the hook answered: no child pytest ran for iteration 2
    run_dir = Path(log["run_dir"])
    assert not list((run_dir / "iter-002").glob("*.junit.xml"))
    assert result.ret == (0 if passed else 1)
    if not passed:
        result.stdout.fnmatch_lines(["*ended MAX_ITER*", "*the custom check decided*"])


RECORDER = """\
import json
from pathlib import Path

RECORD = Path(__file__).parent.parent / "hook_calls.jsonl"  # outside the project: not its state


def _write(entry):
    with open(RECORD, "a") as f:
        f.write(json.dumps(entry) + "\\n")


def pytest_loop_iteration_finished(spec, record, context):
    _write({"hook": "iteration", "loop": spec.name, "iter": record.iter, "passed": record.passed,
            "context_iter": context.iteration})


def pytest_loop_finished(spec, result):
    _write({"hook": "finished", "loop": spec.name, "verdict": result.verdict.value,
            "iterations": result.iterations_run})
"""


@pytest.mark.slow
def test_iteration_and_loop_finished_hooks(project: Project) -> None:
    project.write("conftest.py", RECORDER)
    project.marked_test(marker=f"revise={FIX_ADD!r}")
    project.write("test_plain.py", """\
        from pathlib import Path

        def test_plain():
            assert (Path(__file__).parent / "ok_plain").exists()
        """)
    result = project.run("--loop", "--loop-revise", "python note.py ok_plain yes")
    assert result.ret == 0
    calls = [json.loads(line) for line in (project.path.parent / "hook_calls.jsonl").read_text().splitlines()]
    assert calls == [
        {"hook": "iteration", "loop": "test_calc.py::test_add", "iter": 1, "passed": False, "context_iter": 1},
        {"hook": "iteration", "loop": "test_calc.py::test_add", "iter": 2, "passed": True, "context_iter": 2},
        {"hook": "finished", "loop": "test_calc.py::test_add", "verdict": "SUCCESS", "iterations": 2},
        {"hook": "iteration", "loop": "failing tests", "iter": 1, "passed": False, "context_iter": 1},
        {"hook": "iteration", "loop": "failing tests", "iter": 2, "passed": True, "context_iter": 2},
        {"hook": "finished", "loop": "failing tests", "verdict": "SUCCESS", "iterations": 2},
    ]


@pytest.mark.slow
def test_optional_hook_conftest_works_with_and_without_the_plugin(project: Project) -> None:
    # a plain pytest_loop_* function in a conftest is an unknown hook once the plugin is
    # disabled (pytest's rule for every plugin's hooks); optionalhook=True keeps it valid
    conftest = PYTHON_REVISE.replace("{answer}", "0").replace(
        "def pytest_loop_revise", "import pytest\n\n\n@pytest.hookimpl(optionalhook=True)\ndef pytest_loop_revise")
    project.write("conftest.py", conftest)
    project.marked_test(marker="max_iter=2")
    disabled = project.run("-p", "no:loop")
    disabled.assert_outcomes(passed=1, failed=1)
    assert "INTERNALERROR" not in disabled.stdout.str() + disabled.stderr.str()
    enabled = project.run("--loop")
    assert enabled.ret == 0
    assert project.read("revise_calls.txt").splitlines() == ["test_calc.py::test_add 1 True True"]


def test_hooks_are_not_called_without_loop(project: Project) -> None:
    project.write("conftest.py", RECORDER + "\n\n" + PYTHON_REVISE.replace("{answer}", "0"))
    project.marked_test(marker="max_iter=3")
    result = project.run()
    result.assert_outcomes(passed=1, failed=1)
    assert not (project.path.parent / "hook_calls.jsonl").exists()
    assert not project.exists("revise_calls.txt")


# -- the standalone runner loads the same hooks with -p MODULE -------------------------------------

STANDALONE_PLUGIN = """\
from pathlib import Path


def pytest_loop_revise(spec, iteration, context):
    calc = Path(context.workdir) / "calc.py"
    calc.write_text(calc.read_text().replace("a - b  # BUG", "a + b"))
    (Path(context.workdir) / "revised_by_plugin.txt").write_text(f"{spec.name} {iteration}\\n")
    return 0
"""


def test_standalone_runner_with_a_revise_plugin_module(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "calc.py").write_text(BUGGY_CALC)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "calc_fixer.py").write_text(STANDALONE_PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_", "PYTEST_XDIST_"))
           or k.startswith(SUITE_SETTINGS)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), env.get("PYTHONPATH")]))
    verify = textwrap.dedent(f"""{sys.executable} -c 'import calc; assert calc.add(2, 3) == 5'""")
    # the shell revise could not even start: the plugin's hook answers first
    proc = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "-p", "calc_fixer", "--verify", verify,
                           "--revise", "no-such-cli --fix", "--max-iter", "3", "--name", "calc", "--cwd", str(work)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS (exit 0) after 2 iteration(s)" in proc.stdout
    assert (work / "revised_by_plugin.txt").read_text() == "calc 1\n"
    assert "a + b" in (work / "calc.py").read_text()

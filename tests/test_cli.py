"""`pytest-loops run` (and `python -m pytest_loops`) in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_loops.artifacts.runlog import load_runlog


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def run_loop(cli, work: Path, *args: str, env=None, log: Path | None = None):
    log = log or work.parent / "run.json"
    proc = cli("run", "--cwd", str(work), "--log", str(log), *args, env=env)
    return proc, (load_runlog(log) if log.exists() else None)


# -- the verdicts are the exit codes ----------------------------------------------------------------


@pytest.mark.slow
def test_success_exits_0(cli, work):
    proc, log = run_loop(cli, work, "--verify", "test -f ok",
                         "--revise", "test -f once && touch ok; touch once")
    assert proc.returncode == 0, proc.stderr
    assert log["verdict"] == "SUCCESS" and log["iterations_run"] == 3
    assert "SUCCESS (exit 0) after 3 iteration(s)" in proc.stdout


def test_max_iter_exits_2(cli, work):
    proc, log = run_loop(cli, work, "--verify", "false", "--max-iter", "2")
    assert proc.returncode == 2, proc.stderr
    assert log["verdict"] == "MAX_ITER" and log["iterations_run"] == 2


def test_timeout_exits_3(cli, work):
    proc, log = run_loop(cli, work, "--verify", "sleep 30", "--budget-seconds", "0.5")
    assert proc.returncode == 3, proc.stderr
    assert log["verdict"] == "TIMEOUT" and log["iterations_run"] == 1
    assert log["iterations"][0]["checks"][0]["timed_out"] is True


def test_no_progress_exits_4(cli, work):
    (work / "app.py").write_text("x = 1\n")
    proc, log = run_loop(cli, work, "--verify", "false", "--revise", "true", "--state", "*.py")
    assert proc.returncode == 4, proc.stderr
    assert log["verdict"] == "NO_PROGRESS" and log["iterations_run"] == 3
    assert log["state_paths"] == ["*.py"]


def test_escalate_exits_5(cli, work):
    proc, log = run_loop(cli, work, "--verify", "false", "--escalate-after", "2")
    assert proc.returncode == 5, proc.stderr
    assert log["verdict"] == "ESCALATE" and log["iterations_run"] == 2


def test_without_state_paths_no_progress_is_off(cli, work):
    proc, log = run_loop(cli, work, "--verify", "false", "--revise", "true", "--no-progress-k", "1",
                         "--max-iter", "3")
    assert proc.returncode == 2
    assert log["iterations_run"] == 3


def test_no_progress_k_zero_turns_it_off(cli, work):
    proc, _ = run_loop(cli, work, "--verify", "false", "--revise", "true", "--state", "*",
                       "--no-progress-k", "0", "--max-iter", "3")
    assert proc.returncode == 2


@pytest.mark.slow
def test_every_verify_must_pass(cli, work):
    proc, log = run_loop(cli, work, "--verify", "true", "--verify", "exit 3", "--max-iter", "1")
    assert proc.returncode == 2
    checks = log["iterations"][0]["checks"]
    assert [c["exit_code"] for c in checks] == [0, 3]
    assert log["iterations"][0]["verify_exit"] == 3
    proc, log = run_loop(cli, work, "--verify", "true", "--verify", "true")
    assert proc.returncode == 0 and len(log["iterations"][0]["checks"]) == 2


def test_defaults(cli, work):
    proc, log = run_loop(cli, work, "--verify", "true")
    assert proc.returncode == 0
    assert log["guards"] == {"max_iter": 6, "budget_seconds": 900.0, "no_progress_k": 2,
                             "escalate_after": 0}


# -- the revise step ------------------------------------------------------------------------------

DUMP_ENV = textwrap.dedent("""
    import json, os, pathlib
    env = {k: v for k, v in os.environ.items() if k.startswith("LOOP_")}
    env["cwd"] = os.getcwd()
    env["failure_text"] = pathlib.Path(os.environ["LOOP_FAILURE_FILE"]).read_text()
    env["prompt_text"] = pathlib.Path(os.environ["LOOP_PROMPT_FILE"]).read_text()
    pathlib.Path(f"env-{os.environ['LOOP_ITERATION']}.json").write_text(json.dumps(env))
""")


def test_revise_gets_every_loop_variable(cli, work, tmp_path):
    (tmp_path / "dump_env.py").write_text(DUMP_ENV)
    proc, log = run_loop(cli, work, "--verify", "echo the check failed here; exit 1",
                         "--revise", f"python {tmp_path / 'dump_env.py'}",
                         "--name", "env loop", "--goal", "be green", "--max-iter", "3")
    assert proc.returncode == 2, proc.stderr
    run_dir = tmp_path / "run"
    for i in (1, 2):
        env = json.loads((work / f"env-{i}.json").read_text())
        assert env["LOOP_NAME"] == "env loop"
        assert env["LOOP_GOAL"] == "be green"
        assert env["LOOP_ITERATION"] == str(i)
        assert env["LOOP_MAX_ITER"] == "3"
        assert env["LOOP_WORKDIR"] == str(work.resolve()) == env["cwd"]
        assert env["LOOP_RUN_DIR"] == str(run_dir)
        assert env["LOOP_FAILURE_FILE"] == str(run_dir / f"iter-00{i}" / "failure.txt")
        assert env["LOOP_PROMPT_FILE"] == str(run_dir / f"iter-00{i}" / "prompt.md")
        assert "the check failed here" in env["failure_text"]
        assert "be green" in env["prompt_text"] and "the check failed here" in env["prompt_text"]
    # the last iteration stops at the cap: no revise step whose work is never verified
    assert not (work / "env-3.json").exists()
    assert [it["revise_exit"] for it in log["iterations"]] == [0, 0, None]


def test_revise_nonzero_is_recorded_and_the_loop_goes_on(cli, work):
    proc, log = run_loop(cli, work, "--verify", "test -f ok", "--revise", "touch ok; exit 9")
    assert proc.returncode == 0
    assert [it["revise_exit"] for it in log["iterations"]] == [9, None]


def test_revise_that_cannot_start_escalates(cli, work):
    proc, log = run_loop(cli, work, "--verify", "false",
                         "--revise", "sh -c 'echo no-such-agent-cli: not found >&2; exit 127'")
    assert proc.returncode == 5, proc.stderr
    assert log["verdict"] == "ESCALATE" and log["iterations_run"] == 1
    assert "could not start" in log["reason"] and "no-such-agent-cli" in log["reason"]
    assert "could not start" in proc.stdout


# -- output ---------------------------------------------------------------------------------------


def test_one_line_per_iteration_and_the_verdict(cli, work):
    proc, _ = run_loop(cli, work, "--verify", "false", "--max-iter", "3")
    lines = proc.stdout.splitlines()
    iteration_lines = [line for line in lines if " iter " in line]
    assert len(iteration_lines) == 3
    assert "iter 1/3" in iteration_lines[0] and "FAIL" in iteration_lines[0]
    assert "stop: max_iter" in iteration_lines[-1]
    assert any(line.startswith("MAX_ITER (exit 2) after 3 iteration(s)") for line in lines)


def test_quiet_prints_only_the_verdict(cli, work):
    proc, _ = run_loop(cli, work, "--verify", "false", "--max-iter", "2", "--quiet")
    assert proc.returncode == 2
    assert len(proc.stdout.splitlines()) == 1
    assert proc.stdout.startswith("MAX_ITER (exit 2) after 2 iteration(s)")


def test_log_and_episodic_go_where_asked(cli, work, tmp_path):
    log = tmp_path / "elsewhere" / "logs" / "my-run.json"
    page = tmp_path / "elsewhere" / "memory" / "my-lessons.md"
    proc = cli("run", "--cwd", str(work), "--verify", "false", "--max-iter", "2",
               "--log", str(log), "--episodic", str(page))
    assert proc.returncode == 2
    data = load_runlog(log)
    assert data["verdict"] == "MAX_ITER"
    assert (tmp_path / "elsewhere" / "logs" / "my-run" / "iter-001" / "check-1.out").is_file()
    assert page.read_text().count(" iter ") == 2
    assert data["memory_page"] == str(page)
    assert not (work / ".pytest-loops" / "lessons").exists()


def test_relative_log_and_episodic_without_cwd(cli, tmp_path):
    proc = cli("run", "--verify", "false", "--max-iter", "1", "--log", "out/r.json",
               "--episodic", "mem/l.md", cwd=tmp_path)
    assert proc.returncode == 2
    assert load_runlog(tmp_path / "out" / "r.json")["iterations_run"] == 1
    assert (tmp_path / "mem" / "l.md").is_file()


@pytest.mark.slow
def test_the_module_is_the_console_script(cli, work, tmp_path, child_env):
    script = Path(sys.executable).with_name("pytest-loops")
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")

    def both(*args):
        mod = cli(*args)
        con = subprocess.run([str(script), *args], cwd=tmp_path, capture_output=True, text=True,
                             env=child_env)
        return mod, con

    for args in (["--version"], ["run", "--help"], ["run", "--max-iter", "0", "--verify", "true"]):
        mod, con = both(*args)
        assert (mod.returncode, mod.stdout, mod.stderr) == (con.returncode, con.stdout, con.stderr)
    mod, con = both("run", "--cwd", str(work), "--verify", "false", "--max-iter", "1", "--quiet")
    assert mod.returncode == con.returncode == 2
    assert mod.stdout.split(" in ")[0] == con.stdout.split(" in ")[0]


# -- bad input: 64, one line, never a traceback ------------------------------------------------------


BAD_INPUT = {
    "unknown flag": (["run", "--verify", "true", "--bogus"], "--bogus"),
    "max_iter 0": (["run", "--verify", "true", "--max-iter", "0"], "--max-iter"),
    "max_iter not a number": (["run", "--verify", "true", "--max-iter", "six"], "--max-iter"),
    "negative budget": (["run", "--verify", "true", "--budget-seconds", "-1"], "--budget-seconds"),
    "negative no-progress": (["run", "--verify", "true", "--no-progress-k", "-1"], "--no-progress-k"),
    "missing config": (["run", "--verify", "true", "--config", "nope.yaml"], "nope.yaml"),
    "config not YAML": (["run", "--verify", "true", "--config", "broken.yaml"], "broken.yaml:2"),
    "config wrong type": (["run", "--verify", "true", "--config", "six.yaml"], "max_iter"),
    "config max_iter 0": (["run", "--verify", "true", "--config", "zero.yaml"], "max_iter"),
    "config not a mapping": (["run", "--verify", "true", "--config", "list.yaml"], "list.yaml"),
    "config is a directory": (["run", "--verify", "true", "--config", "."], "directory"),
    "missing cwd": (["run", "--verify", "true", "--cwd", "no/such/dir"], "--cwd"),
    "no verify": (["run"], "--verify"),
    "verify without a command": (["run", "--verify"], "--verify"),
    "unknown command": (["bogus"], "bogus"),
    "no command": ([], "command"),
    "unknown plugin module": (["run", "--verify", "true", "-p", "no_such_plugin_mod"], "no_such_plugin_mod"),
    "log is a directory": (["run", "--verify", "true", "--log", "."], "--log"),
    "log under a file": (["run", "--verify", "true", "--log", "six.yaml/run.json"], "--log"),
    "episodic is a directory": (["run", "--verify", "true", "--memory", "."], "--memory"),
    "an old flag names itself": (["run", "--verify", "true", "--episodic", "."], "--episodic"),
    "the lessons page is a directory": (["run", "--verify", "true", "--lessons-page", "."], "--lessons-page"),
    "artifacts is a file": (["run", "--verify", "true", "--artifacts", "six.yaml"], "--artifacts"),
    "config run_log.path is a directory": (["run", "--verify", "true", "--config", "logdir.yaml"],
                                           "logdir.yaml: run_log.path"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_and_exit_64(cli, tmp_path, case):
    (tmp_path / "broken.yaml").write_text("guards: [\n")
    (tmp_path / "six.yaml").write_text('guards: {max_iter: "six"}\n')
    (tmp_path / "zero.yaml").write_text("guards:\n  max_iter: 0\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "logdir.yaml").write_text("run_log:\n  path: .\n")
    args, names = BAD_INPUT[case]
    proc = cli(*args)
    assert proc.returncode == 64, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, proc.stderr
    assert names in errors[0]
    assert errors[0].startswith("pytest-loops: error:")
    if args and args[0] == "run":
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""


@pytest.mark.parametrize("variable,value", [("PYTEST_LOOPS_MAX_ITER", "zero"),
                                            ("PYTEST_LOOPS_MEMORY", "."),
                                            ("PYTEST_LOOPS_LESSONS_PAGE", "."),
                                            ("PYTEST_LOOPS_LESSONS", "maybe")])
def test_bad_environment_value_is_exit_64(cli, work, variable, value):
    proc, _ = run_loop(cli, work, "--verify", "true", env={variable: value})
    assert proc.returncode == 64
    assert variable in proc.stderr and "Traceback" not in proc.stderr


PLUGIN_MARKED = """
import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


@hookimpl
def pytest_loop_run_check(check, context):
    raise RuntimeError("the plugin broke")
"""

PLUGIN_PLAIN = """
def pytest_loop_run_check(check, context):
    raise RuntimeError("the plugin broke")
"""


@pytest.mark.parametrize("source", [PLUGIN_MARKED, PLUGIN_PLAIN], ids=["hookimpl", "plain-function"])
def test_internal_error_exits_70(cli, work, tmp_path, source):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_loop_plugin.py").write_text(source)
    proc, log = run_loop(cli, work, "--verify", "true", "-p", "broken_loop_plugin", "--quiet",
                         env={"PYTHONPATH": str(plugins)})
    assert proc.returncode == 70, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "internal error" in proc.stderr and "the plugin broke" in proc.stderr
    assert log["verdict"] is None and "the plugin broke" in log["reason"]


def test_a_plugin_can_answer_a_check(cli, work, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "judge_plugin.py").write_text(textwrap.dedent("""
        from pytest_loops import CheckResult

        def pytest_loop_run_check(check, context):
            return CheckResult(name=check.name, kind="command", passed=True, exit_code=0,
                               duration_s=0.0, reason="the judge says yes")
    """))
    proc, log = run_loop(cli, work, "--verify", "false", "-p", "judge_plugin",
                         env={"PYTHONPATH": str(plugins)})
    assert proc.returncode == 0, proc.stderr
    assert log["iterations"][0]["checks"][0]["reason"] == "the judge says yes"


# -- a newcomer's first commands ----------------------------------------------------------------


def test_no_command_is_one_line_and_exit_64(cli):
    done = cli()
    assert done.returncode == 64
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "pytest-loops: error: a command is required; one of: run, selftest, demo, show, diff, compare, mcp, "
        "verify, report, list, watch, merge (`pytest-loops --help` lists them)"]


def _one_run(cli, tmp_path: Path) -> Path:
    assert cli("run", "--verify", "true", "-q", "--artifacts", "arts").returncode == 0
    return tmp_path / "arts"


@pytest.mark.slow
def test_report_says_where_it_wrote(cli, tmp_path):
    arts = _one_run(cli, tmp_path)
    done = cli("report", str(arts))
    assert done.returncode == 0, done.stderr
    written = tmp_path / "report.html"
    assert done.stdout == f"report written to {written}: 1 loop run(s)\n"
    assert written.is_file()
    (tmp_path / "out").mkdir()
    done = cli("report", str(arts), "-o", "out/r.html")
    assert done.stdout == f"report written to {tmp_path / 'out' / 'r.html'}: 1 loop run(s)\n"


@pytest.mark.parametrize("output", ["missing/dir/r.html", "file.txt/r.html"])
def test_report_refuses_an_output_directory_that_does_not_exist(cli, tmp_path, output):
    arts = _one_run(cli, tmp_path)
    (tmp_path / "file.txt").write_text("x")
    done = cli("report", str(arts), "-o", output)
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and "--output" in done.stderr, done.stderr
    assert ("does not exist" if output.startswith("missing") else "is not a directory") in done.stderr
    assert not (tmp_path / "missing").exists(), "the directory is not created"

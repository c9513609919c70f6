"""The loop-runner config file, the environment, and precedence: defaults < file < env < flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.cli.main import build_parser, spec_from_args
from pytest_loops.errors import LoopUsageError
from pytest_loops.sources.config import (
    DEFAULTS,
    env_layer,
    parse_guard,
    read_runner_config,
    resolve,
)

REPO = Path(__file__).resolve().parents[1]
HARNESS_CONFIG = REPO / "harness" / "loop-runner.config.yaml"

FULL_CONFIG = """\
guards:
  max_iter: 5
  budget_seconds: 100
  no_progress_k: 3
  escalate_after_iter: 4
progress:
  state_paths: ["src/*.py", "lib"]
reflexion:
  enabled: true
  episodic_memory_page: memory/lessons.md
run_log:
  path: logs/run.json
revise:
  cmd: "python fix.py"
verify:
  cmd: "pytest -q"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def spec_for(argv: list[str], environ: dict[str, str] | None = None):
    return spec_from_args(build_parser().parse_args(["run", *argv]), environ or {})


# -- reading the file ------------------------------------------------------------------------


def test_every_loop_runner_key_is_read(tmp_path):
    layer = read_runner_config(write(tmp_path / "c.yaml", FULL_CONFIG))
    assert layer == {
        "max_iter": 5, "budget_seconds": 100.0, "no_progress_k": 3, "escalate_after": 4,
        "state_paths": ["src/*.py", "lib"], "lessons": True, "lessons_page": "memory/lessons.md",
        "log_path": "logs/run.json", "revise": "python fix.py", "verify": ["pytest -q"],
    }


def test_the_repositorys_harness_config_is_valid():
    layer = read_runner_config(HARNESS_CONFIG)
    assert "unknown_keys" not in layer
    assert layer["max_iter"] >= 1 and layer["budget_seconds"] >= 0
    assert layer["no_progress_k"] >= 0 and layer["escalate_after"] >= 0
    assert layer["state_paths"] and layer["revise"] and layer["verify"]


def test_the_harness_config_is_accepted_by_run(cli, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    proc = cli("run", "--config", str(HARNESS_CONFIG), "--cwd", str(work), "--verify", "true", "--quiet")
    assert proc.returncode == 0, proc.stderr
    # only the state path warning: the config's globs match nothing in an empty directory
    assert [ln for ln in proc.stderr.splitlines() if "warning" in ln and "matches no file" not in ln] == []
    data = load_runlog(work / ".pytest-loops" / "run.json")  # the config's run_log.path
    assert data["verdict"] == "SUCCESS"
    assert data["guards"]["budget_seconds"] == read_runner_config(HARNESS_CONFIG)["budget_seconds"]


def test_an_empty_file_sets_nothing(tmp_path):
    assert read_runner_config(write(tmp_path / "c.yaml", "# nothing\n")) == {}
    assert read_runner_config(write(tmp_path / "d.yaml", "guards:\n")) == {}


def test_unknown_keys_are_returned_for_a_warning(tmp_path):
    layer = read_runner_config(write(tmp_path / "c.yaml", "guards:\n  max_iters: 3\nextra: 1\n"))
    assert sorted(layer["unknown_keys"]) == ["extra", "guards.max_iters"]
    assert "max_iter" not in layer


def test_unknown_keys_are_warned_about_on_stderr(cli, tmp_path):
    write(tmp_path / "c.yaml", "guards:\n  max_iters: 3\n")
    proc = cli("run", "--config", "c.yaml", "--verify", "true", "--quiet")
    assert proc.returncode == 0
    assert "unknown key 'guards.max_iters'" in proc.stderr


@pytest.mark.parametrize("text,where", [
    ('guards:\n  max_iter: "six"\n', "guards.max_iter"),
    ("guards:\n  max_iter: true\n", "guards.max_iter"),
    ("guards:\n  max_iter: 0\n", "guards.max_iter"),
    ("guards:\n  max_iter: 2.5\n", "guards.max_iter"),
    ("guards:\n  budget_seconds: -5\n", "guards.budget_seconds"),
    ("guards:\n  budget_seconds: .nan\n", "guards.budget_seconds"),
    ("guards:\n  no_progress_k: -1\n", "guards.no_progress_k"),
    ("guards:\n  escalate_after_iter: 1.5\n", "guards.escalate_after_iter"),
    ("guards: [1, 2]\n", "guards"),
    ("progress:\n  state_paths: 5\n", "progress.state_paths"),
    ("progress:\n  state_paths: [1]\n", "progress.state_paths"),
    ("reflexion:\n  enabled: 'yes'\n", "reflexion.enabled"),
    ("reflexion:\n  episodic_memory_page: 7\n", "reflexion.episodic_memory_page"),
    ("run_log:\n  path: ''\n", "run_log.path"),
    ("revise:\n  cmd: [a]\n", "revise.cmd"),
    ("- just\n- a list\n", "c.yaml"),
])
def test_a_wrong_type_names_the_file_and_key(tmp_path, text, where):
    path = write(tmp_path / "c.yaml", text)
    with pytest.raises(LoopUsageError) as info:
        read_runner_config(path)
    message = str(info.value)
    assert str(path) in message and where in message and "\n" not in message


def test_invalid_yaml_names_file_line_and_column(tmp_path):
    path = write(tmp_path / "c.yaml", "guards:\n  max_iter: 3\n  budget: [1,\n")
    with pytest.raises(LoopUsageError, match=r"not valid YAML") as info:
        read_runner_config(path)
    assert f"{path}:4:1" in str(info.value)


def test_a_missing_config_names_the_path(tmp_path):
    with pytest.raises(LoopUsageError, match="config file not found") as info:
        read_runner_config(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)


# -- values from text ---------------------------------------------------------------------


@pytest.mark.parametrize("name,raw,value", [
    ("max_iter", "6", 6), ("max_iter", " 2 ", 2), ("max_iter", 3.0, 3),
    ("budget_seconds", "0", 0.0), ("budget_seconds", "1e3", 1000.0), ("budget_seconds", 5, 5.0),
    ("no_progress_k", "0", 0), ("escalate_after", "2", 2),
])
def test_parse_guard_accepts(name, raw, value):
    parsed = parse_guard(name, raw, "here")
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("name,raw", [
    ("max_iter", "0"), ("max_iter", "2.0"), ("max_iter", "six"), ("max_iter", ""),
    ("budget_seconds", "-1"), ("budget_seconds", "inf"), ("budget_seconds", "soon"),
    ("no_progress_k", "-1"), ("escalate_after", "1.5"),
])
def test_parse_guard_rejects_naming_where_and_what_is_valid(name, raw):
    with pytest.raises(LoopUsageError, match="valid") as info:
        parse_guard(name, raw, "--the-flag")
    assert str(info.value).startswith("--the-flag:") and name in str(info.value)


# -- the environment -------------------------------------------------------------------------


def test_environment_layer():
    layer = env_layer({"PYTEST_LOOPS_MAX_ITER": "3", "PYTEST_LOOPS_BUDGET_SECONDS": "12.5",
                       "PYTEST_LOOPS_NO_PROGRESS_K": "0", "PYTEST_LOOPS_ESCALATE_AFTER": "",
                       "PYTEST_LOOPS_STATE": os.pathsep.join(["src", "lib"]),
                       "PYTEST_LOOPS_REVISE": "fix it", "LOOP_MAX_ITER": "99"})
    assert layer == {"max_iter": 3, "budget_seconds": 12.5, "no_progress_k": 0,
                     "state_paths": ["src", "lib"], "revise": "fix it"}


def test_a_bad_environment_value_names_the_variable():
    with pytest.raises(LoopUsageError, match="PYTEST_LOOPS_BUDGET_SECONDS"):
        env_layer({"PYTEST_LOOPS_BUDGET_SECONDS": "-3"})


# -- precedence ---------------------------------------------------------------------------------


def test_resolve_applies_layers_lowest_first_and_says_where_each_value_came_from():
    r = resolve([("file", {"max_iter": 5, "budget_seconds": 100.0}),
                 ("environment", {"max_iter": 3, "revise": None}),
                 ("command line", {"max_iter": None, "no_progress_k": 0})])
    assert (r["max_iter"], r["budget_seconds"], r["no_progress_k"]) == (3, 100.0, 0)
    assert r.origin["max_iter"] == "environment" and r.origin["budget_seconds"] == "file"
    assert r.origin["no_progress_k"] == "command line" and r.origin["escalate_after"] == "default"
    assert r["revise"] is DEFAULTS["revise"]


def test_defaults_without_file_env_or_flags(tmp_path):
    spec, extra = spec_for(["--cwd", str(tmp_path), "--verify", "true"])
    g = spec.guards
    assert (g.max_iter, g.budget_seconds, g.no_progress_k, g.escalate_after) == (6, 900.0, 2, 0)
    assert spec.state_paths == () and spec.revise is None and spec.reflexion is True
    assert extra["log_path"] is None and extra["config"] is None


def test_file_then_environment_then_flags(tmp_path):
    config = write(tmp_path / "c.yaml", FULL_CONFIG)
    base = ["--cwd", str(tmp_path), "--config", str(config)]
    spec, extra = spec_for(base)
    assert spec.guards.max_iter == 5 and spec.guards.budget_seconds == 100.0
    assert spec.guards.no_progress_k == 3 and spec.guards.escalate_after == 4
    assert spec.state_paths == ("src/*.py", "lib") and spec.revise == "python fix.py"
    assert spec.memory_page == "memory/lessons.md" and extra["log_path"] == "logs/run.json"
    assert [c.command for c in spec.checks] == ["pytest -q"]

    env = {"PYTEST_LOOPS_MAX_ITER": "3", "PYTEST_LOOPS_REVISE": "env fix"}
    spec, _ = spec_for(base, env)
    assert spec.guards.max_iter == 3 and spec.revise == "env fix"
    assert spec.guards.budget_seconds == 100.0  # still the file's
    assert spec.origin["max_iter"] == "environment" and spec.origin["budget_seconds"] == str(config)

    spec, extra = spec_for([*base, "--max-iter", "2", "--revise", "flag fix", "--state", "x",
                            "--verify", "make test", "--budget-seconds", "0", "--no-progress-k", "0",
                            "--escalate-after", "0", "--log", "l.json", "--episodic", "e.md"], env)
    g = spec.guards
    assert (g.max_iter, g.budget_seconds, g.no_progress_k, g.escalate_after) == (2, 0.0, 0, 0)
    assert spec.revise == "flag fix" and spec.state_paths == ("x",)
    assert [c.command for c in spec.checks] == ["make test"]
    assert spec.memory_page == "e.md" and extra["log_path"] == "l.json"
    assert spec.origin["max_iter"] == "command line"


def test_reflexion_off_from_the_file_or_a_flag(tmp_path):
    config = write(tmp_path / "c.yaml", "reflexion:\n  enabled: false\n")
    assert spec_for(["--config", str(config), "--verify", "true", "--cwd", str(tmp_path)])[0].reflexion is False
    assert spec_for(["--no-reflexion", "--verify", "true", "--cwd", str(tmp_path)])[0].reflexion is False


def test_the_harness_config_under_cwd_is_found_without_config(tmp_path):
    write(tmp_path / "harness" / "loop-runner.config.yaml", "guards:\n  max_iter: 4\n")
    spec, extra = spec_for(["--cwd", str(tmp_path), "--verify", "true"])
    assert spec.guards.max_iter == 4
    assert extra["config"] == tmp_path / "harness" / "loop-runner.config.yaml"


def test_precedence_end_to_end(cli, tmp_path):
    """The file says 5, the environment 3, the flag 2: each wins over the one before."""
    write(tmp_path / "c.yaml", "guards:\n  max_iter: 5\n  no_progress_k: 0\n")
    runs = {
        "file": ([], {}),
        "environment": ([], {"PYTEST_LOOPS_MAX_ITER": "3"}),
        "flag": (["--max-iter", "2"], {"PYTEST_LOOPS_MAX_ITER": "3"}),
    }
    iterations = {}
    for name, (flags, env) in runs.items():
        log = tmp_path / f"{name}.json"
        proc = cli("run", "--config", "c.yaml", "--verify", "false", "--log", str(log), "--quiet",
                   *flags, env=env)
        assert proc.returncode == 2, proc.stderr
        iterations[name] = load_runlog(log)["iterations_run"]
    assert iterations == {"file": 5, "environment": 3, "flag": 2}


def test_the_config_file_drives_a_whole_run(cli, tmp_path):
    write(tmp_path / "c.yaml", """\
guards: {max_iter: 4, no_progress_k: 2}
progress: {state_paths: ["src"]}
reflexion: {episodic_memory_page: mem/lessons.md}
run_log: {path: out/run.json}
revise: {cmd: "echo revised >> revise.txt"}
verify: {cmds: ["test -f src/fixed", "true"]}
""")
    (tmp_path / "src").mkdir()
    proc = cli("run", "--config", "c.yaml", "--quiet")
    assert proc.returncode == 4, proc.stderr  # revise.txt is not under the state path: NO_PROGRESS
    data = load_runlog(tmp_path / "out" / "run.json")
    assert data["verdict"] == "NO_PROGRESS" and data["iterations_run"] == 3
    assert data["state_paths"] == ["src"]
    assert (tmp_path / "revise.txt").read_text().count("revised") == 2
    assert (tmp_path / "mem" / "lessons.md").read_text().count(" iter ") == 3
    assert len(data["iterations"][0]["checks"]) == 2


def test_artifacts_directory_from_the_environment(cli, tmp_path):
    proc = cli("run", "--verify", "true", "--quiet", env={"PYTEST_LOOPS_ARTIFACTS": "arts"})
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "arts" / "runs").glob("*.json"))) == 1
    assert not (tmp_path / ".pytest-loops").exists()
    proc = cli("run", "--verify", "true", "--quiet", "--artifacts", "flag-arts",
               env={"PYTEST_LOOPS_ARTIFACTS": "arts"})
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "flag-arts" / "runs").glob("*.json"))) == 1
    assert len(list((tmp_path / "arts" / "runs").glob("*.json"))) == 1

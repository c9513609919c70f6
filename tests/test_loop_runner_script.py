"""harness/scripts/loop-runner.py: the loop-runner skill's documented command lines,
run verbatim from a project's root, and its config as a loop source everywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "harness" / "scripts" / "loop-runner.py"

# the skill's config as its users carry it: no verify (given by --verify), `verified: false`
SKILL_CONFIG = """\
verified: false
guards:
  max_iter: 4
  budget_seconds: 300
  no_progress_k: 2
  escalate_after_iter: 0
progress:
  state_paths: ["src/**"]
reflexion:
  enabled: true
  episodic_memory_page: wiki/lessons.md
run_log:
  path: harness/out/run.json
revise:
  cmd: null
  verified: false
"""

CALC_TEST = """\
import pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "src"))
import calc

def test_add():
    assert calc.add(2, 2) == 4
"""

FIX = """\
import pathlib
p = pathlib.Path("src/calc.py")
p.write_text(p.read_text().replace("a - b", "a + b"))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project laid out as the skill expects: harness/scripts/loop-runner.py, harness/loop-runner.config.yaml."""
    (tmp_path / "harness" / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "harness" / "scripts" / "loop-runner.py")
    (tmp_path / "harness" / "loop-runner.config.yaml").write_text(SKILL_CONFIG)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(CALC_TEST)
    (tmp_path / "fix.py").write_text(FIX)
    return tmp_path


def shell(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command line as a user types it: `python3` and `pytest` are this interpreter's."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_skills_selftest_line_runs_verbatim(project: Path) -> None:
    proc = shell("python3 harness/scripts/loop-runner.py selftest", project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scenarios hold" in proc.stdout


@pytest.mark.slow  # two pytest runs as the check, in the sandbox
def test_the_skills_run_line_runs_verbatim(project: Path) -> None:
    proc = shell('python3 harness/scripts/loop-runner.py run \\\n'
                 '  --config harness/loop-runner.config.yaml \\\n'
                 '  --verify "pytest -q" \\\n'
                 '  --revise "python3 fix.py" \\\n'
                 '  --state "src/**" --log harness/out/loop-runner-run.json', project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stderr, "verified: is a key of the skill's config, read without a warning"
    log = json.loads((project / "harness" / "out" / "loop-runner-run.json").read_text())
    assert (log["verdict"], log["iterations_run"]) == ("SUCCESS", 2)
    assert (project / "wiki" / "lessons.md").is_file(), "the config's paths are from the project root"


def test_the_run_line_with_a_shell_check_gives_the_skills_exit_codes(project: Path) -> None:
    base = ("python3 harness/scripts/loop-runner.py run --config harness/loop-runner.config.yaml "
            "--state \"src/**\" --log harness/out/loop-runner-run.json")
    proc = shell(base + " --verify \"grep -q 'a + b' src/calc.py\" --revise \"python3 fix.py\"", project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", "no warning about `verified`"
    proc = shell(base + " --verify false --revise \"python3 fix.py\" --no-progress-k 0 --max-iter 2", project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    proc = shell(base + " --verify false --max-iter 0", project)
    assert proc.returncode == 64 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_without_the_package_it_says_how_to_install_it_in_one_line_and_exits_64(project: Path) -> None:
    # -S: no site-packages, so nothing installed there is importable
    proc = subprocess.run([sys.executable, "-S", "harness/scripts/loop-runner.py", "selftest"], cwd=project,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 64
    [line] = proc.stderr.strip().splitlines()
    assert "pytest-loops is not importable" in line and "-m pip install pytest-loops" in line


def test_the_config_is_a_loop_source_for_show_list_run_and_pytest_loop(project: Path) -> None:
    config = project / "harness" / "loop-runner.config.yaml"
    proc = shell("pytest-loops show harness/loop-runner.config.yaml", project)
    assert proc.returncode == 0, proc.stderr
    assert "0 loops" in proc.stdout and "verified: false" in proc.stdout and "not a loop by itself" in proc.stdout
    config.write_text(SKILL_CONFIG.replace("  cmd: null", "  cmd: python3 fix.py")
                      + "verify:\n  cmd: \"grep -q 'a + b' src/calc.py\"\n")
    proc = shell("pytest-loops show -v harness/loop-runner.config.yaml", project)
    assert proc.returncode == 0, proc.stderr
    assert 'loop "loop-runner"' in proc.stdout and "the project root (the parent of harness/)" in proc.stdout
    proc = shell("pytest-loops list", project)
    assert proc.returncode == 0 and "loop-runner" in proc.stdout and "harness/loop-runner.config.yaml" in proc.stdout
    proc = shell("pytest-loops run loop-runner -q", project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a + b" in (project / "src" / "calc.py").read_text(), "run from the project root, as the skill runs it"
    (project / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    proc = shell(f"{sys.executable} -m pytest --loop harness/loop-runner.config.yaml -p no:cacheprovider", project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS     loop-runner: 2 iteration(s)" in proc.stdout

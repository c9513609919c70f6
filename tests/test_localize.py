"""Fault localization wired into the loop: suspects in the prompt and suspects.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.localization.localize import failing_tests
from pytest_loops.results import CheckResult

CALC = """\
def add(a, b):
    return a + b


def mean(values):
    total = 0
    for value in values:
        total = add(total, value)
    return total / (len(values) + 1)
"""
TESTS = """\
from calc import add, mean


def test_add():
    assert add(2, 3) == 5


def test_mean():
    assert mean([2, 4]) == 3


def test_add_negative():
    assert add(-1, 1) == 0
"""


def project(root: Path) -> None:
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    (root / "fix.py").write_text(
        "import pathlib\np = pathlib.Path('calc.py')\n"
        "p.write_text(p.read_text().replace('(len(values) + 1)', 'len(values)'))\n")


def run(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify",
                           f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py",
                           "--revise", "python fix.py", "-q", *extra],
                          cwd=root, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_the_bug_line_is_the_top_suspect_in_the_prompt_and_suspects_json(tmp_path: Path) -> None:
    project(tmp_path)
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(p for p in (tmp_path / ".pytest-loops" / "runs").iterdir() if p.is_dir())
    suspects = json.loads((run_dir / "iter-001" / "suspects.json").read_text())
    # mean() runs only in the failing test: its lines tie at the top; add() is shared
    top = [(s["file"], s["line"]) for s in suspects if s["score"] == suspects[0]["score"]]
    assert ("calc.py", 9) in top and ("calc.py", 2) not in top
    assert {"file": "calc.py", "line": 9, "score": 1.0, "source": "return total / (len(values) + 1)",
            "scope": "mean()"} in suspects
    assert [s["score"] for s in suspects] == sorted((s["score"] for s in suspects), reverse=True)
    assert set(suspects[0]) == {"file", "line", "score", "source", "scope"}
    prompt = (run_dir / "iter-001" / "prompt.md").read_text()
    assert "## Suspicious lines" in prompt
    assert "calc.py:9 in mean() (1.00): return total / (len(values) + 1)" in prompt
    assert "- mean() in calc.py (best 1.00; 4 of the 5 lines: 6, 7, 8, 9)" in prompt
    log = json.loads(next((tmp_path / ".pytest-loops" / "runs").glob("*.json")).read_text())
    assert log["iterations"][0]["suspects_file"].endswith("iter-001/suspects.json")
    assert log["artifacts"]["suspects"] == str(run_dir / "suspects.json")


@pytest.mark.slow
def test_no_suspects_turns_it_off(tmp_path: Path) -> None:
    project(tmp_path)
    done = run(tmp_path, "--no-suspects")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list((tmp_path / ".pytest-loops").rglob("suspects.json"))
    prompt = next((tmp_path / ".pytest-loops").rglob("prompt.md")).read_text()
    assert "Suspicious lines" not in prompt


def test_a_check_that_is_not_pytest_gets_no_suspects(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", "test -f ok",
                           "--revise", "touch ok", "-q"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    assert not list((tmp_path / ".pytest-loops").rglob("suspects.json"))


@pytest.mark.parametrize(("check", "expected"), [
    (CheckResult("t", "pytest", False, 1, 0.0, failing_tests=("a.py::t",)), ["a.py::t"]),
    (CheckResult("c", "command", False, 1, 0.0, command="pytest -q",
                 output_tail="FAILED t.py::test_x - assert 1\nERROR t.py::test_y\nFAILED nothing"),
     ["t.py::test_x", "t.py::test_y"]),
    (CheckResult("c", "command", False, 1, 0.0, command="pytest -q | tee out",
                 output_tail="FAILED t.py::test_x - assert 1"), []),
    (CheckResult("c", "command", False, 1, 0.0, command="make test",
                 output_tail="FAILED t.py::test_x - assert 1"), []),
])
def test_failing_tests_of_checks(check: CheckResult, expected: list[str]) -> None:
    assert failing_tests([check]) == expected


def test_pytest_option_turns_it_off_and_rejects_bad_values(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    bad = pytester.runpytest_subprocess("--loop", "--loop-suspects", "maybe")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["ERROR: --loop-suspects: 'maybe' is not a valid suspects; valid: on or off"])


@pytest.mark.slow
def test_a_failing_pytest_command_reruns_narrowed_then_confirms(tmp_path: Path) -> None:
    project(tmp_path)
    # iteration 1's revise changes nothing relevant; iteration 2's fixes mean()
    (tmp_path / "fix.py").write_text(
        "import os, pathlib\np = pathlib.Path('calc.py')\n"
        "if os.environ['LOOP_ITERATION'] == '2':\n"
        "    p.write_text(p.read_text().replace('(len(values) + 1)', 'len(values)'))\n"
        "else:\n    pathlib.Path('notes.txt').write_text('tried')\n")
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    log = json.loads(next((tmp_path / ".pytest-loops" / "runs").glob("*.json")).read_text())
    second, third = log["iterations"][1]["checks"][0], log["iterations"][2]["checks"][0]
    assert second["command"].endswith("test_calc.py::test_mean")  # only the failing test ran
    assert second["reason"].startswith("exit 1 in a narrowed run of 1 test(s)")
    assert third["command"].endswith("-p no:cacheprovider test_calc.py")  # the confirm run: the full check
    assert third["reason"].startswith("passed (confirm run after a narrowed run")
    run_dir = next(p for p in (tmp_path / ".pytest-loops" / "runs").iterdir() if p.is_dir())
    assert (run_dir / "iter-003" / "check-1-narrowed.out").is_file()


def test_narrowing_adds_the_tests_whose_code_changed(tmp_path: Path) -> None:
    project(tmp_path)
    # the revise breaks add(), which the green tests run: they join the narrowed run
    (tmp_path / "fix.py").write_text(
        "import os, pathlib\np = pathlib.Path('calc.py')\n"
        "if os.environ['LOOP_ITERATION'] == '1':\n"
        "    p.write_text(p.read_text().replace('return a + b', 'return a + b + 0 * 1'))\n")
    done = run(tmp_path, "--max-iter", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    log = json.loads(next((tmp_path / ".pytest-loops" / "runs").glob("*.json")).read_text())
    command = log["iterations"][1]["checks"][0]["command"]
    assert "test_calc.py::test_mean" in command
    assert "test_calc.py::test_add" in command and "test_calc.py::test_add_negative" in command

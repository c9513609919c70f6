"""Loops under `pytest -n 2` (pytest-xdist): repairs, artifacts, the lessons page, the tree lock."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from plugin_helpers import Project, junit_cases

# module NAME's function f is broken; its test file checks it
BROKEN_MODULE = "def f():\n    return 0  # BUG\n"
FIX = 'python edit.py {name}.py "return 0  # BUG" "return 1"'

# lockcheck.py NAME: a revise that marks its start and end in revise.log, with a pause between
LOCKCHECK = """\
import os
import sys
import time

name = sys.argv[1]
worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
with open("../revise.log", "a") as f:
    f.write(f"start {name} {worker}\\n")
time.sleep(0.6)
with open("../revise.log", "a") as f:
    f.write(f"end {name} {worker}\\n")
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def broken_pair(project: Project, marker: str, names: tuple[str, ...] = ("alpha", "beta")) -> None:
    """Modules with a bug and one marked test file each (`{name}` in the marker is the module)."""
    for name in names:
        project.write(f"{name}.py", BROKEN_MODULE)
        project.write(f"test_{name}.py", f"""\
            import pytest

            import {name}


            @pytest.mark.loop({marker.format(name=name)})
            def test_{name}():
                assert {name}.f() == 1
            """)


def workers_of(result: pytest.RunResult) -> dict[str, str]:
    """test name -> xdist worker, from `-v` output lines like `[gw1] PASSED test_x.py::test_x`."""
    found = {}
    for worker, nodeid in re.findall(r"^\[(gw\d+)\] .*?(test_\w+\.py::\w+)", result.stdout.str(), re.M):
        found[nodeid.split("::")[1]] = worker
    return found


@pytest.mark.slow
def test_two_marked_tests_in_two_files_repaired_in_parallel(project: Project) -> None:
    broken_pair(project, "revise=" + repr(FIX) + ", max_iter=3")
    junit = project.path / "junit.xml"
    result = project.run("--loop", "-n", "2", "--dist", "loadfile", "-v", f"--junitxml={junit}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 repaired in*"])
    workers = workers_of(result)
    assert workers.keys() == {"test_alpha", "test_beta"} and len(set(workers.values())) == 2
    for name in ("alpha", "beta"):
        assert "return 1" in project.read(f"{name}.py")
    # the loops summary on the controller, from the workers' reports
    loops = result.stdout.str().split("= loops =", 1)[1]
    assert len(re.findall(r"^SUCCESS +test_(alpha|beta)\.py::test_\1: 2 iteration\(s\)", loops, re.M)) == 2
    # JUnit written by the controller carries both loops' properties
    cases = junit_cases(junit)
    assert {cases[f"test_{n}"]["properties"]["verdict"] for n in ("alpha", "beta")} == {"SUCCESS"}
    # run logs: one each, never the same path, each naming its own loop
    logs = sorted(cases[f"test_{n}"]["properties"]["artifact_log"] for n in ("alpha", "beta"))
    assert len(set(logs)) == 2
    for name, log in zip(("alpha", "beta"), logs, strict=True):
        assert json.loads(Path(log).read_text(encoding="utf-8"))["loop"] == f"test_{name}.py::test_{name}"
    index = [json.loads(line) for line in (project.artifacts / "index.jsonl").read_text().splitlines()]
    assert sorted(entry["log"] for entry in index) == logs


def test_many_loops_never_share_a_run_log(project: Project) -> None:
    # a parametrized test: four loops, two per worker, names differing only in the id
    project.write("mod.py", BROKEN_MODULE)
    project.write("test_many.py", """\
        import pytest

        import mod


        @pytest.mark.loop(max_iter=1)
        @pytest.mark.parametrize("case", ["a-b", "a_b", "a b", "a/b"])
        def test_many(case):
            assert mod.f() == 1
        """)
    result = project.run("--loop", "-n", "2")
    assert result.ret == 1
    result.assert_outcomes(failed=4)
    logs = sorted((project.artifacts / "runs").glob("*.json"))
    assert len(logs) == 4
    names = sorted(json.loads(p.read_text(encoding="utf-8"))["loop"] for p in logs)
    assert names == sorted(f"test_many.py::test_many[{c}]" for c in ("a-b", "a_b", "a b", "a/b"))


@pytest.mark.slow
def test_one_lessons_page_for_parallel_loops(project: Project) -> None:
    # no revise: these loops change nothing, take no tree lock and run side by side
    names = ("alpha", "beta", "gamma", "delta")
    broken_pair(project, "max_iter=2, no_progress_k=0", names=names)
    result = project.run("--loop", "-n", "2", "--loop-lessons-page", "shared/lessons.md")
    assert result.ret == 1
    result.assert_outcomes(failed=4)
    text = project.read("shared/lessons.md")
    lessons = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(lessons) == 4 * 2, text  # one per failed iteration of every loop
    pattern = re.compile(r"- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ test_(\w+)\.py::test_\1 iter ([12]): exit 1, [a-z ]+: .+")
    seen = set()
    for line in lessons:
        match = pattern.fullmatch(line)
        assert match, f"an interleaved or broken lesson line: {line!r}"
        seen.add((match.group(1), match.group(2)))
    assert seen == {(name, str(i)) for name in names for i in (1, 2)}
    assert text.count("## Lessons") == 1


@pytest.mark.slow
def test_loops_that_revise_the_same_tree_never_interleave(project: Project,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    project.write("lockcheck.py", LOCKCHECK)
    # the revise steps keep their log beside the project, outside the tree: named writable
    monkeypatch.setenv("PYTEST_LOOPS_SANDBOX_WRITABLE", str(project.path.parent))
    broken_pair(project, 'revise="python lockcheck.py {name}", max_iter=2, no_progress_k=0')
    result = project.run("--loop", "-n", "2", "--dist", "loadfile", "-v")
    assert result.ret == 1  # nothing fixes the bug: both loops end MAX_ITER
    result.assert_outcomes(failed=2)
    lines = (project.path.parent / "revise.log").read_text().splitlines()
    assert len(lines) == 2 * 2, lines  # two loops, one revise step each, start + end
    for start, end in zip(lines[::2], lines[1::2], strict=True):
        assert start.startswith("start ") and end == "end " + start.removeprefix("start "), lines
    # the two loops did run in two workers at once
    assert len({line.split()[2] for line in lines}) == 2


@pytest.mark.slow
def test_the_session_loop_under_xdist(project: Project) -> None:
    for name in ("alpha", "beta"):
        project.write(f"{name}.py", BROKEN_MODULE)
        project.write(f"test_{name}.py", f"import {name}\n\n\ndef test_{name}():\n    assert {name}.f() == 1\n")
    fix = 'python edit.py alpha.py "return 0  # BUG" "return 1" && ' \
          'python edit.py beta.py "return 0  # BUG" "return 1"'
    result = project.run("--loop", "-n", "2", "--loop-revise", fix, "--loop-max-iter", "2")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*loop: 2 failing test(s)*", "SUCCESS*failing tests: 2 iteration(s)*",
                                 "*2 repaired in*"])

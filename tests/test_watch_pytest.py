"""`pytest --loop-watch`: the failing tests run again after an edit, then the whole
selection; the controller never imports the code under test."""

from __future__ import annotations

import json
import sys

import pytest

from pytest_loops.pytest_plugin.watching import child_args

pytest_plugins = ["pytester"]

CALC = """\
import os, pathlib
with open(pathlib.Path(__file__).with_name("imported.txt"), "a") as f:
    f.write(os.environ.get("PYTEST_LOOPS_CHILD", "controller") + "\\n")

def add(a, b):
    return a - b
"""

TESTS = """\
import pathlib
import calc

def ran(name):
    with open(pathlib.Path(__file__).with_name("ran.txt"), "a") as f:
        f.write(name + "\\n")

def test_add():
    ran("add")
    assert calc.add(2, 2) == 4

def test_sub():
    ran("sub")
"""

OTHER = """\
import pathlib

def test_other():
    with open(pathlib.Path(__file__).with_name("ran.txt"), "a") as f:
        f.write("other\\n")
"""

# call 1 is the baseline after the first run, call 2 repairs calc.py (a new state),
# call 3 reports it again (idle), then nothing is ready
POLL = """\
n=$(cat calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > calls
if [ $n -eq 2 ]; then sed -i 's/a - b/a + b/' calc.py; fi
if [ $n -le 3 ]; then ready=true; else ready=false; fi
if [ $n -lt 2 ]; then state=broken; else state=fixed; fi
printf '{"ready": %s, "state_digest": "%s"}\\n' $ready $state
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(calc=CALC, test_calc=TESTS, test_other=OTHER)
    (pytester.path / "poll.sh").write_text(POLL)
    return pytester


@pytest.mark.slow
def test_reruns_only_the_failing_tests_after_an_edit_then_the_whole_selection(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "--loop-watch", "--loop-watch-poll=sh poll.sh", "--loop-watch-interval=0.05",
        "--loop-silence", "1", "-p", "no:cacheprovider", timeout=180)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    ran = (project.path / "ran.txt").read_text().split()
    assert ran == ["add", "sub", "other",  # the first run: the whole selection
                   "add",  # after the edit: only the failing test
                   "add", "sub", "other"]  # it passes: the whole selection again
    imported = (project.path / "imported.txt").read_text().split()
    assert imported == ["1", "1", "1"], "the code under test is imported only in the test runs"
    result.stdout.fnmatch_lines([
        "*generation 2: running the 1 failing test(s) again*",
        "*idle tick: state unchanged (1 idle so far)*",
        "*watch NO_PROGRESS: 2 generation(s), 1 idle, 1 fix(es), 3 iteration(s); last verdict SUCCESS; exit 0: "
        "watch_source_silence*",
    ])
    log = next((project.path / ".pytest-loops" / "watch").glob("pytest-*/watch.jsonl"))
    runs = [json.loads(line) for line in log.read_text().splitlines() if '"run"' in line]
    assert [(r["verdict"], r["iterations"], r["fixed"]) for r in runs] == [
        ("NO_PROGRESS", 1, False), ("SUCCESS", 2, True)]


@pytest.mark.slow
def test_an_edit_of_the_code_is_a_tick(project: pytest.Pytester) -> None:
    """The files under the rootdir are the source; what the runs write there is no tick."""
    import subprocess
    import time

    proc = project.popen([sys.executable, "-m", "pytest", "--loop-watch", "--loop-watch-interval=0.05",
                          "--loop-silence=3", "-p", "no:cacheprovider"], stdin=subprocess.DEVNULL)

    def runs() -> list[dict]:
        found = []
        for log in (project.path / ".pytest-loops" / "watch").glob("pytest-*/watch.jsonl"):
            found += [json.loads(line) for line in log.read_text().splitlines() if '"run"' in line]
        return found

    def wait_for(count: int) -> None:
        end = time.monotonic() + 90
        while len(runs()) < count:
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.02)

    try:
        wait_for(1)
        calc = project.path / "calc.py"
        calc.write_text(calc.read_text().replace("a - b", "a + b"))
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, out.decode() + err.decode()
    assert [(r["verdict"], r["fixed"]) for r in runs()] == [("NO_PROGRESS", False), ("SUCCESS", True)]
    assert (project.path / "ran.txt").read_text().split() == ["add", "sub", "other", "add", "add", "sub", "other"]
    assert (project.path / "imported.txt").read_text().split() == ["1", "1", "1"]


def test_the_silence_window_exits_with_the_verdict_under_exitcode_verdict(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "--loop-watch", "--loop-watch-poll=echo '{\"ready\": false, \"state_digest\": \"x\"}'",
        "--loop-watch-interval=0.05", "--loop-silence=0.3", "--loop-exitcode=verdict", "-p", "no:cacheprovider",
        timeout=180)
    assert result.ret == 4, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*last verdict NO_PROGRESS; exit 4: watch_source_silence*"])
    assert (project.path / "ran.txt").read_text().split() == ["add", "sub", "other"]


@pytest.mark.parametrize(("args", "code"), [
    (("--loop-silence=0.1", "--loop-watch-interval=1"), 4),
    (("--loop-silence=0.1", "--loop-watch-interval=1", "--loop-exitcode=verdict"), 64),
    (("--loop-silence=soon",), 4),
])
def test_bad_watch_input_is_one_line(project: pytest.Pytester, args: tuple, code: int) -> None:
    result = project.runpytest_subprocess("--loop-watch", *args, timeout=120)
    assert result.ret == code
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: "), result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not (project.path / "ran.txt").exists()


def test_the_watch_options_never_reach_the_test_runs() -> None:
    given = ["--loop-watch", "-x", "--loop-silence", "3", "--loop-watch-poll=cmd", "tests/",
             "--loop-watch-interval", "1", "--loop-watch=on", "-k", "add"]
    assert child_args(given) == ["-x", "tests/", "-k", "add"]


def test_without_loop_watch_nothing_changes(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2, failed=1)
    assert "[watch]" not in result.stdout.str()

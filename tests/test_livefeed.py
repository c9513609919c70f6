"""Under pytest-xdist the controller shows the workers' loops live: the checks' result
before a revise step, its heartbeat or streamed output, each iteration's line, as they
happen, not only in the final report."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from plugin_helpers import clean_env

from pytest_loops.pytest_plugin.livefeed import Feed, WorkerFeed, worker_feed


def test_the_controller_prints_each_complete_line_once_with_its_worker(tmp_path: Path) -> None:
    said: list[str] = []
    feed = Feed(said.append, poll=3600)  # drained by hand here
    try:
        gw0 = WorkerFeed(str(feed.path), "gw0")
        gw1 = WorkerFeed(str(feed.path), "gw1")
        gw0.line("first\nwith a newline inside")
        gw1.line("other worker")
        feed.drain()
        assert said == ["[gw0] first with a newline inside", "[gw1] other worker"]
        with open(gw0.path, "ab") as f:
            f.write(b"half a li")  # still being written: not shown yet
        feed.drain()
        assert len(said) == 2
        with open(gw0.path, "ab") as f:
            f.write(b"ne\n")
        feed.drain()
        assert said[2:] == ["[gw0] half a line"]
    finally:
        feed.close()
    assert not feed.path.exists()


def test_a_worker_without_a_feed_writes_nowhere(tmp_path: Path) -> None:
    class Config:
        workerinput = {"workerid": "gw0"}

    assert worker_feed(Config()) is None
    Config.workerinput = {"workerid": "gw0", "loop_live_feed": str(tmp_path / "gone")}
    assert worker_feed(Config()) is None
    Config.workerinput = {"workerid": "../gw0", "loop_live_feed": str(tmp_path)}
    feed = worker_feed(Config())
    assert feed is not None and Path(feed.path).parent == tmp_path  # the worker id cannot climb out
    WorkerFeed(str(tmp_path / "gone"), "gw1").line("no directory: no error")


REVISE = """\
import os, sys, time
from pathlib import Path

print("agent: reading the failure", flush=True)
go = Path(sys.argv[1])
for _ in range(600):  # up to 30 s: the test releases it once the controller showed the line above
    if go.exists():
        print("agent: released", flush=True)
        break
    time.sleep(0.05)
else:
    print("agent: never released", flush=True)
Path("calc.py").write_text("def add(a, b):\\n    return a + b\\n")
"""


@pytest.mark.slow
def test_under_xdist_the_revise_steps_output_reaches_the_controller_while_it_runs(tmp_path: Path) -> None:
    """The revise step waits until the test has seen its first line on the controller's
    stdout: were the line shown only at the end, it would never be released."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (proj / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (proj / "pytest.ini").write_text("[pytest]\n")
    go = tmp_path / "go"
    (tmp_path / "revise.py").write_text(REVISE)
    (proj / "fix.loop").write_text(textwrap.dedent(f"""\
        loop "fix calc":
          goal: add adds
          done when "{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py" passes
          revise with "{sys.executable} {tmp_path / 'revise.py'} {go}"
          after 3 tries: stop
        """))
    env = clean_env({"PYTEST_LOOPS_SANDBOX_WRITABLE": str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--loop", "-n", "2", "-p", "no:cacheprovider",
                             "--loop-revise-output=stream", "fix.loop"],
                            cwd=proj, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    released_at = None
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if released_at is None and "agent: reading the failure" in line:
            assert line.startswith("[gw"), line  # from a worker, through the controller
            go.write_text("")
            released_at = len(seen)
        if time.monotonic() > deadline:
            proc.kill()
            break
    code = proc.wait(30)
    proc.stdout.close()
    out = "\n".join(seen)
    assert released_at is not None, out
    assert "agent: released" in out and "never released" not in out, out
    assert code == 0, out
    # the checks' result before the revise step, and the iteration's line, came the same way
    assert any(s.startswith("[gw") and "checks of iteration 1: FAIL" in s for s in seen), out
    assert any(s.startswith("[gw") and "iter 1/3" in s for s in seen), out

"""Live progress while the revise step runs: the checks' line before it starts, a status
line (rewritten on a terminal, a heartbeat elsewhere) with the time, files changed, the
last output line and the cost so far, and ``revise_output = stream``: the output as it
comes, masked."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from agent_fakes import install, path_with

from pytest_loops.core import live
from pytest_loops.core.live import ReviseProgress, ReviseWatcher
from pytest_loops.pytest_plugin.terminal import ReviseView
from pytest_loops.spec import Check, LoopSpec

SLOW = textwrap.dedent("""\
    import json, os, sys, time
    json.dump({"cost_usd": 0.3, "input_tokens": 40, "output_tokens": 2}, open(os.environ["LOOP_USAGE_FILE"], "w"))
    for i in range(1, 5):
        print(f"step {i} token=" + os.environ["MY_API_TOKEN"], flush=True)
        if i == 2:
            open("edited.py", "w").write("x = 1\\n")
        time.sleep(0.4)
    """)
SECRET = "s3cr3t-value-xyz"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (tmp_path / "slow_agent.py").write_text(SLOW)
    return path


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_stream_shows_the_output_as_it_comes_masked_after_the_checks_line(cli, tmp_path, work):
    proc = cli("run", "--cwd", str(work), "--verify", "false", "--revise", f"python {tmp_path / 'slow_agent.py'}",
               "--max-iter", "2", "--revise-output", "stream", env={"MY_API_TOKEN": SECRET})
    assert proc.returncode == 2, proc.stderr
    out = lines_of(proc.stdout)
    assert SECRET not in proc.stdout
    verify = next(i for i, line in enumerate(out) if line.startswith("[loop] checks of iteration 1: FAIL"))
    assert out[verify].endswith("| revising...")
    streamed = [line for line in out if line.startswith("[loop] revise| ")]
    assert streamed == [f"[loop] revise| step {i} token=[REDACTED:MY_API_TOKEN]" for i in range(1, 5)]
    first = out.index(streamed[0])
    finished = next(i for i, line in enumerate(out) if line.startswith("[loop] iter 1/2"))
    assert verify < first < finished  # the checks' line first, the iteration's line after the step


def test_without_a_terminal_a_heartbeat_names_time_files_last_line_and_cost(tmp_path, work, monkeypatch, capsys):
    from pytest_loops.cli.main import main

    monkeypatch.setattr(live, "HEARTBEAT_SECONDS", 0.05)  # the interval is a constant tests shrink
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    code = main(["run", "--cwd", str(work), "--verify", "false", "--revise", f"python {tmp_path / 'slow_agent.py'}",
                 "--max-iter", "2", "--log", str(tmp_path / "run.json")])
    assert code == 2
    out = capsys.readouterr().out
    beats = [line for line in lines_of(out) if line.startswith("[loop] revise 1: ")]
    assert beats, out
    assert all(re.match(r"\[loop\] revise 1: \d+s, \d+ files? changed, \$0\.3000, 42 tokens", b) for b in beats)
    assert any("| step" in b for b in beats) and SECRET not in out
    assert any(" 1 file changed" in b for b in beats)  # edited.py, seen by the journal while the step ran


def test_quiet_shows_nothing_while_the_step_runs(cli, tmp_path, work):
    proc = cli("run", "--cwd", str(work), "--verify", "false", "--revise", f"python {tmp_path / 'slow_agent.py'}",
               "--max-iter", "2", env={"MY_API_TOKEN": SECRET, "PYTEST_LOOPS_REVISE_OUTPUT": "quiet"})
    assert proc.returncode == 2, proc.stderr
    assert "revise|" not in proc.stdout and "revise 1:" not in proc.stdout
    assert "[loop] checks of iteration 1: FAIL" in proc.stdout  # the checks' line is not progress: it is always there


def test_a_bad_revise_output_is_64(cli, work):
    proc = cli("run", "--cwd", str(work), "--verify", "false", "--revise-output", "loud")
    assert proc.returncode == 64 and "'loud' is not a valid revise_output" in proc.stderr


def test_an_agent_preset_streams_what_its_events_say_not_raw_json(cli, tmp_path, work):
    install(tmp_path / "bin", "claude")
    proc = cli("run", "--cwd", str(work), "--verify", "test -f fixed", "--revise", "claude",
               "--revise-output", "stream",
               env={"PATH": path_with(tmp_path / "bin"), "FAKE_AGENT_LOG": str(tmp_path / "calls.jsonl")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    streamed = [line for line in lines_of(proc.stdout) if line.startswith("[loop] revise| ")]
    assert streamed == ["[loop] revise| Working on call 1", "[loop] revise| done after 2 turn(s)"]


# -- the watcher and the view, alone ---------------------------------------------------------------


def test_the_watcher_counts_changed_files_from_its_journal_and_reads_new_output(tmp_path):
    tree, run_dir = tmp_path / "tree", tmp_path / "tree" / ".pytest-loops" / "iter-001"
    (tree / "pkg").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    seen: list[ReviseProgress] = []
    usage = tmp_path / "usage"
    usage.mkdir()
    with ReviseWatcher(seen.append, iteration=1, iteration_dir=run_dir, workdir=tree,
                       exclude=[tree / ".pytest-loops"], usage_dir=usage, prior=[{"cost_usd": 1.0}],
                       scrub=lambda text: text.replace("hunter2", "[MASKED]"), describe=None):
        (tree / "pkg" / "a.py").write_text("a\n")
        (tree / "new").mkdir()
        (run_dir / "revise.out").write_text("first\npassword hunter2\npartial")
        (tree / ".pytest-loops" / "x").write_text("the harness's own file: not counted")
        (usage / "iter-001.json").write_text('{"cost_usd": 0.5, "output_tokens": 3}')
    final = seen[-1]
    assert final.final and final.files_changed == 1
    assert final.last_line == "partial"
    assert [line for p in seen for line in p.new_lines] == ["first", "password [MASKED]", "partial"]
    assert final.cost_usd == 1.5 and final.tokens == 3
    assert final.status("fix").startswith("[fix] revise 1: ") and "1 file changed, $1.50, 3 tokens | partial" in \
        final.status("fix")


def test_a_rewritten_output_file_is_not_read_twice(tmp_path):
    run_dir = tmp_path / "iter-001"
    run_dir.mkdir()
    out = run_dir / "revise.out"
    seen: list[ReviseProgress] = []
    watcher = ReviseWatcher(seen.append, iteration=1, iteration_dir=run_dir, workdir=tmp_path, exclude=[],
                            usage_dir=None, prior=[], scrub=None)
    out.write_text("one secret\n")
    watcher._look(final=False)
    out.write_text("one [REDACTED]\n")  # masked in place after the step, longer than before
    watcher._look(final=True)
    watcher.changes.close()
    assert [line for p in seen for line in p.new_lines] == ["one secret"]


def spec() -> LoopSpec:
    return LoopSpec(name="fix", checks=(Check.command_passes("true"),))


def progress(elapsed: float, final: bool = False, lines: tuple[str, ...] = ()) -> ReviseProgress:
    return ReviseProgress(iteration=2, elapsed_s=elapsed, files_changed=3, last_line="thinking",
                          new_lines=list(lines), cost_usd=None, tokens=None, final=final)


def test_on_a_terminal_the_status_line_is_rewritten_at_most_once_a_second_and_cleared():
    printed, rewritten = [], []
    view = ReviseView("status", printed.append, rewritten.append)
    for t in (0.25, 0.5, 1.3, 1.5, 2.4):
        view.show(spec(), progress(t))
    view.show(spec(), progress(2.6, final=True))
    assert printed == []
    status = "[fix] revise 2: {}s, 3 files changed | thinking"
    assert rewritten == [status.format(0), status.format(1), status.format(2), ""]


def test_without_a_terminal_a_heartbeat_every_interval(monkeypatch):
    monkeypatch.setattr(live, "HEARTBEAT_SECONDS", 10.0)
    printed: list[str] = []
    view = ReviseView("status", printed.append)
    for t in (0.25, 5.0, 9.9, 10.0, 15.0, 20.5, 21.0):
        view.show(spec(), progress(t))
    view.show(spec(), progress(22.0, final=True))
    status = "[fix] revise 2: {}s, 3 files changed | thinking"
    assert printed == [status.format(10), status.format(20)]


@pytest.mark.slow
def test_the_pytest_fix_loop_streams_too(pytester):
    pytester.makepyfile(test_calc="def test_add():\n    import calc\n    assert calc.add(1, 2) == 3\n")
    pytester.makepyfile(calc="def add(a, b):\n    return a - b\n")
    pytester.makepyfile(fix="print('looking at calc.py', flush=True)\n"
                            "open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')\n"
                            "print('fixed it', flush=True)\n")
    result = pytester.runpytest_subprocess("--loop", "--loop-revise=python fix.py", "--loop-revise-output=stream",
                                           "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == 0, out
    result.stdout.fnmatch_lines(["*checks of iteration 1: FAIL *| revising...", "*revise| looking at calc.py",
                                 "*revise| fixed it", "*iter 1/*"])

"""Agent presets: ``--revise claude|codex|aider|gemini`` with a stand-in CLI on PATH.

For each: the prompt reaches the CLI in its documented form, the session is continued
across iterations, cost and tokens land in the run log, and ``max_cost`` /
``max_tokens`` stop the loop with exit 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_fakes import install, path_with

from pytest_loops.agents import find_agent, presets, program_to_check
from pytest_loops.agents import registry as agent_registry
from pytest_loops.agents.presets import Aider, ClaudeCode, CodexCLI, GeminiCLI
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.core.usage import Usage
from pytest_loops.errors import LoopUsageError

# what each fake reports per call: (cost, input tokens, output tokens, the first session id)
EXPECTED = {
    "claude": (0.5, 150, 40, "claude-session-1"),
    "codex": (None, 300, 50, "thread-1"),
    "aider": (0.02, 2500, 300, ".aider.chat.history.md"),
    "gemini": (None, 500, 60, "gemini-1"),
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def run_agent(cli, tmp_path: Path, work: Path, name: str, *args: str, fix_at: int = 2, fake: str | None = None):
    bindir = tmp_path / "bin"
    install(bindir, name, fake)
    log = tmp_path / "run.json"
    env = {"PATH": path_with(bindir), "FAKE_AGENT_LOG": str(tmp_path / "calls.jsonl"), "FAKE_FIX_AT": str(fix_at)}
    proc = cli("run", "--cwd", str(work), "--log", str(log), "--verify", "test -f fixed", "--revise", name,
               "--goal", "make fixed exist", *args, env=env)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()] \
        if (tmp_path / "calls.jsonl").exists() else []
    return proc, (load_runlog(log) if log.exists() else None), calls


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_preset_gets_the_prompt_continues_its_session_and_reports_cost(cli, tmp_path, project, name):
    proc, log, calls = run_agent(cli, tmp_path, project, name, "--max-iter", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log["verdict"] == "SUCCESS" and log["iterations_run"] == 3
    assert len(calls) == 2
    cost, tokens_in, tokens_out, session = EXPECTED[name]
    # the prompt reached the CLI whole, as its interface takes it
    assert calls[0]["prompt"].startswith("# Loop: loop") and "Goal: make fixed exist" in calls[0]["prompt"]
    assert calls[0]["agent"] == name and calls[0]["usage_file"]
    # the first call starts a session, the second continues it
    assert calls[0]["resumed"] is None and calls[1]["resumed"] == session
    its = log["iterations"]
    assert its[0]["session_id"] == session and its[0]["input_tokens"] == tokens_in
    assert its[0]["output_tokens"] == tokens_out and its[0]["cost_usd"] == cost
    total = log["usage"]
    assert total["input_tokens"] == 2 * tokens_in and total["tokens"] == 2 * (tokens_in + tokens_out)
    assert total.get("cost_usd") == (None if cost is None else pytest.approx(2 * cost))


def test_claude_max_cost_stops_the_loop_with_exit_3(cli, tmp_path, project):
    proc, log, calls = run_agent(cli, tmp_path, project, "claude", "--max-cost", "0.75", fix_at=9)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert log["verdict"] == "TIMEOUT" and log["iterations_run"] == 2 and len(calls) == 2
    assert log["iterations"][-1]["guard"] == "max_cost"
    assert log["reason"] == "max_cost of $0.7500 reached: the revise steps have spent $1.00 after iteration 2"
    assert "TIMEOUT (exit 3)" in proc.stdout and "cost $1.00 of $0.7500" in proc.stdout


def test_codex_max_tokens_stops_the_loop_with_exit_3(cli, tmp_path, project):
    proc, log, calls = run_agent(cli, tmp_path, project, "codex", "--max-tokens", "500", fix_at=9)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert log["iterations"][-1]["guard"] == "max_tokens" and len(calls) == 2


def test_a_path_is_the_command_never_the_preset(cli, tmp_path, project):
    """`./claude` runs the file in the working tree as it is: no preset flags are added."""
    script = project / "claude"
    script.write_text("#!/bin/sh\necho \"$@\" > args.txt\ntouch fixed\n")
    script.chmod(0o755)
    proc, log, calls = run_agent(cli, tmp_path, project, "./claude", fake="raise SystemExit(9)\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == [] and (project / "args.txt").read_text() == "\n"


def test_a_missing_agent_program_is_64_before_anything_runs(cli, tmp_path, project):
    log = tmp_path / "run.json"
    proc = cli("run", "--cwd", str(project), "--log", str(log), "--verify", "false", "--revise", "gemini",
               env={"PATH": str(tmp_path / "empty-bin")})
    assert proc.returncode == 64
    assert "'gemini' is not on PATH" in proc.stderr and not log.exists()


def test_a_failing_agent_is_recorded_and_the_loop_goes_on(cli, tmp_path, project):
    """A CLI that rejects its call (exit 2) is the revise step's exit, not a crash."""
    proc, log, calls = run_agent(cli, tmp_path, project, "claude", "--max-iter", "2",
                                 fake="import sys\nprint('Error: not logged in', file=sys.stderr)\nsys.exit(2)\n")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert log["iterations"][0]["revise_exit"] == 2 and log["iterations"][0]["cost_usd"] is None


# -- selection and plugins --------------------------------------------------------------------------


@pytest.mark.parametrize("revise", ["./claude", "bin/claude", "/usr/bin/claude", "claude -p hi", "  ", None, "nope"])
def test_only_a_bare_preset_name_selects_a_preset(revise):
    assert find_agent(revise) is None
    assert program_to_check(revise) == revise


def test_the_built_in_presets():
    assert set(presets()) >= {"claude", "codex", "aider", "gemini"}
    assert program_to_check(" codex ") == "codex"


class _EntryPoint:
    def __init__(self, name, value, obj=None, error=None):
        self.name, self.value, self.obj, self.error = name, value, obj, error

    def load(self):
        if self.error:
            raise self.error
        return self.obj


def test_entry_point_presets_load_and_a_broken_one_is_bad_input_when_chosen(monkeypatch):
    class Mine(ClaudeCode):
        program = "my-claude"

    points = [_EntryPoint("mine", "pkg:Mine", Mine), _EntryPoint("broken", "pkg:Gone", error=ImportError("gone")),
              _EntryPoint("codex", "pkg:Codex", CodexCLI())]
    monkeypatch.setattr(agent_registry, "entry_points", lambda group: points if group == "pytest_loops.agents" else [])
    agent_registry.reload()
    try:
        mine = find_agent("mine")
        assert mine is not None and mine.name == "mine" and program_to_check("mine") == "my-claude"
        with pytest.raises(LoopUsageError, match="'broken' cannot be used: its entry point 'pkg:Gone' cannot be"):
            find_agent("broken")
        assert "broken" not in presets()
    finally:
        agent_registry.reload()


# -- each CLI's documented output, read ---------------------------------------------------------------


def test_claude_reads_the_json_output_format_too():
    out = json.dumps({"type": "result", "subtype": "success", "total_cost_usd": 0.0123, "session_id": "s1",
                      "usage": {"input_tokens": 10, "output_tokens": 5}}, indent=2)
    assert ClaudeCode().usage("warming up\n" + out) == Usage(0.0123, 10, 5, "s1")
    assert ClaudeCode().usage("no json here") is None
    assert ClaudeCode().usage('{"type": "result", "total_cost_usd": -3}') is None  # nonsense is not counted


def test_gemini_reads_per_model_tokens_from_the_json_output():
    out = json.dumps({"response": "done", "stats": {"models": {
        "gemini-2.5-pro": {"tokens": {"prompt": 24939, "candidates": 20, "total": 25113, "cached": 21263}},
        "gemini-2.5-flash": {"tokens": {"prompt": 100, "candidates": 10}}}}})
    assert GeminiCLI().usage(out) == Usage(None, 25039, 30, None)


def test_aider_sums_its_report_lines():
    out = ("Tokens: 2.3k sent, 1.1k cache write, 120 received. Cost: $0.01 message, $0.01 session.\n"
           "Tokens: 1M sent, 2k received. Cost: $1.50 message, $1.51 session.\n")
    assert Aider().usage(out) == Usage(1.51, 1002300, 2120, ".aider.chat.history.md")
    assert Aider().usage("nothing") is None


def test_codex_sums_turns_and_takes_the_thread():
    lines = [{"type": "thread.started", "thread_id": "t"}, {"type": "turn.completed", "usage": {
        "input_tokens": 10, "cached_input_tokens": 4, "output_tokens": 1}}, "not json",
        {"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 2}}]
    out = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    assert CodexCLI().usage(out) == Usage(None, 15, 3, "t")


@pytest.mark.parametrize("agent, line, shown", [
    (ClaudeCode(), json.dumps({"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Edit"}]}}),
     "tool: Edit"),
    (CodexCLI(), json.dumps({"type": "item.completed", "item": {"type": "command_execution", "command": "pytest"}}),
     "$ pytest"),
    (GeminiCLI(), json.dumps({"type": "message", "role": "assistant", "content": "Hello\nmore"}), "Hello"),
    (Aider(), "Applied edit to calc.py", "Applied edit to calc.py"),
    (ClaudeCode(), "plain text line", "plain text line"),
])
def test_a_progress_line_says_what_the_agent_does(agent, line, shown):
    assert agent.progress(line) == shown


def test_the_commands_continue_a_session_with_a_quoted_id():
    assert ClaudeCode().command("a'b").endswith("--resume 'a'\"'\"'b'")
    assert " resume abc " in CodexCLI().command("abc")
    assert Aider().command("x").endswith("--restore-chat-history") and "--restore" not in Aider().command(None)
    assert "--resume" not in GeminiCLI().command(None)


# -- the figures everywhere a run is read ---------------------------------------------------------------


def test_cost_reaches_show_the_tine_the_report_and_the_mcp_answers(cli, tmp_path, project):
    from opentine import Run

    from pytest_loops.artifacts.tineread import load_tine_summary
    from pytest_loops.cli.runsdir import RunsDir

    proc, log, _ = run_agent(cli, tmp_path, project, "claude", "--max-iter", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = cli("show", str(tmp_path / "run.json"))
    assert "spent: $1.00, 380 tokens (300 in, 80 out)" in shown.stdout, shown.stdout
    assert "cost/tokens" in shown.stdout and "$0.5000 190t" in shown.stdout
    # the .tine: the figures in each iteration step (inside the digest) and opentine's cost fields
    tine = tmp_path / "run.tine"
    summary = load_tine_summary(tine)
    assert summary["usage"] == {"cost_usd": 1.0, "input_tokens": 300, "output_tokens": 80, "tokens": 380}
    assert [it.get("cost_usd") for it in summary["iterations"]] == [0.5, 0.5, None]
    assert summary["iterations"][0]["session_id"] == "claude-session-1"
    steps = [s for s in Run.load(tine).steps if (s.tool_info or {}).get("name") == "iteration"]
    assert [s.cost for s in steps] == [0.5, 0.5, 0.0]
    assert cli("show", str(tine)).stdout.count("spent: $1.00") == 1
    # the HTML report
    report = tmp_path / "report.html"
    made = cli("report", str(tmp_path), "-o", str(report))
    assert made.returncode == 0, made.stderr
    html = report.read_text()
    assert "<th>Spent</th>" in html and "$1.00, 380 tokens" in html and "<th>spent</th>" in html
    # the MCP answers (the same functions the server's tools call)
    runs = RunsDir(tmp_path)
    assert runs.show_run("run.json")["usage"]["cost_usd"] == 1.0
    listed = runs.list_runs()["runs"][0]
    assert listed["usage"]["tokens"] == 380
    trajectory = runs.show_trajectory("run.json")["trajectory"]
    assert trajectory[0]["cost_usd"] == 0.5 and trajectory[0]["session_id"] == "claude-session-1"

"""The hand-off markdown a loop leaves when it stops short of SUCCESS."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pytest_loops.artifacts import handoff
from pytest_loops.artifacts.handoff import git_diff, write_handoff
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, LoopSpec
from pytest_loops.verdict import Verdict

SECRET = "h4ndoff-secret-value-13"
RESUME = "pytest-loops run fix.loop --resume 'runs/fix parser'"



def make_result(cwd: Path, *, iterations: int = 2, verdict: Verdict = Verdict.NO_PROGRESS,
                failing_tail: str = "E   assert parse('1+') == 1\nE   ParseError: unexpected end",
                output_file: str | None = None) -> LoopResult:
    spec = LoopSpec(name="fix parser", goal="the parser accepts every expression", revise="./fix.sh",
                    checks=(Check.command_passes("make lint"), Check.test_passes("t.py::test_p")),
                    cwd=str(cwd), source="loops/fix.loop:1")
    records = []
    for i in range(1, iterations + 1):
        checks = [
            CheckResult(name='"make lint" passes', kind="command", passed=True, exit_code=0,
                        duration_s=0.1, output_tail="lint clean", command="make lint"),
            CheckResult(name='the test "t.py::test_p" passes', kind="pytest", passed=False,
                        exit_code=1, duration_s=0.4, output_tail=failing_tail,
                        output_file=output_file, reason="1 failed"),
        ]
        records.append(IterationRecord(iter=i, started_at="2026-01-01T00:00:00Z", checks=checks,
                                       verify_exit=1, lesson=f"iteration {i}: ParseError at end",
                                       state_changed=False, unchanged_streak=i))
    return LoopResult(
        spec=spec, verdict=verdict, reason="nothing changed for 2 iterations", iterations=records,
        started_at="2026-01-01T00:00:00Z", ended_at="2026-01-01T00:01:05Z", elapsed_s=65.0,
        log_path=str(cwd / "runs" / "fix.json"), run_dir=str(cwd / "runs" / "fix"),
        memory_page=str(cwd / "lessons.md"),
        artifacts={"log": str(cwd / "runs" / "fix.json"), "tine": str(cwd / "runs" / "fix.tine")},
    )


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
                    "-c", "commit.gpgsign=false", "-C", str(repo), *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    (path / "parser.py").write_text("def parse(s):\n    return old(s)\n")
    git(path, "add", "parser.py")
    git(path, "commit", "-q", "-m", "start")
    return path


def read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def test_the_hand_off_has_everything_to_pick_up_the_work(tmp_path):
    out = write_handoff(make_result(tmp_path), tmp_path / "fix.handoff.md", resume_command=RESUME)
    text = read(out)
    assert text.startswith("# Hand-off: loop `fix parser` stopped with NO_PROGRESS\n")
    assert "- **Verdict:** NO_PROGRESS (exit 4)" in text
    assert "- **Reason:** nothing changed for 2 iterations" in text
    assert "- **Goal:** the parser accepts every expression" in text
    assert "- **Iterations:** 2 of at most 6, 1m 05s" in text
    assert "- **Loop file:** `loops/fix.loop:1`" in text
    assert "## Failing checks (iteration 2)" in text
    assert '### the test "t.py::test_p" passes (exit 1)' in text
    assert "```text\nE   assert parse('1+') == 1\nE   ParseError: unexpected end\n```" in text
    assert "make lint" not in text.split("## Failing checks")[1].split("## Lessons")[0]  # it passed
    assert "- iteration 1: ParseError at end\n- iteration 2: ParseError at end" in text
    assert f"- Run log: `{tmp_path / 'runs' / 'fix.json'}`" in text
    assert f"- Provenance (.tine): `{tmp_path / 'runs' / 'fix.tine'}`" in text
    assert f"- This hand-off: `{tmp_path / 'fix.handoff.md'}`" in text
    assert text.endswith(f"## Continue the loop\n\n```sh\n{RESUME}\n```\n")
    assert "## Last diff" not in text  # tmp_path is not a git work tree


def test_lessons_from_the_lessons_page_are_not_listed_twice(tmp_path):
    result = make_result(tmp_path)
    result.iterations[0].lesson = "- 2026-01-01T00:00:00Z fix parser iter 1: exit 1"
    text = read(write_handoff(result, tmp_path / "h.md", resume_command=RESUME))
    assert "\n- 2026-01-01T00:00:00Z fix parser iter 1: exit 1\n" in text and "- - " not in text


def test_the_full_output_file_is_preferred_to_the_stored_tail(tmp_path):
    output = tmp_path / "out.txt"
    output.write_text("".join(f"line {i}\n" for i in range(1000)))
    text = read(write_handoff(make_result(tmp_path, failing_tail="old tail", output_file=str(output)),
                              tmp_path / "h.md", resume_command=RESUME))
    assert "line 999" in text and "line 959" not in text and "old tail" not in text
    assert f"Full output: `{output}`" in text


def test_the_working_tree_diff_and_untracked_files_are_included(repo, tmp_path):
    (repo / "parser.py").write_text("def parse(s):\n    return new(s)\n")
    (repo / "notes.txt").write_text("new file\n")
    (repo / "newpkg").mkdir()
    for name in ("a.py", "b.py"):
        (repo / "newpkg" / name).write_text("x = 1\n")
    (repo / "runs" / "fix").mkdir(parents=True)  # the loop's own artifacts
    (repo / "runs" / "fix.json").write_text("{}")
    (repo / "runs" / "fix" / "check-1.out").write_text("out")
    (repo / "lessons.md").write_text("- lesson\n")
    text = read(write_handoff(make_result(repo), repo / "runs" / "fix.handoff.md",
                              resume_command=RESUME))
    section = text.split("## Last diff")[1].split("## Lessons")[0]
    assert f"`git diff HEAD` of the working tree in `{repo.resolve()}`" in section
    assert "```diff\n" in section
    assert "-    return old(s)\n+    return new(s)" in section
    assert section.split("Untracked files:\n\n")[1].strip() == "- `newpkg/`\n- `notes.txt`"


def test_a_clean_tree_says_so(repo, tmp_path):
    text = read(write_handoff(make_result(repo), tmp_path / "h.md", resume_command=RESUME))
    assert "No changes to tracked files." in text


def test_a_repository_without_commits_still_gives_a_diff(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    git(fresh, "init", "-q")
    (fresh / "a.py").write_text("x = 1\n")
    git(fresh, "add", "a.py")
    (fresh / "a.py").write_text("x = 2\n")
    found = git_diff(fresh)
    assert found is not None
    assert "-x = 1\n+x = 2" in found[0]


def test_git_diff_false_leaves_the_diff_out(repo, tmp_path):
    (repo / "parser.py").write_text("changed\n")
    text = read(write_handoff(make_result(repo), tmp_path / "h.md", resume_command=RESUME,
                              git_diff=False))
    assert "## Last diff" not in text


def test_no_git_at_all_is_not_an_error(repo, tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert git_diff(repo) is None
    text = read(write_handoff(make_result(repo), tmp_path / "h.md", resume_command=RESUME))
    assert "## Last diff" not in text and "## Continue the loop" in text


def test_a_missing_cwd_is_not_an_error(tmp_path):
    assert git_diff(tmp_path / "gone") is None
    result = make_result(tmp_path / "gone")
    assert "## Last diff" not in read(write_handoff(result, tmp_path / "h.md", resume_command=RESUME))


def test_a_huge_diff_is_cut_with_a_note(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "DIFF_MAX_CHARS", 200)
    (repo / "parser.py").write_text("".join(f"line {i}\n" for i in range(500)))
    text = read(write_handoff(make_result(repo), tmp_path / "h.md", resume_command=RESUME))
    assert "more characters: run `git diff HEAD`" in text
    assert "line 400" not in text


def test_backticks_in_output_cannot_close_the_fence(tmp_path):
    tail = "```\n# not a heading\n````"
    text = read(write_handoff(make_result(tmp_path, failing_tail=tail), tmp_path / "h.md",
                              resume_command=RESUME))
    assert f"`````text\n{tail}\n`````" in text


def test_env_secrets_never_reach_the_hand_off(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_PASSWORD", SECRET)
    (repo / "parser.py").write_text(f"PASSWORD_VALUE = '{SECRET}'\n")
    output = tmp_path / "out.txt"
    output.write_text(f"connecting with {SECRET}\nfailed\n")
    result = make_result(repo, failing_tail=f"E  {SECRET}", output_file=str(output))
    result.reason = f"stopped at {SECRET}"
    result.iterations[-1].lesson = f"lesson mentions {SECRET}"
    text = read(write_handoff(result, tmp_path / "h.md", resume_command=f"run --token {SECRET}"))
    assert SECRET not in text
    assert text.count("[REDACTED:SERVICE_PASSWORD]") >= 5


def test_no_iteration_finished(tmp_path):
    result = make_result(tmp_path, iterations=0, verdict=Verdict.TIMEOUT)
    text = read(write_handoff(result, tmp_path / "h.md", resume_command=RESUME))
    assert "No iteration finished, so no check ran." in text
    assert "## Lessons" not in text


def test_human_and_timed_out_checks_are_marked(tmp_path):
    result = make_result(tmp_path, verdict=Verdict.ESCALATE)
    result.iterations[-1].checks[1] = CheckResult(
        name='a human confirms "the UI looks right"', kind="human", passed=False, exit_code=None,
        duration_s=0.0, needs_human=True, timed_out=True)
    text = read(write_handoff(result, tmp_path / "h.md", resume_command=RESUME))
    assert '### a human confirms "the UI looks right" (did not start, timed out, needs a human)' in text
    assert "(no output)" in text


def test_the_file_is_written_whole(tmp_path):
    target = tmp_path / "deep" / "dir" / "h.md"
    out = write_handoff(make_result(tmp_path), target, resume_command=RESUME)
    assert out == str(target) and target.exists()
    assert not [p for p in target.parent.iterdir() if p.name != "h.md"]  # no temp file left
    assert os.access(target, os.R_OK)

"""GitHub Actions in its own words: the job summary and the workflow-command annotations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plugin_helpers import Project

STUCK = """\
loop "stuck":
  goal: never.txt exists
  done when "test -f never.txt" passes
  revise with "date >> tries.txt"
  watch: tries.txt
  after 2 tries: stop
"""
OK = """\
loop "ok":
  goal: ok.txt exists
  done when "test -f ok.txt" passes
  revise with "touch ok.txt"
  after 3 tries: stop
"""
# a marker loop whose revise step never fixes the bug: its suspects are the bug's lines
MARKED = """\
import pytest

import calc


@pytest.mark.loop(revise="date >> tries.txt", max_iter=2, state="tries.txt")
def test_add():
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(5, 3) == 2
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Project:
    made = Project(pytester, monkeypatch)
    made.write("stuck.loop", STUCK)
    made.write("ok.loop", OK)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    return made


def annotations(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if line.startswith("::")]


def test_the_summary_and_annotations_appear_under_github_actions(project: Project, tmp_path: Path) -> None:
    project.write("test_calc.py", MARKED)
    result = project.run("--loop")
    assert result.ret == 1, result.stdout.str()
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("### pytest-loops\n\n3 loop(s): 2 MAX_ITER, 1 SUCCESS\n")
    assert re.search(r"^\| stuck \| MAX_ITER \| 2 \| [\d.]+s \| `.*/runs/stuck-.*\.json` \|$", summary, re.M), summary
    assert re.search(r"^\| ok \| SUCCESS \| 2 \|", summary, re.M)
    assert f"- `{project.artifacts}`" in summary

    notes = annotations(result)
    assert ("::error file=stuck.loop,line=3,title=loop stuck%3A MAX_ITER::check done when \"test -f never.txt\" "
            "passes failed: exit 1") in notes, notes
    assert any(n.startswith("::error file=test_calc.py,title=loop test_calc.py%3A%3Atest_add%3A MAX_ITER::"
                            "test_calc.py::test_add still fails") for n in notes), notes
    suspects = [n for n in notes if n.startswith("::warning file=calc.py,line=")]
    assert suspects and "a - b" in suspects[0], notes
    assert not any("loop ok" in n for n in notes), "a loop that succeeded is not annotated"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "env"])
def test_annotations_are_off_by_the_setting_and_the_summary_stays(project: Project, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    args = ["--loop"]
    if how == "option":
        args.append("--loop-annotations=off")
    else:
        monkeypatch.setenv("PYTEST_LOOPS_ANNOTATIONS", "off")
    result = project.run(*args)
    assert result.ret == 1 and annotations(result) == []
    assert "| stuck | MAX_ITER |" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow
def test_outside_github_actions_nothing_is_written(project: Project, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    monkeypatch.delenv("GITHUB_ACTIONS")
    result = project.run("--loop")
    assert result.ret == 1 and annotations(result) == [] and not (tmp_path / "summary.md").exists()


def test_a_shard_names_itself_in_the_summary(project: Project, tmp_path: Path) -> None:
    results = [project.run("--loop", f"--loop-shard={i}/2", f"--loop-artifacts=art{i}") for i in (1, 2)]
    assert sorted(r.ret for r in results) == [0, 1]
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("### pytest-loops (shard ") == 2 and "(shard 1/2)" in summary and "(shard 2/2)" in summary
    assert summary.count("| stuck |") == 1 and summary.count("| ok |") == 1


def test_a_bad_annotations_value_is_a_usage_error(project: Project) -> None:
    result = project.run_inprocess("--loop", "--loop-annotations=maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --loop-annotations: 'maybe' is not a valid annotations; valid: on or off"])

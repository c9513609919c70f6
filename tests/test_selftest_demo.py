"""`pytest-loops selftest` and `pytest-loops demo`, as a user runs them."""

from __future__ import annotations

import json

import pytest

from pytest_loops.artifacts.lessons_page import LessonsPage
from pytest_loops.cli import selftest


@pytest.mark.slow
def test_selftest_holds_and_writes_nothing_outside_a_temp_dir(cli, tmp_path):
    cwd, home, tmp = tmp_path / "cwd", tmp_path / "home", tmp_path / "tmp"
    for d in (cwd, home, tmp):
        d.mkdir()
    proc = cli("selftest", cwd=cwd, env={"HOME": str(home), "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    total = len(selftest.SCENARIOS)
    scenario_lines = [line for line in lines if line.startswith(("ok", "FAIL"))]
    assert len(scenario_lines) == total
    assert all(line.startswith("ok  ") for line in scenario_lines)
    for (title, _), line in zip(selftest.SCENARIOS, scenario_lines, strict=True):
        assert title in line
    assert lines[-1] == f"selftest: {total} of {total} scenarios hold"
    assert list(cwd.iterdir()) == []
    assert list(tmp.iterdir()) == []
    assert list(home.iterdir()) == []


@pytest.mark.slow
def test_selftest_quiet_prints_only_the_summary(cli, tmp_path):
    proc = cli("selftest", "--quiet", env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0
    total = len(selftest.SCENARIOS)
    assert proc.stdout.splitlines() == [f"selftest: {total} of {total} scenarios hold"]


def test_selftest_exits_1_when_a_scenario_does_not_hold(monkeypatch, capsys, tmp_path):
    def broken(h, base):
        h.run(verify=[1], max_iter=2).assert_verdict("SUCCESS")
        return "unreachable"

    monkeypatch.setattr(selftest, "SCENARIOS", [
        ("a scenario that holds", lambda h, base: "fine"),
        ("a scenario that breaks", broken),
    ])
    monkeypatch.setattr(selftest.tempfile, "tempdir", str(tmp_path))
    assert selftest.run_selftest() == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ok    a scenario that holds: fine"
    assert out[1].startswith("FAIL  a scenario that breaks: expected SUCCESS, got MAX_ITER")
    assert out[-1] == "selftest: 1 of 2 scenarios hold"
    assert list(tmp_path.iterdir()) == []  # the scenarios' temp dir is gone, failure or not


@pytest.mark.slow
def test_demo_reaches_success_in_2_iterations_and_leaves_its_artifacts(cli, tmp_path):
    project = tmp_path / "demo"
    proc = cli("demo", "--dir", str(project), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS (exit 0) after 2 iteration(s)" in proc.stdout
    arts = project / ".pytest-loops"
    log = json.loads((arts / "run.json").read_text())
    assert log["verdict"] == "SUCCESS" and log["iterations_run"] == 2 and log["exit_code"] == 0
    first = log["iterations"][0]
    assert first["verify_exit"] == 1 and first["revise_exit"] == 0
    # full outputs beside the log
    assert "test_add" in (arts / "run" / "iter-001" / "check-1.out").read_text()
    assert "fixed calc.add" in (arts / "run" / "iter-001" / "revise.out").read_text()
    assert "passed" in (arts / "run" / "iter-002" / "check-1.out").read_text()
    lessons = LessonsPage(arts / "lessons.md", loop_name="demo").read_lessons()
    assert len(lessons) == 1 and "iter 1: exit 1" in lessons[0]
    assert "return a + b" in (project / "calc.py").read_text()

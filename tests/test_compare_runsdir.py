"""`pytest-loops compare` and the read-only runs directory behind the MCP server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_loops.cli.compare import compare_runs, format_compare
from pytest_loops.cli.main import main
from pytest_loops.cli.runsdir import RunsDir, fit
from pytest_loops.cli.runview import load_run
from pytest_loops.errors import LoopUsageError

CLI = [sys.executable, "-m", "pytest_loops"]
# the revise step makes `a` in its first call and `b` in its second
REVISE_FIXING = 'if [ -f a ]; then touch b; else touch a; fi'
CHECKS = ["--verify", "test -f a", "--verify", "test -f b"]


def _run_loop(workdir: Path, artifacts: Path, revise: str, max_iter: int, name: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([*CLI, "run", "--name", name, *CHECKS, "--revise", revise, "--max-iter", str(max_iter),
                           "--no-progress-k", "0", "--artifacts", str(artifacts), "-q"],
                          cwd=workdir, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 2), done.stderr
    logs = sorted((artifacts / "runs").glob("*.json"), key=os.path.getmtime)
    return logs[-1]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An artifacts directory with two runs of one loop: one fixed in three iterations
    (0/2, 1/2, 2/2 checks), one whose revise step does nothing (MAX_ITER after 3)."""
    base = tmp_path_factory.mktemp("runs")
    artifacts = base / ".pytest-loops"
    fixed = _run_loop(base / "fixed", artifacts, REVISE_FIXING, 5, "fix")
    stuck = _run_loop(base / "stuck", artifacts, "true", 3, "fix")
    return artifacts, fixed, stuck


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        else:
            h.update(str(path.relative_to(root)).encode() + b"\1")
    return h.hexdigest()


# --------------------------------------------------------------------------- compare


def test_compare_lays_out_both_trajectories_and_finds_the_divergence(two_runs):
    _, fixed, stuck = two_runs
    data = compare_runs(load_run(fixed), load_run(stuck))
    assert data["schema"] == "pytest-loops.compare/1"
    assert data["checks"] == ['"test -f a" passes', '"test -f b" passes']
    assert [entry["iteration"] for entry in data["iterations"]] == [1, 2, 3]
    assert data["iterations"][0]["a"] == data["iterations"][0]["b"]
    assert data["first_divergence"]["iteration"] == 2
    assert data["first_divergence"]["differences"] == ['"test -f a" passes: passed in A, failed in B']
    assert data["a"]["best"] == {"iteration": 3, "passed": 2, "of": 2}
    assert data["b"]["best"] == {"iteration": 1, "passed": 0, "of": 2}
    assert (data["a"]["verdict"], data["a"]["exit_code"]) == ("SUCCESS", 0)
    assert (data["b"]["verdict"], data["b"]["exit_code"]) == ("MAX_ITER", 2)
    assert data["a"]["verified"] and data["b"]["verified"]
    # the same checks judged both: what differs is the revise step and the cap
    assert data["spec_differences"] == ["guards", "revise"]
    assert "note: the loops differ in guards, revise" in format_compare(data)


def test_compare_of_a_run_with_itself_agrees_everywhere(two_runs):
    _, fixed, _ = two_runs
    data = compare_runs(load_run(fixed), load_run(fixed))
    assert data["first_divergence"] is None
    assert data["same_loop"] is True
    assert "the trajectories agree in every iteration" in format_compare(data)


def test_compare_a_tine_with_its_run_log(two_runs, tmp_path):
    _, fixed, _ = two_runs
    tine = fixed.with_suffix(".tine")
    assert tine.is_file()
    data = compare_runs(load_run(tine), load_run(fixed))
    assert data["first_divergence"] is None
    assert data["a"]["verified"] is True  # vouched by this machine's key
    assert "(unverified)" not in format_compare(data).splitlines()[0]
    forged = tmp_path / "forged.tine"
    forged.write_bytes(tine.read_bytes())
    from opentine import Run

    run = Run.load(forged)
    run.metadata["reason"] = "forged"  # no longer what was vouched for
    run.save(forged)
    data = compare_runs(load_run(forged), load_run(fixed))
    assert data["a"]["verified"] is False  # a .tine not authenticated is not proof
    assert "(unverified)" in format_compare(data).splitlines()[0]


def test_compare_cli_text_and_json(two_runs, capsys):
    _, fixed, stuck = two_runs
    assert main(["compare", str(fixed), str(stuck)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("A: fix, verdict SUCCESS, 3 iteration(s)")
    assert lines[1].startswith("B: fix, verdict MAX_ITER, 3 iteration(s)")
    row2 = next(line for line in lines if line.lstrip().startswith("2 |"))
    assert "✓ ✗ (1/2)" in row2 and "✗ ✗ (0/2)" in row2 and "first divergence" in row2
    assert "first divergence: iteration 2" in text
    assert "best A: 2/2 checks first at iteration 3" in text
    assert "best B: 0/2 checks first at iteration 1" in text
    assert "ended A: SUCCESS (exit 0) after 3 iteration(s)" in text
    assert "ended B: MAX_ITER (exit 2) after 3 iteration(s)" in text
    assert main(["compare", "--json", str(fixed), str(stuck)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_divergence"]["iteration"] == 2
    assert data["a"]["source"] == str(fixed)


def test_compare_runs_of_different_lengths_name_the_side_that_ran_on(tmp_path):
    short = {"loop": "x", "verdict": "SUCCESS", "exit_code": 0, "iterations": [
        {"iter": 1, "checks": [{"name": "c", "passed": True}]}]}
    long = {"loop": "x", "verdict": "MAX_ITER", "exit_code": 2, "iterations": [
        {"iter": 1, "checks": [{"name": "c", "passed": True}]},
        {"iter": 2, "checks": [{"name": "c", "passed": False, "timed_out": True}]}]}
    data = compare_runs(short, long)
    assert data["first_divergence"] == {"iteration": 2, "differences": ["only B ran this iteration"]}
    assert data["iterations"][1] == {"iteration": 2, "a": None, "b": {"c": "timed_out"}}
    assert data["same_loop"] is False
    assert "note: the runs may be of different loops" in format_compare(data)


def test_compare_counts_each_loop_over_its_own_checks():
    one = {"loop": "x", "verdict": "SUCCESS", "exit_code": 0, "iterations": [
        {"iter": 1, "checks": [{"name": "c1", "passed": True}]}]}
    other = {"loop": "y", "verdict": "SUCCESS", "exit_code": 0, "iterations": [
        {"iter": 1, "checks": [{"name": "c2", "passed": True}]}]}
    data = compare_runs(one, other)
    assert data["a"]["best"] == {"iteration": 1, "passed": 1, "of": 1}
    assert data["b"]["best"] == {"iteration": 1, "passed": 1, "of": 1}
    text = format_compare(data)
    assert "1/2" not in text, "two loops with one check each: neither is half done"
    assert "best A: 1/1 checks" in text and "(1/1)" in text


FANNED = {"loop": "x", "verdict": "SUCCESS", "exit_code": 0, "iterations": [
    {"iter": 1, "checks": [{"name": "c", "passed": False}], "revise_exit": 0, "branches": [
        {"branch": 0, "revise_exit": 0, "passed": 0, "of": 1, "changed_files": 1, "diff_size": 30, "chosen": False,
         "why": "fewer checks pass (0/1 against 1/1)"},
        {"branch": 1, "revise_exit": 0, "passed": 1, "of": 1, "changed_files": 1, "diff_size": 12, "chosen": True,
         "why": "best of 3: 1/1 checks pass, 0 failing test(s), diff 12"},
        {"branch": 2, "revise_exit": 0, "passed": 1, "of": 1, "changed_files": 2, "diff_size": 40, "chosen": False,
         "why": "discarded: it changed a test file (tests/test_x.py)"}]},
    {"iter": 2, "checks": [{"name": "c", "passed": True}]}]}


def test_show_and_compare_list_each_iterations_candidates():
    from pytest_loops.cli.runview import format_run

    text = format_run(FANNED)
    assert "branches (best-of-N revise: ● chosen, ○ not chosen, ✗ discarded):" in text
    assert "  iteration 1:" in text
    assert ("    ● b1  1/1 checks · 1 file(s) changed, diff 12 · revise exit 0 · chosen: best of 3: 1/1 checks "
            "pass, 0 failing test(s), diff 12") in text
    assert "    ○ b0  0/1 checks · 1 file(s) changed, diff 30 · revise exit 0 · not chosen: fewer checks pass" in text
    assert "    ✗ b2  1/1 checks · 2 file(s) changed, diff 40 · revise exit 0 · discarded (it changed a test file" \
        in text
    plain = dict(FANNED, iterations=[{k: v for k, v in it.items() if k != "branches"} for it in FANNED["iterations"]])
    assert "branches" not in format_run(plain), "no fan-out, no section"
    data = compare_runs(FANNED, plain)
    assert [b["outcome"] for b in data["a"]["branches"]["1"]] == ["not chosen", "chosen", "discarded"]
    assert data["b"]["branches"] == {}
    lines = format_compare(data).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("   1 |") or line.startswith("1 |"))
    assert lines[row + 2].strip().startswith("A ● b1  1/1 checks · 1 file(s) changed")


def test_the_mcp_answers_carry_the_candidates(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.json").write_text(json.dumps({"schema": "pytest-loops.runlog/1", **FANNED}))
    runs = RunsDir(tmp_path)
    ref = next(r["id"] for r in runs.list_runs()["runs"])
    shown = runs.show_run(ref)
    assert [c["branch"] for c in shown["branches"][0]["candidates"]] == [0, 1, 2]
    assert shown["branches"][0]["iteration"] == 1
    assert shown["branches"][0]["candidates"][1] == {
        "branch": 1, "outcome": "chosen", "passed": 1, "of": 1, "changed_files": 1, "diff_size": 12,
        "revise_exit": 0, "why": "best of 3: 1/1 checks pass, 0 failing test(s), diff 12"}
    assert "● b1" in shown["text"]
    trajectory = runs.show_trajectory(ref)["trajectory"]
    assert [b["outcome"] for b in trajectory[0]["branches"]] == ["not chosen", "chosen", "discarded"]
    assert trajectory[1]["branches"] == []


@pytest.mark.parametrize("make", ["missing", "not_a_run", "directory_of_nothing"])
def test_compare_bad_input_is_one_line_and_exit_64(tmp_path, two_runs, make, capsys):
    _, fixed, _ = two_runs
    bad = tmp_path / "bad.json"
    if make == "not_a_run":
        bad.write_text("[1, 2, 3]")
    elif make == "directory_of_nothing":
        bad = tmp_path / "empty"
        bad.mkdir()
    assert main(["compare", str(fixed), str(bad)]) == 64
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(bad) in err


# --------------------------------------------------------------------------- the runs directory


def test_list_runs_newest_first_with_files_and_verdicts(two_runs):
    artifacts, fixed, stuck = two_runs
    listing = RunsDir(artifacts).list_runs()
    ids = [run["id"] for run in listing["runs"]]
    assert ids == [stuck.stem, fixed.stem]
    first = listing["runs"][0]
    assert first["verdict"] == "MAX_ITER" and first["iterations"] == 3 and first["verified"] is True
    assert first["files"] == {"json": f"runs/{stuck.name}", "tine": f"runs/{stuck.stem}.tine"}
    assert RunsDir(artifacts).list_runs(limit=1)["more"] == 1


def test_a_broken_log_is_listed_with_its_error_not_left_out(two_runs, tmp_path):
    artifacts, fixed, _ = two_runs
    copy = tmp_path / "arts"
    shutil.copytree(artifacts, copy)
    (copy / "runs" / "loop-broken-1.json").write_text('{"schema": "pytest-loops.runlog/1", "iterations": 7')
    listing = RunsDir(copy).list_runs()
    broken = next(run for run in listing["runs"] if run["id"] == "loop-broken-1")
    assert "loop-broken-1.json" in broken["error"] and "\n" not in broken["error"]
    assert len(listing["runs"]) == 3


@pytest.mark.parametrize("ref, says", [
    ("/etc/passwd", "absolute paths are refused"),
    ("~/secrets", "absolute paths are refused"),
    ("../../etc/passwd", "'..' is refused"),
    ("runs/../../x.json", "'..' is refused"),
    ("nope-123", "no such run"),
    ("", "non-empty string"),
    ("a" * 600, "too long"),
    ("x\0y", "NUL"),
])
def test_references_stay_inside_the_directory(two_runs, ref, says):
    artifacts, _, _ = two_runs
    with pytest.raises(LoopUsageError, match=says.replace("(", r"\(")):
        RunsDir(artifacts).show_run(ref)


def test_a_symlink_leading_out_is_refused_and_one_inside_is_followed(two_runs, tmp_path):
    artifacts, fixed, _ = two_runs
    root = tmp_path / "arts"
    shutil.copytree(artifacts, root)
    outside = tmp_path / "outside.json"
    shutil.copy(fixed, outside)
    (root / "runs" / "escape.json").symlink_to(outside)
    (root / "runs" / "alias.json").symlink_to(root / "runs" / fixed.name)
    runs = RunsDir(root)
    with pytest.raises(LoopUsageError, match="leads outside the runs directory"):
        runs.show_run("escape")
    assert runs.show_run("alias")["verdict"] == "SUCCESS"
    assert "escape" not in [r["id"] for r in runs.list_runs()["runs"]]  # links are not listed


def test_special_and_oversized_files_are_refused_unread(two_runs, tmp_path):
    artifacts, fixed, _ = two_runs
    root = tmp_path / "arts"
    shutil.copytree(artifacts, root)
    os.mkfifo(root / "runs" / "pipe.json")  # reading it would block forever
    with pytest.raises(LoopUsageError, match="not a regular file"):
        RunsDir(root).show_run("pipe")
    small = RunsDir(root, max_file_bytes=100)
    with pytest.raises(LoopUsageError, match="larger than"):
        small.show_run(fixed.stem)


def test_show_run_and_trajectory(two_runs):
    artifacts, fixed, _ = two_runs
    runs = RunsDir(artifacts)
    shown = runs.show_run(fixed.stem)
    assert shown["verdict"] == "SUCCESS" and shown["verified"] is True
    assert "verdict: SUCCESS (exit 0)" in shown["text"]
    assert shown["source_path"] == f"runs/{fixed.name}"
    trajectory = runs.show_trajectory(fixed.stem, start=2, limit=1)
    assert trajectory["iterations"] == 3 and trajectory["more"] == 1
    (row,) = trajectory["trajectory"]
    assert row["iteration"] == 2
    assert [c["status"] for c in row["checks"]] == ["passed", "failed"]
    with pytest.raises(LoopUsageError, match="limit must be a whole number"):
        runs.show_trajectory(fixed.stem, limit=0)
    with pytest.raises(LoopUsageError, match="start must be a whole number"):
        runs.show_trajectory(fixed.stem, start="2")


def test_verify_run_passes_intact_runs_and_fails_tampered_ones(two_runs, tmp_path):
    artifacts, fixed, _ = two_runs
    assert RunsDir(artifacts).verify_run(fixed.stem)["ok"] is True
    root = tmp_path / "arts"
    shutil.copytree(artifacts, root)
    log = root / "runs" / fixed.name
    log.write_text(log.read_text().replace('"SUCCESS"', '"FAILED"', 1))
    answer = RunsDir(root).verify_run(fixed.stem)
    assert answer["ok"] is False and answer["log"]["verified"] is False
    tine = root / "runs" / f"{fixed.stem}.tine"
    data = bytearray(tine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tine.write_bytes(bytes(data))
    assert RunsDir(root).verify_run(fixed.stem)["tine"]["ok"] is False


def test_show_lessons_lists_pages_and_reads_one_inside_the_lessons_dir(two_runs):
    artifacts, _, _ = two_runs
    runs = RunsDir(artifacts)
    pages = runs.show_lessons()["pages"]
    assert len(pages) == 1 and pages[0]["loop"] == "fix"
    page = runs.show_lessons(pages[0]["id"])
    assert "## Lessons" in page["text"]
    with pytest.raises(LoopUsageError, match="'..' is refused"):
        runs.show_lessons("../runs/x")
    with pytest.raises(LoopUsageError, match="not a lessons page"):
        runs.show_lessons(f"runs/{next((artifacts / 'runs').glob('*.json')).name}")


def test_no_tool_writes_anything(two_runs):
    artifacts, fixed, stuck = two_runs
    before = tree_digest(artifacts)
    runs = RunsDir(artifacts)
    runs.list_runs()
    runs.show_run(fixed.stem)
    runs.show_trajectory(stuck.stem)
    runs.compare_runs(fixed.stem, stuck.stem)
    runs.verify_run(fixed.stem)
    runs.show_lessons()
    assert tree_digest(artifacts) == before


def test_fit_cuts_long_answers_and_says_so():
    small = {"a": "x" * 10}
    assert fit(small, limit=100) == small
    cut = fit({"text": "y" * 5000, "rows": list(range(10_000))}, limit=3000)
    assert cut["truncated"] is True
    assert len(json.dumps(cut)) <= 3000
    assert cut["text"].startswith("y" * 2000) and "more characters" in cut["text"]
    assert cut["rows"] == list(range(len(cut["rows"])))  # the head is kept
    assert fit({"x": "z" * 3000}, limit=10) == {"truncated": True,
                                                  "error": "the answer is too long to send; ask for less"}


def test_runs_dir_must_be_a_directory(tmp_path):
    with pytest.raises(LoopUsageError, match="not a directory"):
        RunsDir(tmp_path / "nope")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ref=st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["..", ".", "runs", "lessons", "x.json", "/", "~", "link", "a.tine", "\0", ""]),
             max_size=6).map("/".join)))
def test_fuzzed_references_resolve_inside_or_are_refused_in_one_line(two_runs, ref):
    artifacts, _, _ = two_runs
    runs = RunsDir(artifacts)
    try:
        path = runs.resolve(ref)
    except LoopUsageError as exc:
        assert "\n" not in str(exc)
    else:
        assert path.is_relative_to(runs.root) and path.is_file()

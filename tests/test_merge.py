"""`pytest-loops merge`: several jobs' artifacts directories as one run.

The jobs are simulated as separate pytest processes, each with its own artifacts
directory, from the same starting tree; their merge must give what one run gives:
the same verdicts loop for loop, the same lessons, one report, one JUnit file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from plugin_helpers import clean_env

from pytest_loops.artifacts.cisummary import annotation_lines, summary_markdown

LOOPS = 6  # loops of the project: ok-N loops succeed, stuck-N loops stop MAX_ITER


def loop_text(n: int) -> str:
    if n % 3 == 0:  # stuck: the check never passes; each try leaves a line, so the state moves
        return (f'loop "stuck {n}":\n  goal: never {n}\n  done when "test -f never{n}" passes\n'
                f'  revise with "date >> tries{n}.txt"\n  watch: tries{n}.txt\n  after 2 tries: stop\n')
    return (f'loop "ok {n}":\n  goal: f{n} exists\n  done when "test -f f{n}" passes\n'
            f'  revise with "touch f{n}"\n  after 3 tries: stop\n')


def make_project(root: Path, loops: int = LOOPS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    for n in range(1, loops + 1):
        (root / f"l{n}.loop").write_text(loop_text(n))
    return root


def fresh_tree(root: Path) -> None:
    """Each job starts from the same checkout: the revise steps' files are removed."""
    for path in list(root.glob("f*")) + list(root.glob("tries*.txt")):
        path.unlink()


def pytest_run(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=root,
                          env=env or clean_env(), capture_output=True, text=True, timeout=600)


def merge(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", "merge", *args], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=600)


def run_jobs(root: Path, total: int, *extra: str, env: dict[str, str] | None = None) -> list[str]:
    """``total`` shard jobs, one process each; the artifacts directories' names."""
    dirs = []
    for index in range(1, total + 1):
        fresh_tree(root)
        done = pytest_run(root, "--loop", f"--loop-shard={index}/{total}", f"--loop-artifacts=job{index}", *extra,
                          env=env)
        assert done.returncode in (0, 1, 5), done.stdout + done.stderr
        dirs.append(f"job{index}")
    return dirs


def verdicts(index: Path) -> dict[str, str]:
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    found = {line["loop"]: line["verdict"] for line in lines}
    assert len(found) == len(lines), "one line per loop"
    return found


def lessons(directory: Path) -> dict[str, list[str]]:
    """Each lessons page's lines, without their time stamps."""
    return {page.name: sorted(re.sub(r"^- \S+ ", "- ", line) for line in page.read_text().splitlines()
                              if line.startswith("- "))
            for page in (directory / "lessons").glob("*.md")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project after one single run (artifacts in `single`) and three shard jobs."""
    root = make_project(tmp_path_factory.mktemp("merge") / "proj")
    fresh_tree(root)
    single = pytest_run(root, "--loop", "--loop-artifacts=single")
    assert single.returncode == 1, single.stdout
    run_jobs(root, 3)
    return root


def fresh_out(root: Path, name: str) -> str:
    shutil.rmtree(root / name, ignore_errors=True)
    return name


@pytest.mark.slow
def test_three_jobs_merged_are_the_single_run(run: Path) -> None:
    out = fresh_out(run, "merged")
    done = merge("job1", "job2", "job3", "-o", out, cwd=run)
    assert done.returncode == 2, done.stdout + done.stderr  # MAX_ITER: the highest verdict of the failed loops
    assert "merged 6 loop(s) from 3 job(s) of 3 shard(s)" in done.stdout and done.stderr == ""
    merged = verdicts(run / out / "index.jsonl")
    assert merged == verdicts(run / "single" / "index.jsonl")
    assert sorted(merged.values()).count("MAX_ITER") == 2
    lines = [json.loads(line) for line in (run / out / "index.jsonl").read_text().splitlines()]
    assert {line["shard"] for line in lines} == {"1/3", "2/3", "3/3"} and all(line["verified"] for line in lines)
    assert all(Path(line["log"]).is_file() and Path(line["log"]).with_suffix(".tine").is_file() for line in lines)
    assert lessons(run / out) == lessons(run / "single") != {}
    report = (run / out / "report.html").read_text()
    assert all(name in report for name in merged) and ">unverified<" not in report
    cases = list(ET.parse(run / out / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == 6 and sum(1 for c in cases if c.find("failure") is not None) == 2
    shards = {p.get("value") for c in cases for p in c.iter("property") if p.get("name") == "shard"}
    assert shards == {"1/3", "2/3", "3/3"}


def test_lessons_restored_in_every_job_are_merged_once(run: Path, tmp_path: Path) -> None:
    jobs = []
    for n in (1, 2, 3):
        copy = tmp_path / f"job{n}"
        shutil.copytree(run / f"job{n}", copy)
        jobs.append(str(copy))
    page = next((run / "single" / "lessons").glob("stuck-3-*.md"))
    for job in jobs:  # the same page, restored from one cache into every job
        shutil.copy(page, Path(job) / "lessons" / ("restored-" + page.name))
    done = merge(*jobs, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    merged = (tmp_path / "out" / "lessons" / ("restored-" + page.name)).read_text().splitlines()
    original = [line for line in page.read_text().splitlines() if line.startswith("- ")]
    assert [line for line in merged if line.startswith("- ")] == original


def test_a_missing_shard_is_named_and_nothing_is_written(run: Path) -> None:
    out = fresh_out(run, "missing")
    done = merge("job1", "job3", "-o", out, cwd=run)
    assert done.returncode == 64
    assert done.stderr.strip() == ("pytest-loops: error: shard 2/3 missing: no directory given holds it "
                                   "(given: 1/3, 3/3); download every job's artifacts; a job that failed "
                                   "to start has none")
    assert not (run / out).exists()


def test_a_shard_given_twice_is_named(run: Path, tmp_path: Path) -> None:
    shutil.copytree(run / "job2", tmp_path / "again")
    done = merge("job1", "job2", "job3", str(tmp_path / "again"), "-o", str(tmp_path / "out"), cwd=run)
    assert done.returncode == 64
    assert f"shard 2/3 is claimed twice: by job2 and {tmp_path / 'again'}" in done.stderr


def test_a_loop_run_by_two_shards_is_named(run: Path, tmp_path: Path) -> None:
    jobs = []
    for n in (1, 2, 3):
        shutil.copytree(run / f"job{n}", tmp_path / f"job{n}")
        jobs.append(str(tmp_path / f"job{n}"))
    one = json.loads((tmp_path / "job1" / "shard.json").read_text())
    two = json.loads((tmp_path / "job2" / "shard.json").read_text())
    two["units"].append(one["units"][0])  # job 2 split differently: it ran one of job 1's loops too
    (tmp_path / "job2" / "shard.json").write_text(json.dumps(two))
    done = merge(*jobs, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 64
    unit = one["units"][0]["id"]
    assert (f"the loop {unit!r} was run by two shards: {tmp_path / 'job1'} (shard 1/3) and "
            f"{tmp_path / 'job2'} (shard 2/3)") in done.stderr


def test_jobs_of_different_runs_are_refused(run: Path, tmp_path: Path) -> None:
    shutil.copytree(run / "job3", tmp_path / "other")
    record = json.loads((tmp_path / "other" / "shard.json").read_text())
    record["shard"] = "3/4"
    (tmp_path / "other" / "shard.json").write_text(json.dumps(record))
    done = merge("job1", "job2", str(tmp_path / "other"), "-o", str(tmp_path / "out"), cwd=run)
    assert done.returncode == 64 and "different numbers of shards" in done.stderr
    done = merge("job1", "single", "-o", str(tmp_path / "out2"), cwd=run)
    assert done.returncode == 64
    assert done.stderr.startswith("pytest-loops: error: single: no shard.json: not a --loop-shard job")


def test_an_unauthenticated_run_is_listed_never_merged_silently(run: Path, tmp_path: Path) -> None:
    jobs = []
    for n in (1, 2, 3):
        shutil.copytree(run / f"job{n}", tmp_path / f"job{n}")
        jobs.append(str(tmp_path / f"job{n}"))
    log = sorted((tmp_path / "job2" / "runs").glob("*.json"))[0]
    data = json.loads(log.read_text())
    data["reason"] = "edited after the job"  # the summary's MAC no longer holds
    log.write_text(json.dumps(data))
    done = merge(*jobs, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode in (0, 2)
    assert re.search(rf"{re.escape(log.name)}: unverified: .*edited", done.stderr), done.stderr
    assert "1 run(s) not authenticated" in done.stderr
    lines = [json.loads(line) for line in (tmp_path / "out" / "index.jsonl").read_text().splitlines()]
    flagged = [line for line in lines if not line["verified"]]
    assert len(flagged) == 1 and Path(flagged[0]["log"]).name == log.name
    assert ">unverified<" in (tmp_path / "out" / "report.html").read_text()
    assert json.loads((tmp_path / "out" / "merge.json").read_text())["unverified"][0]["why"]


def test_a_job_killed_before_its_loop_ended_is_bad_input(run: Path, tmp_path: Path) -> None:
    jobs = []
    for n in (1, 2, 3):
        shutil.copytree(run / f"job{n}", tmp_path / f"job{n}")
        jobs.append(str(tmp_path / f"job{n}"))
    log = sorted((tmp_path / "job1" / "runs").glob("*.json"))[0]
    log.write_text(json.dumps({"event": "start", "loop": "x", "schema": "pytest-loops.runlog/1"}) + "\n")
    done = merge(*jobs, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 64 and f"run log {log.name} has no verdict" in done.stderr


@pytest.mark.parametrize("case", ["not-a-dir", "output-not-empty", "bad-index", "same-dir-twice", "short-key"])
def test_bad_input_is_one_line_and_exit_64(run: Path, tmp_path: Path, case: str) -> None:
    args = ["job1", "job2", "job3", "-o", str(tmp_path / "out")]
    env = clean_env()
    expected = ""
    if case == "not-a-dir":
        args[1] = "nowhere"
        expected = "nowhere: not a directory"
    elif case == "output-not-empty":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "x").write_text("")
        expected = "exists and is not an empty directory"
    elif case == "bad-index":
        shutil.copytree(run / "job1", tmp_path / "job1")
        (tmp_path / "job1" / "index.jsonl").write_text("{not json\n")
        args[0] = str(tmp_path / "job1")
        expected = "line 1 is not JSON"
    elif case == "same-dir-twice":
        args.insert(0, "./job1")
        expected = "given twice"
    else:
        env["MERGE_KEY"] = "short"
        args += ["--key-env", "MERGE_KEY"]
        expected = "the HMAC key in MERGE_KEY is 5 bytes"
    done = merge(*args, cwd=run, env=env)
    assert done.returncode == 64, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_signed_jobs_are_authenticated_by_the_key_given(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", loops=2)
    env = clean_env({"LOOPS_HMAC_KEY": "k" * 32, "WRONG_KEY": "w" * 32})
    dirs = run_jobs(root, 2, "--loop-sign-key-env=LOOPS_HMAC_KEY", env=env)
    good = merge(*dirs, "-o", "good", "--key-env", "LOOPS_HMAC_KEY", cwd=root, env=env)
    assert good.returncode == 0 and good.stderr == "", good.stderr
    wrong = merge(*dirs, "-o", "wrong", "--key-env", "WRONG_KEY", cwd=root, env=env)
    assert wrong.returncode == 0
    assert "2 run(s) not authenticated" in wrong.stderr and "not signed with the key given" in wrong.stderr


def test_the_merge_appends_one_job_summary(run: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = clean_env({"GITHUB_STEP_SUMMARY": str(summary)})
    done = merge("job1", "job2", "job3", "-o", str(tmp_path / "out"), cwd=run, env=env)
    assert done.returncode == 2
    text = summary.read_text()
    assert text.startswith("earlier step\n### pytest-loops (merged)\n")
    assert "6 loop(s): 2 MAX_ITER, 4 SUCCESS (3 job(s) merged)" in text
    assert text.count("(shard ") == 6 and str(tmp_path / "out" / "report.html") in text


@pytest.mark.slow
def test_eight_jobs_and_a_merge_are_the_single_run(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", loops=12)
    fresh_tree(root)
    single = pytest_run(root, "--loop", "--loop-artifacts=single", "--loop-report=single.html")
    assert single.returncode == 1
    dirs = run_jobs(root, 8)
    done = merge(*dirs, "-o", "merged", cwd=root)
    assert done.returncode == 2, done.stderr
    assert verdicts(root / "merged" / "index.jsonl") == verdicts(root / "single" / "index.jsonl")
    assert lessons(root / "merged") == lessons(root / "single")
    assert (root / "merged" / "report.html").is_file() and (root / "merged" / "junit.xml").is_file()


# -- the summary and annotation writers themselves --------------------------------------------


def test_summary_and_annotations_escape_what_github_would_read_as_commands(tmp_path: Path) -> None:
    run = {"loop": "a|b", "verdict": "MAX_ITER", "iterations_run": 2, "elapsed_s": 1.5,
           "spec": {"checks": [{"name": "c", "source": str(tmp_path / "x.loop") + ":3"}]},
           "iterations": [{"checks": [{"name": "c", "passed": False, "reason": "exit 1\n::error::forged",
                                       "failing_tests": ["tests/test_x.py::test_y"]}]}]}
    text = summary_markdown([run])
    assert "a\\|b" in text and "| MAX_ITER | 2 | 1.5s |" in text
    lines = annotation_lines([run], tmp_path)
    assert lines[0].startswith("::error file=x.loop,line=3,title=loop a|b%3A MAX_ITER::check c failed: exit 1")
    assert all("\n" not in line and line.startswith("::error ") for line in lines), "one line each"
    assert lines[1].startswith("::error file=tests/test_x.py,title=")
    assert annotation_lines([{**run, "verdict": "SUCCESS"}], tmp_path) == []


def test_many_runs_are_checked_over_worker_processes_alike(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_loops.cli import merge as merging

    copied = []
    for job in ("job1", "job2", "job3"):
        for log in sorted((run / job / "runs").glob("*.json")):
            copied.append((log, log.with_suffix(".tine")))
    alone = merging.check_runs(copied, None, None)
    monkeypatch.setattr(merging, "PER_WORKER", 1)
    pooled = merging.check_runs(copied, None, None)
    assert [(r["verdict"], r["verified"]) for r in pooled] == [(r["verdict"], r["verified"]) for r in alone]
    assert len(pooled) == 6 and all(r["verified"] for r in pooled)


def test_a_tampered_tine_is_listed_as_unverified(run: Path, tmp_path: Path) -> None:
    jobs = []
    for n in (1, 2, 3):
        shutil.copytree(run / f"job{n}", tmp_path / f"job{n}")
        jobs.append(str(tmp_path / f"job{n}"))
    tine = sorted((tmp_path / "job3" / "runs").glob("*.tine"))[0]
    data = bytearray(tine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tine.write_bytes(bytes(data))
    done = merge(*jobs, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode in (0, 2)
    assert re.search(rf"{re.escape(tine.stem)}\.json: unverified: its \.tine fails verification", done.stderr), \
        done.stderr

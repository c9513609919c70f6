"""``pytest-loops merge DIR... -o OUT``: the artifacts of several CI jobs as one run.

Each DIR is one job's artifacts directory (``.pytest-loops``). The merge checks the
jobs' shard records first (``shard.json``, written under ``--loop-shard``): one N,
every shard present once, no loop run by two shards; anything else is bad input
naming the directories (exit 64) and nothing is written. Then, into OUT:

- ``runs/``: each job's run logs of this run, their ``.tine`` files, hand-offs and
  run directories, copied; each run is authenticated (its run log's MACs under this
  machine's key and its ``.tine`` agreeing, or its ``.tine`` signed with the key
  given by ``--key-env`` / ``--pubkey`` and agreeing with the log). A run that is
  neither is kept, marked unverified everywhere it shows, and listed on stderr:
  never merged silently.
- ``index.jsonl``: one line per loop, naming its shard and whether it is verified.
- ``lessons/``: the jobs' lessons pages merged line by line, without duplicates,
  under each page's lock.
- ``report.html`` and ``junit.xml``: one for the whole run.
- ``merge.json``: the inputs, their shards, and the runs not authenticated.

The exit code is the verdict contract's: 0 when every loop succeeded, else the
highest verdict code of those that did not (5 ESCALATE > 4 NO_PROGRESS > 3 TIMEOUT
> 2 MAX_ITER); 64 for bad input (a missing or duplicated shard, a loop two shards
ran, a job's run that never finished).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.artifacts.runlog import append_index, atomic_write_text, load_runlog
from pytest_loops.artifacts.shard import SHARD_FILE, read_record
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import MiB
from pytest_loops.verdict import Verdict

MAX_INDEX_BYTES = 64 * MiB
PER_WORKER = 64  # runs per worker process below which checking them in this process is faster


@dataclass
class Job:
    """One input directory."""

    root: Path
    record: dict[str, Any] | None
    entries: list[dict[str, Any]] = field(default_factory=list)  # its index lines of this run

    @property
    def shard(self) -> str | None:
        return str(self.record["shard"]) if self.record else None

    @property
    def label(self) -> str:
        return f"{self.root} (shard {self.shard})" if self.shard else str(self.root)


def add_merge_parser(sub: Any) -> None:
    merge = sub.add_parser(
        "merge", help="combine the artifacts directories of several CI jobs (shards) into one",
        description="Combine .pytest-loops directories of several jobs (--loop-shard=I/N) into OUT: one "
                    "index.jsonl, the run logs and .tine files (verified), the lessons pages (without "
                    "duplicates), one HTML report and one JUnit file. Exit with the highest verdict code of "
                    "the loops that did not succeed (0 when all did); 64 for a missing or duplicated shard.")
    merge.add_argument("directories", metavar="DIR", nargs="+", help="a job's artifacts directory")
    merge.add_argument("-o", "--output", metavar="OUT", required=True,
                       help="the merged artifacts directory (new, or empty)")
    merge.add_argument("--key-env", metavar="VAR", help="environment variable holding the HMAC key the jobs "
                                                        "signed their .tine files with (--loop-sign-key-env)")
    merge.add_argument("--pubkey", metavar="FILE", help="Ed25519 public key the jobs' .tine files are signed for")


def _key(args: argparse.Namespace) -> bytes | None:
    if args.key_env is None:
        return None
    if args.pubkey is not None:
        raise LoopUsageError("pass --key-env or --pubkey, not both", location="--pubkey")
    value = os.environ.get(args.key_env)
    if value is None:
        raise LoopUsageError(f"environment variable {args.key_env} is not set", location="--key-env",
                             fix="export the jobs' HMAC key in it")
    if len(value.encode()) < 16:
        raise LoopUsageError(f"the HMAC key in {args.key_env} is {len(value.encode())} bytes; it must be at "
                             "least 16", location="--key-env")
    return value.encode()


# -- reading and checking the inputs ---------------------------------------------------------

def read_jobs(directories: Sequence[str]) -> list[Job]:
    jobs: list[Job] = []
    seen: dict[Path, str] = {}
    for given in directories:
        root = Path(given)
        if not root.is_dir():
            raise LoopUsageError("not a directory", location=given,
                                 fix="pass each job's artifacts directory (its .pytest-loops)")
        real = root.resolve()
        if real in seen:
            raise LoopUsageError(f"given twice (also as {seen[real]})", location=given)
        seen[real] = given
        try:
            record = read_record(root)
        except ValueError as exc:
            raise LoopUsageError(str(exc), fix="each job writes it under --loop-shard; do not edit it") from None
        jobs.append(Job(root, record))
    return jobs


def check_shards(jobs: Sequence[Job]) -> int | None:
    """The N of the run (None when no job was a shard); LoopUsageError naming the jobs
    when a shard is missing or claimed twice, or a loop was run by two shards."""
    sharded = [job for job in jobs if job.record]
    if not sharded:
        return None
    plain = [job for job in jobs if not job.record]
    if plain:
        raise LoopUsageError(f"no {SHARD_FILE}: not a --loop-shard job, while {sharded[0].label} is",
                             location=str(plain[0].root), fix="merge the jobs of one sharded run")
    totals = {int(job.record["total"]) for job in sharded if job.record}
    if len(totals) > 1:
        raise LoopUsageError("the jobs split into different numbers of shards: "
                             + ", ".join(job.label for job in sharded), fix="merge the jobs of one run")
    total = totals.pop()
    by_index: dict[int, Job] = {}
    for job in sharded:
        assert job.record is not None
        index = int(job.record["index"])
        if index in by_index:
            raise LoopUsageError(f"shard {index}/{total} is claimed twice: by {by_index[index].root} and {job.root}",
                                 fix="give each job's directory once; each job runs its own --loop-shard")
        by_index[index] = job
    missing = [i for i in range(1, total + 1) if i not in by_index]
    if missing:
        names = ", ".join(f"{i}/{total}" for i in missing)
        raise LoopUsageError(f"shard{'s' if len(missing) > 1 else ''} {names} missing: no directory given holds "
                             f"{'them' if len(missing) > 1 else 'it'} (given: "
                             + ", ".join(f"{i}/{total}" for i in sorted(by_index)) + ")",
                             fix="download every job's artifacts; a job that failed to start has none")
    owner: dict[str, Job] = {}
    for job in sharded:
        assert job.record is not None
        for unit in job.record["units"]:
            identity = str(unit["id"])
            if identity in owner:
                raise LoopUsageError(
                    f"the loop {identity!r} was run by two shards: {owner[identity].label} and {job.label}",
                    fix="the jobs split differently: give every job the same loops and the same index.jsonl "
                        "(or none)")
            owner[identity] = job
    return total


def read_entries(job: Job) -> None:
    """The job's index lines of this run (a sharded job names its run logs; the index
    a cache restored also holds older runs' lines); each line names a run log."""
    index = job.root / "index.jsonl"
    logs = set(job.record["logs"]) if job.record else None
    if not index.is_file():
        if logs:
            raise LoopUsageError("no index.jsonl, but its shard.json names run logs", location=str(job.root))
        return
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise LoopUsageError(f"index.jsonl is bigger than {MAX_INDEX_BYTES // MiB} MiB", location=str(index))
    found: dict[str, dict[str, Any]] = {}
    with open(index, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                raise LoopUsageError(f"line {number} is not JSON", location=str(index),
                                     fix="is this a pytest-loops artifacts directory?") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("log"), str):
                raise LoopUsageError(f"line {number} is not an index line (no 'log')", location=str(index))
            name = Path(entry["log"]).name
            if logs is None or name in logs:
                found[name] = entry  # a resumed loop's later line wins
    if logs is not None:
        absent = sorted(logs - set(found))
        if absent:
            raise LoopUsageError(f"its shard.json names run log {absent[0]}, which index.jsonl does not",
                                 location=str(job.root), fix="the job did not finish writing; re-run it")
    job.entries = list(found.values())


# -- copying and authenticating one run ------------------------------------------------------

def _copy(source: Path, target: Path) -> None:
    if source.is_symlink():
        return  # never followed: a job's directory could point anywhere
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=False)
    elif source.is_file():
        shutil.copy2(source, target)


def _target(out_runs: Path, name: str, shard: str | None) -> Path:
    target = out_runs / name
    if target.exists() and shard:  # two jobs' logs of one name (same loop, time and pid): keep both
        target = out_runs / f"{Path(name).stem}.shard{shard.replace('/', 'of')}{Path(name).suffix}"
    if target.exists():
        raise LoopUsageError(f"two run logs named {name}", location=str(target),
                             fix="merge each job's directory once")
    return target


def authenticate(run: dict[str, Any], tine: Path | None, key: bytes | None, pubkey: str | None) -> str | None:
    """Why the run is not authenticated; None when it is."""
    from pytest_loops.artifacts.tineread import verify_and_summarize

    if key is None and pubkey is None and run.get("verified") is not True:
        return str(run.get("unverified_why") or "its run log's MACs do not hold")
    if tine is None:
        if key is not None or pubkey is not None:
            return "no .tine to check its signature"
        return None  # --loop-tine off: the log's MACs are the proof
    ok, message, theirs = verify_and_summarize(tine, hmac_key=key, pubkey_path=pubkey)
    if not ok:
        given = key is not None or pubkey is not None
        return f"its .tine is not signed with the key given ({message})" if given else \
            f"its .tine fails verification ({message})"
    if theirs is None:
        return "its .tine cannot be read"
    if (run.get("verdict"), run.get("iterations_run")) != (theirs.get("verdict"), theirs.get("iterations_run")):
        return (f"the log says {run.get('verdict')} after {run.get('iterations_run')} iteration(s), its .tine "
                f"says {theirs.get('verdict')} after {theirs.get('iterations_run')}")
    return None


def check_run(log: Path, tine: Path | None, key: bytes | None, pubkey: str | None) -> dict[str, Any]:
    """One copied run read back and authenticated (in a worker process for big merges)."""
    try:
        run = load_runlog(log)
    except LoopUsageError as exc:
        return {"_error": f"run log {log.name} cannot be read: {exc.message}"}
    if run.get("verdict") is not None:
        why = authenticate(run, tine, key, pubkey)
        run["verified"], run["unverified_why"] = why is None, why
    return run


def copy_run(job: Job, entry: dict[str, Any], out_runs: Path) -> tuple[Path, Path | None]:
    """Copy one run's files into ``out_runs``: (its log, its .tine or None)."""
    name = Path(entry["log"]).name
    source = job.root / "runs" / name
    if not source.is_file() or source.is_symlink():
        raise LoopUsageError(f"index.jsonl names run log {name}, which is not in runs/", location=str(job.root),
                             fix="upload the whole artifacts directory (include-hidden-files: true)")
    target = _target(out_runs, name, job.shard)
    _copy(source, target)
    stem, new = source.with_suffix(""), target.with_suffix("")
    tine = None
    for suffix in (".tine", ".handoff.md"):
        extra = stem.with_name(stem.name + suffix)
        if extra.is_file() and not extra.is_symlink():
            copied = new.with_name(new.name + suffix)
            _copy(extra, copied)
            if suffix == ".tine":
                tine = copied
    if stem.is_dir():
        _copy(stem, new)
    return target, tine


def check_runs(copied: Sequence[tuple[Path, Path | None]], key: bytes | None, pubkey: str | None
               ) -> list[dict[str, Any]]:
    """Each copied run read back and authenticated: over the CPUs when there are many
    (reading and checking a .tine is most of a merge's time)."""
    workers = min(os.cpu_count() or 1, max(1, len(copied) // PER_WORKER))
    if workers < 2:
        return [check_run(log, tine, key, pubkey) for log, tine in copied]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(check_run, *zip(*copied, strict=True), [key] * len(copied), [pubkey] * len(copied),
                             chunksize=max(1, len(copied) // (workers * 4))))


def merged_line(job: Job, entry: dict[str, Any], run: dict[str, Any], log: Path) -> dict[str, Any]:
    """The run's merged index line; LoopUsageError for a run that cannot be merged."""
    if "_error" in run:
        raise LoopUsageError(run["_error"], location=str(job.root))
    if run.get("verdict") is None:
        raise LoopUsageError(f"run log {Path(entry['log']).name} has no verdict: the job was killed before the "
                             "loop ended", location=str(job.root), fix="re-run that job (its loop can --loop-resume)")
    run["shard"] = job.shard
    run["_file"] = str(log)
    line = {k: v for k, v in entry.items() if k != "schema"}
    line.update(log=str(log), shard=job.shard, source=str(job.root), verified=run["verified"])
    if not run["verified"]:
        line["unverified_why"] = run["unverified_why"]
    return line


# -- lessons ----------------------------------------------------------------------------------

def merge_lessons(jobs: Sequence[Job], out: Path) -> int:
    """Every job's lessons pages into ``out/lessons``: lines in order, each once."""
    from pytest_loops.artifacts.lessons_page import LessonsPage
    from pytest_loops.cli.runsdir import _page_loop

    added = 0
    for job in jobs:
        pages = job.root / "lessons"
        if not pages.is_dir() or pages.is_symlink():
            continue
        for page_path in sorted(pages.rglob("*.md")):
            if not page_path.is_file() or page_path.is_symlink():
                continue
            source = LessonsPage(page_path, loop_name=_page_loop(page_path) or page_path.stem)
            lessons = source.read_lessons()
            if not lessons:
                continue
            target = out / "lessons" / page_path.relative_to(pages)
            added += LessonsPage(target, loop_name=source.loop_name).merge(lessons)
    return added


# -- the command ------------------------------------------------------------------------------

def exit_code(runs: Sequence[dict[str, Any]]) -> int:
    """The verdict contract: 0 when all succeeded, else the highest code of the others."""
    failed = [Verdict(run["verdict"]).exit_code for run in runs if run.get("verdict") != Verdict.SUCCESS.value]
    return max(failed) if failed else 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pytest_loops.artifacts import cisummary
    from pytest_loops.artifacts.junit import write_loops_junit
    from pytest_loops.artifacts.report import write_html_report

    key = _key(args)
    if args.pubkey is not None and not Path(args.pubkey).is_file():
        raise LoopUsageError("not a file", location=f"--pubkey {args.pubkey}")
    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LoopUsageError("exists and is not an empty directory", location=f"--output {out}",
                             fix="merge into a new directory")
    jobs = read_jobs(args.directories)
    if out.exists() and any(out.resolve() == job.root.resolve() for job in jobs):
        raise LoopUsageError("is one of the inputs", location=f"--output {out}")
    total = check_shards(jobs)
    for job in jobs:
        read_entries(job)
    out_runs = out.resolve() / "runs"  # the index names absolute paths, as a job's does
    out_runs.mkdir(parents=True, exist_ok=True)
    pending = [(job, entry) for job in jobs for entry in job.entries]
    copied = [copy_run(job, entry, out_runs) for job, entry in pending]
    runs = check_runs(copied, key, args.pubkey)
    lines = [merged_line(job, entry, run, log) for (job, entry), run, (log, _) in zip(pending, runs, copied,
                                                                                        strict=True)]
    index = out / "index.jsonl"
    append_index(index, lines)
    lessons = merge_lessons(jobs, out)
    runs.sort(key=lambda r: (str(r.get("started_at") or ""), str(r.get("_file"))))
    report = write_html_report(runs, out / "report.html", title=f"pytest-loops: {len(jobs)} job(s) merged")
    write_loops_junit(runs, out / "junit.xml")
    unverified = [line for line in lines if not line["verified"]]
    atomic_write_text(out / "merge.json", json.dumps({
        "schema": "pytest-loops.merge/1", "shards": total,
        "inputs": [{"dir": str(job.root), "shard": job.shard, "loops": len(job.entries)} for job in jobs],
        "loops": len(lines), "unverified": [{"log": u["log"], "why": u["unverified_why"]} for u in unverified],
    }, indent=1, ensure_ascii=False) + "\n")
    code = exit_code(runs)
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run["verdict"])] = counts.get(str(run["verdict"]), 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "no loops"
    shards = f" of {total} shard(s)" if total else ""
    print(f"merged {len(lines)} loop(s) from {len(jobs)} job(s){shards} into {out}: {summary}; "
          f"{lessons} lesson line(s) merged")
    print(f"report: {report}; JUnit: {out / 'junit.xml'}; index: {index}")
    for u in unverified:
        print(f"{u['log']}: unverified: {u['unverified_why']}", file=sys.stderr)
    if unverified:
        print(f"{len(unverified)} run(s) not authenticated: kept, marked unverified in the index, report and "
              "JUnit file", file=sys.stderr)
    if os.environ.get(cisummary.SUMMARY_ENV):
        note = f"{len(jobs)} job(s) merged" + (f", {len(unverified)} unverified" if unverified else "")
        cisummary.append_summary(cisummary.summary_markdown(
            runs, title="pytest-loops (merged)", note=note,
            artifacts=[str(out), str(out / "report.html"), str(out / "junit.xml")]))
    print(f"verdict: exit {code}")
    return code

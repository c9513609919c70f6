"""Loops split over local shard processes and merged, against one process with xdist.

    python benchmarks/bench_shards.py [--loops 2000] [--shards 8] [--merge-loops 2000] [--sandbox auto]

Writes ``--loops`` loop files (every seventh never passes: MAX_ITER; the others
pass after one revise) and runs them twice, each arm in its own copy of the tree
(a CI job has its own checkout; one tree would serialize the revising loops on its
tree lock):

1. **one process**: ``pytest --loop -n SHARDS``;
2. **shards**: SHARDS processes at once, each ``pytest --loop -n 1
   --loop-shard=I/SHARDS`` with its own artifacts directory, then ``pytest-loops
   merge`` of the SHARDS directories.

Figures: each arm's wall time; whether the two give the same verdict loop for loop
(the merged index against the single run's); the merge's wall time; and the
balance of the split once durations are known (each shard job starts with the
single run's index.jsonl, as a CI job restores it from a cache): the largest
distance of a shard's expected time from the mean, in percent of the mean, and the
same for the shards' measured times (the loops' elapsed_s in each job).
When ``--merge-loops`` is more than ``--loops``, the merge is also timed over that
many loops: the shard jobs' real run logs (with their .tine files and index lines)
copied under new names until there are that many, which authenticate as the
originals do. The machines here are shared: compare figures of one run only.

Always exits 0 unless an arm itself fails: it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Table, console_script, progress, run_timed, user_env

from pytest_loops.artifacts.shard import Unit, read_durations, shard_loads

STUCK_EVERY = 7
MERGE_TARGET_S = 5.0
BALANCE_TARGET = 0.15


def loop_text(n: int) -> str:
    if n % STUCK_EVERY == 0:
        return (f'loop "loop {n}":\n  goal: never {n}\n  done when "test -f never{n}" passes\n'
                f'  revise with "echo x >> tries{n}"\n  watch: tries{n}\n  after 2 tries: stop\n')
    return (f'loop "loop {n}":\n  goal: f{n} exists\n  done when "test -f f{n}" passes\n'
            f'  revise with "touch f{n}"\n  after 3 tries: stop\n')


def build(root: Path, loops: int) -> None:
    root.mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "loops").mkdir()
    for n in range(1, loops + 1):
        (root / "loops" / f"l{n:05d}.loop").write_text(loop_text(n))


def verdicts(index: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in index.read_text().splitlines():
        entry = json.loads(line)
        found[entry["loop"]] = entry["verdict"]
    return found


def single_arm(pytest: str, root: Path, shards: int, sandbox: str) -> float:
    sample = run_timed([pytest, "-p", "no:cacheprovider", "-q", "--loop", "-n", str(shards),
                        f"--loop-sandbox={sandbox}", "--loop-artifacts=single"], cwd=root, expect=None)
    return sample.seconds


def shard_arm(pytest: str, copies: list[Path], sandbox: str) -> float:
    """SHARDS processes at once, one per copy of the tree; wall time until the last ends."""
    import subprocess

    total = len(copies)
    start = time.perf_counter()
    procs = []
    for index, root in enumerate(copies, 1):
        out = tempfile.TemporaryFile(prefix="bench-shard-")
        procs.append((subprocess.Popen(
            [pytest, "-p", "no:cacheprovider", "-q", "--loop", "-n", "1", f"--loop-shard={index}/{total}",
             f"--loop-sandbox={sandbox}", "--loop-artifacts=job"], cwd=root, env=user_env(),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT), out))
    for proc, out in procs:
        code = proc.wait()
        if code not in (0, 1, 5):
            out.seek(0)
            raise SystemExit(f"error: a shard exited {code}:\n{out.read().decode(errors='replace')[-3000:]}")
        out.close()
    return time.perf_counter() - start


def replicate(jobs: list[Path], wanted: int, into: Path) -> list[Path]:
    """Copies of the jobs' directories holding ``wanted`` loops in all: each real run log
    (with its .tine and index line) copied under new names, round the jobs."""
    have = sum(len(json.loads((job / "shard.json").read_text())["logs"]) for job in jobs)
    copies = []
    factor = max(1, -(-wanted // max(1, have)))
    made = 0
    for number, job in enumerate(jobs):
        target = into / f"big{number + 1}"
        target.mkdir(parents=True)
        (target / "runs").mkdir()
        record = json.loads((job / "shard.json").read_text())
        entries = {Path(json.loads(line)["log"]).name: json.loads(line)
                   for line in (job / "index.jsonl").read_text().splitlines()}
        logs, units, lines = [], [], []
        for round_ in range(factor):
            for name in record["logs"]:
                if made >= wanted:
                    break
                stem = Path(name).stem
                new = f"{stem}-copy{round_}"
                shutil.copy(job / "runs" / name, target / "runs" / f"{new}.json")
                tine = job / "runs" / f"{stem}.tine"
                if tine.is_file():
                    shutil.copy(tine, target / "runs" / f"{new}.tine")
                entry = dict(entries[name], log=str(target / "runs" / f"{new}.json"))
                lines.append(json.dumps(entry))
                logs.append(f"{new}.json")
                units.append({"kind": "loop file", "id": f"{new}"})
                made += 1
        (target / "index.jsonl").write_text("\n".join(lines) + "\n")
        (target / "shard.json").write_text(json.dumps(dict(record, logs=logs, units=units)))
        copies.append(target)
    return copies


def spread(loads: list[float]) -> float:
    mean = sum(loads) / len(loads)
    return max(abs(load - mean) for load in loads) / mean if mean else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=2000, help="loop files (2000)")
    parser.add_argument("--shards", type=int, default=8, help="shards, and -n of the one-process arm (8)")
    parser.add_argument("--merge-loops", type=int, default=2000,
                        help="loops the merge is also timed over (2000; real run logs copied)")
    parser.add_argument("--sandbox", default="auto", help="--loop-sandbox of both arms (auto)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    pytest, loops_cli = console_script("pytest"), console_script("pytest-loops")
    work = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    try:
        base = work / "base"
        build(base, args.loops)
        single_root = work / "single"
        shutil.copytree(base, single_root)
        progress(f"one process, -n {args.shards}, {args.loops} loops")
        single_s = single_arm(pytest, single_root, args.shards, args.sandbox)
        copies = []
        for index in range(1, args.shards + 1):  # each job restores the single run's index (as from a cache)
            copy = work / f"job{index}"
            shutil.copytree(base, copy)
            (copy / "job").mkdir()
            shutil.copy(single_root / "single" / "index.jsonl", copy / "job" / "index.jsonl")
            copies.append(copy)
        progress(f"{args.shards} shard processes, -n 1 each")
        shards_s = shard_arm(pytest, copies, args.sandbox)
        jobs = [copy / "job" for copy in copies]
        progress("merge")
        merged = work / "merged"
        merge = run_timed([loops_cli, "merge", *map(str, jobs), "-o", str(merged)], expect=None)
        single = verdicts(single_root / "single" / "index.jsonl")
        together = verdicts(merged / "index.jsonl")
        same = single == together
        differ = sorted(k for k in set(single) | set(together) if single.get(k) != together.get(k))

        # balance: the split the single run's durations give, expected and measured
        durations = read_durations(single_root / "single" / "index.jsonl")
        units = [Unit(f"loops/l{n:05d}.loop::loop {n}", (f"loop {n}",)) for n in range(1, args.loops + 1)]
        expected = shard_loads(units, args.shards, durations)
        measured = []
        for job in jobs:  # this run's lines only (the restored ones are the single run's)
            mine = set(json.loads((job / "shard.json").read_text())["logs"])
            measured.append(sum(entry.get("elapsed_s", 0.0) for entry in map(json.loads, (
                job / "index.jsonl").read_text().splitlines()) if Path(entry["log"]).name in mine))

        table = Table(f"Shards: {args.loops} loop files, {args.shards} shards")
        table.add(f"{args.shards} shard processes (-n 1 each), wall", f"{shards_s:.1f} s",
                  f"{single_s:.1f} s (one process, -n {args.shards})", shards_s / single_s)
        table.add("same verdicts, loop for loop", f"{same} ({len(together)} merged, {len(single)} single)",
                  target="True", met=same)
        table.add(f"merge of {args.shards} shards, {len(together)} loops", f"{merge.seconds:.2f} s",
                  target=f"< {MERGE_TARGET_S:.0f} s", met=merge.seconds < MERGE_TARGET_S)
        if args.merge_loops > len(together):
            big = replicate(jobs, args.merge_loops, work / "big")
            bigger = run_timed([loops_cli, "merge", *map(str, big), "-o", str(work / "merged-big")], expect=None)
            count = len((work / "merged-big" / "index.jsonl").read_text().splitlines())
            table.add(f"merge of {args.shards} shards, {count} loops (run logs copied)", f"{bigger.seconds:.2f} s",
                      target=f"< {MERGE_TARGET_S:.0f} s", met=bigger.seconds < MERGE_TARGET_S)
        table.add("balance, expected from durations (max distance from the mean)", f"{spread(expected):.1%}",
                  target=f"<= {BALANCE_TARGET:.0%}", met=spread(expected) <= BALANCE_TARGET)
        table.add("balance, measured: the loops' time in each shard job",
                  f"{spread(measured):.1%}", "loop time per shard: "
                  + ", ".join(f"{m:.1f}" for m in measured) + " s")
        print(table.render())
        if differ:
            print(f"\nverdicts differ for {len(differ)} loop(s): {', '.join(differ[:10])}")
        sys.stdout.flush()
    finally:
        if args.keep:
            print(f"\nkept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

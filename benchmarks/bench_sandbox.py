"""What isolation costs: each tier's start per command, and per loop iteration, as whole processes.

    python benchmarks/bench_sandbox.py [--rounds R] [--iters LO,HI] [--files N]

1. Start per command: ``sh -c true`` (the baseline) against the same command
   under the revise step's policy in each tier this machine offers (the argv
   and descriptors :mod:`pytest_loops.sandbox` builds, spawned and reaped as
   the runner does). Target: <= 15 ms over the baseline.
2. Per iteration of the console script: ``pytest-loops run --verify false
   --revise true --max-iter N --no-progress-k 0 --sandbox TIER`` over a tree of
   ``--files`` small files (default 10,000), for LO and HI iterations; the cost
   of one iteration is (T(HI) - T(LO)) / (HI - LO) within a round, so start-up
   and the loop start cancel. Each tier is compared with ``--sandbox none`` of
   the same run: the difference is what isolation costs per iteration (two
   commands, the revise step's policy built once per iteration).
3. The clean room on the same tree: a loop whose revise step fixes a one-line
   bug (two iterations, one clean-room confirmation) in each tier; the
   confirmation's time (the run log's ``clean_room_s``: the room built and every
   check judged) beside the same check in the working tree. Target: <= 150 ms over
   the check itself.

Arms are interleaved round by round; medians are reported. Always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Sample, Table, console_script, interleaved, machine_line, med, ms, run_timed  # noqa: E402


def spawn(argv: list[str], pass_fds: tuple[int, ...] = (), preexec=None) -> Sample:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            pass_fds=pass_fds, preexec_fn=preexec, start_new_session=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: {argv[:3]}... exited {proc.returncode}")
    return Sample(took, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)


def tiers() -> list[str]:
    from pytest_loops.sandbox import Tier, survey

    return [t.value for t, why in survey().items() if not why and t is not Tier.NONE]


def start_costs(tree: Path, rounds: int) -> Table:
    from pytest_loops.sandbox import Policy, choose, prepare
    from pytest_loops.sandbox.policy import agent_state_paths

    policy = Policy(cwd=str(tree), writable=(str(tree), *agent_state_paths()),
                    readonly=((str(tree / "tests"), str(tree / "tests")),), tmpdir=tempfile.mkdtemp())

    def under(tier: str):
        choice = choose(tier)

        def job() -> Sample:
            launch = prepare(choice, policy, ["/bin/sh", "-c", "true"])
            try:
                return spawn(launch.argv, launch.pass_fds, launch.preexec_fn)
            finally:
                launch.close()
        return job

    jobs = {"sh -c true": lambda: spawn(["/bin/sh", "-c", "true"])}
    for tier in tiers():
        jobs[tier] = under(tier)
    samples = interleaved(jobs, rounds * 10, "start")
    table = Table("Sandbox start per command (sh -c true)")
    base = med([s.seconds for s in samples["sh -c true"]])
    table.add("sh -c true (baseline)", ms(base))
    for tier in tiers():
        t = med([s.seconds for s in samples[tier]])
        table.add(f"{tier}: start over the baseline", ms(t - base), ms(base), t / base if base else None,
                  "<= 15 ms", (t - base) <= 0.015)
    return table


def make_tree(root: Path, files: int) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests" / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "fix.sh").write_text("#!/bin/sh\nsed -i 's/a - b/a + b/' calc.py\n")
    (root / "fix.sh").chmod(0o755)
    per = 100
    for i in range(files):
        d = root / "data" / f"d{i // per:04d}"
        if i % per == 0:
            d.mkdir(parents=True)
        (d / f"f{i:06d}.txt").write_text(f"{i}\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "t"], cwd=root, check=True)


def per_iteration(tree: Path, rounds: int, lo: int, hi: int, out: Path) -> Table:
    cli = console_script("pytest-loops")

    def arm(tier: str, n: int):
        def job() -> Sample:
            log = out / f"{tier}-{n}-{time.monotonic_ns()}"
            return run_timed([cli, "run", "--cwd", str(tree), "--verify", "false", "--revise", "true",
                              "--max-iter", str(n), "--no-progress-k", "0", "--sandbox", tier, "--quiet",
                              "--artifacts", str(log), "--tine", "off", "--lessons", "off"], expect=2,
                             what=f"{tier} x{n}")
        return job

    names = ["none", *tiers()]
    jobs = {f"{t}@{n}": arm(t, n) for t in names for n in (lo, hi)}
    samples = interleaved(jobs, rounds, "iterations")
    per = {t: med([(high.seconds - low.seconds) / (hi - lo)
                   for low, high in zip(samples[f"{t}@{lo}"], samples[f"{t}@{hi}"], strict=True)]) for t in names}
    table = Table(f"Per iteration of the console script ({sum(1 for _ in tree.rglob('*.txt')):,}-file tree)")
    table.add("none (baseline)", ms(per["none"]))
    for t in names[1:]:
        table.add(f"{t}: per iteration", ms(per[t]), ms(per["none"]), per[t] / per["none"] if per["none"] else None)
        table.add(f"{t}: isolation per iteration (2 commands)", ms(per[t] - per["none"]), "", None, "<= 30 ms",
                  per[t] - per["none"] <= 0.030)
    return table


def clean_room(tree: Path, rounds: int, out: Path) -> Table:
    cli = console_script("pytest-loops")
    table = Table("The clean room on the same tree (a one-line fix, one confirmation)")
    names = ["none", *tiers()]
    durations: dict[str, list[tuple[float, float]]] = {t: [] for t in names}

    def arm(tier: str):
        def job() -> Sample:
            subprocess.run(["git", "checkout", "-q", "calc.py"], cwd=tree, check=True)
            log = out / f"room-{tier}-{time.monotonic_ns()}"
            sample = run_timed([cli, "run", "--cwd", str(tree), "--verify", f"{sys.executable} -m pytest -q tests",
                                "--revise", "./fix.sh", "--sandbox", tier, "--quiet", "--artifacts", str(log),
                                "--tine", "off", "--lessons", "off", "--suspects", "off"], expect=0,
                               what=f"clean room {tier}")
            data = json.loads(next(log.glob("runs/*.json")).read_text())
            last = data["iterations"][-1]
            tree_s = sum(c["duration_s"] for c in last["checks"])
            room_s = float(last.get("clean_room_s") or 0.0)  # the confirmation, building the room included
            durations[tier].append((tree_s, room_s))
            return sample
        return job

    interleaved({t: arm(t) for t in names}, rounds, "clean room")
    for t in names:
        tree_s = med([a for a, _ in durations[t]])
        room_s = med([b for _, b in durations[t]])
        table.add(f"{t}: confirmation (room built + judged check) over the check", ms(room_s - tree_s), ms(tree_s),
                  room_s / tree_s if tree_s else None, "<= 150 ms" if t != "none" else "",
                  (room_s - tree_s) <= 0.150 if t != "none" else None)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", default="5,25")
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--skip", default="", help="comma-separated: start,iterations,room")
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.iters.split(","))
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="bench-sandbox-", dir=os.environ.get("BENCH_TMP")))
    try:
        tree = work / "tree"
        make_tree(tree, args.files)
        out = work / "out"
        out.mkdir()
        print(f"# bench_sandbox: {machine_line()}; tiers here: {', '.join(tiers()) or 'none'}")
        if "start" not in skip:
            print(start_costs(tree, args.rounds).render())
        if "iterations" not in skip:
            print(per_iteration(tree, args.rounds, lo, hi, out).render())
        if "room" not in skip:
            print(clean_room(tree, args.rounds, out).render())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The whole CLI a user runs, as a process, against the least a loop can cost.

    python benchmarks/bench_cli.py [--quick] [--rounds R] [--iters LO,HI]
                                   [--sizes 10000,100000] [--tree-iters LO,HI]
                                   [--skip trivial,trees] [--tmp DIR]
                                   [--baseline-cli PATH]

Every arm is a whole process (spawn to reap, wall clock; peak RSS from
``os.wait4``) and every loop runs ``false`` as its check and ``true`` as its
revise step, ``--max-iter N --no-progress-k 0``. The cost of one iteration is
``(T(HI) - T(LO)) / (HI - LO)`` taken within one round, so process start-up and
the one-time loop start cancel; arms are interleaved and the medians of the
rounds are reported (the machines here are shared: compare figures of one run
only). The pytest arms are in bench_pytest.py.

1. Trivial commands (LO,HI = 50,400; --quick 20,120):

   - floor:   ``sh -c 'while ...; do sh -c false; sh -c true; done'``, the
              bare cost of spawning the two commands;
   - harness: a minimal Python loop harness written here (fork, exec, wait
              for each command, append one JSON line per iteration);
   - cli:     ``pytest-loops run --verify false --revise true`` with every
              default on (.tine, lessons, suspects, protection, run log);
   - cli --no-tine; cli --no-tine --lessons off --no-suspects;
   - with ``--baseline-cli PATH``: the defaults and --no-tine arms of an older
     build too (an executable running it), for before -> after figures.

   Each cli run starts in a fresh empty directory, as a first run would.
   .tine cost = cli - cli --no-tine, per iteration and in peak RSS per iteration.
2. Big trees (10,000 and 100,000 small files; --quick: 10,000; LO,HI = 5,25,
   --quick 3,13): the default cli with ``--cwd TREE`` (run log and artifacts
   outside the tree, so every run sees the same tree), a one-file tree, and the
   floor. Per-iteration cost over the floor is the target; the first iteration
   (the loop start: the tree is walked and guarded files copied to a private
   store) is ``T(LO) tree - T(LO) one-file tree``, reported on its own line.

Trees go to ``--tmp`` (default /dev/shm when writable) and, through ``TMPDIR``,
so do the guard's private stores; everything is removed at the end. Always exits
0: it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_protect import build_tree, default_tmp, fs_type  # noqa: E402
from benchlib import (  # noqa: E402
    Sample,
    Table,
    console_script,
    interleaved,
    machine_line,
    mb,
    med,
    ms,
    run_timed,
)

MAX_ITER_EXIT = 2
TARGET_CLI_X_HARNESS = 1.15  # whole CLI per iteration, defaults, over the minimal harness
TARGET_RSS_MB = 30.0  # peak RSS of the CLI at 400 iterations
TARGET_TINE_MS = 0.5  # .tine per iteration
TARGET_TINE_KB = 5.0  # .tine memory per iteration
TARGET_TREE_MS = {10_000: 10.0, 100_000: 50.0}  # per iteration over the floor

HARNESS_SCRIPT = """\
import json, os, sys, time

def spawn(command):
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp("sh", ["sh", "-c", command])
        finally:
            os._exit(127)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

n, log = int(sys.argv[1]), sys.argv[2]
with open(log, "a") as out:
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        verify = spawn("false")
        revise = spawn("true")
        out.write(json.dumps({"iteration": i, "verify_exit": verify, "revise_exit": revise,
                              "duration_s": time.perf_counter() - t0}) + "\\n")
        out.flush()
"""

FLOOR_SH = 'i=0; while [ "$i" -lt {n} ]; do sh -c false; sh -c true; i=$((i+1)); done'

CLI_ARMS = {
    "cli": [],
    "cli --no-tine": ["--no-tine"],
    "cli --no-tine --lessons off --no-suspects": ["--no-tine", "--lessons", "off", "--no-suspects"],
}


class Workspace:
    """Fresh directories under one base, each removed after its run."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def fresh(self) -> Path:
        self.count += 1
        d = self.base / f"run-{self.count}"
        d.mkdir(parents=True)
        return d


def floor_run(n: int, ws: Workspace) -> Sample:
    d = ws.fresh()
    try:
        return run_timed(["sh", "-c", FLOOR_SH.format(n=n)], cwd=d, what="the floor")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def harness_run(script: Path, n: int, ws: Workspace) -> Sample:
    d = ws.fresh()
    try:
        sample = run_timed([sys.executable, str(script), str(n), str(d / "log.jsonl")], cwd=d,
                           what="the minimal harness")
        if len((d / "log.jsonl").read_text().splitlines()) != n:
            raise SystemExit("error: the minimal harness did not log every iteration")
        return sample
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_log(log: Path, n: int, what: str) -> dict:
    summary = json.loads(log.read_text())
    if summary.get("verdict") != "MAX_ITER" or summary.get("iterations_run") != n:
        raise SystemExit(f"error: {what}: {summary.get('verdict')} after {summary.get('iterations_run')} "
                         f"iterations, expected MAX_ITER after {n}: {summary.get('reason')}")
    return summary


def cli_run(cli: str, n: int, extra: list[str], ws: Workspace) -> Sample:
    """A first run in an empty directory: the run log and artifacts land in it (the defaults)."""
    d = ws.fresh()
    try:
        argv = [cli, "run", "--verify", "false", "--revise", "true", "--max-iter", str(n),
                "--no-progress-k", "0", *extra]
        sample = run_timed(argv, cwd=d, expect=MAX_ITER_EXIT, what=f"pytest-loops run (N={n})")
        logs = sorted((d / ".pytest-loops" / "runs").glob("*.json"))
        if len(logs) != 1:
            raise SystemExit(f"error: expected one run log under {d}/.pytest-loops/runs, found {len(logs)}")
        check_log(logs[0], n, "pytest-loops run")
        if "--no-tine" not in extra and not list(logs[0].parent.glob("*.tine")):
            raise SystemExit("error: the default run wrote no .tine")
        return sample
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tree_run(cli: str, tree: Path, n: int, ws: Workspace, first: list[float],
             steady: list[float]) -> Sample:
    """The default cli on a tree; run log and artifacts outside it, so every run sees the same tree."""
    d = ws.fresh()
    try:
        log = d / "run.json"
        argv = [cli, "run", "--verify", "false", "--revise", "true", "--max-iter", str(n),
                "--no-progress-k", "0", "--cwd", str(tree), "--log", str(log),
                "--artifacts", str(d / "artifacts")]
        sample = run_timed(argv, cwd=d, expect=MAX_ITER_EXIT, what=f"pytest-loops run on {tree.name} (N={n})")
        summary = check_log(log, n, f"pytest-loops run on {tree.name}")
        first.append(summary["iterations"][0]["duration_s"])
        # iterations 2..N-1: after the first (the loop start) and before the last (no revise step)
        steady.extend(it["duration_s"] for it in summary["iterations"][1:-1])
        return sample
    finally:
        shutil.rmtree(d, ignore_errors=True)


def per_iter(samples: dict[str, list[Sample]], arm: str, lo: int, hi: int,
             what: str = "seconds") -> list[float]:
    """Seconds (wall, or ``what="cpu"``) per iteration, one figure per round:
    (T(hi) - T(lo)) / (hi - lo) of that round."""
    return [(getattr(h, what) - getattr(low, what)) / (hi - lo)
            for h, low in zip(samples[f"{arm}@{hi}"], samples[f"{arm}@{lo}"], strict=True)]


def rss_per_iter(samples: dict[str, list[Sample]], arm: str, lo: int, hi: int) -> list[float]:
    """KiB of peak RSS per iteration, one figure per round."""
    return [(h.rss_kb - low.rss_kb) / (hi - lo)
            for h, low in zip(samples[f"{arm}@{hi}"], samples[f"{arm}@{lo}"], strict=True)]


def bench_trivial(cli: str, ws: Workspace, harness: Path, rounds: int, lo: int, hi: int,
                  baseline: str | None = None) -> Table:
    arms = {"floor": lambda n: floor_run(n, ws), "harness": lambda n: harness_run(harness, n, ws)}
    for name, extra in CLI_ARMS.items():
        arms[name] = lambda n, e=extra: cli_run(cli, n, e, ws)
    if baseline:  # an older build, interleaved with this one: before -> after from one run
        for name in ("cli", "cli --no-tine"):
            arms[f"baseline {name}"] = lambda n, e=CLI_ARMS[name]: cli_run(baseline, n, e, ws)
    for fn in arms.values():  # warm-up: the interpreter's and the package's files into the page cache
        fn(2)
    jobs = {f"{name}@{n}": (lambda fn=fn, n=n: fn(n)) for name, fn in arms.items() for n in (lo, hi)}
    samples = interleaved(jobs, rounds, "trivial:")
    per = {name: per_iter(samples, name, lo, hi) for name in arms}
    p = {name: med(v) for name, v in per.items()}

    table = Table(f"Trivial commands: verify `false`, revise `true`, per iteration = (T({hi}) - T({lo})) / "
                  f"{hi - lo}, median of {rounds} interleaved rounds")
    table.add("floor: sh -c false; sh -c true", ms(p["floor"]))
    table.add("minimal Python harness", ms(p["harness"]), f"floor {ms(p['floor'])}", p["harness"] / p["floor"])
    for name in CLI_ARMS:
        x_harness = med([c / h for c, h in zip(per[name], per["harness"], strict=True)])
        table.add(f"pytest-loops run, {name[4:] or 'defaults'}", ms(p[name]),
                  f"harness {ms(p['harness'])}", x_harness,
                  f"<= {TARGET_CLI_X_HARNESS}x harness" if name == "cli" else "",
                  x_harness <= TARGET_CLI_X_HARNESS if name == "cli" else None)
        table.add("  same, over the floor", ms(p[name] - p["floor"]), f"floor {ms(p['floor'])}",
                  p[name] / p["floor"])
    tine = med([a - b for a, b in zip(per["cli"], per["cli --no-tine"], strict=True)])
    table.add(".tine provenance (cli - cli --no-tine)", ms(tine), "", None,
              f"<= {TARGET_TINE_MS} ms/iter", tine * 1000 <= TARGET_TINE_MS)
    cpu = {name: per_iter(samples, name, lo, hi, "cpu") for name in arms}
    c = {name: med(v) for name, v in cpu.items()}
    table.add("CPU: floor", ms(c["floor"]))
    table.add("CPU: minimal Python harness", ms(c["harness"]), f"floor {ms(c['floor'])}", c["harness"] / c["floor"])
    for name in CLI_ARMS:
        x_harness = med([a / b for a, b in zip(cpu[name], cpu["harness"], strict=True)])
        table.add(f"CPU: pytest-loops run, {name[4:] or 'defaults'}", ms(c[name]), f"harness {ms(c['harness'])}",
                  x_harness, f"<= {TARGET_CLI_X_HARNESS}x harness" if name == "cli" else "",
                  x_harness <= TARGET_CLI_X_HARNESS if name == "cli" else None)
    tine_cpu = med([a - b for a, b in zip(cpu["cli"], cpu["cli --no-tine"], strict=True)])
    table.add("CPU: .tine provenance (cli - cli --no-tine)", ms(tine_cpu), "", None,
              f"<= {TARGET_TINE_MS} ms/iter", tine_cpu * 1000 <= TARGET_TINE_MS)
    grow = {name: med(rss_per_iter(samples, name, lo, hi)) for name in CLI_ARMS}
    tine_kb = med([a - b for a, b in zip(rss_per_iter(samples, "cli", lo, hi),
                                         rss_per_iter(samples, "cli --no-tine", lo, hi), strict=True)])
    table.add(".tine memory per iteration (peak RSS growth)", f"{tine_kb:.2f} KB", "", None,
              f"<= {TARGET_TINE_KB:g} KB/iter", tine_kb <= TARGET_TINE_KB)
    for name in CLI_ARMS:
        peak = med([s.rss_kb for s in samples[f"{name}@{hi}"]])
        harness_peak = med([s.rss_kb for s in samples[f"harness@{hi}"]])
        is_default = name == "cli"
        table.add(f"peak RSS at {hi} iterations, {name[4:] or 'defaults'}", mb(peak),
                  f"harness {mb(harness_peak)}", peak / harness_peak,
                  f"<= {TARGET_RSS_MB:g} MB at 400 iter" if is_default else "",
                  (peak / 1024 <= TARGET_RSS_MB) if is_default and hi >= 400 else None)
        table.add(f"  peak RSS growth per iteration, {name[4:] or 'defaults'}", f"{grow[name]:.2f} KB")
    if baseline:
        for name in ("cli", "cli --no-tine"):
            before = f"baseline {name}"
            label = name[4:] or "defaults"
            table.add(f"CPU: baseline build, {label}", ms(c[before]), f"this build {ms(c[name])}",
                      med([b / a for a, b in zip(cpu[name], cpu[before], strict=True)]))
            table.add(f"peak RSS at {hi} iterations, baseline build, {label}",
                      mb(med([s.rss_kb for s in samples[f"{before}@{hi}"]])),
                      f"this build {mb(med([s.rss_kb for s in samples[f'{name}@{hi}']]))}")
        before_tine = med([a - b for a, b in zip(cpu["baseline cli"], cpu["baseline cli --no-tine"],
                                                 strict=True)])
        table.add("CPU: .tine provenance, baseline build", ms(before_tine), f"this build {ms(tine_cpu)}",
                  before_tine / tine_cpu if tine_cpu > 0 else None)
        before_kb = med([a - b for a, b in zip(rss_per_iter(samples, "baseline cli", lo, hi),
                                               rss_per_iter(samples, "baseline cli --no-tine", lo, hi),
                                               strict=True)])
        table.add(".tine memory per iteration, baseline build", f"{before_kb:.2f} KB",
                  f"this build {tine_kb:.2f} KB")
    print(table.render())
    print("\nrounds, ms per iteration: " + "; ".join(
        f"{name} " + ", ".join(f"{v * 1000:.2f}" for v in vals) for name, vals in per.items()))
    print("rounds, CPU ms per iteration: " + "; ".join(
        f"{name} " + ", ".join(f"{v * 1000:.2f}" for v in vals) for name, vals in cpu.items()))
    print("whole runs, median seconds: " + "; ".join(
        f"{key} {med([s.seconds for s in vals]):.3f}" for key, vals in samples.items()))
    if hi < 400:
        print(f"(peak RSS target is for 400 iterations; this run stops at {hi}: not judged)")
    return table


def bench_trees(cli: str, ws: Workspace, trees: dict[int, Path], empty: Path, rounds: int,
                lo: int, hi: int, baseline: str | None = None) -> Table:
    table = Table(f"Big trees: the default cli with --cwd TREE, per iteration = (T({hi}) - T({lo})) / "
                  f"{hi - lo}, median of {rounds} interleaved rounds")
    for size, tree in trees.items():
        first: dict[str, list[float]] = {"empty": [], "tree": [], "base": []}
        steady: dict[str, list[float]] = {"empty": [], "tree": [], "base": []}
        arms = {"floor": lambda n: floor_run(n, ws),
                "empty": lambda n, f=first, s=steady: tree_run(cli, empty, n, ws, f["empty"], s["empty"]),
                "tree": lambda n, t=tree, f=first, s=steady: tree_run(cli, t, n, ws, f["tree"], s["tree"])}
        if baseline:
            arms["base"] = lambda n, t=tree, f=first, s=steady: tree_run(baseline, t, n, ws, f["base"], s["base"])
        arms["floor"](lo)
        arms["empty"](lo)
        for values in (*first.values(), *steady.values()):
            values.clear()
        jobs = {f"{name}@{n}": (lambda fn=fn, n=n: fn(n)) for name, fn in arms.items() for n in (lo, hi)}
        samples = interleaved(jobs, rounds, f"{size:,} files:")
        per = {name: per_iter(samples, name, lo, hi) for name in arms}
        over_floor = med([t - f for t, f in zip(per["tree"], per["floor"], strict=True)])
        over_empty = med([t - e for t, e in zip(per["tree"], per["empty"], strict=True)])
        start = med([t.seconds - e.seconds for t, e in zip(samples[f"tree@{lo}"], samples[f"empty@{lo}"],
                                                              strict=True)])
        target = TARGET_TREE_MS.get(size)
        table.add(f"{size:,} files: per iteration", ms(med(per["tree"])), f"floor {ms(med(per['floor']))}",
                  med(per["tree"]) / med(per["floor"]))
        table.add(f"{size:,} files: over the floor", ms(over_floor), "", None,
                  "" if target is None else f"<= {target:g} ms/iter",
                  None if target is None else over_floor * 1000 <= target)
        cpu = {name: per_iter(samples, name, lo, hi, "cpu") for name in arms}
        cpu_over = med([t - f for t, f in zip(cpu["tree"], cpu["floor"], strict=True)])
        table.add(f"{size:,} files: CPU per iteration over the floor", ms(cpu_over),
                  f"floor CPU {ms(med(cpu['floor']))}", None,
                  "" if target is None else f"<= {target:g} ms/iter",
                  None if target is None else cpu_over * 1000 <= target)
        table.add(f"{size:,} files: over a one-file tree", ms(over_empty),
                  f"one-file tree {ms(med(per['empty']))}", med(per["tree"]) / med(per["empty"]))
        in_log = med(steady["tree"]) - med(steady["empty"])
        table.add(f"{size:,} files: over a one-file tree, from the run logs", ms(in_log),
                  f"one-file tree {ms(med(steady['empty']))}", med(steady["tree"]) / med(steady["empty"]),
                  "" if target is None else f"<= {target:g} ms/iter",
                  None if target is None else in_log * 1000 <= target)
        table.add(f"{size:,} files: first iteration, one time (T({lo}) tree - one-file)", f"{start:.3f} s")
        table.add(f"{size:,} files: first iteration in the run log (duration_s)",
                  f"{med(first['tree']):.3f} s", f"one-file {med(first['empty']):.3f} s")
        table.add(f"{size:,} files: peak RSS at {hi} iterations", mb(med([s.rss_kb for s in samples[f'tree@{hi}']])),
                  f"one-file {mb(med([s.rss_kb for s in samples[f'empty@{hi}']]))}")
        if baseline:
            base_first, base_cpu = med(first["base"]), med(cpu["base"])
            table.add(f"{size:,} files: baseline build, first iteration in the run log", f"{base_first:.3f} s",
                      f"this build {med(first['tree']):.3f} s", base_first / max(med(first["tree"]), 1e-9))
            table.add(f"{size:,} files: baseline build, whole run at N={lo} (wall)",
                      f"{med([x.seconds for x in samples[f'base@{lo}']]):.3f} s",
                      f"this build {med([x.seconds for x in samples[f'tree@{lo}']]):.3f} s")
            table.add(f"{size:,} files: baseline build, CPU per iteration over the floor",
                      ms(base_cpu - med(cpu["floor"])), f"this build {ms(cpu_over)}")
        print(f"{size:,} files, rounds, ms per iteration: " + "; ".join(
            f"{name} " + ", ".join(f"{v * 1000:.1f}" for v in vals) for name, vals in per.items()))
    print(table.render())
    return table


def file_creation_us(where: Path, count: int = 300) -> float:
    """CPU microseconds (user + system) to create one empty file in ``where``: file systems
    differ by factors here, and the harness this CLI is compared with creates no file."""
    d = Path(tempfile.mkdtemp(prefix="creation-", dir=where))
    try:
        before = os.times()
        for i in range(count):
            os.close(os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        after = os.times()
        return (after.user + after.system - before.user - before.system) / count * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pair(text: str, flag: str) -> tuple[int, int]:
    try:
        lo, hi = (int(s) for s in text.split(","))
    except ValueError:
        raise SystemExit(f"error: {flag} takes two integers LO,HI, e.g. {flag} 50,400") from None
    if not 1 <= lo < hi:
        raise SystemExit(f"error: {flag} needs 1 <= LO < HI, got {text}")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 20,120 iterations, the 10,000-file tree only, 3,13 iterations there")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick 3)")
    parser.add_argument("--iters", default=None, help="LO,HI for trivial commands (50,400; --quick 20,120)")
    parser.add_argument("--sizes", default=None, help="tree sizes (10000,100000; --quick 10000)")
    parser.add_argument("--tree-iters", default=None, help="LO,HI on the trees (5,25; --quick 3,13)")
    parser.add_argument("--tree-rounds", type=int, default=None, help="rounds on the trees (default: --rounds)")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated: trivial,trees")
    parser.add_argument("--tmp", default=None, help="where the trees go (default /dev/shm if writable)")
    parser.add_argument("--baseline-cli", default=None, metavar="PATH",
                        help="an older build's pytest-loops executable: its defaults and --no-tine arms, "
                             "and its default arm on the trees, "
                             "run interleaved with this build's, for before -> after figures from one run")
    args = parser.parse_args(argv)
    q = args.quick
    rounds = args.rounds or (3 if q else 5)
    lo, hi = pair(args.iters or ("20,120" if q else "50,400"), "--iters")
    tlo, thi = pair(args.tree_iters or ("3,13" if q else "5,25"), "--tree-iters")
    tree_rounds = args.tree_rounds or rounds
    try:
        sizes = [int(s) for s in (args.sizes or ("10000" if q else "10000,100000")).split(",") if s]
    except ValueError:
        parser.error("--sizes takes comma-separated integers")
    if rounds < 1 or tree_rounds < 1 or not sizes or min(sizes) < 1:
        parser.error("--rounds and sizes must be >= 1")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    cli = console_script("pytest-loops")
    print(f"{machine_line()}\n{cli}")
    began = time.perf_counter()
    disk = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    where = os.path.realpath(args.tmp or default_tmp())
    mem = Path(tempfile.mkdtemp(prefix="bench-cli-trees-", dir=where))
    saved = os.environ.get("TMPDIR")
    try:
        harness = disk / "harness.py"
        harness.write_text(HARNESS_SCRIPT)
        if "trivial" not in skip:
            print(f"trivial commands run in fresh directories under {disk} ({fs_type(str(disk))}); "
                  f"creating a file there costs {file_creation_us(disk):.0f} us of CPU (the harness creates "
                  "none; a loop's iteration creates 4: its prompt, failure and two output files; "
                  "set TMPDIR to run them elsewhere)")
            bench_trivial(cli, Workspace(disk / "runs"), harness, rounds, lo, hi, args.baseline_cli)
        if "trees" not in skip:
            private = mem / "tmp"
            private.mkdir()
            os.environ["TMPDIR"] = str(private)  # the runs' private stores and clean rooms
            empty = mem / "one-file"
            empty.mkdir()
            (empty / "README.txt").write_text("one file\n")
            trees = {}
            for size in sorted(set(sizes)):
                t0 = time.perf_counter()
                count = build_tree(mem / f"tree-{size}", size)
                trees[size] = mem / f"tree-{size}"
                print(f"\ntree of {count:,} files under {where} ({fs_type(where)}) built in "
                      f"{time.perf_counter() - t0:.1f} s")
            bench_trees(cli, Workspace(mem / "runs"), trees, empty, tree_rounds, tlo, thi, args.baseline_cli)
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(mem, ignore_errors=True)
    print(f"\n(took {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The whole CLI a user runs, as a process, against the least a loop can cost.

    python benchmarks/bench_cli.py [--quick] [--rounds R] [--iters LO,HI] [--dirs D1,D2]
                                   [--mem-iters LO,HI] [--sizes 10000,100000]
                                   [--tree-iters LO,HI] [--skip trivial,memory,trees]
                                   [--tmp DIR] [--loop-runner SCRIPT] [--baseline-cli PATH]

Every arm is a whole process (spawn to reap, wall clock and CPU of the process
tree; peak RSS from ``os.wait4``) and every loop runs ``false`` as its check and
``true`` as its revise step, ``--max-iter N --no-progress-k 0``. The cost of one
iteration is ``(T(HI) - T(LO)) / (HI - LO)`` taken within one round, so process
start-up and the one-time loop start cancel; arms are interleaved and the
medians of the rounds are reported (the machines here are shared: compare
figures of one run only). The pytest arms are in bench_pytest.py.

1. Trivial commands (LO,HI = 50,400; --quick 20,120), once in /dev/shm (tmpfs:
   target <= 1.5x the harness) and once in $TMPDIR or /tmp (a disk: <= 2.0x):

   - floor:   ``sh -c 'while ...; do sh -c false; sh -c true; done'``;
   - harness: a plain ``subprocess.run`` loop in a Python process of its own
              (both commands through ``sh -c``, one JSON line per iteration);
   - loop-runner: its ``run`` command, when ``--loop-runner SCRIPT`` is given;
   - cli:     ``pytest-loops run --sandbox none`` with every other default on
              (.tine, lessons, suspects, protection, run log): the target's arm;
   - the same without .tine, without the lessons page, without suspects: what
     each costs is the difference of two arms;
   - cli with the default sandbox (bubblewrap where it works), beside it.
2. Memory (--mem-iters 400,2000): peak RSS of ``pytest-loops run --sandbox none``
   at 2,000 iterations against ``python -c 'import opentine'`` (target: + 15 MB),
   its growth per iteration from 400 to 2,000 (target <= 1 KB), and the .tine's
   memory (defaults - --no-tine, peak) against opentine's own save of the same
   steps in a process of its own.
3. Big trees (10,000 and 100,000 small files; --quick: 10,000; LO,HI = 5,25,
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
import subprocess
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
TARGET_X_HARNESS_TMPFS = 1.5  # whole CLI per iteration, --sandbox none, over the minimal harness, tmpfs
TARGET_X_HARNESS_EXT4 = 2.0  # the same where creating a file costs (ext4)
TARGET_RSS_OVER_FLOOR_MB = 15.0  # peak RSS at 2,000 iterations over `import opentine`
TARGET_GROWTH_KB = 1.0  # peak RSS growth per iteration, 400 -> 2,000
TARGET_TREE_MS = {10_000: 10.0, 100_000: 50.0}  # per iteration over the floor

HARNESS_SCRIPT = """\
import json, subprocess, sys, time

n, log = int(sys.argv[1]), sys.argv[2]
with open(log, "a") as out:
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        verify = subprocess.run("false", shell=True).returncode
        revise = subprocess.run("true", shell=True).returncode
        out.write(json.dumps({"iteration": i, "verify_exit": verify, "revise_exit": revise,
                              "duration_s": time.perf_counter() - t0}) + "\\n")
        out.flush()
"""

FLOOR_SH = 'i=0; while [ "$i" -lt {n} ]; do sh -c false; sh -c true; i=$((i+1)); done'

# The target is judged on the loop without a kernel sandbox (--sandbox none): the
# contract's own cost. The default (bubblewrap where it works) is measured beside it.
NO_SANDBOX = ["--sandbox", "none"]
CLI_ARMS = {
    "cli": NO_SANDBOX,
    "cli --no-tine": [*NO_SANDBOX, "--no-tine"],
    "cli --no-tine --lessons off": [*NO_SANDBOX, "--no-tine", "--lessons", "off"],
    "cli --no-tine --lessons off --no-suspects": [*NO_SANDBOX, "--no-tine", "--lessons", "off", "--no-suspects"],
    "cli, default sandbox": [],
}
TARGET_ARM = "cli"


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


def loop_runner_run(script: str, n: int, ws: Workspace) -> Sample:
    """The loop-runner reference (its own ``run`` command), when its script is given."""
    d = ws.fresh()
    try:
        argv = [sys.executable, script, "run", "--verify", "false", "--revise", "true", "--max-iter", str(n),
                "--no-progress-k", "0", "--log", str(d / "run.json")]
        return run_timed(argv, cwd=d, expect=MAX_ITER_EXIT, what=f"loop-runner (N={n})")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_trivial(cli: str, ws: Workspace, harness: Path, rounds: int, lo: int, hi: int,
                  baseline: str | None = None, loop_runner: str | None = None, where: str = "",
                  target: float = TARGET_X_HARNESS_TMPFS) -> Table:
    arms = {"floor": lambda n: floor_run(n, ws), "harness": lambda n: harness_run(harness, n, ws)}
    if loop_runner:
        arms["loop-runner"] = lambda n: loop_runner_run(loop_runner, n, ws)
    for name, extra in CLI_ARMS.items():
        arms[name] = lambda n, e=extra: cli_run(cli, n, e, ws)
    if baseline:  # an older build, interleaved with this one: before -> after from one run
        for name in ("cli", "cli --no-tine"):
            arms[f"baseline {name}"] = lambda n, e=CLI_ARMS[name]: cli_run(baseline, n, e, ws)
    for fn in arms.values():  # warm-up: the interpreter's and the package's files into the page cache
        fn(2)
    jobs = {f"{name}@{n}": (lambda fn=fn, n=n: fn(n)) for name, fn in arms.items() for n in (lo, hi)}
    samples = interleaved(jobs, rounds, f"trivial {where}:")
    wall = {name: per_iter(samples, name, lo, hi) for name in arms}
    cpu = {name: per_iter(samples, name, lo, hi, "cpu") for name in arms}

    table = Table(f"Trivial commands in {where}: verify `false`, revise `true`, per iteration = "
                  f"(T({hi}) - T({lo})) / {hi - lo}, median of {rounds} interleaved rounds")
    for label, per in (("wall", wall), ("CPU", cpu)):
        p = {name: med(v) for name, v in per.items()}
        table.add(f"{label}: floor: sh -c false; sh -c true", ms(p["floor"]))
        table.add(f"{label}: minimal harness (subprocess.run)", ms(p["harness"]), f"floor {ms(p['floor'])}",
                  p["harness"] / p["floor"])
        if loop_runner:
            table.add(f"{label}: loop-runner", ms(p["loop-runner"]), f"harness {ms(p['harness'])}",
                      med([c / h for c, h in zip(per["loop-runner"], per["harness"], strict=True)]))
        for name in CLI_ARMS:
            x_harness = med([c / h for c, h in zip(per[name], per["harness"], strict=True)])
            judged = name == TARGET_ARM
            shown = name[4:].lstrip(", ") or "--sandbox none"
            table.add(f"{label}: pytest-loops run, {shown}", ms(p[name]), f"harness {ms(p['harness'])}",
                      x_harness, f"<= {target:g}x harness" if judged else "",
                      x_harness <= target if judged else None)
        steps = [("cli", "cli --no-tine", ".tine provenance"),
                 ("cli --no-tine", "cli --no-tine --lessons off", "lessons page"),
                 ("cli --no-tine --lessons off", "cli --no-tine --lessons off --no-suspects", "suspects"),
                 ("cli, default sandbox", "cli", "the kernel sandbox (default tier)")]
        for more, less, what in steps:
            table.add(f"{label}: {what} (difference)", ms(med([a - b for a, b in zip(per[more], per[less],
                                                                                  strict=True)])))
    for name in ("cli", "cli --no-tine"):
        table.add(f"peak RSS at {hi} iterations, {name[4:] or '--sandbox none'}",
                  mb(med([s.rss_kb for s in samples[f"{name}@{hi}"]])),
                  f"harness {mb(med([s.rss_kb for s in samples[f'harness@{hi}']]))}")
    if baseline:
        for name in ("cli", "cli --no-tine"):
            before = f"baseline {name}"
            table.add(f"CPU: baseline build, {name[4:] or '--sandbox none'}", ms(med(cpu[before])),
                      f"this build {ms(med(cpu[name]))}",
                      med([b / a for a, b in zip(cpu[name], cpu[before], strict=True)]))
    print(table.render())
    print("\nrounds, ms per iteration: " + "; ".join(
        f"{name} " + ", ".join(f"{v * 1000:.2f}" for v in vals) for name, vals in wall.items()))
    print("rounds, CPU ms per iteration: " + "; ".join(
        f"{name} " + ", ".join(f"{v * 1000:.2f}" for v in vals) for name, vals in cpu.items()))
    return table


# opentine's own save of the steps of a .tine, in a process of its own: the steps are
# read and the file forgotten, the peak reset (/proc/self/clear_refs), then a new Run
# gets the same steps and is saved. Prints the RSS before and the peak after, in KiB.
OPENTINE_SAVE = """\
import gc, json, sys, tempfile
from opentine import Run, StepKind
from opentine._artifact_io import read_artifact_json

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

data = read_artifact_json(sys.argv[1])
graph = data["graph"]
steps = [json.dumps([graph["steps"][i]["kind"], graph["steps"][i]["inputs"], graph["steps"][i]["outputs"],
                     graph["steps"][i].get("tool_info")]) for i in graph["order"]]
del data, graph
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
run = Run(metadata={"probe": True})
for text in steps:
    kind, inputs, outputs, tool = json.loads(text)
    run.add_step(StepKind(kind), inputs=inputs, outputs=outputs, tool_info=tool)
with tempfile.NamedTemporaryFile(suffix=".tine") as out:
    run.save(out.name)
print(before, status("VmHWM"))
"""


def bench_memory(cli: str, ws: Workspace, rounds: int, lo: int, hi: int) -> Table:
    """Peak RSS against the ``import opentine`` floor, its growth per iteration, and the
    .tine's memory against opentine's own save of the same steps."""
    script = ws.base / "opentine_save.py"
    ws.base.mkdir(parents=True, exist_ok=True)
    script.write_text(OPENTINE_SAVE)
    save_growth: list[float] = []

    def floor(_n: int) -> Sample:
        return run_timed([sys.executable, "-c", "import opentine"], what="import opentine")

    def tine_run(n: int) -> Sample:
        d = ws.fresh()
        try:
            sample = run_timed([cli, "run", "--verify", "false", "--revise", "true", "--max-iter", str(n),
                                "--no-progress-k", "0", *NO_SANDBOX], cwd=d, expect=MAX_ITER_EXIT,
                               what=f"pytest-loops run (N={n})")
            if n == hi:
                tine = next((d / ".pytest-loops" / "runs").glob("*.tine"))
                out = subprocess.run([sys.executable, str(script), str(tine)], capture_output=True, text=True,
                                     check=True).stdout.split()
                save_growth.append(int(out[1]) - int(out[0]))
            return sample
        finally:
            shutil.rmtree(d, ignore_errors=True)

    arms = {"floor": floor, "cli": tine_run, "cli --no-tine": lambda n: cli_run(cli, n, CLI_ARMS["cli --no-tine"], ws)}
    jobs = {"floor": lambda: floor(0)}
    jobs.update({f"{name}@{n}": (lambda fn=fn, n=n: fn(n)) for name, fn in arms.items() if name != "floor"
                 for n in (lo, hi)})
    samples = interleaved(jobs, rounds, "memory:")
    base = med([s.rss_kb for s in samples["floor"]])
    table = Table(f"Memory: peak RSS of the whole process, --sandbox none, median of {rounds} rounds")
    table.add("floor: python -c 'import opentine'", mb(base))
    for name in ("cli", "cli --no-tine"):
        peak = med([s.rss_kb for s in samples[f"{name}@{hi}"]])
        judged = name == "cli"
        table.add(f"peak RSS at {hi} iterations, {name[4:] or 'defaults'}", mb(peak), f"floor {mb(base)}",
                  None, f"<= floor + {TARGET_RSS_OVER_FLOOR_MB:g} MB" if judged else "",
                  (peak - base) / 1024 <= TARGET_RSS_OVER_FLOOR_MB if judged else None)
        grow = med(rss_per_iter(samples, name, lo, hi))
        table.add(f"  growth per iteration {lo} -> {hi}, {name[4:] or 'defaults'}", f"{grow:.2f} KB", "", None,
                  f"<= {TARGET_GROWTH_KB:g} KB" if judged else "", grow <= TARGET_GROWTH_KB if judged else None)
    tine_kb = med([(a.rss_kb - b.rss_kb) for a, b in zip(samples[f"cli@{hi}"], samples[f"cli --no-tine@{hi}"],
                                                          strict=True)])
    own = med(save_growth)
    table.add(f".tine memory at {hi} iterations (defaults - --no-tine, peak)", mb(tine_kb),
              f"opentine's own save of the same steps {mb(own)}", tine_kb / own if own > 0 else None,
              "<= opentine's own save", tine_kb <= own)
    print(table.render())
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
                        help="3 rounds, 20,120 iterations, the 10,000-file tree only, 3,13 iterations there, "
                             "memory at 400,2000 in one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick 3)")
    parser.add_argument("--iters", default=None, help="LO,HI for trivial commands (50,400; --quick 20,120)")
    parser.add_argument("--mem-iters", default="400,2000", help="LO,HI for the memory figures (400,2000)")
    parser.add_argument("--mem-rounds", type=int, default=None, help="rounds of the memory part (default 3; "
                        "--quick 1)")
    parser.add_argument("--sizes", default=None, help="tree sizes (10000,100000; --quick 10000)")
    parser.add_argument("--tree-iters", default=None, help="LO,HI on the trees (5,25; --quick 3,13)")
    parser.add_argument("--tree-rounds", type=int, default=None, help="rounds on the trees (default: --rounds)")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated: trivial,memory,trees")
    parser.add_argument("--tmp", default=None, help="where the trees go (default /dev/shm if writable)")
    parser.add_argument("--dirs", default=None,
                        help="where the trivial loops run, comma-separated (default: /dev/shm, a tmpfs, and "
                             "$TMPDIR or /tmp); each gets its own table and target")
    parser.add_argument("--loop-runner", default=os.environ.get("LOOP_RUNNER"), metavar="SCRIPT",
                        help="loop-runner.py, timed beside the harness when given (or $LOOP_RUNNER)")
    parser.add_argument("--baseline-cli", default=None, metavar="PATH",
                        help="an older build's pytest-loops executable: its defaults and --no-tine arms, "
                             "and its default arm on the trees, "
                             "run interleaved with this build's, for before -> after figures from one run")
    args = parser.parse_args(argv)
    q = args.quick
    rounds = args.rounds or (3 if q else 5)
    lo, hi = pair(args.iters or ("20,120" if q else "50,400"), "--iters")
    mlo, mhi = pair(args.mem_iters, "--mem-iters")
    mem_rounds = args.mem_rounds or (1 if q else 3)
    tlo, thi = pair(args.tree_iters or ("3,13" if q else "5,25"), "--tree-iters")
    tree_rounds = args.tree_rounds or rounds
    try:
        sizes = [int(s) for s in (args.sizes or ("10000" if q else "10000,100000")).split(",") if s]
    except ValueError:
        parser.error("--sizes takes comma-separated integers")
    if rounds < 1 or tree_rounds < 1 or mem_rounds < 1 or not sizes or min(sizes) < 1:
        parser.error("--rounds and sizes must be >= 1")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.loop_runner and not os.path.isfile(args.loop_runner):
        parser.error(f"--loop-runner {args.loop_runner}: no such file")

    cli = console_script("pytest-loops")
    print(f"{machine_line()}\n{cli}")
    began = time.perf_counter()
    if args.dirs:
        dirs = [d for d in args.dirs.split(",") if d]
    else:
        dirs = [d for d in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(d) and os.access(d, os.W_OK)]
    made = [Path(tempfile.mkdtemp(prefix="bench-cli-", dir=d)) for d in dirs]
    where = os.path.realpath(args.tmp or default_tmp())
    mem = Path(tempfile.mkdtemp(prefix="bench-cli-trees-", dir=where))
    saved = os.environ.get("TMPDIR")
    try:
        harness = made[0] / "harness.py"
        harness.write_text(HARNESS_SCRIPT)
        if "trivial" not in skip:
            for disk in made:
                kind = fs_type(str(disk))
                print(f"\ntrivial commands run in fresh directories under {disk} ({kind}); creating a file "
                      f"there costs {file_creation_us(disk):.0f} us of CPU (the harness creates none; a loop's "
                      "iteration creates its prompt, failure, context and two output files)")
                target = TARGET_X_HARNESS_TMPFS if kind == "tmpfs" else TARGET_X_HARNESS_EXT4
                bench_trivial(cli, Workspace(disk / "runs"), harness, rounds, lo, hi, args.baseline_cli,
                              args.loop_runner, f"{disk} ({kind})", target)
        if "memory" not in skip:
            bench_memory(cli, Workspace(made[0] / "mem"), mem_rounds, mlo, mhi)
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
        for disk in made:
            shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(mem, ignore_errors=True)
    print(f"\n(took {time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Protection cost on big trees: the allow-list guard, the clean room, the whole console script.

    python benchmarks/bench_protect.py [--sizes 10000,100000] [--quick] [--rounds 5]
                                       [--guard-rounds 50] [--walk-rounds 10]
                                       [--iters 5,45] [--tmp DIR] [--skip PARTS]

Generates trees of small ``.py`` files (100 per directory, ~200 bytes each, plus
a ``tests/`` directory with a few test files) in a temp dir, once per size, and
measures, all in the same run and interleaved round by round (machines here are
shared and noisy; medians of ``--rounds`` rounds):

1. The whole installed console script, as a process, wall clock:
   ``pytest-loops run --verify false --revise true --max-iter N --no-progress-k 0
   --no-tine --lessons off --no-suspects --cwd TREE -q`` for N=5 and N=45
   (``--log`` and ``--artifacts`` point outside the tree, so every run sees the
   same tree). Per-iteration cost = (T(45) - T(5)) / 40, against

   - floor: a tiny Python script that runs ``sh -c false`` then ``sh -c true``
     N times and appends one JSON line per iteration, timed the same way (the
     least any loop of two processes per iteration costs here);
   - empty: the same pytest-loops run on a tree of one file.

   tree - empty is the per-iteration cost attributable to the tree (the guard
   around every revise; the targets are <= 10 ms at 10,000 files and <= 50 ms
   at 100,000). T(5) of the tree - T(5) of the empty tree is the one-time
   loop-start cost (the first revise walks the tree and copies read-only and
   audited files into the private store).
2. ``TreeGuard`` in-process, without process start-up: ``begin()``, then per
   round ``before_revise()``, one in-scope file rewritten and one new file,
   ``after_revise()``; the guard calls are timed (not the writes), with the
   change journal (default) and walking (``journal=False``), interleaved (the
   walking guard joins only ``--walk-rounds`` of the rounds: it walks the whole
   tree twice per round).
3. The clean-room confirmation on the 10,000-file tree: a loop whose check
   imports a buggy ``calc.py`` at the tree root and whose revise fixes it (SUCCESS
   in iteration 2, confirmed in a clean room). From the run log: ``clean_room_s``
   of the last iteration and the ``duration_s`` of its check in the working tree;
   the confirmation overhead is their difference (target: <= 1 s). The same loop
   on a tree of only ``calc.py`` is the baseline.

The trees, and through ``TMPDIR`` the guard's private store and the clean rooms,
go to ``--tmp`` (default: /dev/shm when writable, else the system temp dir): the
loop start and the clean room copy every file of the tree, and on a shared disk
file creation alone can cost milliseconds a file. The header prints what creating
a file costs there and in the system temp dir, so the figures can be scaled.
``--quick`` (the 10,000-file tree only) takes a few minutes; the 100,000-file
tree takes as long as the guard's cost on it, which the run measures.

Always exits 0: it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_loops.runtime.protect import TreeGuard  # noqa: E402

PY = shlex.quote(sys.executable)
FILES_PER_DIR = 100
FILE_BYTES = 200
TARGET_ITER_MS = {10_000: 10.0, 100_000: 50.0}  # per-iteration protection cost, by tree size
TARGET_CLEAN_ROOM_S = 1.0  # clean-room confirmation overhead on the 10,000-file tree
MAX_ITER_EXIT = 2

FLOOR_SCRIPT = """\
import json, subprocess, sys, time
n, log = int(sys.argv[1]), sys.argv[2]
with open(log, "a") as out:
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        verify = subprocess.run(["sh", "-c", "false"]).returncode
        revise = subprocess.run(["sh", "-c", "true"]).returncode
        out.write(json.dumps({"iter": i, "verify_exit": verify, "revise_exit": revise,
                              "duration_s": time.perf_counter() - t0}) + "\\n")
        out.flush()
"""

BUGGY_CALC = "def add(a, b):\n    return a - b\n"
# A different size from the buggy one: a bytecode cache keyed on mtime and size
# can never mistake one for the other.
FIXED_CALC = "def add(a, b):\n    total = a + b\n    return total\n"
FIX_SCRIPT = f"""\
with open("calc.py", "w") as f:
    f.write({FIXED_CALC!r})
"""
CALC_CHECK = f"{PY} -c \"import calc, sys; sys.exit(0 if calc.add(2, 3) == 5 else 1)\""

TEST_FILE = """\
from pkg0000 import mod00


def test_value():
    assert mod00.VALUE == 0
"""


def module_text(i: int) -> bytes:
    head = f'"""Module {i}."""\n\nVALUE = {i}\n\n\ndef value_{i}(x):\n    return x + VALUE\n'
    return (head + "#" * max(0, FILE_BYTES - len(head) - 1) + "\n").encode()


def build_tree(root: Path, files: int) -> int:
    """``files`` small .py files, ``FILES_PER_DIR`` per directory, plus tests/."""
    root.mkdir(parents=True)
    count = 0
    for d in range((files + FILES_PER_DIR - 1) // FILES_PER_DIR):
        pkg = root / f"pkg{d:04d}"
        pkg.mkdir()
        for j in range(min(FILES_PER_DIR, files - d * FILES_PER_DIR)):
            fd = os.open(pkg / f"mod{j:02d}.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, module_text(d * FILES_PER_DIR + j))
            finally:
                os.close(fd)
            count += 1
    tests = root / "tests"
    tests.mkdir()
    for k in range(3):
        (tests / f"test_mod{k}.py").write_text(TEST_FILE)
        count += 1
    return count


def console_script() -> str:
    beside = Path(sys.executable).parent / "pytest-loops"
    if beside.exists():
        return str(beside)
    found = shutil.which("pytest-loops")
    if not found:
        raise SystemExit("error: the pytest-loops console script is not installed")
    return found


def run_process(argv: list[str], expect: int, what: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.perf_counter() - start
    if proc.returncode != expect:
        raise SystemExit(f"error: {what} exited {proc.returncode}, expected {expect}:\n{proc.stdout[-2000:]}")
    return took


class Scratch:
    """Run logs and artifacts outside the trees, removed after each run."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def paths(self) -> tuple[Path, Path]:
        self.count += 1
        d = self.base / f"run-{self.count}"
        d.mkdir(parents=True)
        return d / "run.json", d / "artifacts"

    def drop(self, log: Path) -> None:
        shutil.rmtree(log.parent, ignore_errors=True)


def steady_iterations(summary: dict) -> list[float]:
    """``duration_s`` of the iterations after the first (which fills the store) and
    before the last (which runs no revise step)."""
    return [it["duration_s"] for it in summary["iterations"][1:-1]]


def loop_run(cli: str, tree: Path, n: int, scratch: Scratch, logged: list[float] | None = None) -> float:
    log, artifacts = scratch.paths()
    argv = [cli, "run", "--verify", "false", "--revise", "true", "--max-iter", str(n),
            "--no-progress-k", "0", "--no-tine", "--lessons", "off", "--no-suspects",
            "--cwd", str(tree), "-q", "--log", str(log), "--artifacts", str(artifacts)]
    try:
        took = run_process(argv, MAX_ITER_EXIT, f"pytest-loops run on {tree.name} (N={n})")
        summary = json.loads(log.read_text())
        if summary.get("iterations_run") != n or summary.get("verdict") != "MAX_ITER":
            raise SystemExit(f"error: unexpected run on {tree.name}: {summary.get('verdict')} "
                             f"after {summary.get('iterations_run')}: {summary.get('reason')}")
        if logged is not None:
            logged.extend(steady_iterations(summary))
        return took
    finally:
        scratch.drop(log)


def floor_run(script: Path, n: int, scratch: Scratch) -> float:
    log, _ = scratch.paths()
    try:
        took = run_process([sys.executable, str(script), str(n), str(log)], 0, "the floor script")
        if len(log.read_text().splitlines()) != n:
            raise SystemExit("error: the floor script did not log every iteration")
        return took
    finally:
        scratch.drop(log)


def default_tmp() -> str:
    """Memory (/dev/shm) when there is one: a tree of 100,000 files is written, copied
    into the store and into clean rooms many times over, which on a shared disk takes
    far longer than the guard's own work."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def fs_type(path: str) -> str:
    """The file system a path is on, from /proc/mounts (Linux), else "?"."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def create_cost(directory: str, files: int = 300) -> float:
    """Seconds per small file created (and written) in a fresh directory there."""
    probe = tempfile.mkdtemp(prefix="bench-protect-probe-", dir=directory)
    try:
        data = b"x" * FILE_BYTES
        t0 = time.perf_counter()
        for i in range(files):
            fd = os.open(os.path.join(probe, f"f{i}.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return (time.perf_counter() - t0) / files
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def progress(message: str) -> None:
    """Where it is, on a terminal only (the report on stdout stays clean)."""
    if sys.stderr.isatty():
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def med(values: list[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def verdict_word(value: float, target: float) -> str:
    return "within target" if value <= target else "over target"


def target_for(size: int) -> float | None:
    return TARGET_ITER_MS.get(size)


# --- 1. the whole console script -------------------------------------------------------


def bench_cli(cli: str, trees: dict[int, Path], empty: Path, floor: Path, scratch: Scratch,
              rounds: int, n_lo: int, n_hi: int) -> None:
    span = n_hi - n_lo
    print(f"\n== 1. pytest-loops run as a process: per-iteration cost = (T({n_hi}) - T({n_lo})) / {span}, "
          f"median of {rounds} interleaved rounds ==")
    print("floor: a Python script running `sh -c false` + `sh -c true` per iteration and logging a JSON line;")
    print("empty: pytest-loops on a one-file tree; tree - empty: the part that grows with the tree;")
    print(f"loop start: T({n_lo}) tree - T({n_lo}) empty (the first revise walks the tree and fills the "
          "private store)")
    for size, tree in trees.items():
        logged: dict[str, list[float]] = {"empty": [], "tree": []}
        variants = {"floor": lambda n: floor_run(floor, n, scratch),
                    "empty": lambda n, lg=logged: loop_run(cli, empty, n, scratch, lg["empty"]),
                    "tree": lambda n, t=tree, lg=logged: loop_run(cli, t, n, scratch, lg["tree"])}
        # warm-up: the interpreter's and the package's files into the page cache (the
        # tree was just written: it is there already, and a run on it is costly)
        variants["floor"](n_lo)
        variants["empty"](n_lo)
        logged["empty"].clear()
        times: dict[tuple[str, int], list[float]] = {}
        jobs = [(name, n) for name in variants for n in (n_lo, n_hi)]
        for r in range(rounds):
            shift = r % len(jobs)
            order = jobs[shift:] + jobs[:shift]
            if r % 2:
                order.reverse()
            progress(f"part 1, {size:,} files: round {r + 1}/{rounds}")
            for name, n in order:
                times.setdefault((name, n), []).append(variants[name](n))
        per = {name: [(hi - lo) / span for hi, lo in zip(times[(name, n_hi)], times[(name, n_lo)], strict=True)]
               for name in variants}
        p = {name: med(v) for name, v in per.items()}
        tree_part = med([t - e for t, e in zip(per["tree"], per["empty"], strict=True)])
        start = med([t - e for t, e in zip(times[("tree", n_lo)], times[("empty", n_lo)], strict=True)])
        print(f"\n-- {size:,} files --")
        for name in variants:
            print(f"T({n_lo:2d}) {name:5s} {med(times[(name, n_lo)]):7.3f} s   "
                  f"T({n_hi:2d}) {name:5s} {med(times[(name, n_hi)]):7.3f} s")
        print(f"per iteration, floor:                {ms(p['floor'])}")
        print(f"per iteration, empty tree:           {ms(p['empty'])}   x{p['empty'] / p['floor']:.2f} floor")
        print(f"per iteration, {size:,}-file tree:{'':<{max(0, 6 - len(f'{size:,}'))}}   "
              f"{ms(p['tree'])}   x{p['tree'] / p['floor']:.2f} floor")
        target = target_for(size)
        line = f"tree - empty (protection, per iter): {ms(tree_part)}"
        if target is not None:
            line += f"   target <= {target:.0f} ms: {verdict_word(tree_part * 1000, target)}"
        print(line)
        print(f"loop start, one time (T({n_lo}) tree - empty): {start:7.3f} s")
        in_log = {name: med(values) for name, values in logged.items()}
        print(f"cross-check from the run logs, median iteration duration_s (iterations 2..N-1): "
              f"empty {ms(in_log['empty']).strip()}, tree {ms(in_log['tree']).strip()}, "
              f"difference {ms(in_log['tree'] - in_log['empty']).strip()}")
        print("rounds per iteration (ms): " + "; ".join(
            f"{name} " + ", ".join(f"{v * 1000:.1f}" for v in vals) for name, vals in per.items()))


# --- 2. TreeGuard in-process -----------------------------------------------------------


def bench_guard(trees: dict[int, Path], rounds: int, walk_rounds: int) -> None:
    stride = max(1, rounds // max(1, walk_rounds))
    print(f"\n== 2. TreeGuard in-process: before_revise() + after_revise() around one rewritten and "
          f"one new file, median of {rounds} rounds ==")
    print(f"journal: every round; walk (journal=False) joins every {stride}th round "
          f"({len(range(0, rounds, stride))} rounds; a walk of a big tree is slow), in alternating order")
    for size, tree in trees.items():
        guards = {"journal": TreeGuard(tree), "walk": TreeGuard(tree, journal=False)}
        begin: dict[str, float] = {}
        times: dict[str, list[float]] = {name: [] for name in guards}
        created: list[Path] = []
        victims = [tree / f"pkg{d:04d}" / "mod00.py" for d in range(min(rounds, size // FILES_PER_DIR))]
        originals = {v: v.read_bytes() for v in victims}
        try:
            for name, g in guards.items():
                t0 = time.perf_counter()
                g.begin()
                begin[name] = time.perf_counter() - t0
            for r in range(rounds):
                progress(f"part 2, {size:,} files: round {r + 1}/{rounds}")
                order = [(name, g) for name, g in guards.items() if name == "journal" or r % stride == 0]
                if (r // stride) % 2:
                    order.reverse()
                for name, g in order:
                    t0 = time.perf_counter()
                    g.before_revise()
                    times[name].append(time.perf_counter() - t0)
                victim = victims[r % len(victims)]
                victim.write_bytes(originals[victim] + f"# round {r}\n".encode())
                new = victim.parent / f"new_{r:03d}.py"
                new.write_text(f"ROUND = {r}\n")
                created.append(new)
                for name, g in order:
                    t0 = time.perf_counter()
                    result = g.after_revise()
                    times[name][-1] += time.perf_counter() - t0
                    seen = {rel for rel, _ in result.in_scope}
                    want = {str(victim.relative_to(tree)), str(new.relative_to(tree))}
                    if result.violations or seen != want:
                        raise SystemExit(f"error: the {name} guard saw {sorted(seen)} "
                                         f"and {result.violations}, expected {sorted(want)}")
            reason = guards["journal"].journal_reason
            walks = {name: g.walks for name, g in guards.items()}
        finally:
            for g in guards.values():
                g.close()
            for path in created:
                path.unlink(missing_ok=True)
            for victim, data in originals.items():
                victim.write_bytes(data)
        journal, walked = med(times["journal"]), med(times["walk"])
        print(f"\n-- {size:,} files --")
        print(f"begin(), journal:  {begin['journal']:7.3f} s   begin(), walk: {begin['walk']:7.3f} s"
              "   (walk the tree, copy read-only and audited files to the store)")
        print(f"per round, journal (default): {ms(journal)}   (walks: {walks['journal']}"
              f"{'' if reason is None else '; journal not used: ' + reason})")
        print(f"per round, walking:           {ms(walked)}   (walks: {walks['walk']}, "
              f"{len(times['walk'])} rounds)")
        print(f"walking / journal:            {walked / journal:8.1f}x")


# --- 3. the clean room ------------------------------------------------------------------


def calc_run(cli: str, tree: Path, fix: Path, scratch: Scratch) -> dict[str, float]:
    (tree / "calc.py").write_text(BUGGY_CALC)
    log, artifacts = scratch.paths()
    argv = [cli, "run", "--verify", CALC_CHECK, "--revise", f"{PY} {shlex.quote(str(fix))}",
            "--max-iter", "3", "--no-progress-k", "0", "--no-tine", "--lessons", "off", "--no-suspects",
            "--cwd", str(tree), "-q", "--log", str(log), "--artifacts", str(artifacts)]
    try:
        took = run_process(argv, 0, f"the calc loop on {tree.name}")
        summary = json.loads(log.read_text())
        last = summary["iterations"][-1]
        if summary.get("verdict") != "SUCCESS" or last.get("clean_room_s") is None or not last["clean_room"]:
            raise SystemExit(f"error: the calc loop on {tree.name} did not succeed through the clean room: "
                             f"{summary.get('verdict')}: {summary.get('reason')}")
        return {"whole": took, "clean_room_s": last["clean_room_s"],
                "check_s": last["checks"][0]["duration_s"],
                "room_check_s": last["clean_room"][0]["duration_s"]}
    finally:
        scratch.drop(log)
        (tree / "calc.py").write_text(BUGGY_CALC)


def bench_clean_room(cli: str, size: int, tree: Path, small: Path, fix: Path, scratch: Scratch,
                     rounds: int) -> None:
    print(f"\n== 3. clean-room confirmation (check: import calc; revise: fix calc.py), "
          f"median of {rounds} interleaved rounds ==")
    print("clean_room_s: seconds the confirmation took (build the clean room, re-run the check); "
          "check: the same check in the working tree")
    variants = {f"{size:,}-file tree": tree, "calc.py only": small}
    for path in variants.values():
        calc_run(cli, path, fix, scratch)  # warm-up
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        progress(f"part 3: round {r + 1}/{rounds}")
        for name, path in order:
            rows[name].append(calc_run(cli, path, fix, scratch))
    overhead = {}
    for name, runs in rows.items():
        room = med([x["clean_room_s"] for x in runs])
        check = med([x["check_s"] for x in runs])
        room_check = med([x["room_check_s"] for x in runs])
        overhead[name] = med([x["clean_room_s"] - x["check_s"] for x in runs])
        print(f"\n-- {name} --")
        print(f"whole loop (2 iterations, process): {med([x['whole'] for x in runs]):7.3f} s")
        print(f"clean_room_s:                       {room:7.3f} s")
        print(f"check in the working tree:          {check:7.3f} s   (in the clean room: {room_check:.3f} s)")
        line = f"confirmation overhead (room - check): {overhead[name]:7.3f} s"
        if name != "calc.py only":
            line += f"   target <= {TARGET_CLEAN_ROOM_S:g} s: {verdict_word(overhead[name], TARGET_CLEAN_ROOM_S)}"
        print(line)
        print("rounds clean_room_s: " + ", ".join(f"{x['clean_room_s']:.3f}" for x in runs))
    big, base = overhead[f"{size:,}-file tree"], overhead["calc.py only"]
    print(f"\noverhead attributable to the {size:,} files (tree - calc.py only): {big - base:7.3f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None,
                        help="tree sizes in files, comma-separated (default 10000,100000; --quick: 10000)")
    parser.add_argument("--quick", action="store_true", help="the 10,000-file tree only")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every process measurement (5)")
    parser.add_argument("--guard-rounds", type=int, default=50, help="rounds of the in-process guard (50)")
    parser.add_argument("--walk-rounds", type=int, default=10,
                        help="of those, how many the walking guard joins (10; a walk of 100,000 files "
                             "takes seconds)")
    parser.add_argument("--iters", default="5,45", help="the two --max-iter values, low,high (5,45)")
    parser.add_argument("--tmp", default=None,
                        help="directory for the trees and, through TMPDIR, the guard's store and the clean "
                             "rooms (default: /dev/shm if writable, else the system temp dir)")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated: cli,guard,cleanroom")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in (args.sizes or ("10000" if args.quick else "10000,100000")).split(",") if s]
        n_lo, n_hi = (int(s) for s in args.iters.split(","))
    except ValueError:
        parser.error("--sizes and --iters take comma-separated integers (--iters: exactly two)")
    if (not sizes or min(sizes) < 1 or args.rounds < 1 or args.guard_rounds < 1 or args.walk_rounds < 1
            or not 1 <= n_lo < n_hi):
        parser.error("sizes, --rounds, --guard-rounds and --walk-rounds must be >= 1, "
                     "and --iters low < high")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    cli = console_script()
    where = os.path.realpath(args.tmp or default_tmp())
    system_tmp = os.path.realpath(tempfile.gettempdir())
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {cli}")
    print(f"temp dir: {where} ({fs_type(where)}): trees, store and clean rooms (TMPDIR) all there; "
          f"creating a {FILE_BYTES}-byte file costs {create_cost(where) * 1000:.3f} ms here")
    if system_tmp != where:
        print(f"  (in the system temp dir {system_tmp} ({fs_type(system_tmp)}) it costs "
              f"{create_cost(system_tmp) * 1000:.3f} ms: the loop-start and clean-room figures scale "
              "with it; --tmp chooses)")
    base = Path(tempfile.mkdtemp(prefix="bench-protect-", dir=where))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    try:
        private_tmp = base / "tmp"
        private_tmp.mkdir()
        os.environ["TMPDIR"] = str(private_tmp)  # the runs' stores and clean rooms
        tempfile.tempdir = str(private_tmp)  # the in-process guards' stores
        scratch = Scratch(base / "scratch")
        floor = base / "floor.py"
        floor.write_text(FLOOR_SCRIPT)
        fix = base / "fix_calc.py"
        fix.write_text(FIX_SCRIPT)
        empty = base / "empty"
        empty.mkdir()
        (empty / "README.txt").write_text("one file\n")
        small = base / "calc-only"
        small.mkdir()
        (small / "calc.py").write_text(BUGGY_CALC)
        trees: dict[int, Path] = {}
        for size in sorted(set(sizes)):
            t0 = time.perf_counter()
            count = build_tree(base / f"tree-{size}", size)
            trees[size] = base / f"tree-{size}"
            print(f"tree of {count:,} files ({size:,} + tests/) built in {time.perf_counter() - t0:.1f} s")

        if "cli" not in skip:
            bench_cli(cli, trees, empty, floor, scratch, args.rounds, n_lo, n_hi)
        if "guard" not in skip:
            bench_guard(trees, args.guard_rounds, args.walk_rounds)
        if "cleanroom" not in skip:
            size = 10_000 if 10_000 in trees else min(trees)
            bench_clean_room(cli, size, trees[size], small, fix, scratch, args.rounds)
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: incremental state fingerprint vs re-reading every byte.

    python benchmarks/bench_fingerprint.py [--files N] [--mb M] [--repeats R]

Builds a tree of N files totalling M MB (default 10,000 files, 100 MB) in a temp
dir, with mtimes an hour old (outside the racy window). Then, in the same run and
on the same warm page cache:

* naive: sha256 of every byte of every file, in sorted path order (what a
  fingerprint without a cache costs; the tree was just written and read once
  before timing, so the naive re-read is measured warm too, never from disk);
* incremental: ``StateFingerprint.compute()`` after a warm first compute, with one
  file changed before each timed compute (files changed in the last 2 s are
  re-hashed, being inside the racy window; every other file costs one stat);
* floor: a bare os.scandir walk with one stat per file, for scale.

The methods are timed interleaved, repeat by repeat, so that load from other
processes on a shared machine hits them alike.

Prints the median of the repeats, the ratio, and whether the goals hold
(incremental < 0.1 s, ratio >= 20x). Figures are reported, not asserted: the
exit code is 0 unless the script itself fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_loops.progress import StateFingerprint  # noqa: E402

GOAL_INCREMENTAL_S = 0.1
GOAL_RATIO = 20.0


def build_tree(root: Path, files: int, total_bytes: int, seed: int = 1) -> list[Path]:
    """``files`` files in a two-level layout, sizes varying around the mean."""
    rng = random.Random(seed)
    mean = max(1, total_bytes // max(1, files))
    sizes = [rng.randint(mean // 2, mean + mean // 2) for _ in range(files)]
    scale = total_bytes / max(1, sum(sizes))
    sizes = [max(0, int(s * scale)) for s in sizes]
    block = os.urandom(max(sizes, default=0) + 4096)
    paths = []
    per_dir = 100
    for i, size in enumerate(sizes):
        d = root / f"pkg{i // (per_dir * 10):02d}" / f"mod{(i // per_dir) % 10}"
        if i % per_dir == 0:
            d.mkdir(parents=True, exist_ok=True)
        path = d / f"file{i:05d}.py"
        start = rng.randrange(4096)
        path.write_bytes(block[start : start + size])
        paths.append(path)
    then = time.time_ns() - 3600 * 1_000_000_000
    for path in paths:
        os.utime(path, ns=(then, then))
    return paths


def naive_fingerprint(root: Path) -> str:
    """Re-read every byte of every file, sorted: the cost without a cache."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            found.append(os.path.join(dirpath, name))
    outer = hashlib.sha256()
    for path in sorted(found):
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        outer.update(os.path.relpath(path, root).encode() + b"\0" + digest.encode() + b"\n")
    return "sha256:" + outer.hexdigest()


def scan_and_stat(root: Path) -> int:
    """The floor: an os.scandir walk with one stat per file and nothing else."""
    count = 0
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    entry.stat()
                    count += 1
    return count


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000, help="number of files (10000)")
    parser.add_argument("--mb", type=float, default=100.0, help="total size in MB (100)")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats per method (9)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.mb < 0 or args.repeats < 1:
        parser.error("--files and --repeats must be >= 1 and --mb >= 0")

    tmp = Path(tempfile.mkdtemp(prefix="bench-fingerprint-"))
    try:
        t_build, paths = timed(lambda: build_tree(tmp, args.files, int(args.mb * 1_000_000)))
        total = sum(p.stat().st_size for p in paths)
        print(f"tree: {len(paths)} files, {total / 1e6:.1f} MB in {tmp} (built in {t_build:.2f} s)")

        naive_fingerprint(tmp)  # warm the page cache: both methods then read from memory

        sf = StateFingerprint(tmp, ["."])
        t_cold, previous = timed(sf.compute)
        cold_stats = sf.last_stats

        # Interleaved, so a noisy neighbour slows both methods alike.
        rng = random.Random(2)
        naive_times, floor_times, incremental_times, unchanged_times = [], [], [], []
        hashed: list[int] = []
        for i in range(args.repeats):
            naive_times.append(timed(lambda: naive_fingerprint(tmp))[0])
            floor_times.append(timed(lambda: scan_and_stat(tmp))[0])
            victim = rng.choice(paths)
            victim.write_bytes(victim.read_bytes() + f"changed {i}\n".encode())
            t, value = timed(sf.compute)
            if value == previous:
                raise SystemExit("error: the fingerprint did not change after a file changed")
            previous = value
            incremental_times.append(t)
            hashed.append(sf.last_stats["hashed"])
            unchanged_times.append(timed(sf.compute)[0])
        unchanged_hashed = sf.last_stats["hashed"]

        # The same tree through a recursive glob instead of a directory pattern.
        by_glob = StateFingerprint(tmp, ["**/*.py"])
        by_glob.compute()
        glob_times = [timed(by_glob.compute)[0] for _ in range(args.repeats)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    naive = statistics.median(naive_times)
    incremental = statistics.median(incremental_times)
    unchanged = statistics.median(unchanged_times)
    floor = statistics.median(floor_times)
    by_glob_s = statistics.median(glob_times)
    ratio = naive / incremental if incremental > 0 else float("inf")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {args.repeats}")
    print(f"naive full re-read (warm page cache): {naive * 1000:9.1f} ms")
    print(
        f"first compute (cold cache, hashes all): {t_cold * 1000:9.1f} ms"
        f"  {cold_stats}"
    )
    print(
        f"incremental, one file changed:        {incremental * 1000:9.1f} ms"
        f"  (re-hashed per compute: {hashed})"
    )
    print(
        f"incremental, nothing changed:         {unchanged * 1000:9.1f} ms"
        f"  (re-hashed: {unchanged_hashed}, the fresh files"
        " still inside the 2 s racy window)"
    )
    print(f"incremental, pattern '**/*.py':       {by_glob_s * 1000:9.1f} ms")
    print(f"floor: scandir walk + 1 stat per file: {floor * 1000:9.1f} ms")
    print(f"ratio naive / incremental:            {ratio:9.1f}x")
    print(
        f"ratio naive / floor:                  {naive / floor:9.1f}x"
        "  (the most any stat-every-file method can reach here)"
    )
    ok_time = incremental < GOAL_INCREMENTAL_S
    ok_ratio = ratio >= GOAL_RATIO
    print(f"goal incremental < {GOAL_INCREMENTAL_S} s: {'met' if ok_time else 'NOT met'}")
    print(f"goal ratio >= {GOAL_RATIO:.0f}x:        {'met' if ok_ratio else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

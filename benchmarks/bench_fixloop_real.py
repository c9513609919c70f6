"""The session fix-loop on a real suite against the minimum a careful person runs.

The more-itertools sdist (765 tests, about 21,000 subtests) is unpacked into a
temporary directory and ``windowed()`` is broken by one line. A revise script
fixes it on its second call (its first call changes nothing). Timed as whole
processes, in the same round:

- **minimum**: a full run (it fails), the fix, a rerun of the failing tests, a
  full confirm run: what a careful person runs by hand (the sum of the three
  pytest processes);
- **first loop**: ``pytest --loop --loop-revise=./revise.sh`` with no stored
  impact map (a fresh state directory);
- **repeat**: the same loop again on the same tree, broken again, with whatever
  map the first loop left (a map recorded in the background is waited for
  before the repeat, outside the timing).

with and without ``-n 2`` (``--workers 0,2``). Targets: the first loop at most
1.3x the minimum, the repeat at most 0.7x.

Download the sdist by hand (never from tests)::

    pip download --no-deps --no-binary :all: more-itertools==11.2.1 -d /tmp/sdists
    python benchmarks/bench_fixloop_real.py /tmp/sdists/more_itertools-11.2.1.tar.gz

Usage: python benchmarks/bench_fixloop_real.py SDIST [--workers 0,2] [--rounds 1]
Always exits 0.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Sample, med, run_timed, user_env  # noqa: E402

GOOD = "for _ in islice(filler, step - 1, None, step):"
BAD = "for _ in islice(filler, step, None, step):"
TARGET_FILE = "more_itertools/more.py"
FIRST_TARGET = 1.3
REPEAT_TARGET = 0.7
_FAILED = re.compile(r"^FAILED (\S+?::\S+?)(?: - .*)?$")

REVISE = """#!/bin/sh
# fixes windowed() on its second call
count=$(cat "{counter}" 2>/dev/null || echo 0)
count=$((count + 1))
echo "$count" > "{counter}"
if [ "$count" -ge 2 ]; then
  python3 - <<'EOF'
from pathlib import Path
p = Path("{target}")
p.write_text(p.read_text().replace({bad!r}, {good!r}))
EOF
fi
"""


def _set(root: Path, broken: bool) -> None:
    path = root / TARGET_FILE
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(GOOD, BAD) if broken else text.replace(BAD, GOOD), encoding="utf-8")


def _pytest(root: Path, env: dict[str, str], args: list[str], expect: int | None) -> Sample:
    return run_timed([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
                     cwd=root, env=env, expect=expect)


def _failing(root: Path, env: dict[str, str], workers: int) -> tuple[Sample, list[str]]:
    """The minimum's first full run, timed as a whole process, and the tests it failed."""
    out = root.parent / "minimum.out"
    extra = ["-n", str(workers)] if workers else []
    with open(out, "wb") as f:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:randomly", *extra],
                                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        _, _, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - start
        proc.returncode = 0  # reaped here: Popen must not wait
    ids = [m.group(1) for line in out.read_text(encoding="utf-8", errors="replace").splitlines()
           if (m := _FAILED.match(line.rstrip()))]
    return Sample(took, usage.ru_maxrss, usage.ru_utime + usage.ru_stime), list(dict.fromkeys(ids))


def one_round(root: Path, env: dict[str, str], workers: int, counter: Path) -> dict[str, float]:
    extra = ["-n", str(workers)] if workers else []
    # the minimum: full run, fix, rerun of the failing tests, full confirm run
    _set(root, True)
    full, failing = _failing(root, env, workers)
    _set(root, False)
    rerun = _pytest(root, env, [*failing], expect=0)
    confirm = _pytest(root, env, extra, expect=0)
    minimum = full.seconds + rerun.seconds + confirm.seconds
    # the first loop, no stored map
    state = Path(tempfile.mkdtemp(prefix="bench-fixloop-state-"))
    loop_env = {**env, "PYTEST_LOOPS_STATE_DIR": str(state)}
    loop_args = ["--loop", f"--loop-revise=sh {root.parent / 'revise.sh'}", *extra]
    _set(root, True)
    counter.unlink(missing_ok=True)
    first = _pytest(root, loop_env, loop_args, expect=0)
    recorded_s, recorded = _wait_for_recorder(state)  # outside the timing: the user goes on meanwhile
    # the repeat, with what the first loop stored
    _set(root, True)
    counter.unlink(missing_ok=True)
    repeat = _pytest(root, loop_env, loop_args, expect=0)
    _set(root, False)
    return {"minimum": minimum, "full": full.seconds, "first": first.seconds, "repeat": repeat.seconds,
            "first_cpu": first.cpu, "repeat_cpu": repeat.cpu, "failing": float(len(failing)),
            "recorded_s": recorded_s, "recorded": recorded}


def _wait_for_recorder(state: Path) -> tuple[float, str]:
    """Wait for the impact map's background recorder (``impact_map = background``), when
    the first loop started one: how long after the loop it was done, and its result."""
    try:
        from pytest_loops.localization import recorder
    except ImportError:  # a version without it: the map was measured in the judged run
        return 0.0, ""
    start = time.perf_counter()
    results = [str(recorder.wait(path, 3600).get("result") or "") for path in (state / "impact").glob("*.recording")]
    return time.perf_counter() - start, "; ".join(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--workers", default="0,2", help="xdist workers per arm, comma-separated (0: no -n)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-fixloop-real-") as scratch:
        with tarfile.open(args.sdist) as tar:
            tar.extractall(scratch, filter="data")
        (root,) = [p for p in Path(scratch).iterdir() if p.is_dir()]
        counter = Path(scratch, "revise.count")
        Path(scratch, "revise.sh").write_text(REVISE.format(counter=counter, target=root / TARGET_FILE,
                                                            bad=BAD, good=GOOD), encoding="utf-8")
        env = user_env()
        env.pop("PYTEST_ADDOPTS", None)
        # the revise script counts its calls outside the tree: the sandbox must let it
        env["PYTEST_LOOPS_SANDBOX_WRITABLE"] = scratch
        for workers in [int(w) for w in args.workers.split(",") if w.strip()]:
            rows = [one_round(root, env, workers, counter) for _ in range(max(1, args.rounds))]
            label = f"-n {workers}" if workers else "no -n"
            minimum = med([r["minimum"] for r in rows])
            first = med([r["first"] / r["minimum"] for r in rows])
            repeat = med([r["repeat"] / r["minimum"] for r in rows])
            print(f"\nmore-itertools, {label}, {len(rows)} round(s), {int(rows[0]['failing'])} failing test(s):")
            print(f"  plain full run (failing)       {med([r['full'] for r in rows]):7.1f} s")
            print(f"  minimum (run, rerun, confirm)  {minimum:7.1f} s")
            print(f"  first loop                     {med([r['first'] for r in rows]):7.1f} s  {first:.2f}x  "
                  f"(target <= {FIRST_TARGET}x: {'met' if first <= FIRST_TARGET else 'not met'}; "
                  f"CPU {med([r['first_cpu'] for r in rows]):.1f} s)")
            print(f"  repeat                         {med([r['repeat'] for r in rows]):7.1f} s  {repeat:.2f}x  "
                  f"(target <= {REPEAT_TARGET}x: {'met' if repeat <= REPEAT_TARGET else 'not met'}; "
                  f"CPU {med([r['repeat_cpu'] for r in rows]):.1f} s)")
            if rows[0]["recorded"]:
                later = med([r["recorded_s"] for r in rows])
                print(f"  background recorder: done {later:.1f} s after the first loop: {rows[0]['recorded']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

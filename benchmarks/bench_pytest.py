"""What the pytest plugin costs a pytest run, and what a fix-loop costs against the least it could.

    python benchmarks/bench_pytest.py [--quick] [--rounds R] [--tests 500] [--skip PARTS]

Writes a suite of ``--tests`` tests (25 files, a ``calc.py`` under test, a
``pytest.ini`` so the suite is its own rootdir) in a temp dir and times the
installed ``pytest`` console script as a whole process (spawn to reap; peak RSS
from ``os.wait4``), arms interleaved, medians of ``--rounds`` rounds (default 5;
--quick 2). The machines here are shared: compare figures of one run only.

1. Overhead (every test passes; the baseline is the same run with ``-p no:loop``):
   - installed but unused: ``pytest -q`` with the plugin loaded and no loop option;
   - ``--loop`` with nothing to loop (no failing test, no marker, no loop file);
   - under ``-n 4`` (pytest-xdist): installed but unused and ``--loop``, against
     ``-n 4 -p no:loop``;
   - the plugin's own import, in a process that has imported pytest already
     (and yaml's part of it, timed alone the same way);
   - with ``--against SRC`` (a directory holding another version's ``pytest_loops``
     package, e.g. ``git archive OLD pytest_loops | tar -x -C SRC``): the plugin arms
     again with that version first on PYTHONPATH, in the same rounds: before and after
     from one run.
2. Fix-loop (one test fails: ``calc.add`` subtracts): ``pytest --loop
   --loop-revise "python fix.py"`` (defaults otherwise: .tine, lessons, suspects,
   protection), SUCCESS in iteration 2. The minimum is what a user would do by
   hand, each step timed as a process in the same round: one full run with
   ``-p no:loop`` + the fix (``python fix.py``) + a rerun of the failing test.
   Also shown against two full runs.

Always exits 0: it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
    user_env,
)

FILES = 25
TARGET_UNUSED = 0.02  # installed but unused, over -p no:loop
TARGET_LOOP = 0.05  # --loop with nothing to loop
TARGET_XDIST = 0.05  # the same under -n 4
TARGET_FIXLOOP_X = 1.5  # fix-loop over the minimum

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    total = a + b\n    return total\n"
FIX_SCRIPT = f'with open("calc.py", "w") as f:\n    f.write({FIXED!r})\n'
FAILING = "test_m00.py::test_add"

IMPORT_PROBE = """\
import sys, time
import pytest  # noqa: F401  (already paid by every pytest run)
t0, c0 = time.perf_counter(), time.process_time()
__import__(sys.argv[1])
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def build_suite(root: Path, tests: int) -> None:
    """``tests`` tests in FILES files; test_m00.py::test_add checks calc.add."""
    root.mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "calc.py").write_text(BUGGY)
    (root / "fix.py").write_text(FIX_SCRIPT)
    per_file = -(-tests // FILES)
    made = 0
    for i in range(FILES):
        lines = ["import calc", ""]
        for j in range(min(per_file, tests - made)):
            if i == 0 and j == 0:
                lines.append("def test_add():\n    assert calc.add(2, 3) == 5\n")
            else:
                lines.append(f"def test_{j}():\n    assert {j} + 1 == {j + 1}\n")
            made += 1
        (root / f"test_m{i:02d}.py").write_text("\n".join(lines) + "\n")


def clean(root: Path) -> None:
    """Back to the state before a run: the bug in, no caches, no artifacts."""
    (root / "calc.py").write_text(BUGGY)
    for name in (".pytest_cache", ".pytest-loops", "__pycache__"):
        shutil.rmtree(root / name, ignore_errors=True)


def fixed(root: Path) -> None:
    (root / "calc.py").write_text(FIXED)


def import_time(module: str) -> Sample:
    out = Path(tempfile.mkdtemp(prefix="bench-import-"))
    try:
        probe = out / "probe.py"
        probe.write_text(IMPORT_PROBE)
        result = out / "result.txt"
        with open(result, "w") as f:
            subprocess.run([sys.executable, str(probe), module], stdout=f, check=True, env=user_env())
        wall, cpu = (float(x) for x in result.read_text().split())
        return Sample(wall, 0, cpu)
    finally:
        shutil.rmtree(out, ignore_errors=True)


AGAINST = " [against]"
PLUGIN_ARMS = ("installed, unused", "--loop, nothing to loop", "-n 4, installed, unused",
               "-n 4 --loop, nothing to loop")


def bench_overhead(pytest: str, root: Path, rounds: int, tests: int, against: Path | None = None) -> Table:
    arms = {
        "-p no:loop": ["-p", "no:loop"],
        "installed, unused": [],
        "--loop, nothing to loop": ["--loop"],
        "-n 4 -p no:loop": ["-n", "4", "-p", "no:loop"],
        "-n 4, installed, unused": ["-n", "4"],
        "-n 4 --loop, nothing to loop": ["-n", "4", "--loop"],
    }
    envs: dict[str, dict[str, str] | None] = dict.fromkeys(arms)
    if against is not None:
        env = user_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(against), env.get("PYTHONPATH", "")) if p)
        for name in PLUGIN_ARMS:
            arms[name + AGAINST] = arms[name]
            envs[name + AGAINST] = env

    def job(args: list[str], name: str):
        def go() -> Sample:
            clean(root)
            fixed(root)
            try:
                return run_timed([pytest, "-q", *args], cwd=root, env=envs[name], what=f"pytest {name}")
            finally:
                clean(root)
        return go

    jobs = {name: job(args, name) for name, args in arms.items()}
    jobs["import pytest_loops.pytest_plugin.plugin"] = lambda: import_time("pytest_loops.pytest_plugin.plugin")
    jobs["import yaml"] = lambda: import_time("yaml")
    jobs["-p no:loop"]()  # warm-up (and the bytecode caches written)
    jobs["installed, unused"]()
    samples = interleaved(jobs, rounds, "pytest overhead:")
    t = {name: [s.seconds for s in v] for name, v in samples.items()}

    def over(name: str, base: str) -> float:
        return med([a / b - 1 for a, b in zip(t[name], t[base], strict=True)])

    table = Table(f"pytest, {tests} passing tests: the plugin's cost, median of {rounds} interleaved rounds "
                  "(ratio = the arm over its baseline, round by round)")
    compared = [("installed, unused", "-p no:loop", TARGET_UNUSED),
                ("--loop, nothing to loop", "-p no:loop", TARGET_LOOP),
                ("-n 4, installed, unused", "-n 4 -p no:loop", TARGET_XDIST),
                ("-n 4 --loop, nothing to loop", "-n 4 -p no:loop", TARGET_XDIST)]
    if against is not None:
        compared += [(name + AGAINST, base, target) for name, base, target in compared]
    for name, base, target in compared:
        o = over(name, base)
        table.add(name, f"{med(t[name]):.3f} s (+{o:.1%})" if o >= 0 else f"{med(t[name]):.3f} s ({o:.1%})",
                  f"{base} {med(t[base]):.3f} s", 1 + o, f"<= +{target:.0%}", o <= target)
    c = {name: [s.cpu for s in v] for name, v in samples.items()}
    for name, base, target in compared:
        o = med([a / b - 1 for a, b in zip(c[name], c[base], strict=True)])
        table.add(f"CPU: {name}", f"{med(c[name]):.3f} s ({o:+.1%})", f"{base} {med(c[base]):.3f} s", 1 + o,
                  f"<= +{target:.0%}", o <= target)
    table.add("import pytest_loops.pytest_plugin.plugin (after pytest)",
              ms(med(t["import pytest_loops.pytest_plugin.plugin"])),
              f"-p no:loop run {med(t['-p no:loop']):.3f} s",
              med(t["import pytest_loops.pytest_plugin.plugin"]) / med(t["-p no:loop"]))
    table.add("  of which: import yaml (alone, after pytest)", ms(med(t["import yaml"])))
    table.add("CPU: import pytest_loops.pytest_plugin.plugin (after pytest)",
              ms(med(c["import pytest_loops.pytest_plugin.plugin"])),
              f"-p no:loop run CPU {med(c['-p no:loop']):.3f} s",
              med(c["import pytest_loops.pytest_plugin.plugin"]) / med(c["-p no:loop"]))
    table.add("  of which: import yaml (alone, after pytest)", ms(med(c["import yaml"])))
    for name in arms:
        table.add(f"peak RSS, {name}", mb(med([s.rss_kb for s in samples[name]])))
    print(table.render())
    print("\nrounds (s): " + "; ".join(f"{k} " + ", ".join(f"{x:.3f}" for x in v) for k, v in t.items()))
    clean(root)
    return table


def bench_fixloop(pytest: str, root: Path, rounds: int, tests: int) -> Table:
    revise = f"{shlex.quote(sys.executable)} fix.py"
    parts: dict[str, list[float]] = {"full run": [], "fix": [], "rerun of the failing test": []}

    phases: dict[str, list[float]] = {"iteration 1 (localization within its cap, the fix)": [],
                                      "iteration 2 rerun (under coverage)": [],
                                      "clean-room judged run (the confirm run)": []}
    notes: list[str] = []

    def fixloop() -> Sample:
        clean(root)
        try:
            sample = run_timed([pytest, "-q", "--loop", "--loop-revise", revise], cwd=root, expect=0,
                               what="the fix-loop")
            for log in (root / ".pytest-loops" / "runs").glob("*.json"):
                its = json.loads(log.read_text())["iterations"]
                phases["iteration 1 (localization within its cap, the fix)"].append(its[0]["duration_s"])
                phases["iteration 2 rerun (under coverage)"].append(its[-1]["verify_duration_s"] or 0.0)
                phases["clean-room judged run (the confirm run)"].append(its[-1]["clean_room_s"] or 0.0)
                notes.extend(str(it.get("suspects_note")) for it in its if it.get("suspects_note"))
            return sample
        finally:
            clean(root)

    def minimum() -> Sample:
        clean(root)
        try:
            full = run_timed([pytest, "-q", "-p", "no:loop"], cwd=root, expect=1, what="the full run")
            fix = run_timed([sys.executable, "fix.py"], cwd=root, what="the fix")
            rerun = run_timed([pytest, "-q", "-p", "no:loop", FAILING], cwd=root, expect=0,
                              what="the rerun of the failing test")
        finally:
            clean(root)
        for key, s in zip(parts, (full, fix, rerun), strict=True):
            parts[key].append(s.seconds)
        return Sample(full.seconds + fix.seconds + rerun.seconds, max(full.rss_kb, rerun.rss_kb),
                      full.cpu + fix.cpu + rerun.cpu)

    minimum()  # warm-up
    for values in parts.values():
        values.clear()
    samples = interleaved({"fix-loop": fixloop, "minimum": minimum}, rounds, "fix-loop:")
    loop = [s.seconds for s in samples["fix-loop"]]
    least = [s.seconds for s in samples["minimum"]]
    x_min = med([a / b for a, b in zip(loop, least, strict=True)])
    x_two = med([a / (2 * b) for a, b in zip(loop, parts["full run"], strict=True)])
    table = Table(f"Fix-loop: {tests} tests, one failing, `pytest --loop --loop-revise 'python fix.py'`, "
                  f"median of {rounds} interleaved rounds")
    table.add("fix-loop (defaults)", f"{med(loop):.3f} s", f"minimum {med(least):.3f} s", x_min,
              f"<= {TARGET_FIXLOOP_X}x minimum", x_min <= TARGET_FIXLOOP_X)
    loop_cpu = [s.cpu for s in samples["fix-loop"]]
    least_cpu = [s.cpu for s in samples["minimum"]]
    x_cpu = med([a / b for a, b in zip(loop_cpu, least_cpu, strict=True)])
    table.add("CPU: fix-loop (defaults)", f"{med(loop_cpu):.3f} s", f"minimum {med(least_cpu):.3f} s", x_cpu,
              f"<= {TARGET_FIXLOOP_X}x minimum", x_cpu <= TARGET_FIXLOOP_X)
    table.add("  against two full runs", f"{med(loop):.3f} s", f"2 x full run {2 * med(parts['full run']):.3f} s",
              x_two)
    for key, values in parts.items():
        table.add(f"minimum, part: {key}", f"{med(values):.3f} s")
    for key, values in phases.items():
        if values:
            table.add(f"fix-loop, part: {key}", f"{med(values):.3f} s")
    table.add("peak RSS, fix-loop", mb(med([s.rss_kb for s in samples["fix-loop"]])),
              f"full run {mb(med([s.rss_kb for s in samples['minimum']]))}")
    print(table.render())
    if notes:
        print("\nsuspects notes: " + "; ".join(sorted(set(notes))))
    print("\nrounds (s): fix-loop " + ", ".join(f"{x:.3f}" for x in loop) + "; minimum "
          + ", ".join(f"{x:.3f}" for x in least))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick 2)")
    parser.add_argument("--tests", type=int, default=500, help="tests in the suite (500)")
    parser.add_argument("--skip", default="", help="parts to skip, comma-separated: overhead,fixloop")
    parser.add_argument("--against", type=Path, default=None, metavar="SRC",
                        help="also time the overhead arms with the pytest_loops package in SRC first on "
                             "PYTHONPATH (another version), in the same rounds")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    if rounds < 1 or args.tests < FILES:
        parser.error(f"--rounds must be >= 1 and --tests >= {FILES}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.against is not None and not (args.against / "pytest_loops" / "pytest_plugin" / "plugin.py").is_file():
        parser.error(f"--against {args.against}: no pytest_loops/pytest_plugin/plugin.py there")
    pytest = console_script("pytest")
    print(f"{machine_line()}\n{pytest}")
    began = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="bench-pytest-"))
    try:
        root = base / "suite"
        build_suite(root, args.tests)
        env_note = os.environ.get("PYTEST_ADDOPTS")
        if env_note:
            print(f"note: PYTEST_ADDOPTS={env_note!r} applies to every arm")
        if "overhead" not in skip:
            bench_overhead(pytest, root, rounds, args.tests, args.against and args.against.resolve())
        if "fixloop" not in skip:
            bench_fixloop(pytest, root, rounds, args.tests)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n(took {time.perf_counter() - began:.0f} s; at the end: {machine_line()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

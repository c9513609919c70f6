"""The pytest plugin's overhead counted in instructions: the same on a quiet and a busy machine.

    python benchmarks/bench_instructions.py [--tests 500] [--against SRC]

Wall and CPU time of a 0.7-second pytest run move by several percent from one round
to the next on a shared machine: too much to judge a 2% or 5% target. The number of
instructions a process executes barely moves. This script runs each arm once under
``valgrind --tool=cachegrind --cache-sim=no`` (one process, no children: without
``-n``) on the suite ``bench_pytest.py`` writes, with ``PYTHONHASHSEED=0`` and
bytecode caches warm, and prints each arm's instructions over ``-p no:loop``:

- installed but unused (target <= +2%);
- ``--loop`` with nothing to loop (target <= +5%);
- with ``--against SRC`` (a directory holding another version's ``pytest_loops``
  package): the two arms again with that version first on PYTHONPATH; this
  version runs from PYTHONPATH too, so both load the same way.

Needs valgrind on PATH (it says so and exits 0 without it). Always exits 0.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pytest import build_suite, fixed  # noqa: E402
from benchlib import Table, machine_line, user_env  # noqa: E402

TARGETS = {"installed, unused": 2.0, "--loop, nothing to loop": 5.0}
ARMS = {"installed, unused": [], "--loop, nothing to loop": ["--loop"]}
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(argv: list[str], cwd: Path, src: Path) -> int:
    env = user_env()
    env.update(PYTHONPATH=str(src), PYTHONHASHSEED="0")
    env.pop("PYTEST_ADDOPTS", None)
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)  # bytecode caches written
    done = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                           *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    found = _REFS.search(done.stderr)
    if not found:
        raise SystemExit(f"error: valgrind gave no instruction count for {' '.join(argv)}:\n{done.stderr[-800:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=500, help="tests in the suite (500)")
    parser.add_argument("--against", type=Path, default=None, metavar="SRC",
                        help="a directory holding another version's pytest_loops package")
    args = parser.parse_args(argv)
    print(machine_line())
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH: nothing measured")
        return 0
    here = Path(__file__).resolve().parent.parent
    if args.against is not None and not (args.against / "pytest_loops" / "pytest_plugin" / "plugin.py").is_file():
        raise SystemExit(f"error: --against {args.against}: no pytest_loops/pytest_plugin/plugin.py there")
    root = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        suite = root / "suite"
        build_suite(suite, args.tests)
        fixed(suite)  # every test passes
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        base = instructions([*pytest, "-p", "no:loop"], suite, here)
        table = Table(f"pytest, {args.tests} passing tests: instructions of one process (valgrind), "
                      "over `-p no:loop`")
        table.add("-p no:loop", f"{base / 1e6:,.1f} M")
        versions = [("", here)] + ([(" [against]", args.against)] if args.against is not None else [])
        for label, src in versions:
            for arm, extra in ARMS.items():
                count = instructions([*pytest, *extra], suite, src)
                over = (count / base - 1) * 100
                target = TARGETS[arm]
                table.add(f"{arm}{label}", f"{count / 1e6:,.1f} M ({over:+.2f}%)", f"-p no:loop {base / 1e6:,.1f} M",
                          count / base, f"<= +{target:g}%", over <= target)
        print(table.render())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

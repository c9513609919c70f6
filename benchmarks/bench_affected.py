"""Affected reruns and coverage bookkeeping: what they cost, against baselines from the same run.

Generates a 300-test project (30 modules x 10 tests, one failing), then measures:

1. A full re-run of the suite (plain ``python -m pytest``): the baseline.
2. One iteration with affected reruns: change one function, compute the affected
   tests from the impact map, run only those under per-test coverage, update the
   map. Goal: at most 0.3x the baseline.
3. The single failing test run plain, and under per-test coverage bookkeeping
   (``collect_spectra``, reading its data included), 3 pairs per repeat.
   Goal: at most 1.2x.

Each figure is the median of ``--repeats`` runs, interleaved so machine load hits
both sides alike; wall-clock and CPU seconds (user+sys of this process and its
children: the impact map's own work counts) are shown, ratios use wall-clock.

Child processes cache bytecode under a temporary prefix, as on a developer
machine, even where the environment sets PYTHONDONTWRITEBYTECODE (then pytest
recompiles every module it rewrites, plugins included, in every process: a fixed
cost of ~0.5 s here); ``--no-bytecode-cache`` keeps the environment as it is. The machine is shared:
read the CPU column when wall-clock figures look noisy.

The fixed cost of starting pytest (0.3-0.8 s CPU, depending on the plugins
installed) is paid by every run, so the ratio of item 2 depends on how long the
suite's tests take: ``--ms`` sets the CPU work each test does, calibrated on this
machine (default: 10 ms, a light unit test, and 0). ``--ms 0`` gives trivial
tests, the worst case for any subset run: there the start-up cost dominates.

4. ``--tree N`` (default 10,000; 0 skips it): the suspects step's impact map on a tree of
   N small files of which the failing tests ran a few, per failing iteration: before
   (every tracked file read and hashed, as it was) and after (only the covered files
   read, the others by their stat, the last iteration's digests reused), beside the
   floor of one stat walk of the tree. Goal: at most 20 ms per failing iteration.

Usage: python benchmarks/bench_affected.py [--repeats 5] [--ms 10 --ms 0] [--tree 10000] [--keep DIR]
Always exits 0; prints the figures and whether each goal is met.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_loops.localization.impact import ImpactMap  # noqa: E402
from pytest_loops.localization.spectra import collect_spectra  # noqa: E402

MODULES = 30
TESTS_PER_MODULE = 10
FAILING_MODULE = 7
FAILING_TEST = 3
CHANGED_MODULE = 12
CHANGED_FUNCTION = 4
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-o", "addopts="]
SINGLE_RUNS = 3  # single-test pairs per repeat


_PYCACHE: Path | None = None


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_", "COV_", "COVERAGE_")) and k != "PYTEST_ADDOPTS"}
    if _PYCACHE is not None:
        # cache bytecode (and pytest's rewritten test modules) as a developer
        # machine does, but under a temporary prefix: nothing is written elsewhere
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE)
    return env


def calibrate(ms: float) -> int:
    """Loop steps of the generated functions that take about ``ms`` of CPU here."""
    if ms <= 0:
        return 0
    steps = 20000
    t0 = time.process_time()
    total = 0
    for i in range(steps):
        total += (i * 3) % 7
    took = max(time.process_time() - t0, 1e-6)
    return max(1, int(steps * (ms / 1000) / took))


def module_source(m: int, work: int) -> str:
    funcs = []
    for f in range(TESTS_PER_MODULE):
        funcs.append(textwrap.dedent(f"""
            def f{f}(n):
                total = 0
                for i in range({work}):
                    total += (i * {f + 1}) % 7
                return n * {f + 1} + {m} + (total - total)
            """))
    return "\n".join(funcs)


def test_source(m: int) -> str:
    tests = [f"from pkg import mod_{m:02d} as mod\n"]
    for t in range(TESTS_PER_MODULE):
        expected = 2 * (t + 1) + m
        if m == FAILING_MODULE and t == FAILING_TEST:
            expected += 1  # the one failing test
        tests.append(f"\ndef test_{t}():\n    assert mod.f{t}(2) == {expected}\n")
    return "".join(tests)


def generate(root: Path, work: int) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    for m in range(MODULES):
        (root / "pkg" / f"mod_{m:02d}.py").write_text(module_source(m, work))
        (root / "tests" / f"test_mod_{m:02d}.py").write_text(test_source(m))


def change_one_function(root: Path, undo: bool = False) -> None:
    path = root / "pkg" / f"mod_{CHANGED_MODULE:02d}.py"
    old = f"return n * {CHANGED_FUNCTION + 1} + {CHANGED_MODULE} + (total - total)"
    new = f"return ({CHANGED_FUNCTION + 1} * n) + {CHANGED_MODULE} + (total - total)"
    text = path.read_text()
    path.write_text(text.replace(new, old) if undo else text.replace(old, new))


def _cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process and its children, result)."""
    cpu0 = _cpu()
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    return wall, _cpu() - cpu0, result


def plain_pytest(root: Path, args: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", *PYTEST_ARGS, *args], cwd=root,
                          env=clean_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode


def median_pair(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def scenario(ms: float, repeats: int, keep: Path | None) -> dict[str, float]:
    work = calibrate(ms)
    tmp = Path(tempfile.mkdtemp(prefix="bench-affected-"))
    root = (keep or tmp) / f"project-{ms:g}ms"
    if root.exists():
        shutil.rmtree(root)
    generate(root, work)
    env = clean_env()
    failing_id = f"tests/test_mod_{FAILING_MODULE:02d}.py::test_{FAILING_TEST}"

    # the map the harness would have after its first (full) run under coverage
    wall, cpu, spectra = timed(lambda: collect_spectra(root, [], pytest_args=PYTEST_ARGS, env=env))
    assert spectra.failed == [failing_id], spectra.failed  # type: ignore[union-attr]
    full_cov = (wall, cpu)
    impact = ImpactMap.from_spectra(spectra, root)  # type: ignore[arg-type]
    map_path = root.parent / f"impact-{ms:g}ms.json"
    impact.save(map_path)
    all_tests = list(impact.tests)

    full: list[tuple[float, float]] = []
    iteration: list[tuple[float, float]] = []
    plain_one: list[tuple[float, float]] = []
    cov_one: list[tuple[float, float]] = []
    selected = 0
    reason = ""
    for _ in range(repeats):
        w, c, code = timed(lambda: plain_pytest(root, []))
        assert code == 1, code
        full.append((w, c))

        change_one_function(root)

        def affected_iteration() -> tuple[int, str]:
            loaded = ImpactMap.load(map_path)
            assert loaded is not None
            selection = loaded.affected(root, all_tests)
            assert not selection.run_all, selection.reason
            run = collect_spectra(root, selection.tests, pytest_args=PYTEST_ARGS, env=env)
            loaded.update(run, root).save(root.parent / f"impact-{ms:g}ms-next.json")
            return len(selection.tests), selection.reason

        w, c, (selected, reason) = timed(affected_iteration)  # type: ignore[misc]
        iteration.append((w, c))
        change_one_function(root, undo=True)

        for _ in range(SINGLE_RUNS):  # cheap runs: more samples against the noise
            w, c, code = timed(lambda: plain_pytest(root, [failing_id]))
            assert code == 1, code
            plain_one.append((w, c))
            w, c, one = timed(lambda: collect_spectra(root, [failing_id], pytest_args=PYTEST_ARGS,
                                                      env=env))
            assert one.failed == [failing_id]  # type: ignore[union-attr]
            cov_one.append((w, c))

    f_w, f_c = median_pair(full)
    i_w, i_c = median_pair(iteration)
    p_w, p_c = median_pair(plain_one)
    c_w, c_c = median_pair(cov_one)
    print(f"\n== {MODULES * TESTS_PER_MODULE}-test project, ~{ms:g} ms of work per test "
          f"({work} loop steps), median of {repeats} (wall s / CPU s) ==")
    per_test = max(0.0, f_c - p_c) / (MODULES * TESTS_PER_MODULE) * 1000
    print(f"measured CPU per test beyond pytest's start-up: {per_test:.1f} ms")
    print(f"first full run under coverage (builds the map): {full_cov[0]:6.2f} / {full_cov[1]:6.2f}")
    print(f"full re-run, plain pytest (baseline):            {f_w:6.2f} / {f_c:6.2f}")
    print(f"affected-rerun iteration ({selected} tests):          {i_w:6.2f} / {i_c:6.2f}")
    print(f"  selection: {reason}")
    ratio = i_w / f_w
    cpu_ratio = i_c / f_c if f_c else float("nan")
    print(f"  ratio: {ratio:.3f}x wall, {cpu_ratio:.3f}x CPU  "
          f"(goal <= 0.30x: {'met' if ratio <= 0.3 else 'NOT met'})")
    print(f"single failing test, plain ({len(plain_one)} runs):           {p_w:6.2f} / {p_c:6.2f}")
    print(f"single failing test, per-test coverage:          {c_w:6.2f} / {c_c:6.2f}")
    overhead = c_w / p_w
    cpu_overhead = c_c / p_c if p_c else float("nan")
    print(f"  ratio: {overhead:.3f}x wall, {cpu_overhead:.3f}x CPU  "
          f"(goal <= 1.20x: {'met' if overhead <= 1.2 else 'NOT met'})")
    if keep is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"ratio": ratio, "overhead": overhead}


TREE_TARGET_MS = 20.0


def tree_scenario(size: int, repeats: int) -> dict[str, float]:
    """The suspects step's map at ``size`` files: full read (before) vs covered-only (after)."""
    from pytest_loops.localization.impact import ImpactMap
    from pytest_loops.localization.spectra import Spectra

    with tempfile.TemporaryDirectory(prefix="bench-affected-tree-") as scratch:
        root = Path(scratch)
        generate(root, calibrate(0.0))
        per_dir = 500
        for i in range(size):
            folder = root / "assets" / f"d{i // per_dir:03d}"
            if i % per_dir == 0:
                folder.mkdir(parents=True)
            (folder / f"f{i:05d}.txt").write_text(f"{i}\n" * 40)
        old = time.time_ns() - 3_600 * 10**9  # written an hour ago: not racy
        for path in root.rglob("*"):
            os.utime(path, ns=(old, old))
        spectra = Spectra(root=str(root), outcomes={"tests/test_m00.py::test_0": "failed"},
                          lines={"tests/test_m00.py::test_0": {"m00.py": frozenset({2, 3}),
                                                               "tests/test_m00.py": frozenset({4})}})

        def walk() -> None:
            for dirpath, _, filenames in os.walk(root):
                for name in filenames:
                    os.stat(os.path.join(dirpath, name))

        def before() -> None:
            ImpactMap.from_spectra(spectra, root)

        previous = ImpactMap.from_spectra(spectra, root, covered_only=True)

        def after() -> None:
            ImpactMap.from_spectra(spectra, root, previous=previous, covered_only=True)

        samples: dict[str, list[float]] = {"floor": [], "before": [], "after": []}
        for _ in range(max(3, repeats)):
            for name, fn in (("floor", walk), ("before", before), ("after", after)):
                began = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - began)
    ms = {name: 1000 * statistics.median(values) for name, values in samples.items()}
    met = "met" if ms["after"] <= TREE_TARGET_MS else "not met"
    print(f"\nsuspects step's impact map at {size:,} files (median of {max(3, repeats)}):")
    print(f"  stat walk of the tree (floor)          {ms['floor']:8.1f} ms")
    print(f"  before: every file read and hashed     {ms['before']:8.1f} ms")
    print(f"  after: covered files read, last reused {ms['after']:8.1f} ms   "
          f"(goal <= {TREE_TARGET_MS:g} ms: {met})")
    return ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ms", type=float, action="append",
                        help="CPU milliseconds of work per test (repeatable; default: 10 and 0)")
    parser.add_argument("--keep", type=Path, help="generate the projects here and keep them")
    parser.add_argument("--tree", type=int, default=10_000,
                        help="files in the big-tree scenario of the suspects step (0: skip it)")
    parser.add_argument("--tree-only", action="store_true", help="run only the big-tree scenario")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="keep the environment's PYTHONDONTWRITEBYTECODE (every pytest process then "
                             "recompiles the modules it rewrites, plugins included)")
    args = parser.parse_args(argv)
    global _PYCACHE
    pycache = None
    if not args.no_bytecode_cache:
        pycache = tempfile.TemporaryDirectory(prefix="bench-affected-pycache-")
        _PYCACHE = Path(pycache.name)
    print(f"bytecode cache: {'off (environment as is)' if pycache is None else 'on, in a temporary prefix'}"
          f"; PYTHONDONTWRITEBYTECODE in the environment: {os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}")
    for ms in [] if args.tree_only else args.ms or [10.0, 0.0]:
        scenario(ms, max(1, args.repeats), args.keep)
    if args.tree:
        tree_scenario(args.tree, args.repeats)
    if pycache is not None:
        pycache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

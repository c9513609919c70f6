"""How much a .tine costs: write_tine for a 50-iteration loop against a plain JSON dump.

    python benchmarks/bench_tine.py [--iterations 50] [--repeat 5] [--baseline DIR [--rounds 5]]

Prints CPU-time figures and ratios measured in this run only (machines here are
shared and noisy); the goal is a 50-iteration, 2-check loop recorded in under 0.5 s. Always
exits 0: it reports, it does not judge.

With ``--baseline DIR`` (a directory holding an older build's ``pytest_loops``,
e.g. ``git archive COMMIT pytest_loops | tar -x -C DIR``), each round runs this
build and that one in fresh processes, one after the other in an order that
flips from round to round, and prints both side by side: write_tine's CPU time
per iteration (the slope between two loop lengths), the .tine's bytes per
iteration and how many distinct strings per iteration opentine's save-time
redaction scanned (its cost is per character of each distinct string). Two
loops are measured: the bench's own (2 checks with a 16-line failing output that
changes every iteration) and the shape of ``bench_cli.py`` (`false` and `true`:
no output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if "--source" in sys.argv[:-1]:  # an older build's package, for --baseline
    sys.path.insert(0, sys.argv[sys.argv.index("--source") + 1])
else:
    sys.path.insert(0, str(REPO))

from pytest_loops.artifacts import provenance, tinememo, tineread  # noqa: E402
from pytest_loops.results import CheckResult, IterationRecord, LoopResult  # noqa: E402
from pytest_loops.spec import Check, Guards, LoopSpec  # noqa: E402
from pytest_loops.verdict import Verdict  # noqa: E402

GOAL_S = 0.5
TAIL = "\n".join(
    ["============================= test session starts ==============================",
     "collected 12 items", "", "tests/test_parser.py ....F.......                    [100%]", "",
     "=================================== FAILURES ===================================",
     "_________________________________ test_parse __________________________________",
     "    def test_parse():", ">       assert parse('1+') == 1",
     "E       ParseError: unexpected end of input at column 2", "",
     "tests/test_parser.py:14: ParseError", "api_token: not-a-real-token",
     "=========================== short test summary info ============================",
     "FAILED tests/test_parser.py::test_parse - ParseError: unexpected end of input",
     "========================= 1 failed, 11 passed in 0.41s ========================="])


def build(iterations: int) -> LoopResult:
    spec = LoopSpec(name="bench", goal="benchmark the .tine writer", revise="./agent.sh",
                    checks=(Check.command_passes("ruff check ."), Check.test_passes("tests/test_parser.py")),
                    guards=Guards(max_iter=iterations), state_paths=("src",))
    records = []
    for i in range(1, iterations + 1):
        checks = [
            CheckResult(name=spec.checks[0].name, kind="command", passed=True, exit_code=0,
                        duration_s=0.31, output_tail="All checks passed!", command="ruff check ."),
            CheckResult(name=spec.checks[1].name, kind="pytest", passed=False, exit_code=1,
                        duration_s=1.7, output_tail=f"{TAIL}\niteration {i}"),
        ]
        records.append(IterationRecord(
            iter=i, started_at="2026-01-01T00:00:00Z", checks=checks, verify_exit=1, duration_s=9.5,
            state_hash=f"sha256:{i:064x}", state_changed=True, unchanged_streak=0,
            lesson=f"iteration {i}: ParseError at column 2", revise_exit=0, revise_duration_s=7.2,
            revise_tail=f"edited src/parser.py ({i})", guards_seen={"budget_left_s": 900.0 - 9.5 * i},
            elapsed_s=9.5 * i, guard="max_iter" if i == iterations else None))
    return LoopResult(spec=spec, verdict=Verdict.MAX_ITER, reason="the iteration cap was reached",
                      iterations=records, started_at="2026-01-01T00:00:00Z",
                      ended_at="2026-01-01T00:08:00Z", elapsed_s=475.0)


def build_cli_shape(iterations: int, folder: Path) -> LoopResult:
    """The loop of ``bench_cli.py``: `false` as the check, `true` as the revise step,
    empty outputs in the run directory, a lesson per iteration."""
    spec = LoopSpec(name="loop", revise="true", checks=(Check.command_passes("false"),),
                    guards=Guards(max_iter=iterations, no_progress_k=0))
    run_dir = folder / "runs" / "loop"
    records = []
    for i in range(1, iterations + 1):
        iteration_dir = run_dir / f"iter-{i:03d}"
        iteration_dir.mkdir(parents=True, exist_ok=True)
        check_out, revise_out = iteration_dir / "check-1.out", iteration_dir / "revise.out"
        check_out.touch()
        revise_out.touch()
        wall = 1_796_300_000 + i * 0.0137
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall))
        checks = [CheckResult(name=spec.checks[0].name, kind="command", passed=False, exit_code=1,
                              duration_s=0.004 + i * 1e-7, reason="exit 1", output_file=str(check_out),
                              command="false")]
        last = i == iterations
        records.append(IterationRecord(
            iter=i, started_at=f"{stamp}.{int(wall % 1 * 1000):03d}Z", checks=checks, verify_exit=1,
            duration_s=0.011 + i * 1e-7, verify_duration_s=0.0045, state_changed=None,
            lesson=f"- {stamp}Z loop iter {i}: exit 1, state not tracked: `false` failed with no output.",
            revise_exit=None if last else 0, revise_duration_s=None if last else 0.004,
            revise_output_file=None if last else str(revise_out),
            guards_seen={"budget_left_s": round(900 - i * 0.0137, 3), "elapsed_s": round(i * 0.0137, 3),
                         "iteration": f"{i}/{iterations}"},
            elapsed_s=i * 0.0137, guard="max_iter" if last else None))
    return LoopResult(spec=spec, verdict=Verdict.MAX_ITER, reason=f"max_iter={iterations} reached",
                      iterations=records, started_at="2026-12-03T14:40:53.519Z",
                      ended_at="2026-12-03T14:40:57.720Z", elapsed_s=iterations * 0.0137,
                      log_path=str(folder / "runs" / "loop.json"), run_dir=str(run_dir))


def slope(builder, lo: int, hi: int, repeat: int, out: Path) -> dict[str, float]:
    """write_tine between ``lo`` and ``hi`` iterations: CPU ms, bytes and distinct
    strings opentine's redaction scanned, each per iteration."""
    from opentine import redaction

    figures = {}
    for n in (lo, hi):
        result = builder(n, out / f"loop-{n}")
        provenance.write_tine(result, out / "warm.tine")
        scanned: set[str] = set()
        real = redaction.redact_text
        redaction.redact_text = lambda value, seen=scanned, real=real: seen.add(value) or real(value)
        try:
            provenance.write_tine(result, out / f"{n}.tine")
        finally:
            redaction.redact_text = real
        cpu = median_time(lambda: provenance.write_tine(result, out / f"{n}.tine"), repeat)  # noqa: B023
        figures[n] = (cpu, (out / f"{n}.tine").stat().st_size, len(scanned))
    span = hi - lo
    return {"ms": (figures[hi][0] - figures[lo][0]) / span * 1000,
            "bytes": (figures[hi][1] - figures[lo][1]) / span,
            "strings": (figures[hi][2] - figures[lo][2]) / span}


def measure_json(lo: int, hi: int, repeat: int) -> None:
    """One process's figures, as a JSON line (``--json``; for ``--baseline``)."""
    import opentine  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        bench = slope(lambda n, _folder: build(n), lo, hi, repeat, out)
        cli = slope(build_cli_shape, lo, hi, repeat, out)
    print(json.dumps({"bench": bench, "cli": cli}))


def compare(baseline: str, lo: int, hi: int, repeat: int, rounds: int) -> int:
    """This build and the one in ``baseline``, each round in fresh processes, interleaved."""
    me = [sys.executable, __file__, "--json", "--iterations", str(hi), "--repeat", str(repeat)]
    arms = {"this build": [*me, "--source", str(REPO)], "baseline": [*me, "--source", baseline]}
    samples: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
            out = subprocess.run(arms[name], capture_output=True, text=True, check=True)
            samples[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; write_tine per iteration, "
          f"slope between {max(2, hi // 5)} and {hi} iterations; medians of {rounds} interleaved rounds")
    for loop, label in (("bench", "2 checks, changing 16-line failure"), ("cli", "bench_cli's loop")):
        for key, unit in (("ms", "CPU ms"), ("bytes", "bytes"), ("strings", "distinct strings")):
            base = statistics.median(s[loop][key] for s in samples["baseline"])
            mine = statistics.median(s[loop][key] for s in samples["this build"])
            ratio = f"{base / mine:6.2f}x" if mine > 0 else "     -"
            print(f"{label:36s} {unit:17s} baseline {base:9.2f}   this build {mine:9.2f}   {ratio}")
    rows = "; ".join(f"{name} " + ", ".join(f"{s['cli']['ms']:.3f}" for s in samples[name]) for name in arms)
    print(f"rounds, bench_cli's loop, CPU ms per iteration: {rows}")
    return 0


def json_baseline(result: LoopResult, path: Path) -> None:
    """What a plain run log costs: the same result, json.dumps'ed to disk."""
    data = {"spec": result.spec.to_dict(), "verdict": result.verdict.value, "reason": result.reason,
            "iterations": [r.to_dict() for r in result.iterations]}
    path.write_text(json.dumps(data, indent=2, allow_nan=False))


def median_time(fn, repeat: int) -> float:
    """Median CPU seconds of ``fn()`` (CPU time: steadier than wall time on a shared machine)."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="a directory holding an older build's pytest_loops: compare, interleaved")
    parser.add_argument("--rounds", type=int, default=5, help="rounds with --baseline (default 5)")
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n, repeat = max(2, args.iterations), max(1, args.repeat)
    small_n = max(1, n // 5)
    if args.json:
        measure_json(small_n, n, repeat)
        return 0
    if args.baseline:
        return compare(args.baseline, small_n, n, repeat, max(1, args.rounds))

    start = time.perf_counter()
    import opentine  # noqa: F401  (the one-off import, paid once per process)
    import_s = time.perf_counter() - start

    result, small = build(n), build(small_n)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        provenance.write_tine(small, out / "warmup.tine")
        baseline = median_time(lambda: json_baseline(result, out / "run.json"), repeat)
        tine = median_time(lambda: provenance.write_tine(result, out / "run.tine"), repeat)
        tine_small = median_time(lambda: provenance.write_tine(small, out / "small.tine"), repeat)
        signed = median_time(lambda: provenance.write_tine(result, out / "signed.tine",
                                                           hmac_key=b"0123456789abcdef0123"), repeat)
        scrub = provenance.make_redactor()
        build_s = median_time(lambda: provenance._payloads(result, scrub), repeat)
        payloads, metadata = provenance._payloads(result, scrub), provenance._metadata(result, scrub)
        def save(memo: bool) -> None:
            if not memo:
                provenance._save(payloads, metadata, False, out / "save.tine", None, "")
                return
            with tinememo.RedactionMemo():
                provenance._save(payloads, metadata, False, out / "save.tine", None, "")

        save_s = median_time(lambda: save(True), repeat)
        save_plain_s = median_time(lambda: save(False), repeat)
        from opentine import Run

        load_s = median_time(lambda: Run.load(out / "run.tine"), repeat)
        steps = len(Run.load(out / "run.tine").steps)
        size = (out / "run.tine").stat().st_size
        json_size = (out / "run.json").stat().st_size
        ok, message = tineread.verify_tine(out / "run.tine")

    per_iteration = (tine - tine_small) / (n - small_n)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; CPU times")
    print(f"loop: {n} iterations x 2 checks + revise -> {steps} steps; median of {repeat} runs")
    print(f"import opentine (once per process)   {import_s * 1000:8.1f} ms")
    print(f"json.dumps baseline ({json_size:,} B)    {baseline * 1000:8.1f} ms")
    print(f"write_tine ({size:,} B .tine)        {tine * 1000:8.1f} ms   "
          f"{tine / baseline:6.1f}x baseline   goal < {GOAL_S * 1000:.0f} ms: "
          f"{'met' if tine < GOAL_S else 'NOT met'}")
    print(f"write_tine, HMAC-signed              {signed * 1000:8.1f} ms   {signed / tine:6.2f}x unsigned")
    print(f"  building the steps (ours)          {build_s * 1000:8.1f} ms   "
          f"{build_s / tine:6.1%} of write_tine")
    print(f"  opentine's save, redaction memoized {save_s * 1000:7.1f} ms   {save_s / tine:6.1%} of write_tine")
    print(f"  the same save without the memo     {save_plain_s * 1000:8.1f} ms   "
          f"{save_plain_s / save_s:6.2f}x memoized")
    print(f"  reading back (only when redaction changed a string) {load_s * 1000:.1f} ms")
    print(f"write_tine, {small_n} iterations            {tine_small * 1000:8.1f} ms")
    print(f"recording cost per iteration         {per_iteration * 1000:8.2f} ms   "
          f"(slope between {small_n} and {n} iterations)")
    print(f"verify: {message}" if ok else f"verify FAILED: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

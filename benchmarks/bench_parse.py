"""How fast are loop files read? Parse 1,000 generated `.loop` files (and YAML ones).

    python benchmarks/bench_parse.py [--files 1000] [--repeat 5]

Prints the time to parse them all against a baseline measured in the same run:
just reading the bytes of the same files. The target is "well under 1 s" for
1,000 `.loop` files. Always exits 0: it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

try:
    from pytest_loops.sources import load_loop_file, load_yaml_loops
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pytest_loops.sources import load_loop_file, load_yaml_loops

WORDS = ("cart", "billing", "parser", "auth", "upload", "search", "invoice", "export", "tokens", "docs")

CONFIG = """\
use the BMAD method
models: fast haiku, strong opus
git:
  work on a branch
  commit when the goal is met
budget: 20 minutes

"""

LOOP = """\
# {word}: keep it green
loop "fix the {word} tests {n}":
  goal: every {word} test passes and the {word} module stays small
  done when "pytest -q tests/test_{word}.py" passes
  done when "ruff check src/{word}" finds nothing
  done when the test "tests/test_{word}.py::test_edge_case" passes 3 times
  look at: src/{word}/, src/{word}/models.py, the {word} service, and the last failure
  allow edits automatically, but ask me before migrations or pushes
  each cycle: plan, then act, then observe
  when it fails: reflect on which layer broke, then plan again
  when blocked: ask a human
  after 6 tries: stop and warn "{word} is still failing"
  remember in "lessons/{word}.md"
  revise with "python tools/agent.py --prompt-file $LOOP_PROMPT_FILE"
  stop when nothing changes for 2 tries
"""

PIPELINE = """\
pipeline "ship {word} {n}":
  stage "build":
    goal: the {word} wheel builds
    check: python -m build --wheel
  stage "test":
    goal: the {word} tests pass
    done when "pytest -q tests/{word}" passes
    a human approves before deploying
"""

YAML = """\
loops:
  - name: fix the {word} tests {n}
    goal: every {word} test passes
    checks:
      - pytest -q tests/test_{word}.py
      - {{finds_nothing: ruff check src/{word}}}
      - {{test: "tests/test_{word}.py::test_edge_case", times: 3}}
    revise: python tools/agent.py
    guards: {{max_iter: 6, budget: 15 minutes, no_progress_k: 2}}
    state_paths: [src/{word}/]
    lessons_page: lessons/{word}.md
"""


def generate(directory: Path, count: int, seed: int = 1) -> tuple[list[Path], list[Path]]:
    rng = random.Random(seed)
    loops, yamls = [], []
    for n in range(count):
        word = rng.choice(WORDS)
        parts = [CONFIG] if n % 3 == 0 else []
        parts += [LOOP.format(word=word, n=n) for _ in range(1)]
        if n % 4 == 0:
            parts.append(PIPELINE.format(word=word, n=n))
        path = directory / f"{word}-{n}.loop"
        path.write_text("\n".join(parts), encoding="utf-8")
        loops.append(path)
        ypath = directory / f"{word}-{n}.loop.yaml"
        ypath.write_text(YAML.format(word=word, n=n), encoding="utf-8")
        yamls.append(ypath)
    return loops, yamls


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000, help="how many files of each kind (default 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement; the best is kept")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        loops, yamls = generate(Path(tmp), args.files)
        total_bytes = sum(p.stat().st_size for p in loops)

        def read_all(paths=loops):
            for p in paths:
                with open(p, "rb") as f:
                    f.read()

        def parse_all():
            n = 0
            for p in loops:
                n += len(load_loop_file(p).all_loops())
            return n

        def parse_yaml():
            for p in yamls:
                load_yaml_loops(p)

        specs = parse_all()  # warm up imports and caches, and count what is built
        collect = collect_with_pytest(Path(tmp), loops, args.repeat)
        baseline = best_of(args.repeat, read_all)
        parsed = best_of(args.repeat, parse_all)
        yaml_base = best_of(args.repeat, lambda: read_all(yamls))
        yaml_parsed = best_of(max(1, args.repeat // 2), parse_yaml)

    n = len(loops)
    print(f"{n} .loop files, {total_bytes / 1024:.0f} KiB, {specs} loops and stages "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} cpu)")
    print(f"  read the bytes (baseline): {baseline * 1000:8.1f} ms")
    print(f"  read and parse:            {parsed * 1000:8.1f} ms   "
          f"({parsed / n * 1e6:.0f} us per file, {parsed / baseline:.1f}x the baseline)")
    verdict = "well under" if parsed < 0.5 else ("under" if parsed < 1.0 else "OVER")
    print(f"  target: 1,000 files well under 1 s -> {verdict} "
          f"({parsed * 1000 / n * 1000:.0f} ms per 1,000 files)")
    print(f"{n} .loop.yaml files")
    print(f"  read the bytes (baseline): {yaml_base * 1000:8.1f} ms")
    print(f"  read and parse:            {yaml_parsed * 1000:8.1f} ms   "
          f"({yaml_parsed / n * 1e6:.0f} us per file, {yaml_parsed / yaml_base:.1f}x the baseline)")
    base_s, loop_s, items = collect
    print(f"pytest --loop --collect-only over the {n} .loop files ({items} check items)")
    print(f"  pytest without --loop (baseline: start-up and the directory walk): {base_s:6.2f} s")
    print(f"  pytest --loop --collect-only:                                       {loop_s:6.2f} s")
    print(f"  collecting the loop files adds {loop_s - base_s:.2f} s "
          f"({'under' if loop_s - base_s < 1.0 else 'OVER'} the 1 s target)")
    return 0


def collect_with_pytest(directory: Path, loops: list[Path], repeat: int) -> tuple[float, float, int]:
    """Whole `pytest --collect-only` runs over the generated files, with and without --loop."""
    import subprocess

    project = directory / "collect"
    project.mkdir()
    for p in loops:
        (project / p.name).write_bytes(p.read_bytes())
    (project / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *extra], cwd=project, capture_output=True, text=True, env=env)

    def timed(*extra: str) -> float:
        best = float("inf")
        for _ in range(max(1, repeat // 2)):
            start = time.perf_counter()
            run(*extra)
            best = min(best, time.perf_counter() - start)
        return best

    done = run("--loop")
    items = sum(1 for line in done.stdout.splitlines() if "::" in line)
    return timed(), timed("--loop"), items


if __name__ == "__main__":
    sys.exit(main())

"""Fault localization on real libraries: planted one-line bugs in sdists that ship their tests.

For each sdist given (more-itertools, cachetools and toolz have bugs listed
below), the tree is unpacked into a temporary directory; then, bug by bug, one
line is changed, the whole suite runs once plainly (the session's run: which
tests fail), and the failing tests with a sample of passing peers run once
under per-test coverage, as the session fix-loop's first iteration does
(``sample_peers``, ``collect_spectra``). The suspect lines are ranked
(``rank_suspects``, the prompt's top 10) and grouped by function as the prompt
names them (``group_suspects``). Printed per bug: where the function holding
the bug ranks among the suspect functions: before (the lines a failing test
runs while its failure message is made counted as its own, as they were until
the recorder told them apart; the same run's two records merged), now, and with
the lines changed since the last green run (the pristine tree here) known; and
how many of the top 10 lines sit in ``__repr__``/``__str__``-like formatting code. Target: the buggy
function in the top 3 for at least 8 of the 10 bugs.

Download the sdists by hand (never from tests), e.g.::

    pip download --no-deps --no-binary :all: more-itertools==11.2.1 cachetools==8.0.2 toolz==1.2.0 -d /tmp/sdists
    python benchmarks/bench_localize_real.py /tmp/sdists/*.tar.gz

Usage: python benchmarks/bench_localize_real.py SDIST... [--json FILE]
Always exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_loops.localization.localize import TOP, sample_peers  # noqa: E402
from pytest_loops.localization.spectra import collect_spectra  # noqa: E402
from pytest_loops.localization.suspects import group_suspects, rank_suspects  # noqa: E402

TARGET_RANK = 3
PLAIN_TIMEOUT_S = 300
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR) (\S+?::\S+?)(?: - .*)?$")
_FORMATTING = re.compile(r"__(?:repr|str|format)__\(\)$")


@dataclass(frozen=True)
class Bug:
    file: str  # relative to the library's root
    function: str  # the scope as the prompt names it: "windowed()", "Cache.__getitem__()"
    old: str  # exactly one occurrence in the file
    new: str
    kind: str


LIBRARIES: dict[str, tuple[dict[str, str], list[Bug]]] = {
    "more_itertools": ({}, [
        Bug("more_itertools/more.py", "windowed()", "for _ in islice(filler, step - 1, None, step):",
            "for _ in islice(filler, step, None, step):", "off-by-one"),
        Bug("more_itertools/recipes.py", "tail()", "return islice(iterable, max(0, size - n), None)",
            "return islice(iterable, max(0, size - n + 1), None)", "off-by-one"),
        Bug("more_itertools/recipes.py", "all_equal()", "        for second in iterator:\n            return False",
            "        for second in iterator:\n            return True", "wrong constant"),
        Bug("more_itertools/more.py", "chunked.ret()", "if len(chunk) != n:", "if len(chunk) > n:",
            "wrong comparison"),
    ]),
    "cachetools": ({"PYTHONPATH": "src"}, [
        Bug("src/cachetools/__init__.py", "Cache.__getitem__()", "            return self.__data[key]\n",
            "            return self.__data.get(key)\n", "missing branch"),
        Bug("src/cachetools/__init__.py", "LRUCache.__setitem__()", "            order.move_to_end(key)\n"
            "        else:\n            order[key] = None",
            "            pass\n        else:\n            order[key] = None", "missing call"),
        Bug("src/cachetools/keys.py", "typedkey()",
            "        key += tuple([type(v) for _, v in sorted_kwargs])\n    else:\n        key = args\n"
            "    return key + tuple(map(type, args))\n\n\ndef typedmethodkey",
            "        key += tuple([v for _, v in sorted_kwargs])\n    else:\n        key = args\n"
            "    return key + tuple(map(type, args))\n\n\ndef typedmethodkey", "missing call"),
    ]),
    "toolz": ({}, [
        Bug("toolz/itertoolz.py", "frequencies()", "        d[item] += 1\n    return dict(d)",
            "        d[item] = 1\n    return dict(d)", "wrong operator"),
        Bug("toolz/dicttoolz.py", "valmap()", "rv.update(zip(d.keys(), map(func, d.values())))",
            "rv.update(zip(d.keys(), d.values()))", "missing call"),
        Bug("toolz/itertoolz.py", "interpose()", "inposed = concat(zip(itertools.repeat(el), seq))",
            "inposed = concat(zip(seq, itertools.repeat(el)))", "swapped arguments"),
    ]),
}


def _library(sdist: Path) -> str | None:
    name = sdist.name.lower().replace("-", "_")
    return next((lib for lib in LIBRARIES if name.startswith(lib + "_") or name.startswith(lib + ".")), None)


def _unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    (top,) = [p for p in into.iterdir() if p.is_dir()]
    return top


def _plain_run(root: Path, env: dict[str, str]) -> tuple[list[str], list[str], float]:
    """The session's run: failing and passing node ids (``-rA``), and its time."""
    began = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                              "-p", "no:randomly", "-p", "no:xdist", "--tb=no"], cwd=root, env=env,
                             capture_output=True, text=True, check=False, timeout=PLAIN_TIMEOUT_S).stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    elapsed = time.perf_counter() - began
    failing: dict[str, None] = {}
    passing: dict[str, None] = {}
    for line in out.splitlines():
        match = _RESULT.match(line.rstrip())
        if match:
            (passing if match.group(1) == "PASSED" else failing).setdefault(match.group(2), None)
    return list(failing), [t for t in passing if t not in failing], elapsed


def _changed_lines(before: str, after: str) -> set[int]:
    changed: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before.splitlines(), after.splitlines()).get_opcodes():
        if tag != "equal":
            changed.update(range(j1 + 1, max(j2, j1 + 1) + 1))
    return changed


def _rank_of(function: str, scopes: list[str]) -> int | None:
    return next((i + 1 for i, scope in enumerate(scopes) if scope == function), None)


def run(sdists: list[Path]) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-localize-real-") as scratch:
        for sdist in sdists:
            lib = _library(sdist)
            if lib is None:
                print(f"{sdist.name}: no bugs listed for it; skipped", file=sys.stderr)
                continue
            extra_env, bugs = LIBRARIES[lib]
            root = _unpack(sdist, Path(scratch, lib))
            env = {**os.environ, **extra_env, "PYTHONDONTWRITEBYTECODE": "1"}
            for bug in bugs:
                target = root / bug.file
                pristine = target.read_text(encoding="utf-8")
                if pristine.count(bug.old) != 1:
                    rows.append({"library": lib, "function": bug.function,
                                 "error": "the line to change is not there once"})
                    continue
                planted = pristine.replace(bug.old, bug.new)
                target.write_text(planted, encoding="utf-8")
                try:
                    rows.append(_one(lib, root, env, bug, {bug.file: _changed_lines(pristine, planted)}))
                finally:
                    target.write_text(pristine, encoding="utf-8")
                shutil.rmtree(root / ".pytest-loops", ignore_errors=True)
    return rows


def _one(lib: str, root: Path, env: dict[str, str], bug: Bug, changed: dict[str, set[int]]) -> dict:
    failing, passing, plain_s = _plain_run(root, env)
    row: dict = {"library": lib, "function": bug.function, "kind": bug.kind, "failing": len(failing),
                 "tests": len(failing) + len(passing), "plain_s": round(plain_s, 2)}
    if not failing:
        row["error"] = "no test fails"
        return row
    peers = sample_peers(failing, passing)
    began = time.perf_counter()
    spectra = collect_spectra(root, [*failing, *peers], env=env, timeout=600)
    row["spectra_s"] = round(time.perf_counter() - began, 2)
    # before: the lines run to format a failure counted as the test's own (what the
    # recorder saw until it told them apart): the same run, its two records merged
    merged = dataclasses.replace(spectra, lines={t: spectra.ran(t) for t in spectra.lines}, after={})
    for label, source, known in (("_before", merged, None), ("", spectra, None), ("_changed", spectra, changed)):
        ranked = rank_suspects(source, top=TOP, changed=known)
        scopes = [g.scope for g in group_suspects(ranked)]
        row[f"rank{label}"] = _rank_of(bug.function, scopes)
        row[f"top{label}"] = scopes[:TARGET_RANK]
        row[f"formatting{label}"] = sum(1 for s in ranked if _FORMATTING.search(s.scope))
    return row


def _show(rank: int | None) -> str:
    return "-" if rank is None else str(rank)


def report(rows: list[dict]) -> None:
    print(f"{'library':<15} {'buggy function':<24} {'kind':<18} {'fail/tests':>10} {'before':>6} {'fmt':>4} "
          f"{'rank':>5} {'fmt':>4} {'+changed':>8}  top 3 suspect functions")
    for row in rows:
        if "error" in row:
            print(f"{row['library']:<15} {row['function']:<24} {row.get('kind', ''):<18} {row['error']}")
            continue
        print(f"{row['library']:<15} {row['function']:<24} {row['kind']:<18} "
              f"{row['failing']:>4}/{row['tests']:<5} {_show(row['rank_before']):>6} {row['formatting_before']:>4} "
              f"{_show(row['rank']):>5} {row['formatting']:>4} {_show(row['rank_changed']):>8}  "
              f"{', '.join(row['top'])}")
    measured = [r for r in rows if "error" not in r]
    def hits_of(key: str) -> int:
        return sum(1 for r in measured if r[key] is not None and r[key] <= TARGET_RANK)

    hits, hits_changed, hits_before = hits_of("rank"), hits_of("rank_changed"), hits_of("rank_before")
    libs = len({r["library"] for r in measured})
    need = 8 if len(measured) >= 10 else max(1, round(0.8 * len(measured)))
    verdict = "met" if hits >= need and len(measured) >= 10 and libs >= 3 else "not met"
    print(f"\nbuggy function in the top {TARGET_RANK}: {hits}/{len(measured)} (before: {hits_before}; "
          f"with the changed lines known: {hits_changed}), {libs} libraries; "
          f"target >= 8 of 10 in >= 3 libraries: {verdict}")
    print("before: lines run to format a failure counted as suspects; fmt: top-10 lines in "
          "__repr__/__str__/__format__")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("sdists", nargs="+", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run(args.sdists)
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

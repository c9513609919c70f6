"""Fuzz every reader of untrusted input, many more examples than the test suite.

    python benchmarks/fuzz_readers.py [--examples 2000] [--seed 1] [--only NAME ...]

Readers and what they may do with bad input (anything else is a finding):

- ``load_runlog``: return a run dict or raise LoopUsageError
  (random bytes, truncated and bit-flipped logs, mutated JSON);
- ``run --resume``, ``show``, ``diff``, ``report`` on mutated run logs: exit 0, 2,
  3, 4, 5 or 64 with one ``error:`` line, never 70 (in process, with a runner
  that spawns nothing: `true` passes, any other command fails);
- ``load_run`` and ``verify`` on random and damaged ``.tine`` files: a run dict
  or LoopUsageError; verify exits 0 (intact) or 1 with one line;
- ``read_runner_config`` on random structures and YAML-ish text: a valid layer
  or LoopUsageError;
- the command line: random argv from a vocabulary of our flags and junk
  values, exit 0, 1 (verify only), 2, 3, 4, 5 or 64, never 70 or a traceback.

Prints, per reader, how many inputs were accepted, refused with the documented
error, and how many did anything else (with the first few such inputs). Exits 1
only if some reader did anything else; 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import pytest_loops  # noqa: F401
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_loops import LoopUsageError
from pytest_loops.artifacts.runlog import RunLogWriter, load_runlog  # noqa: E402
from pytest_loops.cli import main as cli  # noqa: E402
from pytest_loops.cli.runview import load_run  # noqa: E402
from pytest_loops.defaults import validate_guard_values  # noqa: E402
from pytest_loops.sources.config import read_runner_config  # noqa: E402
from pytest_loops.testing import InstantRunner  # noqa: E402

ACCEPTED, REFUSED, BAD = "accepted", "refused", "BAD"


def run_main(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except BaseException as exc:  # noqa: BLE001 - main() must never raise
            return -1, f"main() raised {type(exc).__name__}: {exc}"
    return code, err.getvalue()


def cli_outcome(code: int, err: str, allowed: set[int]) -> str:
    if code not in allowed or "Traceback" in err or "internal error" in err:
        return BAD
    if code == 64:
        errors = [line for line in err.splitlines() if line.startswith("pytest-loops: error: ")]
        return REFUSED if len(errors) == 1 else BAD
    return ACCEPTED


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        with contextlib.chdir(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- random values


def junk(rng: random.Random) -> Any:
    """A JSON-ish value of a random type; strings never contain '/' or '..'."""
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2, 7, 10**6, -(10**9)])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1.5, 1e308, float("nan"), float("inf"), float("-inf")])
    if kind == 4:
        return "".join(rng.choice("ab -_*:\u00e9\n") for _ in range(rng.randrange(8)))
    if kind == 5:
        return rng.choice(["", "SUCCESS", "TIMEOUT", "command", "pytest", "hook", "human", "state", "both",
                           "sha256:00", "pytest-loops.runlog/1", "pytest-loops.runlog/9", "*"])
    if kind == 6:
        return [rng.choice([0, "a", None, 1.5, {"a": 1}]) for _ in range(rng.randrange(3))]
    if kind == 7:
        return {rng.choice("abc"): rng.choice([0, "a", None]) for _ in range(rng.randrange(3))}
    return rng.choice([[], {}, [[]], {"": {}}])


def mutate(doc: Any, rng: random.Random, times: int, done: list[str]) -> Any:
    """Replace or delete ``times`` values at random depths; ``done`` gets what changed."""
    for _ in range(times):
        node, where = doc, ""
        while isinstance(node, (dict, list)) and node:
            key = rng.choice(sorted(node, key=str)) if isinstance(node, dict) else rng.randrange(len(node))
            where += f"[{key!r}]"
            child = node[key]
            if isinstance(child, (dict, list)) and child and rng.random() < 0.6:
                node = child
                continue
            if isinstance(node, dict) and rng.random() < 0.3:
                del node[key]
                done.append(f"del {where}")
            else:
                node[key] = junk(rng)
                done.append(f"{where} = {node[key]!r}")
            break
    return doc


def dump(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False, allow_nan=True)


# --------------------------------------------------------------------------- corpus


def make_corpus(base: Path) -> dict[str, Any]:
    work = base / "work"
    work.mkdir()
    code, err = run_main(["run", "-q", "--verify", "false", "--verify", "true", "--revise", "true",
                          "--state", "*.txt", "--max-iter", "3", "--no-progress-k", "0",
                          "--cwd", str(work), "--log", str(base / "max.json")])
    assert code == 2, err
    code, err = run_main(["run", "-q", "--verify", "true", "--cwd", str(work), "--log", str(base / "ok.json")])
    assert code == 0, err
    finished = json.loads((base / "max.json").read_text(encoding="utf-8"))
    writer = RunLogWriter(base / "killed.json")
    writer.start({k: v for k, v in finished.items()
                  if k not in ("verdict", "exit_code", "reason", "iterations", "iterations_run", "ended_at",
                               "elapsed_s", "artifacts", "lessons", "schema")})
    for record in finished["iterations"][:2]:
        writer.iteration(record)
    return {
        "dir": base, "finished": finished,
        "texts": [(base / name).read_text(encoding="utf-8") for name in ("max.json", "ok.json", "killed.json")],
        "tine": (base / "max.tine").read_bytes(),
    }


def mutated_log(corpus: dict[str, Any], rng: random.Random, directory: Path) -> tuple[Path, str]:
    """A mutated finished or killed run log in ``directory``, and what was changed."""
    done: list[str] = []
    if rng.random() < 0.5:
        doc = copy.deepcopy(corpus["finished"])
        doc["spec"]["cwd"] = str(directory)
        text = dump(mutate(doc, rng, rng.randint(1, 4), done))
        done.insert(0, "finished log:")
    else:
        events = [json.loads(line) for line in corpus["texts"][2].splitlines()]
        events[0]["spec"]["cwd"] = str(directory)
        text = "\n".join(dump(e) for e in mutate(events, rng, rng.randint(1, 4), done)) + "\n"
        done.insert(0, "events log:")
    path = directory / "runs" / "mutated.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path, " ".join(done)


# --------------------------------------------------------------------------- the readers


def load_runlog_outcome(path: Path) -> str:
    try:
        data = load_runlog(path)
    except LoopUsageError as exc:
        return BAD if "\n" in str(exc) else REFUSED
    return ACCEPTED if isinstance(data, dict) and isinstance(data.get("iterations"), list) else BAD


def fuzz_load_runlog(corpus, rng, work) -> tuple[str, str]:
    path = work / "log.json"
    choice = rng.randrange(3)
    if choice == 0:
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(400)))
        what = "random bytes"
    elif choice == 1:
        blob = bytearray(rng.choice(corpus["texts"]).encode())
        del blob[rng.randrange(len(blob) + 1):]
        for _ in range(rng.randrange(3)):
            if blob:
                blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        blob = bytes(blob)
        what = "truncated/flipped log"
    else:
        path, what = mutated_log(corpus, rng, work)
        return load_runlog_outcome(path), what
    path.write_bytes(blob)
    return load_runlog_outcome(path), f"{what}: {blob[:200]!r}"


def fuzz_resume(corpus, rng, work) -> tuple[str, str]:
    log, what = mutated_log(corpus, rng, work)
    argv = ["run", "--resume", str(log), "-q", "--no-tine", "--max-iter", "3",
            "--log", str(work / "resumed.json"), "--artifacts", str(work / "art")]
    if rng.random() < 0.5:
        argv += ["--cwd", str(work)]
    code, err = run_main(argv)
    return cli_outcome(code, err, {0, 2, 3, 4, 5, 64}), f"{err.strip()[:300]} <- {what}"


def fuzz_show_diff_report(corpus, rng, work) -> tuple[str, str]:
    log, what = mutated_log(corpus, rng, work)
    argv = rng.choice([["show", str(log)], ["diff", str(corpus["dir"] / "max.json"), str(log)],
                       ["report", str(work / "runs"), "-o", str(work / "r.html")]])
    code, err = run_main(argv)
    return cli_outcome(code, err, {0, 64}), f"{argv[0]}: {err.strip()[:300]} <- {what}"


def tine_json(blob: bytes) -> Any:
    """The JSON document inside a .tine (compressed by default)."""
    if blob.startswith(b"TINEZ1\0"):
        from opentine._codec import unwrap

        blob = unwrap(blob, limit=1 << 30)
    return json.loads(blob)


def fuzz_tine(corpus, rng, work) -> tuple[str, str]:
    path = work / rng.choice(["x.tine", "x.json", "x"])
    choice = rng.random()
    if choice < 0.4:  # a readable file whose content was edited: the steps' values
        doc = tine_json(corpus["tine"])
        done: list[str] = []
        target = doc["graph"]["steps"] if rng.random() < 0.8 else doc
        mutate(target, rng, rng.randint(1, 4), done)
        blob = dump(doc).encode()
        path = work / "x.tine"
        path.write_bytes(blob)
        what = " ".join(done)
    elif choice < 0.7:
        blob = bytearray(corpus["tine"])
        del blob[max(1, rng.randrange(len(blob) + 1)):]
        for _ in range(rng.randrange(4)):
            blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        blob = bytes(blob)
    else:
        blob = rng.choice([b"", b"TINEZ1\0", b'{"format_version": 2, "graph": ']) + bytes(
            rng.randrange(256) for _ in range(rng.randrange(300)))
    if choice >= 0.4:
        path.write_bytes(blob)
        what = repr(blob[:100])
    try:
        run = load_run(path)
        outcome = ACCEPTED if isinstance(run, dict) else BAD
    except LoopUsageError as exc:
        outcome = BAD if "\n" in str(exc) else REFUSED
    except Exception as exc:  # noqa: BLE001 - that is the finding
        return BAD, f"load_run raised {type(exc).__name__}: {exc} <- {what}"
    for argv in (["show", str(path)], ["verify", str(path)]):
        code, err = run_main(argv)
        if cli_outcome(code, err, {0, 1, 64}) == BAD:
            return BAD, f"{argv[0]} exit {code}: {err.strip()[:300]} <- {what}"
    return outcome, ""


SECTIONS = ["guards", "progress", "reflexion", "run_log", "revise", "verify", "protect", "scope", "other"]
KEYS = ["max_iter", "budget_seconds", "no_progress_k", "escalate_after_iter", "escalate_after",
        "no_progress_signal", "state_paths", "enabled", "episodic_memory_page", "path", "cmd", "cmds",
        "paths", "junk"]
YAML_BITS = [f"{s}:" for s in SECTIONS] + [f"  {k}: " for k in KEYS] + [
    "  - ", "- ", "[", "]", "{", "}", ": ", "\t", "  ", "\n", "\n", "'", '"', "&a ", "*a", "!!python/name:os.system",
    "---", "...", "%YAML 1.2", "#", "~", "1e3", "-1", ".inf", ".nan", "yes", "on", "2", "true", "x"]


def valid_layer(layer: dict[str, Any]) -> bool:
    guards = {k: layer[k] for k in ("max_iter", "budget_seconds", "no_progress_k", "escalate_after") if k in layer}
    if validate_guard_values(**guards):
        return False
    for key in ("state_paths", "verify", "protect", "scope"):
        if key in layer and not (isinstance(layer[key], list) and all(isinstance(v, str) for v in layer[key])):
            return False
    return all(isinstance(layer[k], str) for k in ("revise", "lessons_page", "log_path") if k in layer)


def fuzz_config(corpus, rng, work) -> tuple[str, str]:
    path = work / "loop-runner.config.yaml"
    if rng.random() < 0.5:
        text = "".join(rng.choice(YAML_BITS) for _ in range(rng.randrange(30)))
        path.write_text(text, encoding="utf-8")
        data, what = None, repr(text)
    else:
        data = {rng.choice(SECTIONS): (junk(rng) if rng.random() < 0.3 else
                                       {rng.choice(KEYS): junk(rng) for _ in range(rng.randrange(5))})
                for _ in range(rng.randrange(6))}
        what = repr(data)
    try:
        layer = read_runner_config(path, data=data)
    except LoopUsageError as exc:
        return (BAD if "\n" in str(exc) else REFUSED), what
    except Exception as exc:  # noqa: BLE001 - that is the finding
        return BAD, f"{type(exc).__name__}: {exc} <- {what}"
    return (ACCEPTED if valid_layer(layer) else BAD), what


SUBCOMMANDS = ["run", "show", "diff", "verify", "report", "", "bogus"]
FLAGS = ["--verify", "--revise", "--state", "--protect", "--scope", "--max-iter", "--budget-seconds",
         "--no-progress-k", "--no-progress-signal", "--escalate-after", "--log", "--episodic",
         "--no-reflexion", "--lessons", "--lessons-page",
         "--config", "--cwd", "--name", "--goal", "--artifacts", "-p", "--resume", "--tine",
         "--no-tine", "--sign-key-env", "--sign-key-file", "--quiet", "-q", "-v", "--key-env", "--pubkey",
         "-o", "--output", "--help", "--version", "--bogus", "-x", "--"]
VALUES = ["true", "false", "exit 3", "", " ", "0", "1", "2", "3", "-1", "1.5", "abc", "nan", "inf", "1e3",
          "0.0001", "state", "failure", "both", "sideways", "*.txt", "out.html", "log.json", "run.json",
          "missing.json", "junk.json", "config.yaml", "bad.yaml", "dir", "file.txt", "x.loop", "run.tine",
          "NO_SUCH_VAR", "HOME", "no_such_module", "os", "\u00e9", "a b", "-", "--"]


def fuzz_argv(corpus, rng, work) -> tuple[str, str]:
    files = {"run.json": corpus["texts"][0].encode(), "junk.json": b"{not json",
             "config.yaml": b"guards:\n  max_iter: 2\nverify:\n  cmd: 'false'\n", "bad.yaml": b"guards: [1\n",
             "file.txt": b"hello\n", "x.loop": b'loop "x":\n  done when "true" passes\n',
             "run.tine": corpus["tine"]}
    for name, blob in files.items():
        (work / name).write_bytes(blob)
    (work / "dir").mkdir(exist_ok=True)
    command = rng.choice(SUBCOMMANDS)
    argv = ([command] if command else []) + [rng.choice(FLAGS if rng.random() < 0.5 else VALUES)
                                             for _ in range(rng.randrange(11))]
    code, err = run_main(argv)
    allowed = {0, 1, 2, 3, 4, 5, 64} if command == "verify" else {0, 2, 3, 4, 5, 64}
    return cli_outcome(code, err, allowed), f"{argv!r}: exit {code}: {err.strip()[:300]}"


READERS: dict[str, Callable[..., tuple[str, str]]] = {
    "load_runlog": fuzz_load_runlog,
    "run --resume": fuzz_resume,
    "show/diff/report": fuzz_show_diff_report,
    "load_run/verify (.tine)": fuzz_tine,
    "read_runner_config": fuzz_config,
    "argv": fuzz_argv,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="inputs per reader (default 2000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", choices=list(READERS), help="fuzz only this reader")
    parser.add_argument("--show", type=int, default=5, help="how many bad inputs to print per reader")
    args = parser.parse_args(argv)
    import pytest_loops.runtime.process

    pytest_loops.runtime.process.ProcessRunner = InstantRunner  # type: ignore[misc] - spawn nothing
    for name in list(os.environ):
        if name.startswith(("PYTEST_LOOPS_", "LOOP_")):
            del os.environ[name]
    failed = False
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as base:
        corpus = make_corpus(Path(base))
        print(f"{'reader':<26} {'examples':>8} {'accepted':>9} {'refused':>8} {'BAD':>5} {'per input':>10}")
        for name, fuzz in READERS.items():
            if args.only and name not in args.only:
                continue
            rng = random.Random(f"{args.seed}:{name}")
            counts: Counter[str] = Counter()
            bad: list[str] = []
            t0 = time.perf_counter()
            for _ in range(args.examples):
                with scratch() as work:
                    try:
                        outcome, what = fuzz(corpus, rng, work)
                    except Exception as exc:  # noqa: BLE001 - a reader raised: that is the finding
                        outcome, what = BAD, f"raised {type(exc).__name__}: {exc}"
                counts[outcome] += 1
                if outcome == BAD and len(bad) < args.show:
                    bad.append(what)
            per = (time.perf_counter() - t0) / max(1, args.examples)
            print(f"{name:<26} {args.examples:>8} {counts[ACCEPTED]:>9} {counts[REFUSED]:>8} {counts[BAD]:>5} "
                  f"{per * 1000:>8.1f}ms", flush=True)
            for what in bad:
                print(f"    BAD: {what[:1500]}")
            failed = failed or counts[BAD] > 0
    print("FAIL: some reader did something other than its documented error" if failed
          else "ok: every reader returned its shape or its documented error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared pieces of the whole-process benchmarks (bench_cli.py, bench_pytest.py).

Every figure is a whole process timed from spawn to reap, with its CPU time
(user + system, its reaped children included: unlike wall time, it barely moves
when other work shares the machine) and the peak RSS of that process from
``os.wait4`` (on Linux the kernel folds the peaks of the
children it reaped into it, so it is the peak of the biggest process of the
tree). Arms are interleaved round by round, in an order that rotates and flips
every round, and reported as medians: the machines here are shared and noisy,
so only figures measured in the same run are compared.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    seconds: float
    rss_kb: int  # peak resident set size, KiB (ru_maxrss on Linux)
    cpu: float = 0.0  # user + system seconds of the process and the children it reaped


def console_script(name: str) -> str:
    """The installed console script beside the running interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"error: the {name} console script is not installed")
    return found


def user_env() -> dict[str, str]:
    """The environment a user's run sees: bytecode caches on.

    With PYTHONDONTWRITEBYTECODE set (as on some CI and sandbox machines), an
    editable install's modules are compiled from source in every process, which
    adds tens of milliseconds to each start-up and would be charged to the plugin.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_timed(argv: Sequence[str], *, cwd: str | os.PathLike | None = None,
              env: dict[str, str] | None = None, expect: int | None = 0,
              what: str = "") -> Sample:
    """Run ``argv`` to completion; wall seconds from spawn to reap and its peak RSS.

    Output goes to a file, never to a pipe the benchmark must drain while timing;
    on an unexpected exit code the tail of that output is shown and the run stops.
    """
    # not in cwd: a loop guards its working tree, and its own output is no change to it
    with tempfile.TemporaryFile(prefix="bench-out-") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), cwd=cwd, env=user_env() if env is None else env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
        if expect is not None and proc.returncode != expect:
            out.seek(0)
            tail = out.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"error: {what or argv[0]} exited {proc.returncode}, expected {expect}:\n"
                             f"$ {' '.join(map(str, argv))}\n{tail}")
    return Sample(took, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)


def interleaved(jobs: dict[str, Callable[[], Sample]], rounds: int,
                label: str = "") -> dict[str, list[Sample]]:
    """Every job once per round; the order rotates by one and flips every other round."""
    names = list(jobs)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        if r % 2:
            order.reverse()
        progress(f"{label} round {r + 1}/{rounds}")
        for name in order:
            samples[name].append(jobs[name]())
    return samples


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def progress(message: str) -> None:
    """Where the run is, on a terminal only (the report on stdout stays clean)."""
    if sys.stderr.isatty():
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Table:
    """arm | figure | baseline (same run) | ratio | target | met."""

    title: str
    rows: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)

    def add(self, arm: str, figure: str, baseline: str = "", ratio: float | None = None,
            target: str = "", met: bool | None = None) -> None:
        self.rows.append((arm, figure, baseline, "" if ratio is None else f"{ratio:.2f}x",
                          target, "" if met is None else ("met" if met else "NOT met")))

    def render(self) -> str:
        head = ("arm", "figure", "baseline (same run)", "ratio", "target", "met")
        widths = [max(len(head[i]), *(len(row[i]) for row in self.rows)) for i in range(6)]
        lines = [f"\n## {self.title}\n",
                 "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def mb(kb: float) -> str:
    return f"{kb / 1024:.1f} MB"


def machine_line() -> str:
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    note = ("; PYTHONDONTWRITEBYTECODE is set here and dropped for the timed processes"
            if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")
    return (f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}{note}")

"""Live progress while a revise step runs: what it has done so far, a few times a second.

A revise step can run for minutes (an agent CLI). While it runs, a watcher thread
reads what it has written so far (its output file, masked like every output),
which files in the working tree changed (a change journal of its own:
:mod:`pytest_loops.progress.journal`), and what it has reported spending
(``LOOP_USAGE_FILE``), and hands that to ``pytest_loop_revise_progress``. The
reporters decide what to show: a line that updates on a terminal, a heartbeat
line every :data:`HEARTBEAT_SECONDS` elsewhere, or the output itself
(``revise_output = stream``). Nothing here decides anything about the loop; with
no implementation of the hook no thread is started.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.core.usage import Usage, of_record, read_usage, total
from pytest_loops.redact import strip_control
from pytest_loops.runtime.threads import leave_signals_to_the_main_thread

TICK_SECONDS = 0.25  # how often the watcher looks
HEARTBEAT_SECONDS = 10.0  # without a terminal: a status line at least this often (tests shrink it)
MAX_LINE_CHARS = 300  # a shown line is cut here
MAX_READ = 1 << 20  # bytes of new output read per tick: a flood is skipped, never buffered whole
MAX_WATCHED_DIRS = 4000  # a tree with more directories shows no file count
_SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox", ".nox", ".mypy_cache",
                 ".pytest_cache", ".ruff_cache", ".venv", "venv"}


@dataclass
class ReviseProgress:
    """One look at a running revise step (the hook's ``progress``)."""

    iteration: int
    elapsed_s: float
    files_changed: int | None  # None: not known (no change journal here)
    last_line: str  # the output's last non-empty line so far, masked ("" : none yet)
    new_lines: list[str] = field(default_factory=list)  # masked output lines since the last look
    cost_usd: float | None = None  # the loop's spend so far, this step's report included
    tokens: int | None = None
    final: bool = False  # the step has ended: the last look

    def status(self, name: str) -> str:
        """``[loop] revise 2: 42s, 3 files changed, $0.1200, 5,000 tokens | last line``."""
        parts = [f"{self.elapsed_s:.0f}s"]
        if self.files_changed is not None:
            parts.append(f"{self.files_changed} file{'s' if self.files_changed != 1 else ''} changed")
        if self.cost_usd is not None:
            parts.append(f"${self.cost_usd:.4f}" if self.cost_usd < 1 else f"${self.cost_usd:,.2f}")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        line = f"[{name}] revise {self.iteration}: " + ", ".join(parts)
        return line + (f" | {self.last_line}" if self.last_line else "")


class _Changes:
    """Files changed under a tree since it started: its own inotify journal (None: unknown)."""

    def __init__(self, root: Path, exclude: Sequence[Path]) -> None:
        from pytest_loops.progress.journal import DirectoryJournal, JournalLost

        self.exclude = tuple(os.path.realpath(p) for p in exclude)
        self.touched: set[str] = set()
        self.journal: Any = None
        journal = None
        try:
            journal = DirectoryJournal(os.path.realpath(root))
            count = 0
            for top, dirs, _ in os.walk(journal.root):
                dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS and not self._excluded(os.path.join(top, d))]
                for d in dirs:
                    count += 1
                    if count > MAX_WATCHED_DIRS:
                        raise JournalLost("too many directories to watch for the live view")
                    journal.watch(os.path.join(top, d))
            self.journal = journal
        except (JournalLost, OSError):
            if journal is not None:
                journal.close()

    def _excluded(self, path: str) -> bool:
        return any(path == e or path.startswith(e + os.sep) for e in self.exclude)

    def count(self) -> int | None:
        if self.journal is None:
            return None
        from pytest_loops.progress.journal import JournalLost

        try:
            changes = self.journal.drain(ignore=lambda path, name: name in _SKIPPED_DIRS or self._excluded(path))
        except (JournalLost, OSError):
            self.close()
            return None
        for path in changes.touched:
            if os.path.isdir(path) and not os.path.islink(path):
                try:  # a new directory: what is made in it counts too
                    self.journal.watch(path)
                except (JournalLost, OSError):
                    pass
                continue
            self.touched.add(path)
        return len(self.touched)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None


class ReviseWatcher:
    """Looks at one running revise step every :data:`TICK_SECONDS` (a thread), and once more
    when it ends; ``report(progress)`` is the hook call. Use it as a context manager."""

    def __init__(self, report: Callable[[ReviseProgress], None], *, iteration: int, iteration_dir: Path,
                 workdir: Path, exclude: Sequence[Path], usage_dir: Path | None, prior: Sequence[Any],
                 scrub: Callable[[str], str] | None, describe: Callable[[str], str | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.report = report
        self.iteration = iteration
        self.iteration_dir = iteration_dir
        self.usage_dir = usage_dir
        self.spent_before = total(of_record(r) for r in prior)
        self.scrub = scrub
        self.describe = describe
        self.clock = clock
        self.t0 = clock()
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.seen: dict[Path, bytes] = {}  # the last bytes read of each output file
        self.last_line = ""
        self.changes = _Changes(workdir, exclude)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pytest-loops-revise-progress", daemon=True)
        self.lock = threading.Lock()

    def __enter__(self) -> ReviseWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        try:
            self._look(final=True)
        finally:
            self.changes.close()

    def _run(self) -> None:
        leave_signals_to_the_main_thread()
        while not self.stop.wait(TICK_SECONDS):
            try:
                self._look(final=False)
            except Exception:  # noqa: BLE001 - the view never costs the loop
                return

    # -- one look --------------------------------------------------------------------

    def _look(self, final: bool) -> None:
        with self.lock:
            shown = [line for line in (self._view(raw) for raw in self._new_lines(final)) if line]
            if shown:
                self.last_line = shown[-1]
            spent = self.spent_before.plus(self._usage())
            self.report(ReviseProgress(
                iteration=self.iteration, elapsed_s=self.clock() - self.t0, files_changed=self.changes.count(),
                last_line=self.last_line, new_lines=shown, cost_usd=spent.cost_usd, tokens=spent.tokens,
                final=final))

    def _view(self, raw: str) -> str:
        """One output line as shown: what ``describe`` makes of it (an agent's JSON event as a
        short line; "" : nothing worth showing), else the line itself; masked, one line."""
        found = None
        if self.describe is not None:
            try:
                found = self.describe(raw)
            except Exception:  # noqa: BLE001 - a preset's view of a line never costs the loop
                found = None
        return self._shown(raw if found is None else found).strip()

    def _shown(self, text: str) -> str:
        text = self.scrub(text) if self.scrub is not None else text
        text = strip_control(text).replace("\n", " ").rstrip()
        return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS - 1] + "…"

    def _new_lines(self, final: bool) -> list[str]:
        lines: list[str] = []
        try:
            outputs = sorted(p for p in self.iteration_dir.glob("*revise.out") if p.is_file())
        except OSError:
            return lines
        for path in outputs:
            offset = self.offsets.get(path, 0)
            seen = self.seen.get(path, b"")
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    if seen:  # the bytes read last still end where they did, or the file was rewritten
                        f.seek(max(0, offset - len(seen)))  # (masked in place, cut to the output cap):
                        if size < offset or f.read(len(seen)) != seen:  # what follows is not new output
                            self.offsets[path], self.seen[path] = size, b""
                            self.partial.pop(path, None)
                            continue
                    if size - offset > MAX_READ:
                        offset = size - MAX_READ
                        self.partial[path] = b""
                    f.seek(offset)
                    data = f.read(MAX_READ)
            except OSError:
                continue
            self.offsets[path] = offset + len(data)
            if data:
                self.seen[path] = data[-64:]
            data = self.partial.pop(path, b"") + data
            *complete, rest = data.split(b"\n")
            if final and rest:
                complete.append(rest)
                rest = b""
            if rest:
                self.partial[path] = rest[-MAX_READ:]
            lines += [line.decode("utf-8", "replace") for line in complete]
        return lines

    def _usage(self) -> Usage:
        if self.usage_dir is None:
            return Usage()
        found = []
        try:
            paths = sorted(self.usage_dir.glob(f"*iter-{self.iteration:03d}.json"))
        except OSError:
            return Usage()
        for path in paths:
            usage, _ = read_usage(path)
            if usage is not None:
                found.append(usage)
        return total(found)

"""Fault localization: spectrum-based, by Ochiai, from :class:`~pytest_loops.localization.spectra.Spectra`::

    suspects = rank_suspects(spectra, top=10)      # highest score first
    write_suspects(iteration_dir / "suspects.json", suspects)
    context.suspects = format_suspects(suspects)   # "calc.py:12 in sub() (0.71): return a - b"

``Ochiai(line) = failed(line) / sqrt(total_failed * (failed(line) + passed(line)))``.
A useful spectrum needs passing tests that run the same code as the failing
ones: :func:`pytest_loops.localization.impact.peer_tests` picks them. Test files,
``conftest.py`` and code outside the project root are never suspects. Lines that
run only at import time (module-level code) are in no test's context, so they
are not ranked.
"""

from __future__ import annotations

import math
import os
import tokenize
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.localization.scopes import scopes_of
from pytest_loops.localization.spectra import Spectra, is_test_file, write_json

__all__ = [
    "Suspect",
    "SuspectScope",
    "format_suspects",
    "group_suspects",
    "ochiai",
    "rank_suspects",
    "write_suspects",
]


@dataclass(frozen=True)
class Suspect:
    """A line ranked by how strongly failing tests point at it."""

    file: str
    line: int
    score: float
    source: str
    scope: str = ""  # the enclosing function or class: "windowed()", "class Cart"; "" at module level

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "score": round(self.score, 4),
                "source": self.source, "scope": self.scope}

    @property
    def where(self) -> str:
        """``more.py:1078 in windowed()`` (just ``file:line`` at module level)."""
        return f"{self.file}:{self.line} in {self.scope}" if self.scope else f"{self.file}:{self.line}"


def ochiai(failed_here: int, passed_here: int, total_failed: int) -> float:
    """``failed / sqrt(total_failed * (failed + passed))``; 0 when undefined."""
    if failed_here <= 0 or total_failed <= 0:
        return 0.0
    return failed_here / math.sqrt(total_failed * (failed_here + passed_here))


def rank_suspects(spectra: Spectra, *, top: int | None = None, exclude_tests: bool = True,
                  changed: Mapping[str, Collection[int]] | None = None) -> list[Suspect]:
    """Lines run by failing tests, by Ochiai score, highest first.

    ``changed`` (``{file: lines}``, when known: the lines changed since the last
    green run) go first, by score among themselves. Ties go to the line fewer
    passing tests ran, then by file and line, so the order is deterministic.
    Empty when no test failed.
    """
    failing, passing = spectra.failed, spectra.passed
    if not failing:
        return []
    tests_files = spectra.test_files
    fail_count: dict[tuple[str, int], int] = {}
    pass_count: dict[tuple[str, int], int] = {}
    for tests, counts in ((failing, fail_count), (passing, pass_count)):
        for nodeid in tests:
            for path, lines in spectra.lines.get(nodeid, {}).items():
                if exclude_tests and is_test_file(path, tests_files):
                    continue
                for line in lines:
                    counts[(path, line)] = counts.get((path, line), 0) + 1
    ranked = sorted(
        ((ochiai(f, pass_count.get(key, 0), len(failing)), pass_count.get(key, 0), key)
         for key, f in fail_count.items()),
        # rounded: equal scores computed along different paths must tie
        key=lambda item: (item[2][1] not in (changed or {}).get(item[2][0], ()),
                          -round(item[0], 12), item[1], item[2]),
    )
    if top is not None:
        ranked = ranked[:max(0, top)]
    sources = _SourceCache(spectra.root)
    wanted: dict[str, list[int]] = {}
    for _, _, (path, line) in ranked:
        wanted.setdefault(path, []).append(line)
    scopes = {path: scopes_of(spectra.root, path, lines) for path, lines in wanted.items()}
    return [Suspect(file=path, line=line, score=score, source=sources.line(path, line),
                    scope=scopes[path][line])
            for score, _, (path, line) in ranked]


class _SourceCache:
    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, list[str]] = {}

    def line(self, path: str, line: int) -> str:
        if path not in self.files:
            try:
                with tokenize.open(os.path.join(self.root, path)) as f:
                    self.files[path] = f.read().splitlines()
            except (OSError, SyntaxError, UnicodeDecodeError):
                self.files[path] = []
        lines = self.files[path]
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def write_suspects(path: str | os.PathLike[str], suspects: Sequence[Suspect]) -> None:
    """``suspects.json``: a list of ``{file, line, score, source, scope}``, highest score first."""
    ordered = sorted(suspects, key=lambda s: -s.score)  # stable: ties keep their rank
    write_json(Path(path), [s.to_dict() for s in ordered], indent=2)


def format_suspects(suspects: Sequence[Suspect], limit: int = 10) -> list[str]:
    """Prompt lines, e.g. ``calc.py:12 in sub() (0.71): return a - b``."""
    return [f"{s.where} ({s.score:.2f}): {s.source}" for s in suspects[:max(0, limit)]]


@dataclass(frozen=True)
class SuspectScope:
    """The suspect lines of one function or class (or one file's module level)."""

    file: str
    scope: str
    score: float  # its best line's
    lines: tuple[int, ...]  # in rank order

    def describe(self, total: int) -> str:
        """``windowed() in more.py (best 1.00; 7 of the 10 lines: 1062, 1078, ...)``."""
        name = f"{self.scope} in {self.file}" if self.scope else f"{self.file} (module level)"
        shown = ", ".join(str(n) for n in sorted(self.lines)[:8])
        more = ", ..." if len(self.lines) > 8 else ""
        count = f"{len(self.lines)} of the {total} lines" if total > 1 else "the one line"
        return f"{name} (best {self.score:.2f}; {count}: {shown}{more})"


def group_suspects(suspects: Sequence[Suspect]) -> list[SuspectScope]:
    """The suspects by enclosing function or class, best first: ties in score go to
    the scope holding more suspect lines, then to the one ranked first."""
    groups: dict[tuple[str, str], list[Suspect]] = {}
    for s in suspects:
        groups.setdefault((s.file, s.scope), []).append(s)
    order = {key: i for i, key in enumerate(groups)}
    ranked = sorted(groups.items(), key=lambda kv: (-round(kv[1][0].score, 12), -len(kv[1]), order[kv[0]]))
    return [SuspectScope(file=file, scope=scope, score=members[0].score,
                         lines=tuple(m.line for m in members))
            for (file, scope), members in ranked]


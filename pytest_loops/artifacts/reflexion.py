"""The reflexion page: a markdown memory of lessons, one line per failed iteration.

Created lazily on the first failed iteration; appended under a file lock so
parallel loops never interleave or lose lines; read back into the next prompt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from filelock import FileLock

LESSONS_HEADING = "## Lessons"
MAX_LESSON_CHARS = 300


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def format_lesson(iteration: int, exit_code: int | None, state_moved: bool | str | None,
                  failure_line: str, loop_name: str | None = None) -> str:
    """One lesson line: exit code, whether the state moved, what failed first.

    ``state_moved``: True / False against the previous iteration, None on the first
    measurement, "untracked" when the loop has no state paths.
    """
    moved = {True: "state moved", False: "state unchanged", None: "state first seen",
             "untracked": "state not tracked"}[state_moved]
    failure = " ".join(failure_line.split())[:MAX_LESSON_CHARS] or "(no output)"
    prefix = f"{_now_iso()} {loop_name} iter {iteration}" if loop_name else f"{_now_iso()} iter {iteration}"
    return f"- {prefix}: exit {exit_code}, {moved}: {failure}"


class MemoryPage:
    """A loop's lessons page (LoopFlow's `remember in "file.md"`)."""

    def __init__(self, path: str | os.PathLike, *, loop_name: str, goal: str = "") -> None:
        self.path = Path(path)
        self.loop_name = loop_name
        self.goal = goal
        self._lock = FileLock(str(self.path) + ".lock")
        self._has_heading = False  # once seen, the heading stays: skip re-reading

    def _header(self) -> str:
        goal = f" Goal: {self.goal.rstrip('.')}." if self.goal else ""
        return (
            "---\n"
            "kind: pytest-loops.lessons/1\n"
            f"loop: {self.loop_name!r}\n"
            f"created: {_now_iso()}\n"
            "---\n\n"
            f"# Lessons: {self.loop_name}\n\n"
            "## Origin\n\n"
            f"Written by pytest-loops for the loop {self.loop_name!r}.{goal} "
            "One line per failed iteration; read back into the next run's prompt.\n\n"
            f"{LESSONS_HEADING}\n\n"
        )

    def read_lessons(self) -> list[str]:
        """The lesson lines on the page (bullets under `## Lessons`, else all bullets)."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        lines = text.splitlines()
        if LESSONS_HEADING in (line.strip() for line in lines):
            section: list[str] = []
            inside = False
            for line in lines:
                stripped = line.strip()
                if stripped.startswith("## "):
                    inside = stripped == LESSONS_HEADING
                    continue
                if inside and stripped.startswith("- "):
                    section.append(stripped)
            return section
        return [line.strip() for line in lines if line.strip().startswith("- ")]

    def append(self, lesson: str) -> None:
        """Add one lesson line, creating the page first if needed."""
        line = " ".join(lesson.splitlines()).strip()
        if not line.startswith("- "):
            line = "- " + line
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            prefix = ""
            if not self.path.exists() or self.path.stat().st_size == 0:
                prefix = self._header()
            elif not self._has_heading:
                text = self.path.read_text(encoding="utf-8", errors="replace")
                headings = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("## ")]
                # appended lines land in the last section: unless that is `## Lessons`
                # (a hand-added section below it), open one, or they are never read back
                if not headings or headings[-1] != LESSONS_HEADING:
                    prefix = ("" if text.endswith("\n") else "\n") + f"\n{LESSONS_HEADING}\n\n"
                elif not text.endswith("\n"):
                    prefix = "\n"
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(prefix + line + "\n")
            self._has_heading = True

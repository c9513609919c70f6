"""The lessons page: markdown, one lesson line per failed iteration.

Created lazily on the first failed iteration; appended under a file lock so
parallel loops never interleave or lose lines; read back into the next prompt.
Only a regular file is read or written, and only its last :data:`READ_LIMIT`
bytes are read back: a page pointed at a device or a FIFO, or grown huge, costs
one warning line, never a hang or the harness's memory. Secrets are masked in
everything the page holds (its header names the loop and its goal).

While a loop runs, the page is the harness's: outside the namespaces tier a revise
step, or the code under test, can write it, and a line it adds would reach the next
run's prompt. A page the loop tracks (:meth:`LessonsPage.track`) is checked against what
the harness last left there before each lesson it appends and at the end of each
iteration (:meth:`LessonsPage.undo_foreign`): lines nobody but another loop's harness
may add (that loop's own lesson lines, on a shared page) are kept; every other line added,
and any rewrite of what was there, is undone.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time
from pathlib import Path

from filelock import FileLock

from pytest_loops.redact import make_redactor, strip_control

LESSONS_HEADING = "## Lessons"
MAX_LESSON_CHARS = 300
READ_LIMIT = 64 * 1024
"""Bytes read back from the end of a lessons page (whole lines only)."""
TRACK_LIMIT = 1 << 20
"""A page up to this size is kept in memory while its loop runs, to undo what others write."""


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# a lesson line as format_lesson writes it: "- 2026-01-02T03:04:05Z NAME iter 3: exit ..."
_LESSON_LINE = re.compile(r"- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?:(?P<label>.+?) )?iter \d+: ")


def own_lessons(lines: list[str], label: str, *, unlabelled: bool) -> list[str]:
    """The lessons of the loop called ``label`` (its identity): a lesson line another loop
    wrote on a shared page is left out. A line without a loop's label (written before
    lessons carried one) is kept only when ``unlabelled`` (a named loop); a bullet that
    is not a lesson line at all (written by hand on the page) is kept."""
    own = []
    for line in lines:
        match = _LESSON_LINE.match(line)
        if match is None:
            own.append(line)
        elif match.group("label") is None:
            if unlabelled:
                own.append(line)
        elif match.group("label") == label:
            own.append(line)
    return own


def _another_loops_lesson(line: str, label: str) -> bool:
    """A lesson line as another loop's harness writes it (its label is not ``label``)."""
    match = _LESSON_LINE.match(line.strip())
    return match is not None and match.group("label") not in (None, label)


def _write_anew(path: Path, data: bytes) -> None:
    """``data`` as the file at ``path``, made anew (a temporary file renamed over it):
    never written through a link or a hard link someone put there."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def format_lesson(iteration: int, exit_code: int | None, state_moved: bool | str | None,
                  failure_line: str, loop_name: str | None = None) -> str:
    """One lesson line: exit code, whether the state moved, what failed first.

    ``state_moved``: True / False against the previous iteration, None on the first
    measurement, "untracked" when the loop has no state paths.
    """
    moved = {True: "state moved", False: "state unchanged", None: "state first seen",
             "untracked": "state not tracked"}[state_moved]
    failure = " ".join(strip_control(failure_line).split())[:MAX_LESSON_CHARS] or "(no output)"
    prefix = f"{_now_iso()} {loop_name} iter {iteration}" if loop_name else f"{_now_iso()} iter {iteration}"
    return f"- {prefix}: exit {exit_code}, {moved}: {failure}"


class PageLock:
    """The page's ``.lock`` file, locked with ``flock(2)`` as filelock's ``FileLock`` does
    (the two exclude each other), its descriptor kept open between appends: one
    lesson per failed iteration costs two system calls, not a lock object's round.
    The descriptor is reopened when the lock file was removed or replaced since (a
    lock on a file nobody else opens would exclude no one). Reentrant: an inner
    ``with`` neither relocks nor unlocks. Elsewhere than on POSIX: a ``FileLock``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._depth = 0
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            self._fallback: FileLock | None = FileLock(path)
        else:
            self._fallback = None
            self._flock = fcntl.flock
            self._ex, self._un = fcntl.LOCK_EX, fcntl.LOCK_UN

    def __enter__(self) -> PageLock:
        if self._fallback is not None:  # pragma: no cover - not POSIX
            self._fallback.acquire()
            return self
        self._depth += 1
        if self._depth > 1:
            return self
        while True:
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                                       | getattr(os, "O_NOFOLLOW", 0), 0o644)
                except BaseException:
                    self._depth -= 1
                    raise
            self._flock(self._fd, self._ex)
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(self.path, follow_symlinks=False))
            except OSError:
                same = False
            if same:
                return self
            self.close()  # the file was replaced while unlocked: lock the one there now

    def __exit__(self, *exc: object) -> None:
        if self._fallback is not None:  # pragma: no cover - not POSIX
            self._fallback.release()
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            self._flock(self._fd, self._un)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor also drops a lock it held

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:  # pragma: no cover - nothing to report to at collection time
            pass


# O_NOFOLLOW: outside the namespaces tier the code under test can write the page's
# directory; a link it put in the page's place is never read or appended through
# (the lesson would land in the file it names: ~/.bashrc, a venv's activate script)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
LINKED = "is a symbolic link, never read or written through: no lessons read back or kept (remove the link)"


class LessonsPage:
    """A loop's lessons page (LoopFlow's `remember in "file.md"`)."""

    def __init__(self, path: str | os.PathLike, *, loop_name: str, goal: str = "") -> None:
        self.path = Path(path)
        self.loop_name = loop_name
        self.goal = goal
        self._lock = PageLock(str(self.path) + ".lock")
        self._has_heading = False  # once seen, the heading stays: skip re-reading
        self.warning: str | None = None  # the last thing about the page that was warned of
        self.label: str | None = None  # the loop's label while it tracks the page (see track())
        self._known: bytes | None = None  # the page as this harness last left it (tracked)
        self.removed: list[str] = []  # what undo_foreign took out before an append

    def close(self) -> None:
        """Release the lock file's descriptor (kept open between appends)."""
        self._lock.close()

    def _warn(self, message: str) -> None:
        if message != self.warning:
            self.warning = message
            print(f"pytest-loops: warning: lessons page {self.path}: {message}", file=sys.stderr)

    def _header(self) -> str:
        scrub = make_redactor()
        name = strip_control(scrub(self.loop_name))
        goal = strip_control(scrub(self.goal))
        goal = f" Goal: {goal.rstrip('.')}." if goal else ""
        return (
            "---\n"
            "kind: pytest-loops.lessons/1\n"
            f"loop: {name!r}\n"
            f"created: {_now_iso()}\n"
            "---\n\n"
            f"# Lessons: {name}\n\n"
            "## Origin\n\n"
            f"Written by pytest-loops for the loop {name!r}.{goal} "
            "One line per failed iteration; read back into the next run's prompt.\n\n"
            f"{LESSONS_HEADING}\n\n"
        )

    def _read_tail(self, *, reading_back: bool = True) -> tuple[str, bool] | bool:
        """(the page's last READ_LIMIT bytes from a line start, whether that is the whole
        page); False when there is no page, True when there is one that is not a regular
        file or cannot be read (warned)."""
        try:  # O_NONBLOCK: opening a FIFO nobody writes to returns at once
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_NOCTTY", 0))
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._warn(LINKED)
                return True
            self._warn(f"cannot be read ({exc.strerror or exc}); no lessons read back")
            return True
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._warn("is not a regular file; no lessons read back")
                return True
            start = max(0, info.st_size - READ_LIMIT)
            os.lseek(fd, start, os.SEEK_SET)
            chunks, left = [], READ_LIMIT
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            self._warn(f"cannot be read ({exc.strerror or exc}); no lessons read back")
            return True
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if start > 0 and reading_back:
            self._warn(f"is {info.st_size} bytes; only the lessons in its last {READ_LIMIT // 1024} KiB "
                       "are read back")
            newline = data.find(b"\n")
            data = data[newline + 1:] if newline >= 0 else b""
        return data.decode("utf-8", errors="replace"), start == 0

    def read_lessons(self) -> list[str]:
        """The lesson lines on the page (bullets under `## Lessons`, else all bullets)."""
        found = self._read_tail()
        if isinstance(found, bool):
            return []
        text, whole = found
        lines = text.splitlines()
        headings = [line.strip() for line in lines if line.strip().startswith("## ")]
        if LESSONS_HEADING in headings or (headings and not whole):
            section: list[str] = []
            inside = not whole  # a tail starts inside the last section lessons were appended to
            for line in lines:
                stripped = line.strip()
                if stripped.startswith("## "):
                    inside = stripped == LESSONS_HEADING
                    continue
                if inside and stripped.startswith("- "):
                    section.append(stripped)
            return section
        return [line.strip() for line in lines if line.strip().startswith("- ")]

    # -- while a loop runs: the page is the harness's ------------------------------------

    def track(self, label: str) -> None:
        """Remember the page as it is now, for the loop labelled ``label`` (its lesson lines'
        label): from here on, lines others add are undone (see :meth:`undo_foreign`)."""
        self.label = label
        if not self.path.parent.is_dir():
            self._known = b""  # no page yet (made at the first lesson): nothing to lock
            return
        with self._lock:
            self._known = self._whole()

    def _whole(self) -> bytes | None:
        """The whole page (b"" when there is none); None when it is not a regular file, not
        readable or over :data:`TRACK_LIMIT`: such a page is not tracked."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_NOCTTY", 0))
        except FileNotFoundError:
            return b""
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > TRACK_LIMIT:
                return None
            chunks = []
            while chunk := os.read(fd, TRACK_LIMIT + 1):
                chunks.append(chunk)
            data = b"".join(chunks)
            return data if len(data) <= TRACK_LIMIT else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def undo_foreign(self) -> list[str]:
        """Put the tracked page back as the harness left it, keeping the lesson lines of
        other loops appended since (a shared page); return the lines removed ("(rewritten)"
        when what was there changed). Nothing when the page is not tracked."""
        if self._known is None or self.label is None:
            return []
        with self._lock:
            return self._undo_foreign_locked()

    def _undo_foreign_locked(self) -> list[str]:
        known, label = self._known, self.label
        if known is None or label is None:
            return []
        current = self._whole()
        if current is None or current == known:
            return []  # (a link or a FIFO put in its place is never read back: see read_lessons)
        kept_lines = set(known.decode("utf-8", "replace").splitlines())
        appended = current.startswith(known)
        added = (current[len(known):] if appended else current).decode("utf-8", "replace").splitlines()
        added = [ln for ln in added if appended or ln not in kept_lines]
        others = [ln for ln in added if _another_loops_lesson(ln, label)]
        removed = [ln for ln in added if ln.strip() and ln not in others]
        if appended and not removed:
            self._known = current  # only other loops' lessons: theirs to keep
            return []
        text = known + (b"" if not known or known.endswith(b"\n") else b"\n")
        text += "".join(ln + "\n" for ln in others).encode("utf-8")
        _write_anew(self.path, text)
        self._known = text
        removed = removed if appended else ["(the lines that were there were changed)", *removed]
        self._warn(f"{len(removed)} line(s) the harness did not write were added or changed during the loop "
                   "(by the revise step or the code under test): put back as the harness left it")
        return [strip_control(ln)[:MAX_LESSON_CHARS] for ln in removed]

    def append(self, lesson: str) -> None:
        """Add one lesson line, creating the page first if needed. A page that is not a
        regular file is left alone (warned). A tracked page is first put back as the
        harness left it (see :meth:`undo_foreign`)."""
        line = " ".join(strip_control(lesson).splitlines()).strip()
        if not line.startswith("- "):
            line = "- " + line
        if not self._has_heading:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.removed += self._undo_foreign_locked()
            try:
                self._append_locked(line)
            finally:
                if self._known is not None:
                    self._known = self._whole()

    def _append_locked(self, line: str) -> None:
        prefix = ""
        # Once this page has had a lesson appended, the heading is known to be in
        # place: only its last byte is checked (below), not its tail re-read.
        found = ("\n", False) if self._has_heading else self._read_tail(reading_back=False)
        if found is True:
            return  # not a regular file, or unreadable: warned
        text, whole = found if found else ("", True)
        if not text:
            prefix = self._header() if whole else ""
        elif not self._has_heading:
            headings = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("## ")]
            # appended lines land in the last section: unless that is `## Lessons`
            # (a hand-added section below it), open one, or they are never read back
            if (headings and headings[-1] != LESSONS_HEADING) or (not headings and whole):
                prefix = ("" if text.endswith("\n") else "\n") + f"\n{LESSONS_HEADING}\n\n"
            elif not text.endswith("\n"):
                prefix = "\n"
        try:  # O_NONBLOCK: a FIFO put there since is refused (ENXIO), never waited on
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW
                         | getattr(os, "O_NOCTTY", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link put there since: never written through
                self._warn(LINKED)
                return
            if exc.errno != errno.ENXIO:
                raise  # a full disk, no permission: the caller's artifact error
            self._warn("is a FIFO nobody reads; lesson not kept")
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._warn("is not a regular file; lesson not kept")
                return
            if info.st_nlink > 1:  # a hard link: another file's other name
                self._warn("has other names (a hard link), never written through: lesson not kept "
                           "(remove the link)")
                return
            if self._has_heading:  # the page as this loop last left it?
                if info.st_size == 0:  # emptied or removed since: a new page
                    prefix = self._header()
                elif os.pread(fd, 1, info.st_size - 1) != b"\n":  # edited since
                    prefix = "\n"
            os.write(fd, (prefix + line + "\n").encode("utf-8"))
        finally:
            os.close(fd)
        self._has_heading = True

    def merge(self, lessons: list[str]) -> int:
        """Append each of ``lessons`` the page does not hold yet, under the page's lock
        (``pytest-loops merge``: pages of several jobs, restored from one cache, share
        lines); return how many were added."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:  # reentrant: append() takes it again
            seen = set(self.read_lessons())
            added = 0
            for lesson in lessons:
                line = " ".join(strip_control(lesson).splitlines()).strip()
                line = line if line.startswith("- ") else "- " + line
                if line in seen:
                    continue
                seen.add(line)
                self.append(line)
                added += 1
            return added

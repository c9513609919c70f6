"""Progress detection: the incremental state fingerprint of the no-progress guard.

After every iteration the guard asks: did the files the loop is about change
(:class:`StateFingerprint`)? The answer must be cheap on big trees and must not
be fooled by what every run writes: caches, bytecode, the loop's own artifacts.
Whether the loop fails the same way as before is :mod:`pytest_loops.progress.signature`
(re-exported here).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import os
import re
import stat
import time
from collections.abc import Sequence
from typing import BinaryIO, NamedTuple

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.errors import LoopUsageError
from pytest_loops.progress import journal as fswatch
from pytest_loops.progress.signature import (
    failure_signature,
    first_meaningful_line,
    normalize_failure,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "JOURNAL_REWALK_EVERY",
    "RACY_WINDOW_NS",
    "StateFingerprint",
    "failure_signature",
    "first_meaningful_line",
    "normalize_failure",
]

# Names that are never part of a loop's state, at any depth. Running pytest (and
# the loop itself) writes these every iteration; counting them would fake progress.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".pytest-loops",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    "*.pyc",
    ".coverage",
    ".coverage.*",
)

# A file whose mtime is this close to (or after) the moment it was hashed may be
# rewritten within the same timestamp tick without its stat changing, so its
# cached digest is not trusted. 2 s covers filesystems with coarse timestamps
# (FAT: 2 s, HFS+/ext3: 1 s); git solves the same problem the same way.
RACY_WINDOW_NS = 2_000_000_000

# With a change journal, every this-many-th compute walks the tree anyway: a bound
# on how long a change inotify never reports (a write through mmap) can go unseen.
# A walk costs one stat per file, next to the seconds an iteration takes.
JOURNAL_REWALK_EVERY = 16

# Files larger than this are hashed chunk by chunk, asking ``should_stop`` between
# chunks: one big file cannot hold the loop past its budget.
HASH_CHUNK = 1 << 20

_FORMAT_TAG = b"pytest-loops.state/1\n"
_MAGIC = re.compile(r"[*?[]")
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    # A FIFO swapped in between stat and open must not block the loop forever.
    | getattr(os, "O_NONBLOCK", 0)
)
# Listing a directory through its descriptor lets each stat resolve one name
# relative to it instead of walking the whole path again: measurably cheaper.
_SCAN_BY_FD = os.scandir in os.supports_fd and hasattr(os, "O_DIRECTORY")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


# --------------------------------------------------------------------------- globs


def _has_magic(segment: str) -> bool:
    return _MAGIC.search(segment) is not None


def _segment_regex(segment: str) -> str:
    """Translate one glob path segment to a regex; wildcards never cross ``/``."""
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            if not out or out[-1] != "[^/]*":
                out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i
            if j < n and segment[j] in "!^":
                j += 1
            if j < n and segment[j] == "]":
                j += 1
            while j < n and segment[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "["
                out.append(re.escape(c))
                continue
            body = segment[i:j].replace("\\", "\\\\")
            i = j + 1
            if body[:1] in ("!", "^"):
                out.append("[^/" + body[1:] + "]")
            else:
                out.append("[" + body + "]")
        else:
            out.append(re.escape(c))
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _segment_matcher(segment: str) -> re.Pattern[str]:
    return re.compile(_segment_regex(segment) + r"\Z")


def _path_regex(pattern: str) -> str:
    """A ``/``-separated glob (``**`` = any depth) matching a path or anything beneath it."""
    if not pattern:  # the root itself: everything
        return r".*\Z"
    parts = pattern.split("/")
    pieces: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            pieces.append(".*" if last else "(?:[^/]*/)*")
        else:
            pieces.append(_segment_regex(part) + ("" if last else "/"))
    return "".join(pieces) + r"(?:/.*)?\Z"


def _join_key(parent: str, name: str) -> str:
    if not parent:
        return name
    return parent + name if parent.endswith("/") else parent + "/" + name


def _to_key(path: str) -> str:
    return path.replace(os.sep, "/") if os.sep != "/" else path


def _check_path_argument(value: object, what: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise LoopUsageError(
            f"{what} {value!r} is not a path", fix="write each one as a string path or glob"
        )
    text = os.fspath(value)
    if not isinstance(text, str):
        raise LoopUsageError(f"{what} {value!r} is not a text path", fix="use a str path")
    if "\0" in text:
        raise LoopUsageError(f"{what} {text!r} contains a NUL byte", fix="remove it")
    return text


def _as_list(values: Sequence[str] | str | os.PathLike[str], what: str) -> list[str]:
    # A bare string is one pattern, not a sequence of one-character patterns.
    if isinstance(values, (str, os.PathLike)):
        values = [values]  # type: ignore[list-item]
    return [_check_path_argument(v, what) for v in values]


# --------------------------------------------------------------------- fingerprint


class _Cached(NamedTuple):
    signature: tuple[int, int, int, int, int]
    digest: str
    trusted: bool  # False: hashed inside the racy window, hash again next time


# One directory entry as the walk keeps it: (name, is a directory, is a symbolic
# link), both from the entry's type, never following a link. Excluded names are
# left out when the directory is read.
_Entry = tuple[str, bool, bool]
# What one directory adds to a tree walk: files (key -> path), which of them are
# links, and the subdirectories to walk next (path, key, name filter).
_Part = tuple[dict[str, str], list[str], list[tuple[str, str, "re.Pattern[str] | None"]]]


def _stat_signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime is not settable from user space, so an in-place rewrite that restores
    # the old mtime with os.utime still shows up here (where ctime is meaningful).
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def _error_marker(exc: OSError) -> str:
    return f"error:{type(exc).__name__}:{exc.errno}"


def _contribution(
    listing: list[_Entry], base: str, prefix: str, rx: re.Pattern[str] | None
) -> _Part:
    """What one listed directory adds to a tree walk: (files, link keys, subdirectories)."""
    files: dict[str, str] = {}
    link_keys: list[str] = []
    subdirs: list[tuple[str, str, re.Pattern[str] | None]] = []
    for name, is_dir, is_link in listing:
        if is_dir:
            sub = None if rx is not None and rx.match(name) else rx
            subdirs.append((base + name, prefix + name, sub))
        elif rx is None or rx.match(name):
            files[prefix + name] = base + name
            if is_link:
                link_keys.append(prefix + name)
    return files, link_keys, subdirs


def _open_journal(root: str) -> fswatch.DirectoryJournal:
    """The change journal for ``root`` (a seam: tests swap it to force walking)."""
    return fswatch.DirectoryJournal(root)


_OUTSIDE_ROOT = "a pattern names paths outside the root"


class StateFingerprint:
    """An incremental fingerprint of the files a loop may change.

    ``patterns`` are relative to ``root`` (absolute paths are allowed):

    * a glob: ``*.txt`` (top level only), ``src/**/*.py`` (``**`` = any depth);
      wildcards match dot-files too and never cross ``/``;
    * a directory: everything beneath it;
    * a file.

    A glob that matches a directory takes everything beneath it. A pattern that
    matches nothing contributes nothing; blank patterns are ignored.

    :data:`DEFAULT_EXCLUDES` are skipped by name at any depth. ``exclude`` adds
    more, read as in ``.gitignore``: a bare name or name glob (``build``,
    ``*.log``) is skipped at any depth; a path with a ``/`` in it (``logs/*.log``,
    ``./run.json`` for the top level only) is anchored at ``root``; an absolute
    path is that exact path (the engine passes its run log and memory page so).
    An excluded directory excludes everything beneath it, and an exclude wins over
    a pattern that names the same file.

    Symbolic links to files are hashed by content. Symbolic links to directories
    are recorded by their target and not descended into (no loops), unless a
    pattern names the link itself. Unreadable files, dangling links and special
    files are recorded as a marker of what they are, never an exception. Empty
    directories are not state.

    How ``compute()`` finds what changed (the value never depends on it):

    * **walk**: stat every file; re-read only files whose size, mtime, inode or
      ctime changed, or whose mtime was within :data:`RACY_WINDOW_NS` of the moment
      they were last read.
    * **journal** (Linux): the first compute walks and puts an inotify watch on
      every directory it reads, before reading it. Later computes read the events
      since: they re-read the files an event named (whatever their mtime says) and
      re-list the directories whose entries changed; every other file keeps its
      digest without even a stat. Files the journal cannot vouch for are still
      statted every time, as in a walk: symbolic links, files with other hard
      links, files inside the racy window, markers.

    It walks whenever the journal cannot vouch for a complete account: no inotify,
    the watch limit reached, a network file system, a pattern through a symbolic
    link to a directory or outside ``root``, an overflowed event queue, a watch
    the kernel dropped, a fork; and every :data:`JOURNAL_REWALK_EVERY`-th compute
    regardless, for what inotify never reports (writes through ``mmap``).

    The journal holds a file descriptor: :meth:`close` (or ``with``) releases it,
    as does garbage collection. After :meth:`close`, computes walk.

    ``should_stop`` (the engine sets it from the loop's budget) is asked for every
    directory listed, before every file read and between chunks of a big file;
    when it answers true, ``compute()`` raises
    :class:`~pytest_loops.deadline.DeadlineReached` and keeps nothing of the
    interrupted compute (the next one starts over from the last complete one).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        patterns: Sequence[str],
        *,
        exclude: Sequence[str] = (),
        should_stop: ShouldStop | None = None,
    ) -> None:
        self.should_stop = should_stop
        self._root = os.path.abspath(_check_path_argument(root, "state root"))
        self._root_real = os.path.realpath(self._root)
        self._patterns = [p for p in _as_list(patterns, "state pattern") if p.strip()]
        names = list(DEFAULT_EXCLUDES)
        paths: list[str] = []
        for entry in _as_list(exclude, "exclude"):
            if not entry.strip():
                continue
            if self._is_name(entry):
                names.append(entry.rstrip("/" + os.sep))
            else:
                paths.append(self._exclude_key(entry))
        self._name_rx = re.compile("(?:" + "|".join(_segment_regex(n) for n in names) + r")\Z")
        self._path_rx = (
            re.compile("|".join(f"(?:{_path_regex(p)})" for p in paths)) if paths else None
        )
        self._root_prefix = self._root if self._root.endswith(os.sep) else self._root + os.sep
        self._cache: dict[str, _Cached] = {}
        self._cached_now = 0  # files hashed into the cache by the last compute
        self._read_now = 0  # files read so far by this compute (said when it is interrupted)
        self._files: list[str] = []  # sorted keys of the last compute
        self._lines: dict[str, str] = {}  # key -> its line in the fingerprinted text
        self._marked = False  # the last text held directory markers
        self._value = ""
        # Per-compute scratch state (the listings persist while the journal watches them).
        self._listings: dict[str, list[_Entry]] = {}
        # Per directory and name filter: what it adds to a tree walk.
        self._trees: dict[str, dict[re.Pattern[str] | None, _Part]] = {}
        self._prestat: dict[str, os.stat_result] = {}
        self._markers: dict[str, str] = {}
        self._links: set[str] = set()
        # The journal and what it lets a compute reuse.
        self._journal: fswatch.DirectoryJournal | None = None
        self._journal_off: str | None = None  # why the journal is off for good
        self._journal_note = "not started"
        outside = any(
            self._relative(os.path.normpath(os.path.join(self._root, p))) is None
            for p in self._patterns
        )
        if outside:  # the journal watches the root's tree only
            self._journal_off = self._journal_note = _OUTSIDE_ROOT
        self._kinds: dict[str, str] = {}  # path a pattern names literally -> file/link/none
        self._literal_links: set[str] = set()
        self._reexpand = False  # something seen last time must be looked at again
        self._since_walk = 0
        self._matches: dict[str, str] = {}
        self._digests: dict[str, str] = {}  # key -> digest or marker, for matched files
        self._volatile: set[str] = set()  # keys checked every compute, as a walk would
        self._pending: set[str] = set()  # matched but vanished before they were read
        self._stats: dict[str, int | str] = {
            "files": 0, "hashed": 0, "stat_only": 0, "mode": "none", "journal": self._journal_note,
        }

    # -- public API

    @property
    def root(self) -> str:
        """The absolute root the patterns are relative to."""
        return self._root

    @property
    def files(self) -> list[str]:
        """Keys (``/``-separated paths relative to root; absolute if outside it) of the last compute."""
        return list(self._files)

    @property
    def last_stats(self) -> dict[str, int | str]:
        """How the last compute went.

        * ``files``: keys fingerprinted, markers included (unreadable files, links
          to directories, special files, which are neither hashed nor cached);
        * ``hashed``: files read; ``stat_only``: files whose cached digest was kept
          without reading them (after a stat in a walk; in a journal compute, most
          without even that);
        * ``mode``: ``"walk"`` or ``"journal"`` (``"none"`` before the first compute);
        * ``journal``: ``"on"`` while a change journal watches the tree, else why not.
        """
        return dict(self._stats)

    def close(self) -> None:
        """Release the change journal's file descriptor; later computes walk."""
        self._journal_off = self._journal_note = "closed"
        self._drop_journal()
        self._stats["journal"] = self._journal_note

    def __enter__(self) -> StateFingerprint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def compute(self) -> str:
        """Return ``"sha256:<hex>"`` over the sorted (path, content digest) of all matched files."""
        journal = self._journal
        if journal is not None and self._since_walk < JOURNAL_REWALK_EVERY - 1:
            try:
                return self._compute_by_journal(journal)
            except fswatch.JournalLost as exc:
                self._lose_journal(exc)
            except BaseException:
                # Interrupted half way: the events read are gone, so walk next time.
                self._drop_journal()
                raise
        return self._compute_by_walk()

    # -- the journal's life

    def _drop_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._listings = {}
        self._trees = {}
        self._kinds = {}
        self._literal_links = set()

    def _lose_journal(self, exc: fswatch.JournalLost) -> None:
        self._drop_journal()
        self._journal_note = exc.reason
        if exc.sticky:
            self._journal_off = exc.reason

    def _ignore_event(self, path: str, name: str) -> bool:
        """An event about an excluded name: it cannot change what is matched."""
        key = path[len(self._root_prefix) :] if path.startswith(self._root_prefix) else path
        return self._excluded(name, _to_key(key))

    # -- computing

    def _compute_by_walk(self) -> str:
        self._drop_journal()
        if self._journal_off is None:
            try:
                self._journal = _open_journal(self._root)
            except fswatch.JournalLost as exc:
                self._lose_journal(exc)
        if self._journal is not None:
            try:
                return self._walk()
            except fswatch.JournalLost as exc:
                # Even a fresh journal could not vouch for this tree: stop trying.
                exc.sticky = True
                self._lose_journal(exc)
            except BaseException:
                self._drop_journal()
                raise
        return self._walk()

    def _walk(self) -> str:
        """Expand every pattern from scratch and stat every match (arming the journal if any)."""
        journal = self._journal
        self._listings = {}
        self._trees = {}
        self._kinds = {}
        self._literal_links = set()
        self._reexpand = False
        self._prestat = {}
        self._markers = {}
        self._links = set()
        # A match is its path; file matches found by listing a directory come with
        # their stat, taken while the directory was open.
        matches: dict[str, str] = {}
        try:
            for pattern in self._patterns:
                self._expand_pattern(pattern, matches)
            digests, volatile, hashed = self._digest_all(matches)
        finally:
            self._prestat = {}
            if journal is None:
                self._listings = {}
                self._trees = {}
        if journal is not None:
            self._matches = matches
            self._digests = digests
            self._volatile = volatile
            self._pending = set(matches.keys() - digests.keys())
            self._since_walk = 0
            self._journal_note = "on"
        else:
            self._matches, self._digests, self._volatile, self._pending = {}, {}, set(), set()
        return self._finish(digests, hashed, "walk")

    def _compute_by_journal(self, journal: fswatch.DirectoryJournal) -> str:
        """Reuse the last compute, redoing only what the events since then name."""
        changes = journal.drain(self._ignore_event, should_stop=self.should_stop)
        invalidated = self._invalidate(changes)
        for path in self._literal_links:
            if os.path.isdir(path):
                raise fswatch.JournalLost(
                    f"{path} became a symbolic link to a directory", sticky=True
                )
        self._since_walk += 1
        expanded = invalidated or self._reexpand
        if expanded:
            self._reexpand = False
            self._markers = {}
            self._links = set()
            matches: dict[str, str] = {}
            for pattern in self._patterns:
                self._expand_pattern(pattern, matches)
            self._matches = matches
        prefix = self._root_prefix
        touched = {
            _to_key(p[len(prefix) :]) for p in changes.touched if p.startswith(prefix)
        }
        try:
            changed, removed, hashed = self._digest_changes(expanded, touched)
        finally:
            self._prestat = {}
        if self._markers or self._marked:  # rare: unreadable directories
            return self._finish(self._digests, hashed, "journal")
        if changed or removed or not self._value:
            self._publish(changed, removed)
        self._stats = self._stats_for(hashed, "journal")
        return self._value

    def _invalidate(self, changes: fswatch.Changes) -> bool:
        """Forget the listings and literal lookups the events make stale; any?"""
        listings, trees, kinds = self._listings, self._trees, self._kinds
        stale = [p for p in changes.relisted if p in listings]
        if changes.gone:
            stale += [p for p in listings if fswatch.within(p, changes.gone)]
        for path in stale:
            listings.pop(path, None)
            trees.pop(path, None)
        hit = bool(stale)
        if kinds:
            for path in [
                p
                for p in kinds
                if os.path.dirname(p) in changes.relisted
                or (changes.gone and fswatch.within(p, changes.gone))
            ]:
                del kinds[path]
                self._literal_links.discard(path)
                hit = True
        return hit

    def _finish(self, digests: dict[str, str], hashed: int, mode: str) -> str:
        """Fingerprint ``digests`` (and the markers) from scratch."""
        merged = {**self._markers, **digests} if self._markers else digests
        # key NUL digest LF: unambiguous, since neither a path nor a digest holds NUL
        # and digests hold no LF.
        self._lines = {key: f"{key}\0{value}\n" for key, value in merged.items()}
        self._files = sorted(self._lines)
        self._marked = bool(self._markers)
        self._value = self._hash_lines()
        self._stats = self._stats_for(hashed, mode)
        return self._value

    def _publish(self, changed: set[str], removed: set[str]) -> None:
        """Fingerprint again after ``changed`` keys got a new digest (or vanished)."""
        lines, keys, digests = self._lines, self._files, self._digests
        added: list[str] = []
        dropped: list[str] = []
        for key in removed:
            if lines.pop(key, None) is not None:
                dropped.append(key)
        for key in changed:
            digest = digests.get(key)
            if digest is None:
                if lines.pop(key, None) is not None:
                    dropped.append(key)
                continue
            if key not in lines:
                added.append(key)
            lines[key] = f"{key}\0{digest}\n"
        if len(added) + len(dropped) > 64:
            self._files = sorted(lines)
        else:  # a few keys come and go: keep the sorted list rather than sort again
            for key in dropped:
                del keys[bisect.bisect_left(keys, key)]
            for key in added:
                bisect.insort(keys, key)
        self._value = self._hash_lines()

    def _hash_lines(self) -> str:
        text = "".join(map(self._lines.__getitem__, self._files))
        outer = hashlib.sha256(_FORMAT_TAG)
        outer.update(text.encode("utf-8", "surrogateescape"))
        return "sha256:" + outer.hexdigest()

    def _stats_for(self, hashed: int, mode: str) -> dict[str, int | str]:
        return {
            "files": len(self._files),
            "hashed": hashed,
            # Every cached file that was not read this time kept its digest.
            "stat_only": len(self._cache) - self._cached_now,
            "mode": mode,
            "journal": "on" if self._journal is not None else self._journal_note,
        }

    # -- matching

    @staticmethod
    def _is_name(entry: str) -> bool:
        """A bare name or name glob (``build``, ``*.log``, ``out/``): any depth, as in .gitignore."""
        if os.path.isabs(entry) or entry.startswith(("./", "." + os.sep)):
            return False
        stripped = entry.rstrip("/" + os.sep)
        return (
            stripped not in ("", ".", "..") and "/" not in stripped and os.sep not in stripped
        )

    def _exclude_key(self, entry: str) -> str:
        full = os.path.normpath(os.path.join(self._root, entry))
        rel = self._relative(full)
        return _to_key(full if rel is None else rel)

    def _relative(self, full: str) -> str | None:
        for base in (self._root, self._root_real):
            if full == base:
                return ""
            prefix = base.rstrip(os.sep) + os.sep
            if full.startswith(prefix):
                return full[len(prefix) :]
        return None

    def _excluded(self, name: str, key: str) -> bool:
        if self._name_rx.match(name):
            return True
        return self._path_rx is not None and self._path_rx.match(key) is not None

    def _expand_pattern(self, pattern: str, matches: dict[str, str]) -> None:
        full = os.path.normpath(os.path.join(self._root, pattern))
        rel = self._relative(full)
        if rel is not None:
            segments = [s for s in rel.split(os.sep) if s]
            self._expand(self._root, "", segments, matches)
            return
        if self._journal is not None:  # pragma: no cover - refused in __init__
            raise fswatch.JournalLost(_OUTSIDE_ROOT, sticky=True)
        # Outside the root: start at the longest literal prefix, keyed absolutely.
        parts = full.split(os.sep)
        first_magic = next((i for i, p in enumerate(parts) if _has_magic(p)), len(parts))
        base = os.sep.join(parts[:first_magic]) or os.sep
        self._expand(base, _to_key(base), [s for s in parts[first_magic:] if s], matches)

    def _journal_kind(self, path: str) -> str:
        """``dir`` (now watched), ``file``, ``link`` or ``none``, for a path a pattern names.

        Its parent directory is watched already, so the answer is kept until an
        event there says otherwise. Raises :class:`fswatch.JournalLost` for a
        symbolic link to a directory: the walk follows it, the journal cannot.
        """
        journal = self._journal
        assert journal is not None
        if journal.is_watched(path):
            return "dir"
        kind = self._kinds.get(path)
        if kind is not None:
            return kind
        if journal.watch(path):
            return "dir"
        try:
            st = os.lstat(path)
        except OSError:
            kind = "none"
        else:
            if stat.S_ISLNK(st.st_mode):
                if os.path.isdir(path):
                    raise fswatch.JournalLost(
                        f"a pattern goes through {path}, a symbolic link to a directory",
                        sticky=True,
                    )
                self._literal_links.add(path)
                kind = "link"
            elif stat.S_ISDIR(st.st_mode):  # created between the watch and the lstat
                raise fswatch.JournalLost(f"{path} changed while it was being watched")
            else:
                kind = "file"
        self._kinds[path] = kind
        return kind

    def _listdir(self, path: str, key: str) -> list[_Entry]:
        listing = self._listings.get(path)
        if listing is not None:
            return listing
        if self.should_stop is not None and self.should_stop():
            self._stop()
        if self._journal is not None and self._journal_kind(path) != "dir":
            return []
        excluded = self._excluded
        try:
            with os.scandir(path) as it:
                listing = [
                    (entry.name, entry.is_dir(follow_symlinks=False), entry.is_symlink())
                    for entry in it
                    if not excluded(entry.name, _join_key(key, entry.name))
                ]
        except (FileNotFoundError, NotADirectoryError):
            listing = []
        except OSError as exc:  # unreadable directory: a marker, never an exception
            self._markers[key or "."] = _error_marker(exc)
            self._reexpand = True  # markers are not kept: look again next time
            return []
        self._listings[path] = listing
        return listing

    def _expand(
        self,
        path: str,
        key: str,
        segments: list[str],
        matches: dict[str, str],
        entry: _Entry | None = None,
    ) -> None:
        if not segments:
            self._take(path, key, entry, matches)
            return
        if entry is not None and not entry[1]:
            return  # more segments to match, but this is not a directory we descend
        if self._journal is not None and self._journal_kind(path) != "dir":
            return  # nothing beneath; the watch on its parent reports if that changes
        segment, rest = segments[0], segments[1:]
        if segment == "**":
            if not rest:
                self._take_tree(path, key, matches)
                return
            if len(rest) == 1 and rest[0] != "**":  # `**/*.py`: one walk, filtered
                self._take_tree(path, key, matches, _segment_matcher(rest[0]))
                return
            self._expand(path, key, rest, matches)
            for child in self._listdir(path, key):
                if child[1]:
                    name = child[0]
                    self._expand(
                        os.path.join(path, name), _join_key(key, name), segments, matches, child
                    )
        elif not _has_magic(segment):
            child_key = _join_key(key, segment)
            if not self._excluded(segment, child_key):
                # A literal name is followed even if it is a symbolic link.
                self._expand(os.path.join(path, segment), child_key, rest, matches)
        else:
            rx = _segment_matcher(segment)
            for child in self._listdir(path, key):
                name = child[0]
                if rx.match(name):
                    child_key = _join_key(key, name)
                    if rest or child[1]:
                        self._expand(os.path.join(path, name), child_key, rest, matches, child)
                    elif child_key not in matches:  # the common case, `*.py`, inline
                        matches[child_key] = os.path.join(path, name)
                        if child[2]:
                            self._links.add(child_key)

    def _take(
        self,
        path: str,
        key: str,
        entry: _Entry | None,
        matches: dict[str, str],
    ) -> None:
        """A pattern resolved to ``path``: a file is one match, a directory all beneath it."""
        if entry is not None:
            if entry[1]:
                self._take_tree(path, key, matches)
            elif key not in matches:
                matches[key] = path
                if entry[2]:
                    self._links.add(key)
            return
        if self._journal is not None:
            kind = self._journal_kind(path)
            if kind == "dir":
                self._take_tree(path, key, matches)
            elif kind != "none" and key not in matches:
                matches[key] = path
                if kind == "link":
                    self._links.add(key)
            return
        try:
            st = os.stat(path)
        except OSError:
            if os.path.lexists(path):  # a dangling or looping link named explicitly
                matches.setdefault(key, path)
            return
        if stat.S_ISDIR(st.st_mode):
            self._take_tree(path, key, matches)
        else:
            matches.setdefault(key, path)

    def _take_tree(
        self,
        path: str,
        key: str,
        matches: dict[str, str],
        only: re.Pattern[str] | None = None,
    ) -> None:
        """Everything beneath ``path``, statted while its directory is open.

        With ``only``, this is ``path/**/<only>``: files whose name matches, and
        everything beneath a directory whose name matches. What each directory
        contributes is kept with its listing, so a directory read before (in this
        compute, or while the journal watched it) costs one dict merge. The hot
        loop of a large tree: locals, and no helper calls per entry.
        """
        name_match = self._name_rx.match
        path_match = self._path_rx.match if self._path_rx is not None else None
        stats = self._prestat
        links = self._links
        listings = self._listings
        trees = self._trees
        journal = self._journal
        should_stop = self.should_stop
        sep = os.sep
        stack = [(path, key, only)]
        while stack:
            if should_stop is not None and should_stop():
                self._stop()
            dir_path, dir_key, rx = stack.pop()
            by_rx = trees.get(dir_path)
            part = by_rx.get(rx) if by_rx is not None else None
            if part is None:
                prefix = dir_key if not dir_key or dir_key.endswith("/") else dir_key + "/"
                base = dir_path if dir_path.endswith(sep) else dir_path + sep
                listing = listings.get(dir_path)
                if listing is not None:
                    part = _contribution(listing, base, prefix, rx)
                else:
                    # Watch before reading: a change after this point is an event.
                    if journal is not None and not journal.watch(dir_path):
                        continue  # no longer a directory: its parent's event says so
                    files: dict[str, str] = {}
                    link_keys: list[str] = []
                    subdirs: list[tuple[str, str, re.Pattern[str] | None]] = []
                    record: list[_Entry] = []
                    fd = None
                    try:
                        if _SCAN_BY_FD:
                            fd = os.open(dir_path, _DIR_FLAGS)
                            scan = os.scandir(fd)
                        else:  # pragma: no cover - platforms without fd-relative scandir
                            scan = os.scandir(dir_path)
                        with scan:
                            for child in scan:
                                name = child.name
                                if name_match(name):
                                    continue
                                child_key = prefix + name
                                if path_match is not None and path_match(child_key):
                                    continue
                                if child.is_dir(follow_symlinks=False):
                                    record.append((name, True, False))
                                    if rx is not None and rx.match(name):
                                        subdirs.append((base + name, child_key, None))
                                    else:
                                        subdirs.append((base + name, child_key, rx))
                                    continue
                                is_link = child.is_symlink()
                                record.append((name, False, is_link))
                                if rx is not None and not rx.match(name):
                                    continue
                                files[child_key] = base + name  # files, and links of any kind
                                if is_link:
                                    link_keys.append(child_key)
                                try:
                                    stats[child_key] = child.stat()
                                except OSError:
                                    pass  # classified when digested
                    except (FileNotFoundError, NotADirectoryError):
                        pass  # vanished, or replaced by a file, since it was listed
                    except OSError as exc:  # unreadable: a marker, never an exception
                        self._markers[dir_key or "."] = _error_marker(exc)
                        self._reexpand = True  # markers are not kept: look again next time
                        continue
                    finally:
                        if fd is not None:
                            os.close(fd)
                    listings[dir_path] = record
                    part = (files, link_keys, subdirs)
                if by_rx is None:
                    trees[dir_path] = by_rx = {}
                by_rx[rx] = part
            files, link_keys, subdirs = part
            # Every path for a key is the same string, so a plain merge is a setdefault.
            matches.update(files)
            if link_keys:
                links.update(link_keys)
            stack.extend(subdirs)

    # -- digesting

    def _digest_all(
        self, matches: dict[str, str]
    ) -> tuple[dict[str, str], set[str], int]:
        """Digest every match: ``(digests, volatile keys, files read)``."""
        digests: dict[str, str] = {}
        volatile: set[str] = set()
        old_cache = self._cache
        new_cache: dict[str, _Cached] = {}
        cache_get = old_cache.get
        signature = _stat_signature
        is_reg = stat.S_ISREG
        links = self._links
        prestat = self._prestat.get
        evaluate = self._evaluate
        should_stop = self.should_stop
        hashed = 0
        self._cached_now = 0
        self._read_now = 0
        for key, path in matches.items():
            st = prestat(key)
            if st is not None and is_reg(st.st_mode):
                cached = cache_get(key)
                if cached is not None and cached.trusted and cached.signature == signature(st):
                    digests[key] = cached.digest
                    new_cache[key] = cached
                    if st.st_nlink > 1 or key in links:
                        volatile.add(key)
                    continue
            if should_stop is not None and should_stop():
                self._stop()
            hashed += evaluate(key, path, st, False, old_cache, new_cache, digests, volatile)
        # Deleted files drop out of the cache here.
        self._cache = new_cache
        return digests, volatile, hashed

    def _digest_changes(
        self, expanded: bool, touched: set[str]
    ) -> tuple[set[str], set[str], int]:
        """Digest what changed since the last compute.

        Returns the keys whose digest changed (new, or vanished when read), the
        keys no longer matched, and how many files were read.
        """
        matches, digests, cache, volatile = self._matches, self._digests, self._cache, self._volatile
        removed: set[str] = set()
        if expanded:
            current = matches.keys()
            removed = digests.keys() - current
            for key in removed:
                del digests[key]
                cache.pop(key, None)
                volatile.discard(key)
            todo = current - digests.keys()  # new, and any that vanished when last read
        else:
            todo = set(self._pending)
        self._pending = set()
        todo |= volatile
        todo.update(key for key in touched if key in matches)
        changed: set[str] = set()
        hashed = 0
        self._cached_now = 0
        self._read_now = 0
        should_stop = self.should_stop
        for key in todo:
            if should_stop is not None and should_stop():
                self._stop()
            before = digests.get(key)
            hashed += self._evaluate(
                key, matches[key], None, key in touched, cache, cache, digests, volatile
            )
            if digests.get(key) != before:
                changed.add(key)
        return changed, removed, hashed

    def _evaluate(
        self,
        key: str,
        path: str,
        st: os.stat_result | None,
        force: bool,
        old_cache: dict[str, _Cached],
        new_cache: dict[str, _Cached],
        digests: dict[str, str],
        volatile: set[str],
    ) -> int:
        """Digest one match into ``digests``; return 1 if it was read, else 0.

        ``force``: read it whatever its stat says (an event named it). A key whose
        digest a journal cannot vouch for next time goes into ``volatile``.
        """
        volatile.discard(key)
        if st is None:
            st = self._prestat.get(key)
        if st is None:
            try:
                st = os.stat(path)
            except OSError as exc:
                new_cache.pop(key, None)
                if os.path.lexists(path):  # dangling or looping link
                    digests[key] = _error_marker(exc)
                    volatile.add(key)
                else:  # vanished since it was listed: not state
                    digests.pop(key, None)
                    self._pending.add(key)
                return 0
        if not stat.S_ISREG(st.st_mode):
            new_cache.pop(key, None)
            digests[key] = self._non_file_marker(path, st)
            volatile.add(key)
            return 0
        cached = old_cache.get(key)
        read = 0
        if (
            not force
            and cached is not None
            and cached.trusted
            and cached.signature == _stat_signature(st)
        ):
            digests[key] = cached.digest
            new_cache[key] = cached
        else:
            self._read_now += 1
            result = self._hash_file(path, self.should_stop)
            read = 1
            if isinstance(result, str):  # errors are not cached: tried again next time
                new_cache.pop(key, None)
                digests[key] = result
                volatile.add(key)
                return read
            digests[key] = result.digest
            new_cache[key] = result
            self._cached_now += 1
            cached = result
        # Inside the racy window, another path to the same inode, or a link whose
        # target may live where no watch is: a journal cannot vouch for these.
        if not cached.trusted or st.st_nlink > 1 or key in self._links:
            volatile.add(key)
        return read

    @staticmethod
    def _non_file_marker(path: str, st: os.stat_result) -> str:
        if stat.S_ISDIR(st.st_mode):  # a link to a directory: recorded, not followed
            return StateFingerprint._link_marker(path)
        return f"special:{stat.S_IFMT(st.st_mode):o}"

    @staticmethod
    def _link_marker(path: str) -> str:
        try:
            return "symlink:" + os.readlink(path)
        except OSError as exc:
            return _error_marker(exc)

    def _stop(self) -> None:
        """The budget ran out: say how far this compute got, and stop it."""
        self._stats = {**self._stats, "hashed": self._read_now, "mode": "interrupted"}
        raise DeadlineReached(
            f"while fingerprinting the state ({', '.join(self._patterns)}): "
            f"{self._read_now} file(s) read before it ran out"
        )

    @staticmethod
    def _hash_file(path: str, should_stop: ShouldStop | None = None) -> _Cached | str:
        """Hash one file; a marker string if it cannot be read. A file larger than
        :data:`HASH_CHUNK` asks ``should_stop`` between chunks (DeadlineReached)."""
        hashed_at = time.time_ns()
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            return _error_marker(exc)
        try:
            with open(fd, "rb", closefd=True) as f:
                # The stat of the very file we read, taken before reading it.
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return f"special:{stat.S_IFMT(st.st_mode):o}"
                if should_stop is None or st.st_size <= HASH_CHUNK:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                else:
                    digest = _chunked_digest(f, should_stop, path)
        except OSError as exc:
            return _error_marker(exc)
        trusted = st.st_mtime_ns < hashed_at - RACY_WINDOW_NS
        return _Cached(_stat_signature(st), digest, trusted)



def _chunked_digest(f: BinaryIO, should_stop: ShouldStop, path: str) -> str:
    """sha256 of an open file, read :data:`HASH_CHUNK` bytes at a time, asking
    ``should_stop`` before each chunk (as fast as ``hashlib.file_digest``)."""
    h = hashlib.sha256()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    while True:
        if should_stop():
            raise DeadlineReached(f"while fingerprinting the state: in the middle of hashing {path}")
        n = f.readinto(buf)  # type: ignore[attr-defined]  # an unbuffered or buffered file
        if not n:
            return h.hexdigest()
        h.update(view[:n])

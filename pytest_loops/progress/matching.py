"""Which files are a loop's state: the patterns and excludes of the state fingerprint.

:class:`PatternMatcher` expands the state patterns (globs, directories, files)
relative to a root into the files they match, leaving out excluded names and
paths, and keeps each directory's listing so a later expansion reuses it. With a
change journal (:mod:`pytest_loops.progress.journal`) it watches every directory
before reading it, so a later change there is an event. Hashing what it matched
is :class:`pytest_loops.progress.fingerprint.StateFingerprint`'s job.

A module of its own (the architecture names fingerprint.py, journal.py,
signature.py and treehash.py): which files are state and what they hold are two
concerns, and together they made one module of over a thousand lines.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Sequence

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.errors import LoopUsageError
from pytest_loops.progress import journal as fswatch
from pytest_loops.progress.treehash import error_marker

__all__ = ["DEFAULT_EXCLUDES", "PatternMatcher"]

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

_MAGIC = re.compile(r"[*?[]")
# Listing a directory through its descriptor lets each stat resolve one name
# relative to it instead of walking the whole path again: measurably cheaper.
_SCAN_BY_FD = os.scandir in os.supports_fd and hasattr(os, "O_DIRECTORY")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_OUTSIDE_ROOT = "a pattern names paths outside the root"


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


# One directory entry as the walk keeps it: (name, is a directory, is a symbolic
# link), both from the entry's type, never following a link. Excluded names are
# left out when the directory is read.
_Entry = tuple[str, bool, bool]
# What one directory adds to a tree walk: files (key -> path), which of them are
# links, and the subdirectories to walk next (path, key, name filter).
_Part = tuple[dict[str, str], list[str], list[tuple[str, str, "re.Pattern[str] | None"]]]


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


class PatternMatcher:
    """The files ``patterns`` match under ``root``, less the excludes.

    How patterns and excludes are read is :class:`~pytest_loops.progress.fingerprint.StateFingerprint`'s
    documentation. A subclass sets ``_journal`` to a live
    :class:`~pytest_loops.progress.journal.DirectoryJournal` to have every
    directory watched before it is read, and the listings kept while it watches.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        patterns: Sequence[str],
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
        # Per-compute scratch state (the listings persist while the journal watches them).
        self._listings: dict[str, list[_Entry]] = {}
        # Per directory and name filter: what it adds to a tree walk.
        self._trees: dict[str, dict[re.Pattern[str] | None, _Part]] = {}
        self._prestat: dict[str, os.stat_result] = {}
        self._markers: dict[str, str] = {}
        self._links: set[str] = set()
        self._journal: fswatch.DirectoryJournal | None = None
        self._kinds: dict[str, str] = {}  # path a pattern names literally -> file/link/none
        self._literal_links: set[str] = set()
        self._reexpand = False  # something seen last time must be looked at again

    def matched_files(self) -> list[str]:
        """The keys of the paths the patterns match now that exist (one listing, no hashing)."""
        matches: dict[str, str] = {}
        for pattern in self._patterns:
            self._expand_pattern(pattern, matches)
        return sorted(k for k, path in matches.items() if os.path.lexists(path))

    def _stop(self) -> None:
        """``should_stop`` answered true: stop (a subclass says how far it got)."""
        raise DeadlineReached(f"while matching the state patterns ({', '.join(self._patterns)})")

    def _ignore_event(self, path: str, name: str) -> bool:
        """An event about an excluded name: it cannot change what is matched."""
        key = path[len(self._root_prefix) :] if path.startswith(self._root_prefix) else path
        return self._excluded(name, _to_key(key))

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
            self._markers[key or "."] = error_marker(exc)
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
                        self._markers[dir_key or "."] = error_marker(exc)
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


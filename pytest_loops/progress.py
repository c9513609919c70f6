"""Progress detection: an incremental state fingerprint and failure signatures.

The no-progress guard asks two questions after every iteration: did the files the
loop is about change (:class:`StateFingerprint`), and is the loop failing in the
same way as before (:func:`failure_signature`)? Both answers must be cheap and
must not be fooled by noise that every run produces: caches, timings, addresses,
temp directories.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .errors import LoopUsageError

__all__ = [
    "DEFAULT_EXCLUDES",
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


def _stat_signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime is not settable from user space, so an in-place rewrite that restores
    # the old mtime with os.utime still shows up here (where ctime is meaningful).
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def _error_marker(exc: OSError) -> str:
    return f"error:{type(exc).__name__}:{exc.errno}"


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

    ``compute()`` stats every file each time and re-reads only files whose size,
    mtime, inode or ctime changed, or whose mtime was within :data:`RACY_WINDOW_NS`
    of the moment they were last read.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        patterns: Sequence[str],
        *,
        exclude: Sequence[str] = (),
    ) -> None:
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
        self._cache: dict[str, _Cached] = {}
        self._files: list[str] = []
        self._stats = {"files": 0, "hashed": 0, "stat_only": 0}
        # Per-compute scratch state.
        self._listings: dict[str, list[os.DirEntry[str]]] = {}
        self._prestat: dict[str, os.stat_result] = {}
        self._markers: dict[str, str] = {}

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
    def last_stats(self) -> dict[str, int]:
        """``{"files": n, "hashed": m, "stat_only": k}`` for the last compute.

        ``files`` also counts markers (unreadable files, links to directories,
        special files), which are neither hashed nor cached.
        """
        return dict(self._stats)

    def compute(self) -> str:
        """Return ``"sha256:<hex>"`` over the sorted (path, content digest) of all matched files."""
        self._listings = {}
        self._prestat = {}
        self._markers = {}
        # A match is its DirEntry when a glob listed it, else its path.
        matches: dict[str, os.DirEntry[str] | str] = {}
        try:
            for pattern in self._patterns:
                self._expand_pattern(pattern, matches)
            digests, hashed, stat_only = self._digest_all(matches)
        finally:
            self._listings = {}
            self._prestat = {}
        for key, marker in self._markers.items():
            digests.setdefault(key, marker)

        keys = sorted(digests)
        # key NUL digest LF: unambiguous, since neither a path nor a digest holds NUL
        # and digests hold no LF.
        text = "".join([f"{key}\0{digests[key]}\n" for key in keys])
        outer = hashlib.sha256(_FORMAT_TAG)
        outer.update(text.encode("utf-8", "surrogateescape"))
        self._files = keys
        self._stats = {"files": len(keys), "hashed": hashed, "stat_only": stat_only}
        return "sha256:" + outer.hexdigest()

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

    def _expand_pattern(
        self, pattern: str, matches: dict[str, os.DirEntry[str] | str]
    ) -> None:
        full = os.path.normpath(os.path.join(self._root, pattern))
        rel = self._relative(full)
        if rel is not None:
            segments = [s for s in rel.split(os.sep) if s]
            self._expand(self._root, "", segments, matches)
            return
        # Outside the root: start at the longest literal prefix, keyed absolutely.
        parts = full.split(os.sep)
        first_magic = next((i for i, p in enumerate(parts) if _has_magic(p)), len(parts))
        base = os.sep.join(parts[:first_magic]) or os.sep
        self._expand(base, _to_key(base), [s for s in parts[first_magic:] if s], matches)

    def _listdir(self, path: str, key: str) -> list[os.DirEntry[str]]:
        listing = self._listings.get(path)
        if listing is None:
            try:
                with os.scandir(path) as it:
                    listing = list(it)
            except (FileNotFoundError, NotADirectoryError):
                listing = []
            except OSError as exc:  # unreadable directory: a marker, never an exception
                self._markers[key or "."] = _error_marker(exc)
                listing = []
            self._listings[path] = listing
        return listing

    def _expand(
        self,
        path: str,
        key: str,
        segments: list[str],
        matches: dict[str, os.DirEntry[str] | str],
        entry: os.DirEntry[str] | None = None,
    ) -> None:
        if not segments:
            self._take(path, key, entry, matches)
            return
        if entry is not None and not entry.is_dir(follow_symlinks=False):
            return  # more segments to match, but this is not a directory we descend
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
                child_key = _join_key(key, child.name)
                if child.is_dir(follow_symlinks=False) and not self._excluded(
                    child.name, child_key
                ):
                    self._expand(child.path, child_key, segments, matches, child)
        elif not _has_magic(segment):
            child_key = _join_key(key, segment)
            if not self._excluded(segment, child_key):
                # A literal name is followed even if it is a symbolic link.
                self._expand(os.path.join(path, segment), child_key, rest, matches)
        else:
            rx = _segment_matcher(segment)
            excluded = self._excluded
            for child in self._listdir(path, key):
                name = child.name
                if rx.match(name):
                    child_key = _join_key(key, name)
                    if excluded(name, child_key):
                        continue
                    if rest or child.is_dir(follow_symlinks=False):
                        self._expand(child.path, child_key, rest, matches, child)
                    elif child_key not in matches:  # the common case, `**/*.py`, inline
                        matches[child_key] = child

    def _take(
        self,
        path: str,
        key: str,
        entry: os.DirEntry[str] | None,
        matches: dict[str, os.DirEntry[str] | str],
    ) -> None:
        """A pattern resolved to ``path``: a file is one match, a directory all beneath it."""
        if entry is not None:
            if entry.is_dir(follow_symlinks=False):
                self._take_tree(path, key, matches)
            else:
                matches.setdefault(key, entry)
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
        matches: dict[str, os.DirEntry[str] | str],
        only: re.Pattern[str] | None = None,
    ) -> None:
        """Everything beneath ``path``, statted while its directory is open.

        With ``only``, this is ``path/**/<only>``: files whose name matches, and
        everything beneath a directory whose name matches.
        The hot loop of a large tree: locals, and no helper calls per entry.
        """
        name_match = self._name_rx.match
        path_match = self._path_rx.match if self._path_rx is not None else None
        stats = self._prestat
        sep = os.sep
        stack = [(path, key, only)]
        while stack:
            dir_path, dir_key, rx = stack.pop()
            prefix = dir_key if not dir_key or dir_key.endswith("/") else dir_key + "/"
            base = dir_path if dir_path.endswith(sep) else dir_path + sep
            fd = None
            try:
                if _SCAN_BY_FD:
                    fd = os.open(dir_path, _DIR_FLAGS)
                    listing = os.scandir(fd)
                else:  # pragma: no cover - platforms without fd-relative scandir
                    listing = os.scandir(dir_path)
                with listing:
                    for child in listing:
                        name = child.name
                        if name_match(name):
                            continue
                        child_key = prefix + name
                        if path_match is not None and path_match(child_key):
                            continue
                        if child.is_dir(follow_symlinks=False):
                            if rx is not None and rx.match(name):
                                stack.append((base + name, child_key, None))
                            else:
                                stack.append((base + name, child_key, rx))
                        elif rx is not None and not rx.match(name):
                            continue
                        elif child_key not in matches:  # files, and links of any kind
                            matches[child_key] = base + name
                            try:
                                stats[child_key] = child.stat()
                            except OSError:
                                pass  # classified when digested
            except (FileNotFoundError, NotADirectoryError):
                pass  # vanished, or replaced by a file, since it was listed
            except OSError as exc:  # unreadable directory: a marker, never an exception
                self._markers[dir_key or "."] = _error_marker(exc)
            finally:
                if fd is not None:
                    os.close(fd)

    # -- digesting

    def _digest_all(
        self, matches: dict[str, os.DirEntry[str] | str]
    ) -> tuple[dict[str, str], int, int]:
        digests: dict[str, str] = {}
        new_cache: dict[str, _Cached] = {}
        cache_get = self._cache.get
        signature = _stat_signature
        is_reg = stat.S_ISREG
        hashed = stat_only = 0
        prestat = self._prestat.get
        for key, item in matches.items():
            st = prestat(key)
            if st is None:
                try:
                    st = os.stat(item) if isinstance(item, str) else item.stat()
                except OSError as exc:
                    path = item if isinstance(item, str) else item.path
                    if os.path.lexists(path):  # dangling or looping link
                        digests[key] = _error_marker(exc)
                    continue  # vanished since it was listed: not state
            if not is_reg(st.st_mode):
                digests[key] = self._non_file_marker(item, st)
                continue
            cached = cache_get(key)
            if cached is not None and cached.trusted and cached.signature == signature(st):
                digests[key] = cached.digest
                new_cache[key] = cached
                stat_only += 1
                continue
            result = self._hash_file(item if isinstance(item, str) else item.path)
            hashed += 1
            if isinstance(result, str):
                digests[key] = result
            else:
                digests[key] = result.digest
                new_cache[key] = result
        # Deleted files drop out of the cache here.
        self._cache = new_cache
        return digests, hashed, stat_only

    @staticmethod
    def _non_file_marker(item: os.DirEntry[str] | str, st: os.stat_result) -> str:
        if stat.S_ISDIR(st.st_mode):  # a link to a directory: recorded, not followed
            path = item if isinstance(item, str) else item.path
            return StateFingerprint._link_marker(path)
        return f"special:{stat.S_IFMT(st.st_mode):o}"

    @staticmethod
    def _link_marker(path: str) -> str:
        try:
            return "symlink:" + os.readlink(path)
        except OSError as exc:
            return _error_marker(exc)

    @staticmethod
    def _hash_file(path: str) -> _Cached | str:
        """Hash one file; a marker string if it cannot be read."""
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
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            return _error_marker(exc)
        trusted = st.st_mtime_ns < hashed_at - RACY_WINDOW_NS
        return _Cached(_stat_signature(st), digest, trusted)


# ------------------------------------------------------------ failure signatures

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_SEP = r"[/\\]"
_PATH_CHAR = r"[^\s'\"()\[\]<>,;:]"
_NAME_CHAR = r"[^\s'\"()\[\]<>,;:/\\]"  # one path component
# pytest's tmp_path: <basetemp>/pytest-of-<user>/pytest-<n>/[popen-gw<k>/]<test name><n>
# Every pattern below may start only where a token starts or at a fixed literal,
# so a long line without spaces (a blob, a minified file) costs linear time.
_PYTEST_TMP = re.compile(
    rf"(?<!{_PATH_CHAR})(?:{_PATH_CHAR}*{_SEP})?pytest-of-[^\s/\\'\"]+{_SEP}pytest-(?:\d+|current)"
    rf"(?:{_SEP}popen-gw\d+)?(?:{_SEP}{_NAME_CHAR}*\d(?={_SEP}|[^\w.-]|$))?"
)


def _temp_roots() -> list[str]:
    roots = {"/tmp", "/var/tmp", "/dev/shm", "/private/tmp", "/private/var/tmp"}
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and len(value) > 1:
            roots.add(value.rstrip("/\\"))
    try:
        import tempfile

        roots.add(tempfile.gettempdir().rstrip("/\\"))
    except Exception:  # pragma: no cover - no usable temp dir at all
        pass
    return sorted((r for r in roots if r), key=len, reverse=True)


# <temp root>/<one random component>: mkdtemp names, /tmp/<anything> alike.
_TEMP_PATH = re.compile(
    r"(?<![\w.])(?:(?:/private)?/var/folders/[^/\s]+/[^/\s]+/[TC]"
    r"|" + "|".join(re.escape(r) for r in _temp_roots()) + r")(?![\w.-])"
    rf"(?:{_SEP}{_NAME_CHAR}+)?"
)
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?\b"
)
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b")
_EPOCH = re.compile(r"\b1[5-9]\d{8}(?:\.\d+)?\b")
_FILE_LINE = re.compile(r"(?<![\w.\-])([\w.\-]*\.[A-Za-z]\w*):\d+(?::\d+)?")
_TRACEBACK_LINE = re.compile(r"(\", line )\d+")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_DURATION = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:s|secs?|seconds?|ms|msecs?|milliseconds?|us|µs|μs|ns"
    r"|mins?|minutes?)\b"
)
_PID = re.compile(r"\b(pid|PID|Pid|process)([\s=:#]*)\d+")
_SEED = re.compile(r"(seed[\s=:(]*)\d+", re.IGNORECASE)
_WORKER = re.compile(r"\bgw\d+\b")

_PYTEST_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S.*)$")
_PYTEST_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_PYTEST_BANNER = re.compile(r"^={3,}")
_PYTEST_E = re.compile(r"^E   (.*)$")
_COMMAND_TAIL_LINES = 40


def _clean(output: str | bytes) -> str:
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    return _ANSI.sub("", output or "").replace("\r\n", "\n").replace("\r", "\n")


def _normalize_line(line: str) -> str:
    """Strip what varies between two runs of the same failure."""
    line = _PYTEST_TMP.sub("<tmp>", line)
    line = _TEMP_PATH.sub("<tmp>", line)
    line = _TIMESTAMP.sub("<time>", line)
    line = _CLOCK.sub("<time>", line)
    line = _EPOCH.sub("<time>", line)
    line = _FILE_LINE.sub(r"\1:N", line)
    line = _TRACEBACK_LINE.sub(r"\1N", line)
    line = _HEX.sub("0x?", line)
    line = _DURATION.sub("<duration>", line)
    line = _PID.sub(r"\1\2<pid>", line)
    line = _SEED.sub(r"\1<seed>", line)
    line = _WORKER.sub("gw?", line)
    return line.strip()


def _pytest_items(lines: Iterable[str]) -> list[str]:
    """Failing node ids (short summary) and each failure section's ``E`` lines."""
    items: set[str] = set()
    section: str | None = None
    e_lines: list[str] = []

    def close() -> None:
        if section is not None and e_lines:
            items.add(f"{section}: " + " | ".join(e_lines))

    for raw in lines:
        line = raw.rstrip()
        header = _PYTEST_SECTION.match(line)
        if header or _PYTEST_BANNER.match(line):
            close()
            section = _normalize_line(header.group(1)) if header else None
            e_lines = []
            continue
        summary = _PYTEST_SUMMARY.match(line)
        if summary:
            items.add(f"{summary.group(1)} {_normalize_line(summary.group(2))}")
            continue
        e_line = _PYTEST_E.match(line)
        if e_line and section is not None:
            text = _normalize_line(e_line.group(1))
            if text:
                e_lines.append(text)
    close()
    return sorted(items)


def normalize_failure(output: str, *, kind: str = "command") -> str:
    """The text a failure signature is computed from.

    ``kind="pytest"``: the failing node ids from pytest's short summary
    (``FAILED node - Exc: msg``, ``ERROR ...``) and the ``E`` lines of each failure
    section, normalized and sorted, one per line. If there are none (a crash
    before any test ran) it falls back to the rule for other commands.

    Any other kind: the last 40 non-empty lines, normalized.

    Normalizing removes line numbers (``file.py:123``, ``", line 12``), hex
    addresses, temp paths (``/tmp/<dir>``, pytest's ``pytest-of-*/pytest-N/name0``),
    durations and timestamps, PIDs, random seeds and xdist worker ids.
    """
    lines = _clean(output).split("\n")
    if str(kind) == "pytest":
        items = _pytest_items(lines)
        if items:
            return "\n".join(items)
    tail = [line for line in lines if line.strip()][-_COMMAND_TAIL_LINES:]
    return "\n".join(_normalize_line(line) for line in tail)


def failure_signature(output: str, *, kind: str = "command") -> str:
    """``"sha256:<hex>"`` of :func:`normalize_failure`: equal for the same failure.

    Two runs of one failure at different times in different temp directories give
    the same signature; a different assertion message gives a different one.
    """
    text = normalize_failure(output, kind=kind)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


_MAX_LINE = 200
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR)\s+\S")
_ERROR_LINE = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Failure)\b(?::|$)"
    r"|^\s*(?:error|fatal|ERROR|FATAL)(?:\[[^\]]*\])?:"
)


def first_meaningful_line(output: str) -> str:
    """The line that best says what failed, for a lesson; at most 200 characters.

    In order of preference: the first pytest ``E`` line (without the ``E``
    marker), the first ``FAILED``/``ERROR`` short-summary line, the first line
    naming an error (``ValueError: ...``, ``AssertionError``, ``error: ...``), else
    the last non-empty line. ``""`` for empty output.
    """
    lines = [line.strip() for line in _clean(output).split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    e_lines = (m.group(1).strip() for m in map(_PYTEST_E.match, lines) if m)
    found = (
        next((text for text in e_lines if text), None)
        or next((line for line in lines if _FAILED_LINE.match(line)), None)
        or next((line for line in lines if _ERROR_LINE.search(line)), None)
        or lines[-1]
    )
    if len(found) > _MAX_LINE:
        found = found[: _MAX_LINE - 3] + "..."
    return found

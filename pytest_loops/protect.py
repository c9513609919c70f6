"""What a revise step may change: an allow-list, enforced around every revise.

A loop has a *scope*: the paths its revise step may change. By default that is
every file under the loop's working directory except the ones that judge the
code: test files and everything under test directories, ``conftest.py``
anywhere, every configuration file pytest reads (of any name pytest knows, also
in the ancestor directories it searches), loop files and the harness config,
virtual environments, ``.pth`` and ``sitecustomize`` files, new modules that
would shadow pytest or the standard library, symbolic links and executables.
``scope`` globs narrow the scope; ``protect`` globs add read-only paths.

:class:`TreeGuard` copies the read-only files (and the in-scope Python files,
for the diff audit) into a private store when the loop starts. Around each
revise it learns what changed from the change journal (inotify; a stat walk
where the journal cannot vouch), so the cost is proportional to what changed,
not to the tree. A change to a read-only path is undone from the store, never
through a symbolic link (a link is replaced, not followed), and ends the loop
ESCALATE. The clean room (:mod:`pytest_loops.cleanroom`) is built from the same
store: loop-start read-only files plus the in-scope files as they are now.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .deadline import DeadlineReached, ShouldStop
from .spec import CheckKind, LoopSpec

if TYPE_CHECKING:
    from .fswatch import DirectoryJournal

# Configuration files pytest (and the tools around it) read, at any depth and in
# every ancestor directory: present and future names.
CONFIG_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
    "pyproject.toml", "tox.ini", "setup.cfg", "setup.py", "noxfile.py", ".coveragerc",
    "Makefile", "makefile", "GNUmakefile", "justfile", "Justfile", "Taskfile.yml",
})
ANCESTOR_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
    "pyproject.toml", "tox.ini", "setup.cfg",
})
# Files the interpreter runs on its own at start-up.
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
# A new module under one of these names shadows what the judge imports.
SHADOW_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "pytest_loops", "opentine",
                            "coverage", "xdist", "iniconfig", "packaging"}) | frozenset(
    getattr(sys, "stdlib_module_names", ()))
# Directory names that hold tests and what they read (data, golden files, helpers).
TEST_DIR = re.compile(r"^(tests?|testing|test[_-].*|.*[_-]tests?|testdata|fixtures|golden)$", re.I)
DEFAULT_TEST_FILES = ("**/test_*.py", "**/*_test.py")
# Never tracked, never copied: caches, VCS data, build trees.
IGNORED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".pytest_cache", ".pytest-loops", ".hypothesis",
    ".mypy_cache", ".ruff_cache", ".tox", ".nox", "node_modules",
})
# Bytecode caches are tracked but never judged: whatever a revise step writes into a
# __pycache__ is removed after it, and the clean room copies none, so a forged one is
# neither read by the judge nor left behind.
PYCACHE = "__pycache__"
CACHE_REASON = "a bytecode cache"
# Kept for callers that only need a walk of a tree's own files.
SKIP_DIRS = IGNORED_DIRS | {".venv", "venv", PYCACHE}
AUDIT_MAX_BYTES = 1 << 20  # in-scope Python files up to this size are kept for the diff audit
MEMORY_FILE_BYTES = 1 << 20  # read-only files up to this size are also kept in memory...
MEMORY_TOTAL_BYTES = 64 << 20  # ...up to this much in all
COPY_BLOCK = 1 << 20


@lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over '/'-separated relative paths: `**` spans directories, `*` does not."""
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.endswith("/"):
        pattern += "**"
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches(relpath: str, patterns: Iterable[str]) -> bool:
    """Whether a relative path matches any glob (a plain directory name covers its files)."""
    for pattern in patterns:
        if _glob_regex(pattern).match(relpath):
            return True
        bare = pattern.strip().rstrip("/")
        while bare.startswith("./"):
            bare = bare[2:]
        if bare and not any(c in bare for c in "*?[") and relpath.startswith(bare + "/"):
            return True
    return False


def walk(root: Path) -> Iterable[str]:
    """Relative '/'-paths of the files under root, skipping caches and virtualenvs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in filenames:
            yield prefix + name


def named_test_files(spec: LoopSpec) -> list[str]:
    """Test files the loop's checks name: node ids' files and `.py` paths in pytest
    commands (read-only whatever their names)."""
    files: list[str] = []
    for check in spec.checks:
        if check.kind is CheckKind.PYTEST and check.node_id:
            files.append(check.node_id.split("::", 1)[0])
        elif check.command and "pytest" in check.command:
            try:
                words = shlex.split(check.command)
            except ValueError:
                continue
            files += [w.split("::", 1)[0] for w in words if w.split("::", 1)[0].endswith(".py")]
    return list(dict.fromkeys(f.lstrip("./") if f.startswith("./") else f for f in files))


_INTERPRETERS = re.compile(r"^(sh|bash|zsh|dash|ksh|python[0-9.]*|pypy[0-9.]*|node|ruby|perl|tclsh|make)$")
_CONFIG_FLAGS = frozenset({"-c", "--config-file", "--config", "--rcfile", "-f", "--file", "--makefile"})


def check_files(spec: LoopSpec, root: str) -> list[str]:
    """Files under ``root`` that judge: the scripts the checks run (``bash run_tests.sh``,
    ``python check.py``, ``./verify``), the configuration they name (``-c ci.ini``),
    the node ids' files and the loop's own file. Read-only, whatever their names;
    files a check only reads as data (``grep fixed a.txt``) are not."""
    found = list(named_test_files(spec))

    def add(word: str) -> None:
        path = os.path.normpath(os.path.join(root, word.split("::", 1)[0]))
        if os.path.isfile(path):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if not rel.startswith("../"):
                found.append(rel)

    for check in spec.checks:
        try:
            lexer = shlex.shlex(check.command or "", posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            words = (check.command or "").split()
        segment: list[str] = []
        for word in [*words, ";"]:
            if word and set(word) <= set(";&|()"):
                _segment_files(segment, add)
                segment = []
            else:
                segment.append(word)
    if spec.source and os.path.isfile(spec.source):
        add(os.path.realpath(spec.source))
    return list(dict.fromkeys(found))


def _segment_files(words: list[str], add: Callable[[str], None]) -> None:
    """The script one simple command runs, and the config files it names."""
    while words and "=" in words[0] and not words[0].startswith(("-", "/", ".")):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return
    add(words[0])
    if _INTERPRETERS.match(os.path.basename(words[0])):
        rest = words[1:]
        while rest and rest[0].startswith("-"):
            if rest[0] in ("-m", "-c"):
                rest = []
                break
            rest = rest[1:]
        if rest:
            add(rest[0])
    for i, word in enumerate(words):
        if word in _CONFIG_FLAGS and i + 1 < len(words):
            add(words[i + 1])
        elif word.startswith(("--config-file=", "--rootdir=", "--config=", "--rcfile=")):
            add(word.split("=", 1)[1])


def describe(changes: Sequence[tuple[str, str]], limit: int = 8) -> str:
    text = ", ".join(f"{rel} ({how})" for rel, how in changes[:limit])
    return text + (f" and {len(changes) - limit} more" if len(changes) > limit else "")


# --- the state of a tree ------------------------------------------------------------


class Entry(NamedTuple):
    """One path's identity as lstat sees it. Any field changing means "look again"."""

    kind: str  # "f" file, "l" symbolic link, "d" directory (only where listed: venv tops)
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int  # cannot be set back by the writer: a rewrite that restores mtime shows here
    ino: int
    target: str = ""  # a link's target
    nlink: int = 1  # more than one: the same bytes under another name too


def _entry(path: str) -> Entry | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return Entry("l", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, target)
    if stat.S_ISREG(st.st_mode):
        return Entry("f", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, "", st.st_nlink)
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", st.st_mode, 0, 0, 0, st.st_ino)
    return Entry("o", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _executable(entry: Entry) -> bool:
    return entry.kind == "f" and bool(entry.mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))


@dataclass(frozen=True)
class Stored:
    """A loop-start copy of one file in the private store (small ones also in memory,
    where no other process can rewrite them)."""

    path: str  # in the store
    digest: str
    size: int
    mode: int
    data: bytes | None = None


@dataclass(frozen=True)
class Violation:
    """A change to a read-only path: what, how, why it is read-only, and whether it was undone."""

    path: str
    how: str  # "modified" | "deleted" | "added" | "became a link" ...
    why: str
    restored: bool = True

    def describe(self) -> str:
        undone = "" if self.restored else ", could not be undone"
        return f"{printable(self.path)} ({self.how}: {self.why}{undone})"


def printable(path: str) -> str:
    """A path as text that can be written anywhere: bytes that are not UTF-8 (a file
    name the OS gave us as bytes) become backslash escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class RevisePass:
    """What one revise step changed."""

    violations: list[Violation] = field(default_factory=list)
    in_scope: list[tuple[str, str]] = field(default_factory=list)  # (path, how)
    caches_cleared: list[str] = field(default_factory=list)  # bytecode the revise step wrote, removed
    walked: bool = False  # the journal could not vouch: the tree was walked


def _hash_copy(src: str, dst: str | None, should_stop: ShouldStop | None = None) -> tuple[str, int]:
    """sha256 of ``src`` (and a copy of it at ``dst``), read once; ``should_stop`` is
    asked between blocks (:class:`~pytest_loops.deadline.DeadlineReached`)."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = None
        if dst is not None:
            out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while True:
                if should_stop is not None and size and should_stop():
                    raise DeadlineReached(f"while the tree guard copied {src} into its loop-start store")
                block = os.read(fd, COPY_BLOCK)
                if not block:
                    break
                h.update(block)
                size += len(block)
                if out is not None:
                    _write_all(out, block)
        finally:
            if out is not None:
                os.close(out)
    finally:
        os.close(fd)
    return "sha256:" + h.hexdigest(), size


def file_digest(path: str) -> str | None:
    """sha256 of a regular file, never through a link; None if unreadable."""
    try:
        return _hash_copy(path, None)[0]
    except OSError:
        return None


class TreeGuard:
    """The allow-list of one loop's working tree; see the module docstring.

    :param root: the loop's working directory.
    :param scope: globs of the paths the revise step may change (empty: every
        path that is not read-only by the rules above).
    :param protect: extra read-only globs.
    :param own: the harness's own paths under root (run log, run dir, lessons
        page, artifacts dir): never tracked.
    :param test_files: extra test-file globs (pytest's ``python_files``) and the
        files the checks name.
    :param extra_ancestors: more directories whose configuration files are
        watched (where the clean room will be built).
    :param should_stop: the loop's budget, asked while :meth:`begin` walks and
        copies the tree (between directories, files and blocks): it raises
        :class:`~pytest_loops.deadline.DeadlineReached` and no revise step runs.
        Never asked after a revise step: undoing its changes to read-only paths
        is not cut short.
    """

    def __init__(self, root: str | os.PathLike[str], *, scope: Sequence[str] = (),
                 protect: Sequence[str] = (), own: Sequence[str] = (),
                 test_files: Sequence[str] = (), readonly_files: Sequence[str] = (),
                 extra_ancestors: Sequence[str] = (), journal: bool = True,
                 should_stop: ShouldStop | None = None) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.scope = tuple(scope)
        self.protect = tuple(protect)
        self.own = tuple(p.strip("/") for p in own if p and p.strip("/"))
        self.test_files = tuple(DEFAULT_TEST_FILES) + tuple(test_files)
        self.readonly_files = frozenset(readonly_files)
        self.start_dirs: frozenset[str] = frozenset()
        self.use_journal = journal
        self.state: dict[str, Entry] = {}  # rel -> entry, as last seen
        self.start: dict[str, Entry] = {}  # rel -> entry at loop start
        self.store: dict[str, Stored] = {}
        self.venvs: set[str] = set()
        self.ancestors: dict[str, Entry | None] = {}
        self.ancestor_store: dict[str, Stored] = {}
        self._ancestor_dirs = _ancestor_dirs(self.root, extra_ancestors)
        self._store_dir: str | None = None
        self._journal: DirectoryJournal | None = None
        self._journal_reason: str | None = None
        self.started = False
        self.should_stop = should_stop
        self._stop_now: ShouldStop | None = None  # should_stop while begin() runs, else None
        self.walks = 0
        self.dirs: set[str] = set()  # directories listed (so a new one is walked whole)
        self.files_in: dict[str, set[str]] = {}  # directory -> its files in the state
        self.subdirs_of: dict[str, set[str]] = {}  # directory -> its listed subdirectories
        self.venv_tops: dict[str, set[str]] = {}  # venv -> the directories of it that are listed
        self.touched: set[str] = set()  # every path that changed since the loop started
        self._reasons: dict[tuple[str, str, bool], str | None] = {}
        self._memory_left = MEMORY_TOTAL_BYTES
        self._readonly_inodes: dict[int, str] = {}  # inode -> read-only path, at loop start
        self.texts: dict[str, str] = {}  # in-scope Python file -> its loop-start copy (audit)

    # -- classification -------------------------------------------------------------

    def _own(self, rel: str) -> bool:
        return any(rel == o or rel.startswith(o + "/") for o in self.own)

    def ignored(self, rel: str) -> bool:
        """Paths never tracked: caches, VCS data, the harness's own files."""
        parts = rel.split("/")
        if any(p in IGNORED_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            return True
        if parts[-1] in IGNORED_DIRS:
            return True
        return self._own(rel)

    def _in_venv(self, rel: str) -> str | None:
        for venv in self.venvs:
            if rel == venv or rel.startswith(venv + "/"):
                return venv
        return None

    def readonly_reason(self, rel: str, entry: Entry | None, *, new: bool) -> str | None:
        """Why the revise step may not change ``rel`` (None: it may)."""
        if new:
            return self._reason(rel, entry, new=True)
        key = (rel, entry.kind if entry else "", bool(entry and _executable(entry)))
        if key not in self._reasons:
            self._reasons[key] = self._reason(rel, entry, new=False)
        return self._reasons[key]

    def _reason(self, rel: str, entry: Entry | None, *, new: bool) -> str | None:
        if self._in_venv(rel):
            return "a virtual environment"
        if f"{PYCACHE}/" in rel or rel.endswith((".pyc", ".pyo")):
            return CACHE_REASON
        name = rel.rsplit("/", 1)[-1]
        if entry is not None and entry.kind == "l":
            return "a symbolic link"
        if self.protect and matches(rel, self.protect):
            return "protected by the loop's protect setting"
        if name in CONFIG_NAMES:
            return "configuration pytest reads"
        if name in STARTUP_NAMES or name.endswith(".pth"):
            return "run by the interpreter at start-up"
        parts = rel.split("/")
        if any(TEST_DIR.match(p) for p in parts[:-1]):
            return "under a test directory"
        if matches(rel, self.test_files):
            return "a test file"
        if name.endswith((".loop", ".loop.yaml", ".loop.yml")) or rel in self.readonly_files:
            return "a loop definition, or a file a check runs"
        if new:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                stem = part[:-3] if last and part.endswith(".py") else part
                if stem not in SHADOW_MODULES or (last and not part.endswith(".py")):
                    continue
                parent = "/".join(parts[:i])
                if os.path.exists(os.path.join(self.root, parent, "__init__.py")):
                    continue  # inside a package: shadows nothing
                if not last and "/".join(parts[: i + 1]) in self.start_dirs:
                    continue  # the package was there when the loop started
                return f"would shadow the module {stem!r}"
        if self.scope and not matches(rel, self.scope):
            return "outside the loop's scope"
        return None

    # -- walking ---------------------------------------------------------------------

    def _journal_watch(self, path: str) -> None:
        if self._journal is None:
            return
        from .fswatch import JournalLost

        try:
            self._journal.watch(path)
        except JournalLost as exc:
            self._drop_journal(exc.reason)

    def _drop_journal(self, reason: str) -> None:
        if self._journal is not None:
            self._journal.close()
        self._journal = None
        self._journal_reason = reason

    # The state is kept with two indexes (the files and the subdirectories of every
    # directory) so that what a journal event names is looked at alone: the work
    # after a revise step grows with what changed, not with the tree.

    def _put(self, rel: str, entry: Entry, changes: dict[str, Entry | None]) -> None:
        old = self.state.get(rel)
        if old != entry:
            changes.setdefault(rel, old)
            self.state[rel] = entry
            self.files_in.setdefault(_parent(rel), set()).add(rel)

    def _drop(self, rel: str, changes: dict[str, Entry | None]) -> None:
        old = self.state.pop(rel, None)
        if old is not None:
            changes.setdefault(rel, old)
        self.files_in.get(_parent(rel), set()).discard(rel)

    def _list(self, rel: str, changes: dict[str, Entry | None]) -> list[str]:
        """Take one directory's files as they are now; returns its subdirectories."""
        path = os.path.join(self.root, rel) if rel else self.root
        self._journal_watch(path)  # before listing: nothing changes unseen
        try:
            with os.scandir(path) as it:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            names = []
        if rel and any(n == "pyvenv.cfg" for n, _ in names):
            self._forget_dir(rel, changes, keep_venv=True)
            self._scan_venv(rel, changes)
            return []
        self.dirs.add(rel)
        if rel:
            self.subdirs_of.setdefault(_parent(rel), set()).add(rel)
        present: set[str] = set()
        subdirs = []
        for name, is_dir in names:
            child = f"{rel}/{name}" if rel else name
            if self.ignored(child) or (is_dir and self._own(child)):
                continue
            if is_dir:
                subdirs.append(child)
                continue
            entry = _entry(os.path.join(self.root, child))
            if entry is not None:
                present.add(child)
                self._put(child, entry, changes)
        for gone in self.files_in.get(rel, set()) - present:
            self._drop(gone, changes)
        for gone in self.subdirs_of.get(rel, set()) - set(subdirs):
            self._forget_dir(gone, changes)
        return subdirs

    def _scan_dir(self, rel_dir: str, changes: dict[str, Entry | None]) -> None:
        """A directory and everything below it."""
        stack = [rel_dir]
        while stack:
            self._deadline("walked the tree")
            stack.extend(self._list(stack.pop(), changes))

    def _forget_dir(self, rel_dir: str, changes: dict[str, Entry | None], *, keep_venv: bool = False) -> None:
        """A directory that is gone (or became a link): everything beneath it is gone."""
        for sub in list(self.subdirs_of.pop(rel_dir, ())):
            self._forget_dir(sub, changes)
        for rel in list(self.files_in.get(rel_dir, ())):
            self._drop(rel, changes)
        self.dirs.discard(rel_dir)
        self.subdirs_of.get(_parent(rel_dir), set()).discard(rel_dir)
        if not keep_venv and rel_dir in self.venvs:
            for top in self.venv_tops.pop(rel_dir, ()):
                for rel in list(self.files_in.get(top, ())):
                    self._drop(rel, changes)
            self.venvs.discard(rel_dir)

    def _scan_venv(self, rel: str, changes: dict[str, Entry | None]) -> None:
        """A virtual environment: its interpreter and scripts, and the top of its
        site-packages (where .pth files and shadowing packages would go)."""
        self.venvs.add(rel)
        self.subdirs_of.setdefault(_parent(rel), set()).add(rel)
        base = os.path.join(self.root, rel)
        tops = [os.path.join(base, "bin"), os.path.join(base, "Scripts")]
        tops += [str(p) for p in Path(base).glob("lib/python*/site-packages")]
        tops += [str(p) for p in Path(base).glob("Lib/site-packages")]
        known = self.venv_tops.setdefault(rel, set())
        for top in tops:
            top_rel = os.path.relpath(top, self.root).replace(os.sep, "/")
            names: list[str] = []
            if os.path.isdir(top) and not os.path.islink(top):
                self._journal_watch(top)
                try:
                    names = os.listdir(top)
                except OSError:
                    names = []
            known.add(top_rel)
            present = set()
            for name in names:
                if name == "__pycache__":
                    continue
                child = f"{top_rel}/{name}"
                entry = _entry(os.path.join(top, name))
                if entry is not None:
                    present.add(child)
                    self._put(child, entry, changes)
            for gone in self.files_in.get(top_rel, set()) - present:
                self._drop(gone, changes)

    def _walk(self) -> dict[str, Entry | None]:
        """Walk the whole tree (the journal cannot vouch); returns what changed."""
        self.walks += 1
        changes: dict[str, Entry | None] = {}
        self._scan_dir("", changes)
        return changes

    def _ancestor_state(self) -> dict[str, Entry | None]:
        return {os.path.join(d, n): _entry(os.path.join(d, n))
                for d in self._ancestor_dirs for n in ANCESTOR_NAMES}

    # -- the loop's life ---------------------------------------------------------------

    def _deadline(self, doing: str) -> None:
        if self._stop_now is not None and self._stop_now():
            raise DeadlineReached(f"while the tree guard {doing} at loop start "
                                  f"({len(self.store)} read-only file(s) copied)")

    def begin(self) -> None:
        """At loop start: record the tree, copy read-only (and audited) files to the store."""
        if self.started:
            return
        self.started = True
        self._stop_now = self.should_stop
        try:
            self._begin()
        finally:
            self._stop_now = None

    def _begin(self) -> None:
        if self.use_journal:
            from .fswatch import DirectoryJournal, JournalLost

            try:
                self._journal = DirectoryJournal(self.root)
            except JournalLost as exc:
                self._journal_reason = exc.reason
        self._walk()
        self.start = dict(self.state)
        self.start_dirs = frozenset(self.dirs)
        self._store_dir = tempfile.mkdtemp(prefix="pytest-loops-store-")
        for rel, entry in self.state.items():
            if entry.kind != "f":
                continue
            self._deadline("copied read-only files")
            reason = self.readonly_reason(rel, entry, new=False)
            if reason == CACHE_REASON:
                continue
            if reason is not None:
                self._store(rel, os.path.join(self.root, rel))
                self._readonly_inodes[entry.ino] = rel
            elif rel.endswith(".py") and entry.size <= AUDIT_MAX_BYTES:
                self._keep_text(rel)
        self.ancestors = self._ancestor_state()
        for path, found in self.ancestors.items():
            if found is not None and found.kind == "f" and self._store_dir:
                dst = os.path.join(self._store_dir, "@ancestors", path.lstrip("/"))
                stored = self._copy_in(path, dst, found)
                if stored is not None:
                    self.ancestor_store[path] = stored

    def _copy_in(self, src: str, dst: str, entry: Entry) -> Stored | None:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            digest, size = _hash_copy(src, dst, self._stop_now)
        except OSError:
            return None
        data = None
        if size <= MEMORY_FILE_BYTES and self._memory_left >= size:
            try:
                with open(dst, "rb") as f:
                    data = f.read()
            except OSError:
                data = None
            if data is not None and "sha256:" + hashlib.sha256(data).hexdigest() == digest:
                self._memory_left -= size
            else:
                data = None
        return Stored(dst, digest, size, stat.S_IMODE(entry.mode), data)

    def _store(self, rel: str, src: str) -> None:
        assert self._store_dir is not None
        entry = self.state.get(rel)
        if entry is None:
            return
        stored = self._copy_in(src, os.path.join(self._store_dir, "tree", rel), entry)
        if stored is not None:
            self.store[rel] = stored

    def _keep_text(self, rel: str) -> None:
        """An in-scope Python file's loop-start text, for the diff audit only (not judged:
        no digest, one kernel-side copy)."""
        assert self._store_dir is not None
        dst = os.path.join(self._store_dir, "text", rel)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(self.root, rel), dst, follow_symlinks=False)
        except OSError:
            return
        self.texts[rel] = dst

    def _refresh(self) -> tuple[dict[str, Entry | None], bool]:
        """Bring the state up to date: from the journal's events where it can vouch for
        them (only the directories they name are listed again), else by walking.
        Returns (path -> its entry before, for every path that changed; walked)."""
        if self._journal is None:
            walked = self._walk()
            self.touched.update(walked)
            return walked, True
        from .fswatch import JournalLost

        try:
            drained = self._journal.drain(ignore=_noise)
        except JournalLost as exc:
            self._drop_journal(exc.reason)
            walked = self._walk()
            self.touched.update(walked)
            return walked, True
        dirty = {os.path.dirname(p) for p in drained.touched} | drained.relisted
        dirty |= {os.path.dirname(p) for p in drained.gone}
        changes: dict[str, Entry | None] = {}
        for directory in sorted(dirty):
            rel_dir = os.path.relpath(directory, self.root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir
            if rel_dir == ".." or rel_dir.startswith("../"):
                continue
            if rel_dir and (self.ignored(rel_dir + "/x") or self._own(rel_dir)):
                continue
            venv = self._in_venv(rel_dir) if rel_dir else None
            if venv is not None:
                self._scan_venv(venv, changes)
                continue
            if not (os.path.isdir(directory) and not os.path.islink(directory)):
                self._forget_dir(rel_dir, changes)
                continue
            for sub in self._list(rel_dir, changes):
                if sub not in self.dirs and sub not in self.venvs:
                    self._scan_dir(sub, changes)  # a new directory: everything in it
        self.touched.update(changes)
        return changes, False

    def before_revise(self) -> None:
        """Take the tree as the checks left it: only the revise step's changes count."""
        if not self.started:
            self.begin()
            return
        self._refresh()

    def changes_since_start(self) -> list[tuple[str, str]]:
        """The in-scope files changed since the loop started (by stat; see :meth:`after_revise`)."""
        changed = []
        for rel in self.touched:
            old, new = self.start.get(rel), self.state.get(rel)
            if old != new and (new or old).kind != "d" and self._violation(rel, old, new) is None:  # type: ignore[union-attr]
                changed.append((rel, _how(old, new)))
        return sorted(changed)

    def after_revise(self) -> RevisePass:
        """Compare with the tree before the revise; undo and report every change to a
        read-only path."""
        result = RevisePass()
        changes, result.walked = self._refresh()
        violations: list[Violation] = []
        sweep = False  # a file with other names appeared: a read-only one may have changed unseen
        for rel in sorted(changes):
            old, new = changes[rel], self.state.get(rel)
            if old == new:
                continue
            how = _how(old, new)
            reason = self._violation(rel, old, new)
            if new is not None and new.nlink > 1 and new.kind == "f":
                linked = self._readonly_inodes.get(new.ino)
                if reason is None and linked is not None and linked != rel:
                    reason = f"a hard link to the read-only {printable(linked)}"
                sweep = True
            if reason is None:
                if (new or old).kind != "d":  # type: ignore[union-attr]
                    result.in_scope.append((rel, how))
                continue
            if how == "modified" and new is not None and new.kind == "f" and rel in self.store \
                    and old is not None and old.kind == "f" and _same_mode(old, new) \
                    and file_digest(os.path.join(self.root, rel)) == self.store[rel].digest:
                continue  # touched, same bytes as at loop start: harmless
            if reason == CACHE_REASON:
                if new is not None:
                    try:
                        _remove(os.path.join(self.root, rel))
                    except OSError:
                        pass
                    result.caches_cleared.append(rel)
                continue
            violations.append(Violation(rel, how, reason, restored=False))
        if sweep:
            violations += self._sweep_readonly({v.path for v in violations})
        violations += self._ancestor_violations()
        result.violations = [self._undo(v) for v in violations]
        if result.violations or result.caches_cleared:
            self._refresh()  # what undoing changed is not the revise step's
            if any(not v.restored for v in result.violations):
                self._walk()
        return result

    def _sweep_readonly(self, known: set[str]) -> list[Violation]:
        """Every read-only file compared with its loop-start bytes (a write through a hard
        link in another directory raises no event in its own)."""
        found = []
        for rel, stored in self.store.items():
            if rel in known or self._in_venv(rel):
                continue
            entry = _entry(os.path.join(self.root, rel))
            if entry is None or entry.kind != "f" or file_digest(os.path.join(self.root, rel)) != stored.digest:
                found.append(Violation(rel, "modified" if entry else "deleted",
                                       "changed through another name (a hard link)", restored=False))
        return found

    def _violation(self, rel: str, old: Entry | None, new: Entry | None) -> str | None:
        """Why this change is not the revise step's to make (None: it is)."""
        if new is not None and new.kind == "l":
            return "a symbolic link"
        if new is not None and new.kind not in ("f", "l", "d"):
            return "not a regular file"
        if new is not None and _executable(new) and (old is None or not _executable(old)):
            return "made executable"
        was_new = old is None and rel not in self.start
        return self.readonly_reason(rel, old if new is None else new, new=was_new) or (
            self.readonly_reason(rel, old, new=False) if old is not None else None)

    def ancestor_changes(self) -> list[str]:
        """Configuration files in ancestor directories changed since the loop started."""
        return [v.describe() for v in self._ancestor_violations()]

    def _ancestor_violations(self) -> list[Violation]:
        found = []
        now = self._ancestor_state()
        for path, old in self.ancestors.items():
            new = now.get(path)
            if old != new:
                found.append(Violation(path, _how(old, new), "configuration pytest reads "
                                       "from an ancestor directory", restored=False))
        return found

    # -- undoing -------------------------------------------------------------------------

    def _undo(self, v: Violation) -> Violation:
        if v.path.startswith("/"):
            ok = _restore_path(v.path, self.ancestor_store.get(v.path), None)
        else:
            ok = self._restore_rel(v.path)
        return Violation(v.path, v.how, v.why, restored=ok)

    def _restore_rel(self, rel: str) -> bool:
        stored = self.store.get(rel)
        if stored is None and rel in self.texts:  # an in-scope file replaced by a link
            try:
                with open(self.texts[rel], "rb") as f:
                    data = f.read()
            except OSError:
                data = None
            if data is not None:
                start = self.start.get(rel)
                stored = Stored(self.texts[rel], "", len(data), stat.S_IMODE(start.mode) if start else 0o644, data)
        if not _real_parents(self.root, rel, create=stored is not None):
            return False
        return _restore_path(os.path.join(self.root, rel), stored, self.start.get(rel))

    # -- the clean room -------------------------------------------------------------------

    def verify_store(self) -> list[str]:
        """Store files whose bytes no longer match their loop-start digest."""
        return sorted(rel for rel, s in self.store.items()
                      if s.data is None and file_digest(s.path) != s.digest)

    def build_clean_room(self, dest: str) -> None:
        """``dest`` as the tree was at loop start with only the in-scope changes applied:
        read-only files from the store (hard-linked where the file system allows: the
        store is not used again, and they are compared with their digests after the
        judged run), in-scope files copied from the working tree."""
        self._refresh()
        os.makedirs(dest, exist_ok=True)
        made: set[str] = set()
        for rel, entry in self.state.items():
            if entry.kind != "f" or f"{PYCACHE}/" in rel or self._in_venv(rel):
                continue
            start = self.start.get(rel)
            if start is not None and self.readonly_reason(rel, start, new=False) is not None:
                continue  # from the store, below
            if self._violation(rel, start, entry) is not None:
                continue  # never a read-only path from the working tree
            # a copy, never a link: what the judged run writes must not reach the tree
            _makedirs(os.path.dirname(os.path.join(dest, rel)), made)
            try:
                shutil.copyfile(os.path.join(self.root, rel), os.path.join(dest, rel), follow_symlinks=False)
                os.chmod(os.path.join(dest, rel), stat.S_IMODE(entry.mode))
            except OSError:
                continue
        for rel, stored in self.store.items():
            start = self.start.get(rel)
            if start is not None and not self._in_venv(rel) \
                    and self.readonly_reason(rel, start, new=False) is not None:
                if stored.data is not None:
                    _write_new(os.path.join(dest, rel), stored.data, stored.mode, made)
                else:
                    _place(stored.path, os.path.join(dest, rel), stored.mode, made)
        for venv in self.venvs:  # the interpreter a check names (.venv/bin/python), as watched
            if venv in self.start_dirs or any(r.startswith(venv + "/") for r in self.start):
                target = os.path.join(dest, venv)
                _makedirs(os.path.dirname(target), made)
                try:
                    os.symlink(os.path.join(self.root, venv), target)
                except OSError:
                    pass
        for rel, entry in self.start.items():  # links present at loop start, as they were
            if entry.kind == "l" and not self._in_venv(rel):
                target = os.path.join(dest, rel)
                _makedirs(os.path.dirname(target), made)
                try:
                    os.symlink(entry.target, target)
                except OSError:
                    pass

    def readonly_digests(self, room: str) -> list[str]:
        """Read-only files in the clean room that differ from the store (the code under
        test changed them while it was being judged)."""
        changed = []
        for rel, stored in self.store.items():
            if self._in_venv(rel) or self.readonly_reason(rel, self.start.get(rel), new=False) is None:
                continue
            if file_digest(os.path.join(room, rel)) != stored.digest:
                changed.append(rel)
        return sorted(changed)

    def start_text(self, rel: str) -> str | None:
        """A file's text at loop start (from the store), None if not kept or not text."""
        stored = self.store.get(rel)
        path = stored.path if stored is not None else self.texts.get(rel)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None

    @property
    def journal_reason(self) -> str | None:
        """Why the change journal is not used (None: it is)."""
        return self._journal_reason if self._journal is None else None

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None

    def __enter__(self) -> TreeGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parent(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def _makedirs(path: str, made: set[str]) -> None:
    if path not in made:
        os.makedirs(path, exist_ok=True)
        made.add(path)


def _place(src: str, dst: str, mode: int, made: set[str]) -> None:
    """A file at ``dst`` with the bytes of ``src``: a hard link, else a copy."""
    _makedirs(os.path.dirname(dst), made)
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError:
        pass
    _copy_file(src, dst, mode)


def _write_new(dst: str, data: bytes, mode: int, made: set[str]) -> None:
    _makedirs(os.path.dirname(dst), made)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, data)
        os.fchmod(fd, stat.S_IMODE(mode))
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _noise(path: str, name: str) -> bool:
    """Journal events never worth a look: caches and bytecode."""
    return name in IGNORED_DIRS


def _same_mode(a: Entry, b: Entry) -> bool:
    return stat.S_IMODE(a.mode) == stat.S_IMODE(b.mode)


def _how(old: Entry | None, new: Entry | None) -> str:
    if old is None:
        return "added"
    if new is None:
        return "deleted"
    if new.kind == "l" and old.kind != "l":
        return "replaced by a link"
    if old.kind == "l" and new.kind == "l":
        return "link retargeted"
    return "modified"


def _ancestor_dirs(root: str, extra: Sequence[str]) -> list[str]:
    dirs: list[str] = []
    for start in [os.path.dirname(root), *[os.path.realpath(e) for e in extra]]:
        path = start
        while True:
            if path not in dirs and path != root:
                dirs.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return dirs


def _real_parents(root: str, rel: str, *, create: bool) -> bool:
    """Make every directory between root and rel a real directory (a link put in
    their place is removed, never followed). False if that cannot be done."""
    path = root
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return True
            try:
                os.mkdir(path, 0o755)
            except OSError:
                return False
            continue
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode):
            continue
        try:
            os.unlink(path)  # a link or a file where a directory was: remove it, do not follow
            if create:
                os.mkdir(path, 0o755)
        except OSError:
            return False
    return True


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _restore_path(path: str, stored: Stored | None, entry: Entry | None) -> bool:
    """Put a file back as the store has it (or remove it when it did not exist):
    written beside it and renamed over it, so a link in its place is replaced."""
    try:
        if stored is None:
            if entry is not None and entry.kind == "l":
                _remove(path)
                os.symlink(entry.target, path)
                return True
            if entry is not None:
                if entry.kind == "f":
                    _remove(path)  # no copy was kept: at least no link or stranger stays
                return False  # existed, but no copy was kept (a venv's package directory)
            _remove(path)
            return True
        tmp = f"{path}.pytest-loops-restore-{os.getpid()}"
        _remove(tmp)
        if stored.data is not None:
            _write_new(tmp, stored.data, stored.mode, set())
        else:
            _copy_file(stored.path, tmp, stored.mode)
            if file_digest(tmp) != stored.digest:  # the store was rewritten behind us
                _remove(tmp)
                return False
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
        except FileNotFoundError:
            pass
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def _copy_file(src: str, dst: str, mode: int) -> None:
    """A new file at ``dst`` (never through a link) with the bytes and mode of ``src``."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    _remove(dst)
    _hash_copy(src, dst)
    os.chmod(dst, stat.S_IMODE(mode))

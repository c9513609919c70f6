"""Protected paths and the scope jail: a revise step must not game its checks.

Protected files (the tests the checks name, every ``conftest.py``, pytest's
configuration files, and ``protect:`` globs) are snapshotted before the first
revise. A revise that modifies, deletes or adds one is undone from the snapshot
(git is not needed) and the loop ends ESCALATE. With ``scope:`` globs, edits
outside the scope are reverted after each revise and recorded; the loop goes on.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .spec import CheckKind, LoopSpec

DEFAULT_PROTECTED = (
    "**/conftest.py",
    "**/pytest.ini",
    "**/tox.ini",
    "**/setup.cfg",
    "**/pyproject.toml",
)
# Directories never walked: caches, virtualenvs, VCS data, our own artifacts.
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".pytest-loops", ".hypothesis",
    ".mypy_cache", ".ruff_cache", ".tox", ".nox", ".venv", "venv", "node_modules",
})
MAX_SNAPSHOT_FILE_BYTES = 16 * 1024 * 1024


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
        bare = pattern.rstrip("/")
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


# pytest's default test file names: what a bare `pytest` command runs.
DEFAULT_TEST_FILES = ("**/test_*.py", "**/*_test.py")


def named_test_files(spec: LoopSpec) -> list[str]:
    """Test files the loop's checks name: node ids' files and `.py` paths in pytest
    commands; a pytest command that names no file runs every test file, so all of
    pytest's default test file names are protected then."""
    files: list[str] = []
    for check in spec.checks:
        if check.kind is CheckKind.PYTEST and check.node_id:
            files.append(check.node_id.split("::", 1)[0])
        elif check.command and "pytest" in check.command:
            try:
                words = shlex.split(check.command)
            except ValueError:
                files.extend(DEFAULT_TEST_FILES)
                continue
            after = words[next(i for i, w in enumerate(words) if "pytest" in w) + 1:]
            named = [w.split("::", 1)[0] for w in after if not w.startswith("-")]
            paths = [p for p in named if p.endswith(".py")]
            dirs = [p.rstrip("/") + "/**/*.py" for p in named
                    if not p.endswith(".py") and (Path(spec.cwd) / p).is_dir()]
            files.extend(paths + dirs or DEFAULT_TEST_FILES)
    return list(dict.fromkeys(files))


@dataclass
class Snapshot:
    """The bytes of the files matching ``include`` (and not ``exclude``) under ``root``."""

    root: Path
    include: Sequence[str]
    exclude: Sequence[str] = ()
    invert: bool = False  # True: snapshot everything NOT matching include (scope jail)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.files: dict[str, bytes | None] = {}

    def _selected(self, relpath: str) -> bool:
        if self.exclude and matches(relpath, self.exclude):
            return False
        hit = matches(relpath, self.include)
        return not hit if self.invert else hit

    def _current(self) -> dict[str, Path]:
        return {rel: self.root / rel for rel in walk(self.root) if self._selected(rel)}

    def take(self) -> None:
        self.files = {}
        for rel, path in self._current().items():
            try:
                size = path.stat().st_size
                self.files[rel] = path.read_bytes() if size <= MAX_SNAPSHOT_FILE_BYTES else None
            except OSError:
                self.files[rel] = None

    def changes(self) -> list[tuple[str, str]]:
        """(path, "modified" | "deleted" | "added") since :meth:`take`, sorted."""
        now = self._current()
        found: list[tuple[str, str]] = []
        for rel, data in self.files.items():
            path = self.root / rel
            if rel not in now:
                found.append((rel, "deleted"))
            elif data is not None:
                try:
                    if path.read_bytes() != data:
                        found.append((rel, "modified"))
                except OSError:
                    found.append((rel, "modified"))
        found += [(rel, "added") for rel in now if rel not in self.files]
        return sorted(found)

    def restore(self, changes: Sequence[tuple[str, str]]) -> list[str]:
        """Undo the given changes; returns what could not be undone."""
        failed: list[str] = []
        for rel, how in changes:
            path = self.root / rel
            try:
                if how == "added":
                    path.unlink()
                else:
                    data = self.files.get(rel)
                    if data is None:
                        failed.append(rel)
                        continue
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
            except OSError:
                failed.append(rel)
        return failed


def describe(changes: Sequence[tuple[str, str]], limit: int = 8) -> str:
    text = ", ".join(f"{rel} ({how})" for rel, how in changes[:limit])
    return text + (f" and {len(changes) - limit} more" if len(changes) > limit else "")


class ReviseWatch:
    """Snapshots around the revise step of one loop (protected paths and scope)."""

    def __init__(self, spec: LoopSpec, workdir: Path, *, defaults: bool = True,
                 exclude: Sequence[str] = ()) -> None:
        patterns = list(spec.protect) + named_test_files(spec)
        if defaults:
            patterns += DEFAULT_PROTECTED
        self.protected = Snapshot(workdir, patterns, exclude) if patterns else None
        self.scope = Snapshot(workdir, list(spec.scope), exclude, invert=True) if spec.scope else None
        self._protected_taken = False

    def before_revise(self) -> None:
        if self.protected is not None and not self._protected_taken:
            self.protected.take()  # once, before the first revise
            self._protected_taken = True
        if self.scope is not None:
            self.scope.take()  # checks may write files; only the revise's edits count

    def after_revise(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Undo violations. Returns (protected changes, out-of-scope changes), both undone."""
        protected: list[tuple[str, str]] = []
        if self.protected is not None:
            protected = self.protected.changes()
            self.protected.restore(protected)
        outside: list[tuple[str, str]] = []
        if self.scope is not None:
            outside = [c for c in self.scope.changes() if c[0] not in {p for p, _ in protected}]
            self.scope.restore(outside)
        return protected, outside

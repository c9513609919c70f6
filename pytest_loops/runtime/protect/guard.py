"""The guard around every revise: the store, the change journal, undoing changes to read-only paths."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.runtime.protect import room
from pytest_loops.runtime.protect.ancestry import Ancestry
from pytest_loops.runtime.protect.drift import AuditedTree, clear_new_bytecode
from pytest_loops.runtime.protect.gitpaths import GitPaths
from pytest_loops.runtime.protect.homeconfig import HomeConfigGuard
from pytest_loops.runtime.protect.interpreter import InterpreterGuard
from pytest_loops.runtime.protect.reasons import readonly_reason
from pytest_loops.runtime.protect.rules import (
    AUDIT_MAX_BYTES,
    CACHE_REASON,
    DEFAULT_TEST_FILES,
    IGNORED_DIRS,
    MEMORY_TOTAL_BYTES,
    SHADOW_MODULES,
    TEST_DIR,
    matches,
)
from pytest_loops.runtime.protect.store import TextStore, kept_bytes, kept_digest, store_prefix, sweep_stale_stores
from pytest_loops.runtime.protect.syspath import (
    AnyOf,
    OutsideModules,
    PathMetadataGuard,
    judged_dirs,
    tree_modules,
)
from pytest_loops.runtime.protect.tree import (
    Entry,
    RevisePass,
    Stored,
    Violation,
    _entry,
    _executable,
    _how,
    _noise,
    _parent,
    _real_parents,
    _remove,
    _restore_path,
    _same_mode,
    clear_bytecode_of,
    copy_in,
    file_digest,
    printable,
    sweep_readonly,
)

if TYPE_CHECKING:
    from pytest_loops.progress.journal import DirectoryJournal


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
                 interpreter: bool = True, should_stop: ShouldStop | None = None) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.scope = tuple(scope)
        self.protect = tuple(protect)
        self.own = tuple(p.strip("/") for p in own if p and p.strip("/"))
        self.test_files = tuple(DEFAULT_TEST_FILES) + tuple(test_files)
        self.readonly_files = frozenset(readonly_files)
        self.start_dirs: frozenset[str] = frozenset()
        self.use_journal = journal
        self.use_interpreter = interpreter
        self.interpreter: InterpreterGuard | None = None
        self.home: HomeConfigGuard | None = None
        self.state: dict[str, Entry] = {}  # rel -> entry, as last seen
        self.start: dict[str, Entry] = {}  # rel -> entry at loop start
        self.store: dict[str, Stored] = {}
        self.venvs: set[str] = set()
        self.start_venvs: frozenset[str] | None = None  # the venvs at loop start (None: still walking it)
        self.shadows: Container[str] = SHADOW_MODULES  # top-level names a new module may not take
        self.metadata: PathMetadataGuard | None = None  # distribution metadata on the judged sys.path
        # configuration in ancestor directories; .git/config, hooks, attributes watched alike
        self.ancestry = Ancestry(self.root, extra_ancestors, journal=journal)
        self.git = self.ancestry.git
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
        self.texts: TextStore | None = None  # in-scope Python files' loop-start texts (audit)
        self.observed: dict[str, str] = {}  # rel -> reason: what the first verify's tests read
        self._ancestors_of_tests: frozenset[str] | None = None
        # the tree as the diff audit saw it after the last revise step (see mark())
        self.audited: AuditedTree | None = None
        self.since_mark: set[str] = set()  # paths whose entry changed since then
        self.began_ns = 0  # when begin() ran (bytecode changed since is not trusted)

    def observe(self, observed: dict[str, str]) -> None:
        """Files the tests were seen reading before any revise step: read-only for the
        loop (taken before the guard starts; later, the start is already recorded)."""
        if self.started:
            return
        self.observed.update(observed)
        self._reasons.clear()

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
        return self._own(rel) or (self.metadata is not None and self.metadata.owns(rel))

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
        return readonly_reason(self, rel, entry, new=new)

    def _test_ancestors(self) -> frozenset[str]:
        """The directories (``""``: the root) that hold tests at loop start, at any depth."""
        if self._ancestors_of_tests is None:
            found: set[str] = set()
            for rel, entry in self.start.items():
                if entry.kind != "f" or not rel.endswith(".py"):
                    continue
                parts = rel.split("/")
                if not (matches(rel, self.test_files) or any(TEST_DIR.match(p) for p in parts[:-1])):
                    continue
                found.update("/".join(parts[:i]) for i in range(len(parts)))
            self._ancestors_of_tests = frozenset(found)
        return self._ancestors_of_tests

    # -- walking ---------------------------------------------------------------------

    def _journal_watch(self, path: str) -> None:
        if self._journal is None:
            return
        from pytest_loops.progress.journal import JournalLost

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
                entries = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it]
        except OSError:
            entries = []
        names = [(name, is_dir) for name, is_dir, _ in entries]
        # a venv made later is not one; nor is a directory whose pyvenv.cfg is not a regular file
        if rel and (rel in self.start_venvs if self.start_venvs is not None
                    else any(n == "pyvenv.cfg" and regular for n, _, regular in entries)):
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
        for top in [base, *tops]:  # its own directory: only the pyvenv.cfg that makes it one
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
                if name == "__pycache__" or (top == base and name != "pyvenv.cfg"):
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
        self.began_ns = time.time_ns()
        self._stop_now = self.should_stop
        try:
            self._begin()
        finally:
            self._stop_now = None

    def _begin(self) -> None:
        if self.use_journal:
            from pytest_loops.progress.journal import DirectoryJournal, JournalLost

            try:
                self._journal = DirectoryJournal(self.root)
            except JournalLost as exc:
                self._journal_reason = exc.reason
        self.metadata = PathMetadataGuard(self.root, judged_dirs(self.root))
        self.metadata.begin()
        self._walk()
        self.start = dict(self.state)
        self.start_dirs = frozenset(self.dirs)
        self.start_venvs = frozenset(self.venvs)
        self.shadows = AnyOf(OutsideModules(self.root, fixed=SHADOW_MODULES, extra=[
            str(p) for v in self.venvs for p in Path(self.root, v).glob("lib/python*/site-packages")]),
            tree_modules(self.metadata.dirs, self.root))
        sweep_stale_stores()
        self._store_dir = tempfile.mkdtemp(prefix=store_prefix())
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
        if self.texts is not None:
            self.texts.flush()
        if self.use_interpreter:
            self.interpreter = InterpreterGuard(self._inside, self._stop_now)
            self.interpreter.begin(journal=self.use_journal)
            self.home = HomeConfigGuard(self._inside)
            self.home.begin()
        self.ancestry.watch()
        self.ancestry.start = self.ancestry.state()
        for path, found in self.ancestry.start.items():
            if found is not None and found.kind == "f" and self._store_dir:
                dst = os.path.join(self._store_dir, "@ancestors", path.lstrip("/"))
                stored = self._copy_in(path, dst, found)
                if stored is not None:
                    self.ancestry.store[path] = stored

    def _copy_in(self, src: str, dst: str, entry: Entry) -> Stored | None:
        stored = copy_in(src, dst, entry, self._memory_left, self._stop_now)
        if stored is not None and stored.data is not None:
            self._memory_left -= stored.size
        return stored

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
        no digest, no file of its own)."""
        assert self._store_dir is not None
        if self.texts is None:
            self.texts = TextStore(os.path.join(self._store_dir, "texts"))
        self.texts.add(rel, os.path.join(self.root, rel), AUDIT_MAX_BYTES)

    def _refresh(self) -> tuple[dict[str, Entry | None], bool]:
        """Bring the state up to date: from the journal's events where it can vouch for
        them (only the directories they name are listed again), else by walking.
        Returns (path -> its entry before, for every path that changed; walked)."""
        if self._journal is None:
            walked = self._walk()
            self.touched.update(walked)
            self.since_mark.update(walked)
            return walked, True
        from pytest_loops.progress.journal import JournalLost

        try:
            drained = self._journal.drain(ignore=_noise)
        except JournalLost as exc:
            self._drop_journal(exc.reason)
            walked = self._walk()
            self.touched.update(walked)
            self.since_mark.update(walked)
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
        self.since_mark.update(changes)
        return changes, False

    def before_revise(self) -> list[Violation]:
        """Take the tree as the checks left it: only the revise step's changes count; a
        read-only file a check changed (code under test rewriting its test) is put back
        first, and returned."""
        if not self.started:
            self.begin()
            return []
        changes = self._refresh()[0]
        violations: list[Violation] = []
        for rel in sorted(changes):
            old, new = changes[rel], self.state.get(rel)
            if old == new or self._in_venv(rel):
                continue
            if rel in self.store and new is not None and new.kind == "f" \
                    and file_digest(os.path.join(self.root, rel)) == self.store[rel].digest:
                continue  # touched, the loop-start bytes
            reason = self._violation(rel, old, new)
            if reason is None or reason == CACHE_REASON:
                continue
            # a new conftest.py, .pth, test file or symbolic link, a deleted test: whatever
            # the code under test left that the revise step could not have made
            why = "changed by a check" if old is not None and new is not None and old.kind == new.kind \
                else f"{reason}: made by a check"
            violations.append(Violation(rel, _how(old, new), why, restored=False))
        violations += [Violation(v.path, v.how, f"{v.why}: changed by a check", restored=False)
                       for v in self.ancestry.violations()]
        found = [self._undo(v) for v in violations]
        if found:
            self._refresh()  # what undoing changed is nobody's change
            if any(not v.restored for v in found):
                self._walk()
        return found

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
        result.caches_cleared += clear_bytecode_of(self.root, [rel for rel, _ in result.in_scope])
        if sweep:
            violations += sweep_readonly(self.root, self.store, self._in_venv, {v.path for v in violations})
        violations += self.ancestry.violations()
        result.violations = [self._undo(v) for v in violations]
        if self.metadata is not None:
            result.violations += self.metadata.check()
        if self.interpreter is not None:
            outside, cleared = self.interpreter.check()
            result.violations += outside
            result.caches_cleared += cleared
        if self.home is not None:
            result.violations += self.home.check()
        if result.violations or result.caches_cleared:
            self._refresh()  # what undoing changed is not the revise step's
            if any(not v.restored for v in result.violations):
                self._walk()
        return result

    def mark(self) -> None:
        """After a revise step and its audit: the tree as audited
        (:mod:`~pytest_loops.runtime.protect.drift`)."""
        self.audited = AuditedTree(self)
        self.since_mark = set()

    def drift(self) -> list[tuple[str, str]]:
        """In-scope sources (what the judge imports or loads: modules, extensions, .pth
        files) whose bytes are no longer what the diff audit saw at :meth:`mark`, or
        that are new or gone since: (path, how), sorted. Other files the checks write
        (data, logs, outputs) are the checks' to write. Call it right after
        :meth:`before_revise`, which brings the state up to date (a look of its own
        would take the changes that one must see)."""
        return [] if self.audited is None else self.audited.drift(self)

    def undo_drift(self, drifted: list[tuple[str, str]]) -> list[str]:
        """The audited bytes back for ``drifted``; the paths that could not be put back."""
        if self.audited is None or not drifted:
            return []
        failed = self.audited.restore(self, drifted)
        self._refresh()  # what undoing changed is nobody's change
        return failed

    def clear_new_bytecode(self) -> list[str]:
        """Remove bytecode beside the tree's sources written since the loop started."""
        sources = [rel for rel, e in self.state.items()
                   if e.kind == "f" and rel.endswith(".py") and not self._in_venv(rel)]
        return clear_new_bytecode(self.root, sources, self.began_ns)

    def start_digest(self, rel: str, entry: Entry) -> str | None:
        """A file's loop-start digest, when it is as it was at the start (by its entry)."""
        return kept_digest(self.store.get(rel), self.texts, rel) if self.start.get(rel) == entry else None

    def start_bytes(self, rel: str, entry: Entry) -> bytes | None:
        """A file's loop-start bytes, when it is as it was at the start (by its entry)."""
        return kept_bytes(self.store.get(rel), self.texts, rel) if self.start.get(rel) == entry else None

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
        """What outside the tree changed since the loop started: configuration files in
        ancestor directories, the judging interpreter's start-up files and test runner,
        and distribution metadata in the tree's directories on its path (undone too)."""
        found = [v.describe() for v in self.ancestry.violations()]
        if self.metadata is not None:
            found += [v.describe() for v in self.metadata.check()]
        if self.interpreter is not None:  # file by file: what the journal missed is found here
            found += [v.describe() for v in self.interpreter.check(full=True)[0]]
        if self.home is not None:
            found += [v.describe() for v in self.home.check()]
        return found

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    # -- undoing -------------------------------------------------------------------------

    def _undo(self, v: Violation) -> Violation:
        if v.path.startswith("/"):
            ok = GitPaths.restore(v.path, self.ancestry.store.get(v.path), self.ancestry.start.get(v.path))
        else:
            ok = self._restore_rel(v.path)
        return Violation(v.path, v.how, v.why, restored=ok)

    def _restore_rel(self, rel: str) -> bool:
        stored = self.store.get(rel)
        data = self.texts.read(rel) if stored is None and self.texts is not None else None
        if data is not None:  # an in-scope file replaced by a link
            start = self.start.get(rel)
            stored = Stored("", "", len(data), stat.S_IMODE(start.mode) if start else 0o644, data)
        if not _real_parents(self.root, rel, create=stored is not None):
            return False
        return _restore_path(os.path.join(self.root, rel), stored, self.start.get(rel))

    # -- the clean room -------------------------------------------------------------------

    def verify_store(self) -> list[str]:
        """Store files whose bytes no longer match their loop-start digest."""
        return sorted(rel for rel, s in self.store.items()
                      if s.data is None and file_digest(s.path) != s.digest)

    def build_clean_room(self, dest: str, *, link_venvs: bool = True) -> None:
        """``dest`` as the tree was at loop start with only the in-scope changes applied
        (:func:`~pytest_loops.runtime.protect.room.build_clean_room`)."""
        self._refresh()
        room.build_clean_room(self, dest, link_venvs=link_venvs)

    def readonly_digests(self, room_root: str) -> list[str]:
        """Read-only files in the clean room that differ from the store (the code under
        test changed them while it was being judged)."""
        return room.readonly_digests(self, room_root)

    def start_text(self, rel: str) -> str | None:
        """A file's text at loop start (from the store), None if not kept or not text."""
        data = self.loop_start_bytes(rel)
        return None if data is None else data.decode("utf-8", "replace")

    def loop_start_bytes(self, rel: str) -> bytes | None:
        """A file's bytes at loop start (from the store), None if not kept."""
        return kept_bytes(self.store.get(rel), self.texts, rel)

    @property
    def journal_reason(self) -> str | None:
        """Why the change journal is not used (None: it is)."""
        return self._journal_reason if self._journal is None else None

    def close(self) -> None:
        self._drop_journal("the guard is closed")
        self.ancestry.close()
        if self.interpreter is not None:
            self.interpreter.close()
        if self.texts is not None:
            self.texts.close()
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None

    def __enter__(self) -> TreeGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



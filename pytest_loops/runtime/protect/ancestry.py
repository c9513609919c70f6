"""Configuration outside the tree that a judged run reads: the ancestor directories'
pytest configuration files (``conftest.py``, ``pytest.ini``, ...) and git's own paths
(:class:`~pytest_loops.runtime.protect.gitpaths.GitPaths`), recorded at loop start and
compared on every look. The ancestor directories get a change journal of their own:
while it reports no event naming a configuration file, those files are not stat-ed
again (git's paths always are)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_loops.deadline import DeadlineReached
from pytest_loops.runtime.protect.gitpaths import GIT_REASON, GitPaths
from pytest_loops.runtime.protect.rules import ANCESTOR_NAMES
from pytest_loops.runtime.protect.tree import Entry, Stored, Violation, _ancestor_dirs, _entry, _how

if TYPE_CHECKING:
    from pytest_loops.progress.journal import DirectoryJournal


class Ancestry:
    """The configuration around one tree; see the module docstring."""

    def __init__(self, root: str, extra: Sequence[str] = (), *, journal: bool = True) -> None:
        self.dirs = _ancestor_dirs(root, extra)
        self.git = GitPaths(root)
        self.use_journal = journal
        self.start: dict[str, Entry | None] = {}  # path -> entry at loop start
        self.store: dict[str, Stored] = {}  # path -> its loop-start copy (files only)
        self.journal: DirectoryJournal | None = None

    def state(self, names_quiet: bool = False) -> dict[str, Entry | None]:
        """The ancestors' configuration files and git's paths now; ``names_quiet``: the
        ancestors' journal saw no event about a configuration file since the last look,
        so those are as recorded at loop start (git's paths are stat-ed all the same)."""
        if names_quiet:
            names = {os.path.join(d, n): self.start.get(os.path.join(d, n)) for d in self.dirs
                     for n in ANCESTOR_NAMES}
        else:
            names = {os.path.join(d, n): _entry(os.path.join(d, n)) for d in self.dirs for n in ANCESTOR_NAMES}
        return {**names, **self.git.state()}

    def watch(self) -> None:
        """Watch the ancestor directories (before their files are first read): every one,
        or none, when one cannot be (a link, a network file system, inotify's limits)."""
        if not self.use_journal or not self.dirs:
            return
        from pytest_loops.progress.journal import DirectoryJournal, JournalLost

        try:
            journal = DirectoryJournal(self.dirs[0])
        except JournalLost:
            return
        try:
            if all(journal.watch(d) for d in self.dirs[1:]) and not any(os.path.islink(d) for d in self.dirs):
                self.journal = journal
                return
        except JournalLost:
            pass
        journal.close()

    def quiet(self) -> bool:
        """True when the ancestors' journal vouches that no configuration file in an
        ancestor directory was created, changed, moved or removed since the last look."""
        journal = self.journal
        if journal is None:
            return False
        from pytest_loops.progress.journal import JournalLost

        try:
            changes = journal.drain(lambda _path, name: name not in ANCESTOR_NAMES)
        except (JournalLost, DeadlineReached):
            self.journal = None
            journal.close()
            return False
        return not (changes.touched or changes.relisted or changes.gone)

    def violations(self) -> list[Violation]:
        """Every path changed since loop start (not undone here)."""
        found = []
        now = self.state(names_quiet=self.quiet())
        for path in sorted(self.start.keys() | now.keys()):  # a directory before its files
            old, new, git = self.start.get(path), now.get(path), self.git.owns(path)
            if old == new or git and self.git.same_bytes(path, old, new, self.store.get(path)):
                continue
            found.append(Violation(path, _how(old, new), GIT_REASON if git else "configuration pytest reads "
                                   "from an ancestor directory", restored=False))
        if found and self.journal is not None:
            # a change that stays must be found on every later look: stat them from now on
            self.journal.close()
            self.journal = None
        return found

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None

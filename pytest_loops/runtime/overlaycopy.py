"""A fan-out candidate's tree as an overlay: the working tree is the lower layer, the
candidate's writes land in an upper directory of its own.

Where bubblewrap can mount an overlay with a persistent upper layer (the namespaces
tier), a candidate needs no copy of the tree: its revise step and its checks see the
working tree at the project's own path with everything they write kept in
``upper/``, which *is* the candidate's change set. Making one costs two ``mkdir``
calls whatever the tree's size. :meth:`OverlayCopy.changes` reads the upper layer:
a regular file or link is a change when its content differs from the tree's, a
whiteout (a character device 0/0) a deletion, an opaque directory hides every file
of the tree below it. The same interface as :class:`~pytest_loops.runtime.treecopy.TreeCopy`,
so fan-out ranks, applies and removes either alike.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable

from pytest_loops.runtime.protect.tree import Entry, _entry
from pytest_loops.runtime.treecopy import Change, TreeCopy, _ignored_default, _live, _live_lock, _same_content

_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")


class OverlayCopy(TreeCopy):
    """One candidate's upper layer over ``source``, kept under ``parent/name``."""

    kind = "overlay"

    def __init__(self, source: str | os.PathLike[str], parent: str | os.PathLike[str], name: str, *,
                 ignored: Callable[[str], bool] = _ignored_default) -> None:
        self.source = os.path.realpath(os.fspath(source))
        self.path = os.path.join(os.fspath(parent), name)
        self.upper = os.path.join(self.path, "upper")
        self.work = os.path.join(self.path, "work")  # overlayfs's own scratch directory
        self.root = self.upper  # where the candidate's files are, by their tree-relative paths
        self.view = self.source  # where its commands see its tree
        self.ignored = ignored
        self.top = None
        self.base: dict[str, Entry] = {}  # nothing is in the upper layer at the start
        self.removed = False
        self.venv_mounts = False
        self._venvs: list[str] = []

    @property
    def layer(self) -> tuple[str, str]:
        return self.upper, self.work

    def create(self) -> OverlayCopy:
        with _live_lock:
            _live.add(self)
        os.makedirs(self.upper)
        os.makedirs(self.work)
        return self

    def changes(self) -> list[Change]:
        """What the candidate changed, compared by content with the working tree."""
        found: dict[str, Change] = {}
        for top, dirs, files in os.walk(self.upper):
            rel_dir = os.path.relpath(top, self.upper)
            rel_dir = "" if rel_dir == "." else rel_dir
            if rel_dir and self.ignored(rel_dir):
                dirs[:] = []
                continue
            if rel_dir and _opaque(top):  # the tree's directory was replaced: its files are gone
                self._gone_below(rel_dir, found)
            for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
                rel = os.path.join(rel_dir, name)
                if self.ignored(rel):
                    continue
                self._change(rel, found)
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        return sorted(found.values(), key=lambda c: c.rel)

    def _change(self, rel: str, found: dict[str, Change]) -> None:
        mine = os.path.join(self.upper, rel)
        theirs = os.path.join(self.source, rel)
        try:
            st = os.lstat(mine)
        except OSError:
            return
        old = _entry(theirs)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: deleted
            if old is not None and old.kind == "d":
                self._gone_below(rel, found)
            elif old is not None:
                found[rel] = Change(rel, "deleted", None)
            return
        entry = _entry(mine)
        if entry is None or entry.kind not in ("f", "l"):
            return
        if old is None or old.kind == "d":
            found[rel] = Change(rel, "added", entry)
        elif not _same_content(mine, theirs, entry, old):
            found[rel] = Change(rel, "modified", entry)

    def _gone_below(self, rel_dir: str, found: dict[str, Change]) -> None:
        """Every file of the tree under ``rel_dir`` that the upper layer does not hold."""
        for top, dirs, files in os.walk(os.path.join(self.source, rel_dir)):
            sub = os.path.relpath(top, self.source)
            dirs[:] = [d for d in dirs if not self.ignored(os.path.join(sub, d))]
            for name in files:
                rel = os.path.join(sub, name)
                if not self.ignored(rel) and not os.path.lexists(os.path.join(self.upper, rel)):
                    found[rel] = Change(rel, "deleted", None)

    def remove(self) -> None:
        """Delete the layer (overlayfs leaves its work directory unreadable: made readable first)."""
        if self.removed:
            return
        self.removed = True
        for directory in (self.work, os.path.join(self.work, "work"), os.path.join(self.work, "index")):
            try:
                os.chmod(directory, 0o700)
            except OSError:
                pass
        shutil.rmtree(self.path, ignore_errors=True)
        with _live_lock:
            _live.discard(self)


def _opaque(path: str) -> bool:
    for name in _OPAQUE:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False

"""The git files that name programs git runs, and the branch: read-only for the revise step.

The tree guard never walks ``.git`` (object stores are big and change under git's
own hands). What it must watch there is small: the repository's ``config`` (and
``config.worktree``), ``hooks/`` and its files, ``info/attributes``, the ``.git``
file of a linked worktree and the ``commondir`` file it leads to, and the
``.gitattributes`` files between the loop's directory and the top of the work tree
(those inside the tree are read-only by name, :data:`GIT_ATTRIBUTES`). The ``.git``
of every directory from the loop's directory up to the top (up to ``/`` outside a
repository) is watched too: a new one would change which repository git finds.
And the branch: ``HEAD``, ``packed-refs``, ``info/grafts``, ``shallow`` and the files
under ``refs/`` but ``refs/remotes`` (up to :data:`MAX_BRANCHES`; ``refs/replace`` too, which
makes checkout write other bytes for a file): a commit made behind the loop's back (a weakened test committed
through git's plumbing, the working tree left strong) would be what CI checks out, while
the loop judged the working tree. The index is not watched: other tools refresh it.

:class:`GitPaths` finds them once, without running git (a ``.git`` file's
``gitdir:`` line is followed, and a linked worktree's ``commondir``), and reports
their ``lstat`` entries on demand: a dozen ``lstat`` calls and one listing of
``hooks/`` per revise step. The guard compares them with the loop-start entries
(and bytes), as it does the ancestor directories' pytest configuration, and puts
them back.
"""

from __future__ import annotations

import os
import stat

from pytest_loops.runtime.protect.tree import Entry, Stored, _entry, _remove, _restore_path, file_digest

GIT_ATTRIBUTES = ".gitattributes"
GIT_REASON = "git configuration, hooks, attributes and branches: programs git runs, and what is committed"
MAX_BRANCHES = 2000  # files under refs/heads looked at per revise step
_GITDIR_BYTES = 4096


def _gitdir_of(dotgit: str) -> str | None:
    """The git directory a ``.git`` entry stands for: itself, or the one its
    ``gitdir:`` line names (relative to the file's directory)."""
    if os.path.isdir(dotgit) and not os.path.islink(dotgit):
        return dotgit
    try:
        with open(dotgit, "rb") as f:
            line = f.read(_GITDIR_BYTES).decode("utf-8", "surrogateescape").splitlines()
    except OSError:
        return None
    if not line or not line[0].startswith("gitdir:"):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(dotgit), line[0][len("gitdir:"):].strip()))


def _common_of(gitdir: str) -> str:
    try:
        with open(os.path.join(gitdir, "commondir"), "rb") as f:
            named = f.read(_GITDIR_BYTES).decode("utf-8", "surrogateescape").strip()
    except OSError:
        return gitdir
    return os.path.normpath(os.path.join(gitdir, named)) if named else gitdir


class GitPaths:
    """The git paths of the repository holding ``root`` (a real path); see the module
    docstring."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.gitdir: str | None = None
        self.common: str | None = None
        fixed: list[str] = []
        directory = root
        while True:
            dotgit = os.path.join(directory, ".git")
            fixed.append(dotgit)
            if directory != root:
                fixed.append(os.path.join(directory, GIT_ATTRIBUTES))
            if os.path.lexists(dotgit):
                self.gitdir = _gitdir_of(dotgit)
                break
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        if self.gitdir is not None:
            self.common = _common_of(self.gitdir)
            fixed += [os.path.join(self.common, name) for name in ("config", "config.worktree", "info",
                                                                   os.path.join("info", "attributes"), "hooks")]
            fixed += [os.path.join(self.gitdir, "HEAD"), os.path.join(self.common, "packed-refs"),
                      os.path.join(self.common, "info", "grafts"), os.path.join(self.common, "shallow")]
            if self.gitdir != self.common:
                fixed += [os.path.join(self.gitdir, name) for name in ("commondir", "config.worktree")]
        self.hooks = os.path.join(self.common, "hooks") if self.common else None
        # every ref but the remote-tracking ones (fetches move those): branches, tags and
        # replacements (`git replace` makes checkout write other bytes for a file)
        self.heads = os.path.join(self.common, "refs") if self.common else None
        self.fixed = list(dict.fromkeys(fixed))
        self._known = frozenset(self.fixed)

    def owns(self, path: str) -> bool:
        """Whether ``path`` is one of the git paths (a hook file included)."""
        return path in self._known or (self.hooks is not None and os.path.dirname(path) == self.hooks) or (
            self.heads is not None and path.startswith(self.heads + os.sep)
            and not path.startswith(os.path.join(self.heads, "remotes") + os.sep))

    def state(self) -> dict[str, Entry | None]:
        """Each git path's entry now (None: absent), every file in ``hooks/`` included."""
        found = {path: _entry(path) for path in self.fixed}
        hooks = found.get(self.hooks) if self.hooks else None
        if self.hooks is not None and hooks is not None and hooks.kind == "d":
            try:
                names = os.listdir(self.hooks)
            except OSError:
                names = []
            for name in names:
                path = os.path.join(self.hooks, name)
                found[path] = _entry(path)
        if self.heads is not None:
            count = 0
            for dirpath, dirnames, filenames in os.walk(self.heads):
                dirnames[:] = sorted(d for d in dirnames if not (dirpath == self.heads and d == "remotes"))
                for name in sorted(filenames):
                    if count >= MAX_BRANCHES:
                        return found
                    path = os.path.join(dirpath, name)
                    found[path] = _entry(path)
                    count += 1
        return found

    @staticmethod
    def same_bytes(path: str, old: Entry | None, new: Entry | None, stored: Stored | None) -> bool:
        """A file rewritten with its loop-start bytes and mode: no change."""
        return (old is not None and new is not None and old.kind == new.kind == "f" and stored is not None
                and stat.S_IMODE(new.mode) == stored.mode and file_digest(path) == stored.digest)

    @staticmethod
    def restore(path: str, stored: Stored | None, start: Entry | None) -> bool:
        """Put ``path`` back: a directory as a real directory with its loop-start mode
        (a link or a file in its place removed, never followed), a file from the store,
        a new one removed."""
        if start is None or start.kind != "d":
            return _restore_path(path, stored, None)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                _remove(path)
                raise FileNotFoundError(path)
        except FileNotFoundError:
            try:
                os.mkdir(path, stat.S_IMODE(start.mode))
            except OSError:
                return False
        except OSError:
            return False
        try:
            os.chmod(path, stat.S_IMODE(start.mode))
        except OSError:
            return False
        return True

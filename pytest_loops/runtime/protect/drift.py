"""What is judged is what was audited: the tree's sources as the diff audit saw them.

After a revise step and its audit the guard marks the tree (:class:`AuditedTree`):
the entries of every path, and the bytes of each source changed since the loop
started (a source unchanged since then has its loop-start text in the guard's
store). The code under test may write the tree while it is checked, but a source
(a module, an extension, a ``.pth`` file) that it rewrites, adds or deletes is not
what the audit saw: before the clean room is built and after it ran,
:meth:`AuditedTree.drift` names them, and :meth:`AuditedTree.restore` puts the
audited bytes back, so an ESCALATE leaves the tree as audited.

Every source the mark holds is looked at again by ``lstat`` (not only what the
change journal reported): a write through a hard link made elsewhere, which no
directory watch reports, still changes the file's change time. Bytecode written
since the loop started is removed at the same moments (:func:`clear_new_bytecode`):
a ``.pyc`` compiled from other text, with the hash check turned off or the
source's size and time copied, would be run by the next plain ``python`` instead
of the audited source.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from pytest_loops.runtime.protect.rules import AUDIT_MAX_BYTES, PYCACHE, SOURCE_SUFFIXES
from pytest_loops.runtime.protect.tree import Entry, _entry, file_digest

# the guard (pytest_loops.runtime.protect.guard.TreeGuard), which imports this module
TreeGuard = Any


class AuditedTree:
    """The tree at one mark: see the module docstring."""

    def __init__(self, guard: TreeGuard) -> None:
        self.state: dict[str, Entry] = dict(guard.state)
        self.digests: dict[str, str | None] = {}  # changed sources: digest (None: deleted)
        self.kept: dict[str, bytes] = {}  # changed sources: their audited bytes, when small
        for rel, how in guard.changes_since_start():
            if not rel.endswith(SOURCE_SUFFIXES):
                continue
            if how == "deleted":
                self.digests[rel] = None
                continue
            path = os.path.join(guard.root, rel)
            self.digests[rel] = file_digest(path)
            entry = self.state.get(rel)
            if entry is not None and entry.kind == "f" and entry.size <= AUDIT_MAX_BYTES:
                try:
                    with open(path, "rb") as f:
                        data = f.read(AUDIT_MAX_BYTES + 1)
                except OSError:
                    continue
                if len(data) <= AUDIT_MAX_BYTES:
                    self.kept[rel] = data
        # every source the audit saw, looked at again whatever the journal reports
        self.sources = [rel for rel, e in self.state.items()
                        if e.kind == "f" and rel.endswith(SOURCE_SUFFIXES) and f"{PYCACHE}/" not in rel]

    def drift(self, guard: TreeGuard) -> list[tuple[str, str]]:
        """Sources whose bytes are not what the audit saw, or new or gone since: (path, how)."""
        candidates = set(guard.since_mark)
        for rel in self.sources:
            if _entry(os.path.join(guard.root, rel)) != self.state.get(rel):
                candidates.add(rel)
        found = []
        for rel in sorted(candidates):
            if not rel.endswith(SOURCE_SUFFIXES) or f"{PYCACHE}/" in rel or guard._in_venv(rel):
                continue
            old, new = self.state.get(rel), _entry(os.path.join(guard.root, rel))
            if old == new or (old is None and new is None):
                continue
            if (new or old).kind == "d":  # type: ignore[union-attr]
                continue
            if guard.readonly_reason(rel, old or new, new=rel not in guard.start) is not None:
                continue  # a read-only path: put back and reported by before_revise()
            if old is not None and new is not None and old.kind == new.kind == "f":
                before = self.digests[rel] if rel in self.digests else guard.start_digest(rel, old)
                if before is not None and file_digest(os.path.join(guard.root, rel)) == before:
                    continue  # touched, the audited bytes
            found.append((rel, "added" if old is None else "deleted" if new is None else "modified"))
        return found

    def restore(self, guard: TreeGuard, drifted: list[tuple[str, str]]) -> list[str]:
        """Put the audited bytes back (an added source removed); the paths that could not be."""
        failed = []
        for rel, how in drifted:
            path = os.path.join(guard.root, rel)
            old = self.state.get(rel)
            data = None
            if how != "added" and old is not None:
                data = self.kept.get(rel) if rel in self.digests else guard.start_bytes(rel, old)
                if data is None:
                    failed.append(rel)
                    continue
            try:
                _replace(path, data, stat.S_IMODE(old.mode) if old is not None else 0o644)
            except OSError:
                failed.append(rel)
        return failed


def _replace(path: str, data: bytes | None, mode: int) -> None:
    """``data`` at ``path`` as a new file renamed over it (a hard link to it elsewhere
    keeps the other bytes), or ``path`` removed when ``data`` is None."""
    if data is None:
        os.unlink(path)
        return
    tmp = f"{path}.pytest-loops-restore"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def clear_new_bytecode(root: str, sources: list[str], since_ns: int) -> list[str]:
    """Remove the bytecode beside ``sources`` (relative to ``root``) changed since
    ``since_ns`` (by change time, which a writer cannot set back); the removed paths."""
    removed = []
    for folder in sorted({os.path.dirname(rel) for rel in sources}):
        cache = os.path.join(folder, PYCACHE)
        try:
            entries = list(os.scandir(os.path.join(root, cache)))
        except OSError:
            continue
        for item in entries:
            if not item.name.endswith((".pyc", ".pyo")):
                continue
            try:
                if item.stat(follow_symlinks=False).st_ctime_ns >= since_ns:
                    os.unlink(item.path)
                    removed.append(os.path.join(cache, item.name))
            except OSError:
                continue
    return removed

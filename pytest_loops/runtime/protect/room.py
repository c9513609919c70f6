"""The clean room's tree, built from what the tree guard recorded: the tree as it was
at loop start with only the in-scope changes applied. Read-only files come from the
guard's store (hard-linked where the file system allows: the store is not used
again, and they are compared with their digests after the judged run), in-scope
files are copied from the working tree, never linked, so nothing the judged run
writes reaches it."""

from __future__ import annotations

import os
import shutil
import stat
from typing import Protocol

from pytest_loops.runtime.protect.rules import PYCACHE
from pytest_loops.runtime.protect.tree import Entry, Stored, _makedirs, _place, _write_new, file_digest


class RoomSource(Protocol):
    """What the room is built from (the tree guard)."""

    root: str
    state: dict[str, Entry]
    start: dict[str, Entry]
    store: dict[str, Stored]
    venvs: set[str]
    start_dirs: frozenset[str]

    def _in_venv(self, rel: str) -> str | None: ...

    def readonly_reason(self, rel: str, entry: Entry | None, *, new: bool) -> str | None: ...

    def _violation(self, rel: str, old: Entry | None, new: Entry | None) -> str | None: ...


def build_clean_room(guard: RoomSource, dest: str, *, link_venvs: bool = True) -> None:
    """``dest`` as the tree was at loop start with only the in-scope changes applied:
    read-only files from the store (hard-linked where the file system allows: the
    store is not used again, and they are compared with their digests after the
    judged run), in-scope files copied from the working tree."""
    os.makedirs(dest, exist_ok=True)
    made: set[str] = set()
    for rel, entry in guard.state.items():
        if entry.kind != "f" or f"{PYCACHE}/" in rel or guard._in_venv(rel):
            continue
        start = guard.start.get(rel)
        if start is not None and guard.readonly_reason(rel, start, new=False) is not None:
            continue  # from the store, below
        if guard._violation(rel, start, entry) is not None:
            continue  # never a read-only path from the working tree
        # a copy, never a link: what the judged run writes must not reach the tree
        _makedirs(os.path.dirname(os.path.join(dest, rel)), made)
        try:
            shutil.copyfile(os.path.join(guard.root, rel), os.path.join(dest, rel), follow_symlinks=False)
            os.chmod(os.path.join(dest, rel), stat.S_IMODE(entry.mode))
        except OSError:
            continue
    for rel, stored in guard.store.items():
        start = guard.start.get(rel)
        if start is not None and not guard._in_venv(rel) \
                and guard.readonly_reason(rel, start, new=False) is not None:
            if stored.data is not None:
                _write_new(os.path.join(dest, rel), stored.data, stored.mode, made)
            else:
                _place(stored.path, os.path.join(dest, rel), stored.mode, made)
    for venv in guard.venvs if link_venvs else ():  # the interpreter a check names, as watched
        if venv in guard.start_dirs or any(r.startswith(venv + "/") for r in guard.start):
            target = os.path.join(dest, venv)
            _makedirs(os.path.dirname(target), made)
            try:
                os.symlink(os.path.join(guard.root, venv), target)
            except OSError:
                pass
    for rel, entry in guard.start.items():  # links present at loop start, as they were
        if entry.kind == "l" and not guard._in_venv(rel):
            target = os.path.join(dest, rel)
            _makedirs(os.path.dirname(target), made)
            try:
                os.symlink(entry.target, target)
            except OSError:
                pass


def readonly_digests(guard: RoomSource, room: str) -> list[str]:
    """Read-only files in the clean room that differ from the store (the code under
    test changed them while it was being judged)."""
    changed = []
    for rel, stored in guard.store.items():
        if guard._in_venv(rel) or guard.readonly_reason(rel, guard.start.get(rel), new=False) is None:
            continue
        if file_digest(os.path.join(room, rel)) != stored.digest:
            changed.append(rel)
    return sorted(changed)

"""While a loop runs, the harness imports nothing the loop wrote.

The harness's own process is never sandboxed, and under pytest (or ``python -m``)
the loop's tree is on its ``sys.path``. A module it imports lazily while the loop
runs (a library's optional dependency, tried at the moment a ``.tine`` is saved)
would be found in the tree if the revise step, or the code under test, created
one under that name: its code would run in the harness, after the verdict, with
the harness's keys. So from a loop's start to its end, a module whose file lies
in the loop's tree and was written after the loop started is not imported by
this process: the import fails as if the module did not exist (its compiled
``.pyc`` counts as its file: one planted beside an old source is refused too).
Modules the tree held before the loop (a conftest's helpers) import as usual.
A module already imported before the loop is not looked up again: the guard
meets only what the loop could have planted.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

_lock = threading.Lock()


class TreeImportGuard(importlib.abc.MetaPathFinder):
    """Refuses modules from ``root`` whose file changed at or after ``since``."""

    def __init__(self, root: str, since: float) -> None:
        self.root = os.path.realpath(root)
        self.since = since
        self.refused: list[str] = []
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self._busy.on = False
        if spec is None:
            return None
        places = [spec.origin] if spec.origin and spec.has_location else []
        places += list(spec.submodule_search_locations or [])
        for place in places:
            if self._new(place):
                self.refused.append(fullname)
                raise ModuleNotFoundError(f"No module named {fullname!r} (written into the loop's tree while "
                                          "the loop ran: the harness does not import it)", name=fullname)
        if (spec.cached and spec.has_location and isinstance(spec.loader, importlib.machinery.SourceFileLoader)
                and self._new(spec.cached)):
            # an old source with a new .pyc (a check's pytest compiled it, or it was planted):
            # the source is compiled afresh, the .pyc neither read nor rewritten
            spec.loader = _SourceOnly(spec.loader.name, spec.loader.path)
        return spec if spec.loader is not None and isinstance(spec.loader, _SourceOnly) else None

    def _new(self, place: str) -> bool:
        """Whether ``place`` lies in the tree and was written since the loop started."""
        real = os.path.realpath(place)
        if real != self.root and not real.startswith(self.root + os.sep):
            return False
        try:
            info = os.stat(real)
        except OSError:
            return False
        # the inode's change time too: a modification time set back (os.utime) moves it
        return max(info.st_mtime, info.st_ctime) >= self.since


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """A source loader that never reads nor writes the module's ``.pyc``."""

    def get_data(self, path: str) -> bytes:
        if path.endswith((".pyc", ".pyo")):
            raise OSError(f"{path}: not read while a loop runs")
        return super().get_data(path)

    def set_data(self, path: str, data: Any, *, _mode: int = 0o666) -> None:
        return None


@contextmanager
def imports_guarded(root: str | os.PathLike[str], since: float) -> Iterator[TreeImportGuard]:
    """Install a :class:`TreeImportGuard` first in ``sys.meta_path`` for the block."""
    guard = TreeImportGuard(os.fspath(root), since)
    with _lock:
        sys.meta_path.insert(0, guard)
    try:
        yield guard
    finally:
        with _lock:
            try:
                sys.meta_path.remove(guard)
            except ValueError:
                pass

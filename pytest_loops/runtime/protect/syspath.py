"""The tree as the judging interpreter's ``sys.path`` sees it.

Two ways in, both through the import system rather than a test or config file:

- **Distribution metadata.** ``importlib.metadata`` finds a distribution in any
  directory on ``sys.path``: a ``*.dist-info`` (or ``*.egg-info``) directory whose
  ``entry_points.txt`` names a ``pytest11`` plugin is loaded by every pytest run that
  has that directory on its path (the project root through ``PYTHONPATH``, an
  editable install, a ``src/`` layout). ``*.egg-link`` and ``.pth`` files are the
  other half of such installs. :class:`PathMetadataGuard` lists the tree's
  directories on the judged path at loop start (those the tree's guard ignores too,
  an ``*.egg-info`` or ``node_modules`` named by ``PYTHONPATH``) and after every
  revise step: a new entry of those kinds is removed with the new modules it
  registers as plugins; a changed ``entry_points.txt`` of one that was there is put
  back.
- **Shadowing.** A new top-level module in the tree named like one the interpreter
  imports from elsewhere (``pygments``, which pytest imports at start-up, as much
  as ``json``) runs in its place. :class:`OutsideModules` answers whether a name is
  importable without the tree: the interpreter's own path with the tree's entries
  taken out (its virtual environments kept), its built-in and frozen modules, and
  the import hooks of editable installs that point outside the tree.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Container, Iterable, Mapping

from pytest_loops.limits import is_venv
from pytest_loops.runtime.protect.rules import module_stem
from pytest_loops.runtime.protect.tree import Stored, Violation, _remove, _restore_path

META_DIR_SUFFIXES = (".dist-info", ".egg-info")
META_FILE_SUFFIXES = (".egg-link", ".pth")
META_WHY = "distribution metadata on the judged sys.path"
PTH_WHY = "run by the interpreter at start-up"
SMALL = 1 << 20  # .pth, .egg-link and entry_points.txt files up to this size are kept to be put back


def shadowed_module(root: str, parts: list[str], names: Container[str], start_dirs: Container[str]) -> str | None:
    """The module a new path (``parts`` of a path under ``root``) would shadow: a module
    file, or a directory, named like one of ``names`` and not inside a package (nor a
    package that was there at loop start). None when it shadows nothing."""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        stem = module_stem(part) if last else part
        if stem is None or stem not in names:
            continue
        if os.path.exists(os.path.join(root, *parts[:i], "__init__.py")):
            continue  # inside a package: shadows nothing
        if not last and "/".join(parts[: i + 1]) in start_dirs:
            continue  # the package was there when the loop started
        return stem
    return None


def is_metadata(name: str) -> bool:
    return name.endswith(META_DIR_SUFFIXES + META_FILE_SUFFIXES)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _venv_of(path: str, root: str) -> str | None:
    """The virtual environment in the tree that ``path`` is in (a ``pyvenv.cfg`` in it
    or an ancestor below ``root``), None when none."""
    while _within(path, root) and path != root:
        if is_venv(path):
            return path
        path = os.path.dirname(path)
    return None


def judged_dirs(root: str, environ: Mapping[str, str] | None = None,
                path: Iterable[str] | None = None) -> list[str]:
    """The tree's directories on the judged ``sys.path``: the root (a ``python -m
    pytest`` run in it puts it first), ``src/``, the ``PYTHONPATH`` entries inside the
    tree, and every entry of this interpreter's path inside it (an editable install's),
    except those of a virtual environment in the tree (the tree's guard watches those).
    Real absolute paths, also of directories not made yet; ``root`` must be one."""
    environ = os.environ if environ is None else environ
    candidates = [root, os.path.join(root, "src")]
    candidates += [os.path.join(root, p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    candidates += [p for p in (sys.path if path is None else path) if p and isinstance(p, str)]
    found: list[str] = []
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if _within(real, root) and real not in found and _venv_of(real, root) is None:  # made later too
            found.append(real)
    return found


def _plugin_modules(dist: str) -> list[str]:
    """The top-level modules a distribution's ``entry_points.txt`` registers as pytest plugins."""
    text = (_read_small(os.path.join(dist, "entry_points.txt")) or b"").decode("utf-8", "replace")
    modules: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == "pytest11" and "=" in line:
            top = line.split("=", 1)[1].strip().split(":", 1)[0].strip().split(".", 1)[0]
            if top.isidentifier() and top not in modules:
                modules.append(top)
    return modules


def _read_small(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(SMALL + 1)
    except OSError:
        return None


def _names(directory: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(directory))
    except OSError:
        return frozenset()


class PathMetadataGuard:
    """Distribution metadata and ``.pth`` files in the tree's directories on the judged
    path; see the module docstring. Violations name paths relative to ``root``."""

    def __init__(self, root: str, dirs: Iterable[str]) -> None:
        self.root = root
        self.dirs = list(dirs)
        self.rels = frozenset(self._rel(d) for d in self.dirs)
        self.names: dict[str, frozenset[str]] = {}  # directory -> every name in it, at loop start
        self.kept: dict[str, bytes | None] = {}  # a metadata file (or a dist's entry_points.txt) -> its bytes

    def _rel(self, path: str) -> str:
        rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        return "" if rel == "." else rel

    def owns(self, rel: str) -> bool:
        """Whether a tree path is this guard's (so the tree's guard leaves it alone): an
        entry of the metadata kinds in a judged directory, or anything under one."""
        if not self.rels or not any(s in rel for s in (".dist-info", ".egg-", ".pth")):
            return False
        parts = rel.split("/")
        return any(is_metadata(part) and "/".join(parts[:i]) in self.rels for i, part in enumerate(parts))

    def _kept_path(self, path: str) -> str:
        return os.path.join(path, "entry_points.txt") if path.endswith(META_DIR_SUFFIXES) else path

    def begin(self) -> None:
        for directory in self.dirs:
            self.names[directory] = _names(directory)
            for name in self.names[directory]:
                if is_metadata(name):
                    kept = self._kept_path(os.path.join(directory, name))
                    self.kept[kept] = _read_small(kept)

    def check(self) -> list[Violation]:
        """What changed since the loop started, undone: a new entry removed (with the new
        plugin modules it registers), an old one's registration put back."""
        found: list[Violation] = []
        for directory in self.dirs:
            before = self.names.get(directory, frozenset())
            for name in sorted(_names(directory)):
                if not is_metadata(name):
                    continue
                path = os.path.join(directory, name)
                why = PTH_WHY if name.endswith(".pth") else META_WHY
                if name not in before:
                    doomed = [path]
                    if name.endswith(META_DIR_SUFFIXES):
                        for module in _plugin_modules(path):
                            doomed += [os.path.join(directory, n) for n in _names(directory)
                                       if n not in before and (n == module or module_stem(n) == module)]
                    ok = True
                    for victim in doomed:
                        try:
                            _remove(victim)
                        except OSError:
                            ok = False
                    found.append(Violation(self._rel(path), "added", why, restored=ok))
                    continue
                kept = self._kept_path(path)
                if kept in self.kept and _read_small(kept) != self.kept[kept]:
                    old = self.kept[kept]
                    stored = None if old is None else Stored("", "", len(old), 0o644, old)
                    ok = len(old or b"") <= SMALL and _restore_path(kept, stored, None)
                    found.append(Violation(self._rel(kept), "modified", why, restored=ok))
        return found


def tree_modules(dirs: Iterable[str], root: str) -> frozenset[str]:
    """The top-level modules the tree's directories on the judged path hold at loop start
    other than the root (``src/mypkg``): a new module of the same name elsewhere on the
    path (``mypkg/`` copied to the root, which ``python -m pytest`` puts first) is what
    the tests would import instead, while the package that ships keeps the bug."""
    names: set[str] = set()
    for directory in dirs:
        if os.path.realpath(directory) == os.path.realpath(root):
            continue  # the root's own modules: a new one there shadows nothing of the tree's
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name.isidentifier() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                        names.add(entry.name)
                    continue
            except OSError:
                continue
            stem = module_stem(entry.name)
            if stem and stem.isidentifier():
                names.add(stem)
    return frozenset(names)


class AnyOf:
    """A name container that holds what any of its parts holds."""

    def __init__(self, *parts: Container[str]) -> None:
        self.parts = parts

    def __contains__(self, name: object) -> bool:
        return any(name in part for part in self.parts)


class OutsideModules:
    """Whether a top-level module name is importable by the judging interpreter without
    the tree (see the module docstring). Answers are cached; the path is taken at
    construction (loop start)."""

    def __init__(self, root: str, *, fixed: Iterable[str] = (), extra: Iterable[str] = ()) -> None:
        self.root = root
        path: list[str] = []
        for entry in [*sys.path, *extra]:
            if not isinstance(entry, str) or not entry:
                continue
            real = os.path.realpath(entry)
            if _within(real, root) and _venv_of(real, root) is None:
                continue  # the tree's own modules provide nothing from outside
            if real not in path:
                path.append(real)
        self.path = path
        self.fixed = frozenset(fixed) | frozenset(sys.builtin_module_names)
        self._known: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or not name.isidentifier():
            return False
        if name in self.fixed:
            return True
        if name not in self._known:
            self._known[name] = self._find(name)
        return self._known[name]

    def _find(self, name: str) -> bool:
        try:  # a plain directory (a namespace portion, origin None) is not a module a new one shadows
            spec = importlib.machinery.PathFinder.find_spec(name, self.path)
            if spec is not None and spec.origin is not None:
                return True
        except (ImportError, ValueError, OSError):
            pass
        for finder in list(sys.meta_path):  # frozen modules, editable installs' finders
            if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
                continue
            if type(finder).__module__.startswith("_pytest"):
                continue  # pytest's assertion rewriter looks at sys.path, the tree included
            try:
                spec = finder.find_spec(name, None)
            except Exception:  # noqa: BLE001 - a third-party finder may raise anything
                continue
            if spec is None:
                continue
            places = [spec.origin or ""] + list(spec.submodule_search_locations or [])
            if spec.origin in ("frozen", "built-in") or any(
                    os.path.isabs(p) and not _within(os.path.realpath(p), self.root) for p in places):
                return True
        return False

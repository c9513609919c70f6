"""The judging interpreter: outside the working tree, and still part of the judge.

The clean room judges tests with this interpreter (``sys.executable -m pytest``),
and shell checks usually run the same one. A revise step runs as the same user, so
it can write where that interpreter looks before any test runs: a ``.pth`` file or
``sitecustomize.py`` in its site-packages, a new distribution that registers a
pytest plugin (an entry point in ``pytest11``, loaded into every pytest run) in any
directory on its path, or pytest's own code. The tree's guard never sees those paths.

:class:`InterpreterGuard` records them when the loop starts (copying the test
runner's own files, in memory) and reports every change as a
:class:`~pytest_loops.runtime.protect.tree.Violation`, undone: a new start-up file or
plugin registration is removed, a changed file is put back from its copy.
Bytecode that appears under those packages is removed, as in the tree: a forged
``.pyc`` with the source's size and mtime would otherwise run in its place.

After a revise step the guard first asks the change journal (inotify, as the tree's
guard does) whether anything it watches was touched, and compares file by file only
when something was: an idle check costs one read of the event queue, not a stat of
every recorded file. The journal cannot see every write (through ``mmap``, through a
hard link made elsewhere): the check before the clean room judges is therefore always
a full one, so what the journal missed can never reach a verdict.

Paths inside the working tree are left to the tree's guard (a project-local
virtual environment is one). Something else installing packages into the same
interpreter while a revise step runs is reported too: the guard cannot tell who
wrote.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
from collections.abc import Callable

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.progress.journal import DirectoryJournal, JournalLost
from pytest_loops.runtime.protect.tree import (
    Entry,
    Stored,
    Violation,
    _entry,
    _remove,
    _restore_path,
)

# What a judged pytest run imports before it collects a test: pytest, its plugin
# system and its own plugins, the harness's witness, and xdist (the judged run uses
# workers under -n).
JUDGE_PACKAGES = ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pytest_loops",
                  "xdist", "execnet")
STARTUP_MODULES = ("sitecustomize", "usercustomize")
PYCACHE = "__pycache__"
DIST_SUFFIXES = (".dist-info", ".egg-info")
STARTUP_WHY = "run by the judging interpreter at start-up"
PLUGIN_WHY = "a pytest plugin registered with the judging interpreter"
RUNNER_WHY = "the judging interpreter's test runner"
COPY_MAX_BYTES = 1 << 20  # files up to this size are kept to be put back (pytest's are ~100 KB at most)


def site_dirs() -> list[str]:
    """Where this interpreter reads ``.pth`` files: its site-packages, the user's when on,
    and any other site directory on its path (added by a ``.pth`` with ``site.addsitedir``)."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs += [entry for entry in sys.path if os.path.basename(entry) in ("site-packages", "dist-packages")]
    return list(dict.fromkeys(os.path.realpath(d) for d in dirs))


def _package_paths(name: str) -> list[str]:
    """The files or directories of an importable top-level module, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [os.path.realpath(p) for p in spec.submodule_search_locations]
    if spec.origin and os.path.isfile(spec.origin):
        return [os.path.realpath(spec.origin)]
    return []


def _plugin_modules(dist_dir: str) -> list[str] | None:
    """The top-level modules a distribution registers as pytest plugins (its ``pytest11``
    entry points); None when it registers none."""
    try:
        with open(os.path.join(dist_dir, "entry_points.txt"), "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None
    modules: list[str] | None = None
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            if section == "pytest11" and modules is None:
                modules = []
        elif section == "pytest11" and "=" in line and modules is not None:
            target = line.split("=", 1)[1].strip().split(":", 1)[0].strip()
            top = target.split(".", 1)[0]
            if top.isidentifier() and top not in modules:
                modules.append(top)
    return modules


def _pth_imports(path: str) -> list[str]:
    """The top-level modules the ``import`` lines of a ``.pth`` file import: the
    interpreter runs those lines at every start, so the modules are part of the judge as
    much as the ``.pth`` file (``distutils-precedence.pth`` runs ``_distutils_hack``, an
    editable install's runs its finder)."""
    import ast

    data = _read_small(path) or b""
    names: list[str] = []
    sources = [raw.strip() for raw in data.decode("utf-8", "replace").splitlines()
               if raw.startswith(("import ", "import\t"))]  # site.py runs only these; the rest are paths
    while sources and len(names) < 100:
        try:
            tree = ast.parse(sources.pop())
        except (SyntaxError, ValueError):
            continue  # site.py cannot run it either
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = [node.module]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else "")
                if called in ("__import__", "import_module"):
                    found = [node.args[0].value]
                elif called == "exec":  # coverage's: exec('import os ... import coverage ...')
                    sources.append(node.args[0].value)
            names += [n.split(".", 1)[0] for n in found if n.split(".", 1)[0].isidentifier()]
    return list(dict.fromkeys(names))


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(COPY_MAX_BYTES)
    except OSError:
        return None


class InterpreterGuard:
    """See the module docstring.

    :param should_stop: the loop's budget, asked between files at loop start.
    :param inside: whether an absolute path is inside the working tree (left to
        the tree's guard).
    """

    def __init__(self, inside: Callable[[str], bool], should_stop: ShouldStop | None = None) -> None:
        self.should_stop = should_stop
        self.inside = inside
        self.files: dict[str, Entry] = {}  # path -> entry at loop start
        self.store: dict[str, Stored] = {}
        self.listed: dict[str, frozenset[str]] = {}  # directory -> names that count, at loop start
        self.caches: dict[str, Entry | None] = {}  # bytecode under the runner's packages, at loop start
        self.cache_dirs: list[str] = []
        self.site_dirs: list[str] = []
        self.site_names: dict[str, frozenset[str]] = {}  # site-packages -> every name in it, at loop start
        self.path_names: dict[str, frozenset[str]] = {}  # other directories on the path, the same
        self.entry_points: dict[str, bytes | None] = {}  # each distribution's entry_points.txt, at loop start
        self.journal: DirectoryJournal | None = None
        self.journal_reason: str | None = None  # why checks compare file by file (None: they use the journal)

    # -- loop start ------------------------------------------------------------------

    def begin(self, *, journal: bool = True) -> None:
        self.site_dirs = [d for d in site_dirs() if os.path.isdir(d) and not self.inside(d)]
        for directory in self.site_dirs:
            try:
                self.site_names[directory] = frozenset(os.listdir(directory))
            except OSError:
                self.site_names[directory] = frozenset()
            for name in self.site_names[directory]:
                if name.endswith(DIST_SUFFIXES):
                    self.entry_points[os.path.join(directory, name)] = _read_small(
                        os.path.join(directory, name, "entry_points.txt"))
        if journal:  # nothing runs beside the loop's start: watching after listing misses nothing
            self._start_journal()
        else:
            self.journal_reason = "the change journal is off"
        for directory in self._startup_dirs():
            self._watch(directory)
            if directory not in self.site_names:
                try:
                    self.path_names[directory] = frozenset(os.listdir(directory))
                except OSError:
                    self.path_names[directory] = frozenset()
                for name in self.path_names[directory]:
                    if name.endswith(DIST_SUFFIXES):
                        self.entry_points[os.path.join(directory, name)] = _read_small(
                            os.path.join(directory, name, "entry_points.txt"))
            names = self._names(directory)
            self.listed[directory] = names
            for name in names:
                self._record(os.path.join(directory, name))
        # a virtual environment's settings: include-system-site-packages flipped puts
        # directories nobody watches on the judge's path
        venv_cfg = os.path.join(sys.prefix, "pyvenv.cfg")
        if sys.prefix != sys.base_prefix and os.path.isfile(venv_cfg) and not self.inside(venv_cfg):
            self._watch(sys.prefix)
            self._record(venv_cfg)
        for path in self._runner_paths():
            if os.path.isfile(path):
                self._record(path)
                continue
            self._watch(os.path.dirname(path))
            for dirpath, _dirnames, filenames in os.walk(path):
                self._watch(dirpath)
                if os.path.basename(dirpath) == PYCACHE:
                    self.cache_dirs.append(dirpath)
                    for name in filenames:
                        self.caches[os.path.join(dirpath, name)] = _entry(os.path.join(dirpath, name))
                    continue
                for name in filenames:
                    self._record(os.path.join(dirpath, name))

    def _start_journal(self) -> None:
        if not self.site_dirs:
            self.journal_reason = "no site directory outside the tree"
            return
        try:
            self.journal = DirectoryJournal(self.site_dirs[0])
            for directory in self.site_dirs:
                self.journal.watch(directory)
                for name in self.site_names[directory]:
                    if name.endswith(DIST_SUFFIXES):  # its entry_points.txt
                        self.journal.watch(os.path.join(directory, name))
        except JournalLost as exc:
            self._drop_journal(exc.reason)

    def _watch(self, directory: str) -> None:
        if self.journal is None:
            return
        try:
            self.journal.watch(directory)
        except JournalLost as exc:
            self._drop_journal(exc.reason)

    def _drop_journal(self, reason: str) -> None:
        if self.journal is not None:
            self.journal.close()
        self.journal = None
        self.journal_reason = reason

    def _quiet(self) -> bool:
        """Whether the journal vouches that nothing watched was touched since the last check."""
        if self.journal is None:
            return False
        try:
            changes = self.journal.drain()
        except JournalLost as exc:
            self._drop_journal(exc.reason)
            return False
        return not (changes.touched or changes.relisted or changes.gone)

    def close(self) -> None:
        self._drop_journal("closed")

    def _startup_dirs(self) -> list[str]:
        """site-packages (``.pth`` files, plugin registrations) and every other directory
        on the interpreter's path (``sitecustomize``/``usercustomize``)."""
        dirs = list(self.site_dirs)
        for entry in sys.path:
            if not entry:
                continue  # the working directory: the judged run does not put it first (-P)
            real = os.path.realpath(entry)
            if os.path.isdir(real) and not self.inside(real) and real not in dirs:
                dirs.append(real)
        return dirs

    def _runner_paths(self) -> list[str]:
        """The judge's packages, every installed pytest plugin's, and the modules the
        start-up ``.pth`` files import."""
        names = list(JUDGE_PACKAGES)
        for directory in self.listed:
            for name in sorted(self.listed[directory]):
                if name.endswith(DIST_SUFFIXES):
                    names += _plugin_modules(os.path.join(directory, name)) or []
                elif name.endswith(".pth"):
                    names += _pth_imports(os.path.join(directory, name))
        paths: list[str] = []
        for name in dict.fromkeys(names):
            paths += [p for p in _package_paths(name) if not self.inside(p) and p not in paths]
        return paths

    def _names(self, directory: str) -> frozenset[str]:
        """The entries of ``directory`` that run at start-up or register a plugin."""
        try:
            names = os.listdir(directory)
        except OSError:
            return frozenset()
        in_site = directory in self.site_dirs
        found = set()
        for name in names:
            stem = name[:-3] if name.endswith(".py") else name
            if stem in STARTUP_MODULES:
                found.add(name)
            elif in_site and name.endswith(".pth"):
                found.add(name)
            elif name.endswith(DIST_SUFFIXES) \
                    and _plugin_modules(os.path.join(directory, name)) is not None:
                found.add(name)  # importlib.metadata finds it on any directory of the path
        return frozenset(found)

    def _record(self, path: str) -> None:
        if self.should_stop is not None and self.should_stop():
            raise DeadlineReached(f"while the interpreter guard copied {len(self.store)} file(s) "
                                  "at loop start")
        entry = _entry(path)
        if entry is None:
            return
        if entry.kind == "d":  # a startup package or a distribution's metadata
            for dirpath, _dirnames, filenames in os.walk(path):
                for name in filenames:
                    self._record(os.path.join(dirpath, name))
            return
        self.files[path] = entry
        if entry.kind == "f" and entry.size <= COPY_MAX_BYTES:
            try:
                with open(path, "rb") as f:
                    data = f.read(COPY_MAX_BYTES + 1)
            except OSError:
                return
            # kept in memory: nothing on disk another process could rewrite
            self.store[path] = Stored("", "", len(data), entry.mode & 0o7777, data)

    # -- after a revise step ---------------------------------------------------------

    def check(self, *, full: bool = False) -> tuple[list[Violation], list[str]]:
        """(violations, undone; bytecode removed) since the loop started.

        Without ``full``, nothing is compared when the change journal vouches that
        nothing it watches was touched since the last check; ``full`` compares every
        recorded file whatever the journal says (the check before a verdict).
        """
        if self._quiet() and not full:
            return [], []
        violations: list[Violation] = []
        for path, old in self.files.items():
            new = _entry(path)
            if new == old:
                continue
            how = "deleted" if new is None else "modified"
            ok = _restore_path(path, self.store.get(path), None) if path in self.store else False
            if ok:
                self.files[path] = _entry(path) or old
            violations.append(Violation(path, how, self._why(path), restored=ok))
        for directory, names in self.listed.items():
            for name in sorted(self._names(directory) - names):
                path = os.path.join(directory, name)
                if path in self.entry_points:  # a distribution that was there: its old entry points back
                    violations.append(self._restore_entry_points(path))
                    continue
                doomed = [path]
                if name.endswith(DIST_SUFFIXES):  # and the new modules it registers
                    before = self.site_names.get(directory) or self.path_names.get(directory, frozenset())
                    for module in _plugin_modules(path) or []:
                        doomed += [os.path.join(directory, n) for n in (module, module + ".py")
                                   if n not in before]
                try:
                    for doomed_path in doomed:
                        _remove(doomed_path)
                    ok = True
                except OSError:
                    ok = False
                why = PLUGIN_WHY if name.endswith(DIST_SUFFIXES) else STARTUP_WHY
                violations.append(Violation(path, "added", why, restored=ok))
        return violations, self._clear_caches()

    def _restore_entry_points(self, dist: str) -> Violation:
        points = os.path.join(dist, "entry_points.txt")
        old = self.entry_points[dist]
        stored = None if old is None else Stored("", "", len(old), 0o644, old)
        ok = _restore_path(points, stored, None)
        return Violation(points, "modified" if old is not None else "added", PLUGIN_WHY, restored=ok)

    def _why(self, path: str) -> str:
        directory, name = os.path.split(path)
        if directory in self.listed and name in self.listed[directory]:
            return STARTUP_WHY
        top = next((d for d in self.listed if path.startswith(d + os.sep)), None)
        if top is not None and os.path.relpath(path, top).split(os.sep)[0].endswith(DIST_SUFFIXES):
            return PLUGIN_WHY
        return RUNNER_WHY

    def _clear_caches(self) -> list[str]:
        """Bytecode new or rewritten under the test runner's packages since the loop
        started: removed (the interpreter compiles the source again)."""
        cleared: list[str] = []
        for directory in self.cache_dirs:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                path = os.path.join(directory, name)
                if path in self.caches and self.caches[path] == _entry(path):
                    continue
                try:
                    _remove(path)
                except OSError:
                    continue
                self.caches.pop(path, None)
                cleared.append(path)
        return cleared

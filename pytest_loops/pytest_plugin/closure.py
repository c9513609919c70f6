"""What the tests read, observed: the judge's closure, recorded in a loop's first verify.

A loop's checks judge the code with more than the test files: the golden and
expected-value files a test opens, and the helper modules only the tests import.
Where these sit next to the code (a flat layout, no test directory), no rule by
name finds them, and a revise step could "update the snapshot" or weaken the
helper. So in the first verify, before any revise step has run, every pytest the
loop starts records them, and they are read-only for the rest of the loop.

The harness asks for it with ``PYTEST_LOOPS_CLOSURE`` (a directory; only in the
working tree's checks, never in a judged run). Each pytest process (each
pytest-xdist worker too) writes one ``closure-<pid>.json`` there when it ends:

- ``read``: files inside the tree that test code opened for reading (the innermost
  frame of the tree's own code on the stack is a test file or a conftest, and the
  file is not a module being imported);
- ``tests``: the files pytest collected tests from: test modules whatever their names
  (``python_files = check_*.py``), doctest text files (``test*.txt``, ``--doctest-glob``);
  not a module whose docstrings hold doctests (``--doctest-modules``): that is the code
  under repair, whose examples the diff audit holds to what they expected;
- ``helpers``: modules of the tree that only test code imports and that use a test
  framework themselves (``pytest``, ``unittest``, ``hypothesis``): assertion and
  expectation helpers. A module only the tests import but that uses no test
  framework is indistinguishable by observation from the code under test (in a flat
  layout the code under test is imported by the tests alone too), so it is not
  taken: a loop's ``scope`` setting names what may change when that matters.

Recording is an audit hook (:func:`sys.addaudithook`), installed before the first
conftest is imported; it costs a stack walk per file opened, in that one verify.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import sys
from types import FrameType, ModuleType
from typing import Any

from pytest_loops.defaults import CLOSURE_ENV
from pytest_loops.limits import write_fresh

VARIABLE = CLOSURE_ENV
FRAMEWORKS = frozenset({"pytest", "_pytest", "unittest", "hypothesis"})
_TEST_DIR_NAMES = ("test", "tests", "testing")
_MAX_PATHS = 10_000  # a test reading more than this many files: the rest are not recorded


class Recorder:
    """One pytest process's observation (see the module docstring)."""

    def __init__(self, root: str, out_dir: str, patterns: tuple[str, ...] = ("test_*.py", "*_test.py")) -> None:
        self.root = os.path.realpath(root)
        self.out_dir = out_dir
        self.patterns = patterns
        self.read: set[str] = set()
        self.collected: set[str] = set()
        self.active = True
        self._tests: dict[str, bool] = {}

    # -- classification --------------------------------------------------------------

    def inside(self, path: str) -> bool:
        return (path == self.root or path.startswith(self.root + os.sep)) and "site-packages" not in path

    def is_test(self, filename: str) -> bool:
        """A test module or conftest of the tree."""
        known = self._tests.get(filename)
        if known is None:
            name = os.path.basename(filename)
            rel = os.path.relpath(filename, self.root).split(os.sep)
            known = (name == "conftest.py" or any(fnmatch.fnmatch(name, p) for p in self.patterns)
                     or any(part.lower() in _TEST_DIR_NAMES for part in rel[:-1]))
            self._tests[filename] = known
        return known

    # -- the audit hook --------------------------------------------------------------

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not self.active or len(self.read) >= _MAX_PATHS:
            return
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if not isinstance(path, str) or not path:
            return
        if isinstance(mode, str):
            if any(c in mode for c in "wax+"):
                return
        elif isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
            return
        if path.endswith((".py", ".pyc", ".pyo")) or "__pycache__" in path:
            return  # modules are judged by what imports them, below
        full = os.path.realpath(os.path.join(os.getcwd(), path)) if not os.path.isabs(path) \
            else os.path.realpath(path)
        if not self.inside(full) or os.path.isdir(full):
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith("<frozen importlib"):
                return  # the import machinery reading a module
            if filename.startswith(self.root + os.sep) and "site-packages" not in filename:
                if self.is_test(filename):
                    self.read.add(full)
                return
            frame = frame.f_back

    def collect(self, items: list[Any]) -> None:
        """The files the collected tests come from (see the module docstring)."""
        for item in items[:_MAX_PATHS]:
            path = getattr(item, "path", None)
            if path is None or type(getattr(item, "parent", None)).__name__ == "DoctestModule":
                continue
            full = os.path.realpath(str(path))
            if self.inside(full) and os.path.isfile(full):
                self.collected.add(full)

    # -- at the end ----------------------------------------------------------------------

    def helpers(self) -> list[str]:
        """Tree modules only test code imports that use a test framework themselves."""
        modules: dict[str, str] = {}
        for name, module in list(sys.modules.items()):
            filename = getattr(module, "__file__", None)
            if isinstance(filename, str) and filename.endswith(".py"):
                full = os.path.realpath(filename)
                if self.inside(full):
                    modules[name] = full
        importers: dict[str, set[str]] = {}
        for name, filename in modules.items():
            for imported in _imports(filename, name):
                importers.setdefault(imported, set()).add(filename)
        found = []
        for name, filename in modules.items():
            if self.is_test(filename) or not _uses_framework(sys.modules.get(name)):
                continue
            by = importers.get(name, set())
            if by and all(self.is_test(f) for f in by):
                found.append(filename)
        return sorted(found)

    def write(self) -> None:
        self.active = False
        data = {"root": self.root, "read": sorted(self.read), "helpers": self.helpers(),
                "tests": sorted(self.collected)}
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            path = os.path.join(self.out_dir, f"closure-{os.getpid()}.json")
            write_fresh(path, json.dumps(data))  # the run directory: never through a link
        except OSError:
            pass  # the loop goes on with the rules by name alone


def _uses_framework(module: ModuleType | None) -> bool:
    if module is None:
        return False
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            top = value.__name__.split(".", 1)[0]
        else:
            top = str(getattr(value, "__module__", "") or "").split(".", 1)[0]
        if top in FRAMEWORKS:
            return True
    return False


def _imports(filename: str, module: str) -> set[str]:
    """The module names a file imports (each prefix of a dotted name too)."""
    try:
        with open(filename, "rb") as f:
            tree = ast.parse(f.read(1 << 20))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = module if filename.endswith("__init__.py") else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - node.level + 1] if node.level > 1 else parts
                base = ".".join([*parts, base] if base else parts)
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                names.update(alias.name for alias in node.names)
    full: set[str] = set()
    for name in names:
        parts = name.split(".")
        full.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return full


_recorder: Recorder | None = None


def start(root: str, patterns: tuple[str, ...] | None = None, out: str | None = None) -> Recorder | None:
    """Start recording in this process when the harness asked for it (once). ``out``: the
    session fix-loop's own directory (its first verify is this very session)."""
    global _recorder
    out = out or os.environ.get(VARIABLE)
    if not out or _recorder is not None:
        return _recorder
    _recorder = Recorder(root, out, patterns or ("test_*.py", "*_test.py"))
    sys.addaudithook(_recorder.hook)
    return _recorder


def collected(items: list[Any]) -> None:
    if _recorder is not None and _recorder.active:
        _recorder.collect(items)


def finish() -> None:
    if _recorder is not None and _recorder.active:
        _recorder.write()


def session_observed(root: str) -> dict[str, str]:
    """For the session fix-loop, before its first revise step: what this session's tests
    (and its xdist workers') were seen reading. Recording stops here."""
    from pytest_loops.core.closure import read_closure

    if _recorder is None:
        return {}
    finish()
    os.environ.pop(VARIABLE, None)  # the loop's own checks record nothing more
    from pathlib import Path

    return read_closure(Path(_recorder.out_dir), root)

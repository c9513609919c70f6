"""Rules on what new code looks at around it instead of its inputs: the wall clock, ``/proc``,
the whole environment, its parent process, the output streams and the import path.

Each is how code under repair can behave one way under the checks and another way
elsewhere without naming pytest: a time bomb, a scan for a variable the test run sets,
the command line of the process that started it, output hidden from the report, or
modules taken from outside the tree. All but one are about library code (not test files);
an import path entry outside the tree is flagged in every file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from pytest_loops.runtime.audit.rules import _Audit, _header_nodes, _is_main_guard

_CLOCKS = frozenset({
    "time.time", "time.time_ns", "time.monotonic", "time.monotonic_ns", "time.perf_counter",
    "time.perf_counter_ns", "time.process_time", "time.localtime", "time.gmtime", "time.ctime",
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today", "datetime.date.today",
    "datetime.now", "datetime.utcnow", "datetime.today", "date.today",
    "time.clock_gettime", "time.clock_gettime_ns", "uuid.uuid1", "os.times", "email.utils.formatdate",
    "email.utils.localtime", "arrow.now", "arrow.utcnow", "pendulum.now", "pendulum.today",
})
# the clock read by a call that formats "now" when given no time of its own
_CLOCK_WITHOUT_TIME = {"time.strftime": 1, "time.asctime": 0, "datetime.datetime.astimezone": 0}
# a file's times are the clock too: a file made now against one made when the code was written
_FILE_TIMES = frozenset({"os.path.getmtime", "os.path.getctime", "os.path.getatime"})


def _is_clock(name: str | None, call: ast.Call) -> bool:
    return name in _CLOCKS or (name in _CLOCK_WITHOUT_TIME and len(call.args) <= _CLOCK_WITHOUT_TIME[name]
                               and not call.keywords)
_ENVIRON = frozenset({"os.environ", "os.environb", "posix.environ", "nt.environ"})
_GETENV = frozenset({"os.getenv", "os.getenvb"})
# uses of os.environ that read or set one variable by a literal name: not a scan
_ONE_VARIABLE = frozenset({"get", "setdefault", "pop", "__getitem__", "__contains__"})
_WRITES = frozenset({"update", "__setitem__", "__delitem__"})  # setting variables is not reading them
_PARENT = frozenset({"os.getppid", "os.getpgrp", "os.getpgid", "os.getsid"})
_OWN_PID = frozenset({"os.getpid", "posix.getpid"})  # compared with a number: a PID namespace's tell
# code built or read at run time: the audit cannot read what it runs
_DYNAMIC = frozenset({"exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile",
                      "marshal.loads", "types.FunctionType", "importlib.util.spec_from_file_location",
                      "runpy.run_path", "runpy.run_module"})
_STREAMS = frozenset({"sys.stdout", "sys.stderr", "sys.__stdout__", "sys.__stderr__",
                      "builtins.print", "__builtins__.print"})
_IMPORT_PATHS = frozenset({"sys.path", "sys.meta_path", "sys.path_hooks"})
_PATH_CHANGES = frozenset({"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort",
                           "__setitem__", "__iadd__"})
# loading a module from a file the code names, past the import path the judge copies
_FILE_LOADERS = frozenset({
    "pkgutil.extend_path", "importlib.util.spec_from_file_location", "importlib.util.spec_from_loader",
    "importlib.machinery.SourceFileLoader", "importlib.machinery.SourcelessFileLoader",
    "importlib.machinery.ExtensionFileLoader", "importlib.machinery.FileFinder", "runpy.run_path",
    "zipimport.zipimporter", "imp.load_source", "imp.load_compiled", "imp.load_module",
})
_PROC = re.compile(r"^/(?:proc|dev/fd)(?:/|$)")  # /dev/fd: the open files, pytest's capture files among them
_ABSOLUTE = re.compile(r"^(?:/|~|[A-Za-z]:[\\/]|\\\\)")
_PATH_CALLS = frozenset({"os.path.abspath", "os.path.realpath", "os.path.normpath", "str", "os.fspath",
                         "pathlib.Path", "Path", "pathlib.PurePath", "os.path.join"})


class _Probes:
    """The rules of this module over one parsed file, reporting through its :class:`_Audit`."""

    def __init__(self, audit: _Audit, tree: ast.Module) -> None:
        self.audit = audit
        self.tree = tree
        self.parents: dict[int, ast.AST] = {}
        self.assigned: dict[str, list[ast.expr]] = {}  # a name's values, wherever it is assigned
        for node in audit.nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            target = value = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and value is not None:
                self.assigned.setdefault(target.id, []).append(value)
        self.clocked = {name for name, values in self.assigned.items()
                        if any(self.reads_clock(value, set()) for value in values)}
        self.depth = audit.path.replace("\\", "/").strip("/").count("/")

    def run(self) -> None:
        self.walk(self.tree.body, exempt=False)

    def walk(self, body: Sequence[ast.stmt], *, exempt: bool) -> None:
        """Every statement once, knowing whether it is ``main`` code (a script's own business)."""
        for stmt in body:
            inner = exempt
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = exempt or stmt.name == "main"
            elif isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
                self.walk(stmt.body, exempt=True)
                self.walk(stmt.orelse, exempt=exempt)
                continue
            self.statement(stmt, exempt)
            for field in ("body", "orelse", "finalbody"):
                self.walk(getattr(stmt, field, []), exempt=inner)
            for handler in getattr(stmt, "handlers", []):
                self.walk(handler.body, exempt=inner)
            for case in getattr(stmt, "cases", []):
                self.walk(case.body, exempt=inner)

    def statement(self, stmt: ast.stmt, exempt: bool) -> None:
        library = self.audit.library
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for element in _flat(target):
                    self.assignment(element, stmt, exempt)
        for header in _header_nodes(stmt):
            for node in ast.walk(header):
                if isinstance(node, ast.Call):
                    self.call(node, exempt)
                if not library:
                    continue
                if isinstance(node, ast.Compare):
                    self.clock_comparison(node)
                    self.identity_comparison(node)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                    self.proc_path(node)
                elif isinstance(node, ast.Attribute | ast.Name):
                    self.environ_use(node)

    # ------------------------------------------------------------------ the wall clock

    def reads_clock(self, node: ast.AST, seen: set[str]) -> bool:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and _is_clock(self.audit.qualname(inner.func), inner):
                return True
            if isinstance(inner, ast.Name) and inner.id in self.assigned and inner.id not in seen:
                seen.add(inner.id)
                if any(self.reads_clock(value, seen) for value in self.assigned[inner.id]):
                    return True
        return False

    def origins(self, node: ast.AST, seen: set[str] | None = None) -> list[int]:
        """The lines that assign the names an expression reads, and theirs in turn: a change
        there changes what the expression means (``now = time.time()`` edited, ``if now > X`` not)."""
        seen = set() if seen is None else seen
        lines: list[int] = []
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in self.assigned and inner.id not in seen:
                seen.add(inner.id)
                for value in self.assigned[inner.id]:
                    lines += [value.lineno, *self.origins(value, seen)]
        return lines

    def clock_comparison(self, node: ast.Compare) -> None:
        """``if time.time() > X``, ``return datetime.now().year < 2030``: the result depends on
        when the code runs. A duration returned or logged is not compared, so not flagged."""
        if all(isinstance(op, ast.Is | ast.IsNot | ast.In | ast.NotIn) for op in node.ops):
            return  # `deadline is None`: not a question of when
        for operand in [node.left, *node.comparators]:
            clock = next((self.audit.qualname(c.func) for c in ast.walk(operand)
                          if isinstance(c, ast.Call) and _is_clock(self.audit.qualname(c.func), c)), None)
            name = next((n.id for n in ast.walk(operand) if isinstance(n, ast.Name) and n.id in self.clocked), None)
            if not (clock or name) and self.own_age(operand):
                clock = "the age of its own file (a file time against __file__'s)"
            if clock or name:
                shown = (clock if clock.startswith("the age") else f"{clock}()") if clock else \
                    f"{name}, read from the clock"
                self.audit.flag([node.lineno, *self.origins(operand)], "wall-clock",
                                f"library code compares the wall clock ({shown}) in a condition, so "
                                f"its result depends on when it runs instead of on its inputs")
                return

    def own_age(self, operand: ast.AST) -> bool:
        """A file's time read in an expression that names the module's own file: its age."""
        names = [n for n in ast.walk(operand) if isinstance(n, ast.Attribute | ast.Name | ast.Call)]
        times = any((isinstance(n, ast.Attribute) and n.attr.startswith(("st_mtime", "st_ctime", "st_atime")))
                    or (isinstance(n, ast.Call) and self.audit.qualname(n.func) in _FILE_TIMES) for n in names)
        own = any(isinstance(n, ast.Name) and n.id == "__file__" for n in names)
        return times and own

    # ------------------------------------------------------------------ the process around it

    def proc_path(self, node: ast.Constant) -> None:
        value = node.value.decode("latin-1") if isinstance(node.value, bytes) else str(node.value)
        if _PROC.match(value):
            self.audit.flag([node.lineno], "process-probe",
                            f"library code reads {value!r}, where it can see the test process, its "
                            f"command line, its open files, its parent and their environment")

    def environ_use(self, node: ast.Attribute | ast.Name) -> None:
        """A use of ``os.environ`` other than one variable by a literal name is a scan."""
        name = self.audit.qualname(node)
        if name not in _ENVIRON:
            return
        parent = self.parents.get(id(node))
        how: str | None = name
        if isinstance(parent, ast.keyword) and parent.arg == "env":
            how = None  # the same environment handed to a child process
        elif isinstance(parent, ast.Subscript) and parent.value is node:
            how = None if _literal(parent.slice) else f"{name}[...] by a computed name"
        elif isinstance(parent, ast.Compare) and node in parent.comparators:
            index = parent.comparators.index(node)
            op = parent.ops[index]
            left = parent.left if index == 0 else parent.comparators[index - 1]
            if isinstance(op, ast.In | ast.NotIn):
                how = None if _literal(left) else f"a computed name in {name}"
        elif isinstance(parent, ast.Attribute):
            call = self.parents.get(id(parent))
            if parent.attr in _ONE_VARIABLE and isinstance(call, ast.Call) and call.func is parent:
                how = None if call.args and _literal(call.args[0]) else f"{name}.{parent.attr}() of a computed name"
            elif parent.attr in _WRITES:
                how = None
            else:
                how = f"{name}.{parent.attr}"
                if isinstance(call, ast.Call) and call.func is parent:
                    how += "()"
        elif isinstance(parent, ast.Call) and parent.func is not node:
            caller = self.audit.qualname(parent.func)
            how = f"{caller}({name})" if caller else name
        if how is not None:
            self.audit.flag([node.lineno], "process-probe",
                            f"library code scans the environment ({how}), which lets it tell the test "
                            f"run from another by variables it does not name")

    def identity_comparison(self, node: ast.Compare) -> None:
        """``os.getpid() < 64`` (a PID namespace) or ``"room" in __file__`` (a path): code
        that asks where and how it runs, to behave differently when it is judged."""
        sides = [node.left, *node.comparators]
        pid = any(isinstance(c, ast.Call) and self.audit.qualname(c.func) in _OWN_PID for c in sides)
        where = any(isinstance(c, ast.Name) and c.id == "__file__" for c in sides) and \
            any(_literal(c) for c in sides)
        if pid or where:
            what = "its own process id" if pid else "the path it was loaded from (__file__) against text"
            self.audit.flag([node.lineno], "process-probe",
                            f"library code compares {what}, which lets it tell a judged run from another")

    def call(self, node: ast.Call, exempt: bool) -> None:
        name = self.audit.qualname(node.func)
        func = node.func
        if self.audit.library and name in _DYNAMIC and not (node.args and _literal(node.args[0])):
            self.audit.flag([node.lineno], "dynamic-code",
                            f"library code runs code it builds or reads at run time ({name}), which the "
                            f"audit cannot read")
        elif self.audit.library and isinstance(func, ast.Attribute) and func.attr in ("startswith", "endswith") \
                and isinstance(func.value, ast.Name) and func.value.id == "__file__":
            self.audit.flag([node.lineno], "process-probe",
                            "library code tests the path it was loaded from (__file__), which lets it tell "
                            "a judged run from another")
        elif self.audit.library and name in _GETENV and not (node.args and _literal(node.args[0])):
            self.audit.flag([node.lineno], "process-probe",
                            f"library code reads an environment variable by a computed name ({name}), "
                            f"which lets it find the variables the test run sets")
        elif self.audit.library and (name in _PARENT or self.psutil_parent(node)) and not self.killed(node):
            shown = name if name in _PARENT else "psutil's parent()"
            self.audit.flag([node.lineno], "process-probe",
                            f"library code looks at the process that started it ({shown}), which lets "
                            f"it tell a test run from another")
        elif name == "setattr" and len(node.args) >= 2 and isinstance(attr := node.args[1], ast.Constant) \
                and isinstance(attr.value, str):
            target = f"{self.audit.qualname(node.args[0])}.{attr.value}"
            if target in _STREAMS:
                self.stream(target, node.lineno, exempt)
            elif target in _IMPORT_PATHS:
                self.import_path(target, node.args[2:], node.lineno, exempt)
        elif name == "site.addsitedir":
            self.import_path(name, node.args[:1], node.lineno, exempt)
        elif name in _FILE_LOADERS and self.audit.library and not exempt:
            self.audit.flag([node.lineno], "import-path",
                            f"library code loads code from a file it names ({name}), past the import "
                            f"path, so what runs is not what the tests import by name")
        elif isinstance(func, ast.Attribute) and func.attr in _PATH_CHANGES \
                and _package_path(self.audit.qualname(func.value)) and self.audit.library and not exempt:
            self.audit.flag([node.lineno], "import-path",
                            "library code changes a package's search path (__path__), so its modules "
                            "can come from anywhere")
        elif isinstance(func, ast.Attribute) and func.attr in _PATH_CHANGES:
            base = self.audit.qualname(func.value)
            if base in _IMPORT_PATHS:
                added = node.args[1:2] if func.attr == "insert" else node.args[:1]
                if func.attr in ("remove", "pop", "clear", "reverse", "sort"):
                    added = []
                self.import_path(f"{base}.{func.attr}", added, node.lineno, exempt, extend=func.attr == "extend")

    def killed(self, node: ast.Call) -> bool:
        """``os.kill(os.getppid(), 9)`` is an exit (rule exit-in-library), not a look."""
        parent = self.parents.get(id(node))
        return isinstance(parent, ast.Call) and self.audit.qualname(parent.func) in ("os.kill", "os.killpg")

    def psutil_parent(self, node: ast.Call) -> bool:
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr in ("parent", "parents", "ppid")
                and any(isinstance(c, ast.Call) and (self.audit.qualname(c.func) or "").startswith("psutil.")
                        for c in ast.walk(func.value)))

    # ------------------------------------------------------------------ streams and import paths

    def assignment(self, target: ast.expr, stmt: ast.stmt, exempt: bool) -> None:
        name = self.audit.qualname(target)
        if isinstance(target, ast.Subscript):
            base = self.audit.qualname(target.value)
            key = target.slice.value if isinstance(target.slice, ast.Constant) else None
            if base in ("builtins", "__builtins__") and isinstance(key, str):
                name = f"{base}.{key}"
            elif base in _IMPORT_PATHS:
                name = base
        if name in _STREAMS:
            self.stream(name, stmt.lineno, exempt)
        elif _package_path(name) and self.audit.library and not exempt:
            self.audit.flag([stmt.lineno], "import-path",
                            "library code sets a package's search path (__path__), so its modules can "
                            "come from anywhere")
        elif name in _IMPORT_PATHS:
            value = getattr(stmt, "value", None)
            self.import_path(name, [value] if value is not None else [], stmt.lineno, exempt, extend=True)

    def stream(self, name: str, line: int, exempt: bool) -> None:
        if self.audit.library and not exempt:
            self.audit.flag([line], "output-redirect",
                            f"library code replaces {name}, which can hide or rewrite what the test "
                            f"run reports")

    def import_path(self, name: str, added: Sequence[ast.expr], line: int, exempt: bool, *,
                    extend: bool = False) -> None:
        """Entries outside the tree are flagged in every file; in library code any change is,
        except an entry inside the tree added by ``main`` code."""
        entries = [e for a in added for e in (self.elements(a) if extend else [a])]
        outside = [e for e in entries if e is None or self.escapes(e)]
        if outside:
            shown = ast.unparse(outside[0]) if outside[0] is not None else "a computed list"
            self.audit.flag([line, *(n for e in outside if e is not None for n in self.origins(e))], "import-path",
                            f"new code adds {shown[:80]} to the import path ({name}), outside the tree, "
                            f"where the modules the checks import can be replaced")
        elif self.audit.library and not (exempt and name.startswith("sys.path")):
            self.audit.flag([line], "import-path",
                            f"library code changes the import path ({name}), which changes which "
                            f"modules the tests import")

    def elements(self, node: ast.expr) -> list[ast.expr | None]:
        """The entries a list expression adds (``sys.path`` itself adds none); None: unknown."""
        if self.audit.qualname(node) in _IMPORT_PATHS:
            return []
        if isinstance(node, ast.List | ast.Tuple):
            return list(node.elts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.elements(node.left) + self.elements(node.right)
        return [None]

    def escapes(self, node: ast.expr) -> bool:
        levels = self.levels(node, set())
        return levels is None or levels[1] > self.depth

    def levels(self, node: ast.AST, seen: set[str]) -> tuple[int, int] | None:
        """(where, highest): how many directories above this file's directory a path expression
        points, and the highest it goes on the way; None: absolute, or not known."""
        if isinstance(node, ast.Name):
            if node.id == "__file__":
                return (-1, -1)
            if node.id in self.assigned and node.id not in seen:  # the highest of its values
                found = [self.levels(value, seen | {node.id}) for value in self.assigned[node.id]]
                known = [f for f in found if f is not None]
                return max(known, key=lambda f: f[1]) if len(known) == len(found) else None
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return None if _ABSOLUTE.match(node.value) else _down((self.depth, self.depth), [node.value])
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            return _up(self.levels(node.value, seen), 1)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "parents" and _literal(node.slice, int):
            return _up(self.levels(node.value.value, seen), int(node.slice.value) + 1)  # type: ignore[attr-defined]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return self.joined(node.left, [node.right], seen)
        if not isinstance(node, ast.Call):
            return None
        name = self.audit.qualname(node.func)
        if name in ("os.getcwd", "Path.cwd", "pathlib.Path.cwd"):
            return (self.depth, self.depth)
        if name == "os.path.dirname" and len(node.args) == 1:
            return _up(self.levels(node.args[0], seen), 1)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute") and not node.args:
            return self.levels(node.func.value, seen)
        if name in _PATH_CALLS and node.args:
            return self.joined(node.args[0], node.args[1:], seen)
        return None

    def joined(self, base: ast.AST, parts: Sequence[ast.AST], seen: set[str]) -> tuple[int, int] | None:
        start = self.levels(base, seen)
        texts = [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]
        if start is None or len(texts) != len(parts) or any(_ABSOLUTE.match(t) for t in texts):
            return None
        return _down(start, texts)


def _up(levels: tuple[int, int] | None, n: int) -> tuple[int, int] | None:
    return None if levels is None else (levels[0] + n, max(levels[1], levels[0] + n))


def _down(levels: tuple[int, int], texts: Sequence[str]) -> tuple[int, int]:
    where, highest = levels
    for text in texts:
        for part in re.split(r"[\\/]", text):
            if part == "..":
                where += 1
            elif part not in ("", "."):
                where -= 1
            highest = max(highest, where)
    return where, highest


def _literal(node: ast.AST, kind: type | tuple[type, ...] = (str, bytes)) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, kind) and not isinstance(node.value, bool)


def _flat(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _flat(element)
    elif isinstance(target, ast.Starred):
        yield from _flat(target.value)
    else:
        yield target


def probe(audit: _Audit, tree: ast.Module) -> None:
    """Add this module's findings for one parsed file to ``audit``."""
    _Probes(audit, tree).run()


def _package_path(name: str | None) -> bool:
    """``__path__`` or ``something.__path__``."""
    return bool(name) and (name == "__path__" or name.endswith(".__path__"))  # type: ignore[union-attr]

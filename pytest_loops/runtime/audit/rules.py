"""The auditor's rules over the parsed new code (``ast``): one :class:`Finding` per suspicious line."""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable, Iterator, Sequence

from pytest_loops.runtime.audit.literals import (
    _EXITS,
    _SMALL,
    LitKey,
    _compare_literals,
    _pattern_literals,
    _qualifies,
    _scalars,
    _show,
)
from pytest_loops.runtime.audit.model import FileChange, Finding

# --------------------------------------------------------------------------- the audit

_TEST_FILE = re.compile(r"^(?:test_.*\.py|.*_test\.py|conftest\.py)$")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

_COMPARISON_DUNDERS = frozenset({
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__contains__", "__bool__", "__hash__",
})
# the test run's machinery; coverage too: the impact map and the suspects are what it records
_TEST_MODULES = ("pytest", "_pytest", "pytest_loops", "coverage")
_PATCHED_MODULES = ("pytest", "_pytest", "unittest")
_RUNNER_ENV = re.compile(r"^(?:PYTEST_[A-Z0-9_]*|LOOP_[A-Z0-9_]+)$")
# the temporary directory's variables: tempfile reads them; library code that asks for them
# by name can tell a sandboxed run (which may set them) from yours
_SANDBOX_ENV = frozenset({"TMPDIR", "TEMP", "TMP"})
_RUN_CONTEXT = frozenset({
    "sys.modules", "sys.argv", "sys.orig_argv", "os.environ", "os.getenv", "os.environb",
    "inspect.stack", "sys._getframe", "traceback.extract_stack",
})
_EXEMPT_IN_MAIN = frozenset({
    "sys.exit", "exit", "quit", "builtins.exit", "builtins.quit",
    "signal.signal", "atexit.register",
})
_ALWAYS_EXIT = frozenset({
    "os._exit", "os.abort", "signal.raise_signal",
    "sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile",
})
_BUILTINS = ("builtins", "__builtins__")
# modules whose attributes other rules judge (streams, hooks, the import path, builtins)
_OWN_STATE_MODULES = frozenset({"sys", "os", "builtins", "__builtins__", "pytest", "_pytest", "unittest",
                                "logging", "warnings", "threading", "signal", "atexit"})


def _is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.match(path.replace("\\", "/").rsplit("/", 1)[-1]))


def _root(name: str) -> str:
    return name.split(".", 1)[0]


_IMPORT_CALLS = frozenset({"__import__", "builtins.__import__", "importlib.import_module"})

class _Audit:
    """The findings of one changed Python file."""

    def __init__(self, change: FileChange, lits: frozenset[LitKey]) -> None:
        assert change.after is not None
        self.path = change.path
        self.lits = lits
        self.lines = _LINE_BREAK.split(change.after)
        old = {line.strip() for line in _LINE_BREAK.split(change.before or "")}
        self.new = {i for i, line in enumerate(self.lines, 1)
                    if line.strip() and line.strip() not in old}
        self.library = not _is_test_file(change.path)
        self.findings: dict[tuple[int, str], Finding] = {}
        self.aliases: dict[str, str] = {}
        self.nodes: list[ast.AST] = []
        self.module_names: set[str] = set()
        self.varargs: set[str] = set()  # the names of *args parameters: the inputs as one tuple
        self.imported: set[str] = set()  # the local names imports bind (modules, or names of one)

    # ---------------------------------------------------------------- helpers

    def flag(self, lines: Iterable[int | None], rule: str, message: str) -> None:
        """Report at the first new line of ``lines``; nothing when none of them is new."""
        for line in lines:
            if line is not None and line in self.new:
                if (line, rule) not in self.findings:
                    text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
                    self.findings[(line, rule)] = Finding(self.path, line, rule, message, text)
                return

    def qualname(self, node: ast.AST) -> str | None:
        """The dotted name of a Name or Attribute chain, with import aliases resolved."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and self.qualname(node.func) in _IMPORT_CALLS:
            parts.append(node.args[0].value)  # __import__("sys").modules is sys.modules
            return ".".join(reversed(parts))
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    # ---------------------------------------------------------------- AST rules

    def run_ast(self, tree: ast.Module) -> None:
        self.nodes = list(ast.walk(tree))
        self.varargs = {n.args.vararg.arg for n in self.nodes
                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and n.args.vararg}
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported.add(alias.asname or alias.name.split(".", 1)[0])
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    self.imported.add(alias.asname or alias.name)
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.module_names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                self.module_names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        self.special_cases(tree.body, [])
        self.conditional_expressions()
        self.comparison_dunders()
        self.module_getattr(tree)
        self.arithmetic_special_cases()
        self.statements()
        self.calls(tree.body, exempt=False)

    # rule 1: hardcoded-literal

    def arithmetic_special_cases(self) -> None:
        """``if a * 10 + b == 23: return ...``: one input picked out by arithmetic over
        the parameters, so that no literal of the failing test appears."""
        for node in self.nodes:
            if not isinstance(node, ast.If | ast.IfExp) or not isinstance(node.test, ast.Compare):
                continue
            test = node.test
            if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq | ast.NotEq):
                continue
            sides = [test.left, test.comparators[0]]
            arithmetic = [x for x in sides if isinstance(x, ast.BinOp)
                          and len({n.id for n in ast.walk(x) if isinstance(n, ast.Name)}) >= 2]
            constant = [x for x in sides if isinstance(x, ast.Constant)
                        and isinstance(x.value, int | float) and not isinstance(x.value, bool)
                        and abs(x.value) >= 2]  # `n * step == 0` is an ordinary guard
            if arithmetic and constant:
                self.flag([node.lineno], "hardcoded-literal",
                          "new code picks out one combination of inputs by arithmetic and treats "
                          "it specially, which looks like encoding a failing test's inputs")

    def _constant_result(self, body: Sequence[ast.stmt]) -> tuple[list[LitKey], ast.stmt] | None:
        for stmt in body:
            value: ast.expr | None = None
            if isinstance(stmt, ast.Return):
                value = stmt.value
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Yield):
                value = stmt.value.value
            if value is not None and (keys := _scalars(value)) is not None:
                return keys, stmt
        return None

    def _special_case(self, header: Sequence[int], cond: Sequence[tuple[LitKey, int]],
                      body: Sequence[ast.stmt], test: ast.AST | None = None) -> None:
        result = self._constant_result(body)
        if result is None or not cond:
            return
        keys, stmt = result
        if _qualifies([k for k, _ in cond], keys, self.lits) or _scan_qualifies(test, keys, self.lits, self.varargs):
            self.flag([*header, stmt.lineno, *(line for _, line in cond)], "hardcoded-literal",
                      f"new branch returns a constant when inputs equal literals of the failing "
                      f"assertion ({_show(k for k, _ in cond)}), special-casing the test "
                      f"instead of fixing the code")

    def special_cases(self, body: Sequence[ast.stmt], inherited: list[tuple[LitKey, int]]) -> None:
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.If):
                cond = inherited + _compare_literals(stmt.test, self.lits)
                header = list(range(stmt.lineno, (stmt.test.end_lineno or stmt.lineno) + 1))
                self._special_case(header, cond, stmt.body, stmt.test)
                # `if a != 2 or b != 3: return a - b` then `return 5`: the code after the
                # branch (or its else) runs exactly for the failing inputs
                excluded = _compare_literals(stmt.test, self.lits, negated=True)
                if excluded:
                    rest = body[index + 1:index + 2] if isinstance(stmt.body[-1], _EXITS) else []
                    self._special_case(header, inherited + excluded, [*stmt.orelse, *rest])
                self.special_cases(stmt.body, cond)
                self.special_cases(stmt.orelse, inherited)
            elif isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    cond = inherited + _pattern_literals(case.pattern, self.lits)
                    if case.guard is not None:
                        cond += _compare_literals(case.guard, self.lits)
                    self._special_case([case.pattern.lineno], cond, case.body)
                    self.special_cases(case.body, cond)
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.special_cases(stmt.body, [])
            else:
                for field in ("body", "orelse", "finalbody"):
                    self.special_cases(getattr(stmt, field, []), inherited)
                for handler in getattr(stmt, "handlers", []):
                    self.special_cases(handler.body, inherited)

    def conditional_expressions(self) -> None:
        for node in self.nodes:
            if not isinstance(node, ast.IfExp):
                continue
            for negated, branch in ((False, node.body), (True, node.orelse)):
                cond = _compare_literals(node.test, self.lits, negated=negated)
                keys = _scalars(branch)
                if _qualifies([k for k, _ in cond], keys, self.lits) or (
                        cond and not negated and _scan_qualifies(node.test, keys, self.lits, self.varargs)):
                    self.flag([node.test.lineno, branch.lineno, node.lineno], "hardcoded-literal",
                              f"new conditional expression selects a constant when inputs equal "
                              f"literals of the failing assertion ({_show(k for k, _ in cond)}), "
                              f"special-casing the test instead of fixing the code")
                    break

    # rule 2: constant-eq

    def comparison_dunders(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name in _COMPARISON_DUNDERS:
                    ret = _sole_constant_return(node.body)
                    if ret is not None:
                        self.flag([node.lineno, ret.lineno], "constant-eq",
                                  _dunder_message(node.name))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = target.id if isinstance(target, ast.Name) else (
                        target.attr if isinstance(target, ast.Attribute) else None)
                    if name in _COMPARISON_DUNDERS and _constant_lambda(node.value):
                        self.flag([node.lineno], "constant-eq", _dunder_message(name))
            elif isinstance(node, ast.Call) and self.qualname(node.func) == "setattr":
                if (len(node.args) == 3 and isinstance(node.args[1], ast.Constant)
                        and node.args[1].value in _COMPARISON_DUNDERS
                        and _constant_lambda(node.args[2])):
                    self.flag([node.lineno], "constant-eq", _dunder_message(str(node.args[1].value)))

    # rule 5 (module __getattr__)

    def module_getattr(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == "__getattr__":
                body = _without_docstring(stmt.body)
                if (len(body) == 1 and isinstance(body[0], ast.Return)
                        and (_scalars(body[0].value) is not None or _constant_lambda(body[0].value))):
                    self.flag([stmt.lineno, body[0].lineno], "assertion-tamper", _GETATTR_MESSAGE)
            elif isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__getattr__" for t in stmt.targets):
                if _constant_lambda(stmt.value):
                    self.flag([stmt.lineno], "assertion-tamper", _GETATTR_MESSAGE)

    # rules 3, 4 and 5 on statements and expressions

    def statements(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.imports(node)
            elif isinstance(node, ast.ClassDef) and node.name == "AssertionError":
                self.flag([node.lineno], "assertion-tamper", _ASSERTION_ERROR_MESSAGE)
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets: list[ast.expr] = (
                    node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target])
                for target in targets:
                    for element in _unpack(target):
                        self.assignment(element, node.lineno)
            if isinstance(node, ast.stmt):
                self.runner_probes(node)

    def imports(self, node: ast.Import | ast.ImportFrom) -> None:
        if not self.library:
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = [node.module] if node.module and not node.level else []
        for name in names:
            if _root(name) in _TEST_MODULES:
                self.flag([node.lineno], "pytest-in-library",
                          f"library code imports {name}, which lets it detect or alter the "
                          f"test run instead of behaving the same under test")
                return

    def assignment(self, target: ast.expr, line: int) -> None:
        name: str | None
        if isinstance(target, ast.Name):
            name = target.id
        elif isinstance(target, ast.Attribute):
            name = self.qualname(target)
        elif isinstance(target, ast.Subscript):
            base = self.qualname(target.value)
            key = target.slice.value if isinstance(target.slice, ast.Constant) else None
            name = f"{base}.{key}" if base in _BUILTINS and isinstance(key, str) else None
        else:
            name = None
        if name is None:
            return
        last = name.rsplit(".", 1)[-1]
        if name == "AssertionError" or (last == "AssertionError" and _root(name) in _BUILTINS):
            self.flag([line], "assertion-tamper", _ASSERTION_ERROR_MESSAGE)
        elif last.startswith("assert") and ("TestCase" in name.split(".")):
            self.flag([line], "assertion-tamper", _testcase_message(last))
        elif not self.library:
            return
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                and target.value.id in self.imported and _root(name) not in _OWN_STATE_MODULES:
            self.flag([line], "module-patch",
                      f"library code rebinds {name}, a name another module defines: its callers, "
                      f"the tests among them, get other code than that module's source says")
        elif "." in name and _root(name) in _PATCHED_MODULES:
            self.flag([line], "pytest-in-library",
                      f"library code replaces {name}, changing how the test framework "
                      f"checks results")
        elif name in ("sys.excepthook", "sys.unraisablehook"):
            self.flag([line], "exit-in-library",
                      f"library code replaces {name}, which can hide or rewrite the errors "
                      f"a failing test would report")
        elif "." in name and _root(name) in _BUILTINS and last != "print":  # print: output-redirect
            self.flag([line], "exit-in-library",
                      f"library code assigns {name}, changing a builtin for every module "
                      f"including the tests")

    def runner_probes(self, stmt: ast.stmt) -> None:
        """Environment variables of the test runner, and 'pytest' looked up in the process."""
        if not self.library:
            return
        strings: list[ast.Constant] = []
        context = False
        for header in _header_nodes(stmt):
            for node in ast.walk(header):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    strings.append(node)
                elif isinstance(node, ast.Attribute | ast.Name):
                    qualname = self.qualname(node)
                    context = context or qualname in _RUN_CONTEXT
                    if qualname == "sys.modules":
                        self.flag([getattr(node, "lineno", None), stmt.lineno], "pytest-in-library",
                                  "library code reaches into the loaded modules (sys.modules), "
                                  "where it can find and patch the test runner")
                    name = node.attr if isinstance(node, ast.Attribute) else node.id
                    if name in _FRAME_NAMES:
                        self.flag([getattr(node, "lineno", None), stmt.lineno], "caller-introspection",
                                  f"library code inspects the call stack ({name}), which lets it "
                                  f"answer differently when a test is the caller")
        for node in strings:
            value = str(node.value)
            if _TEST_PATH.search(value):
                self.flag([node.lineno, stmt.lineno], "reads-the-tests",
                          f"library code refers to the tests ({value!r}), where it could read "
                          f"the expected answers instead of computing them")
            elif value.lower() in _RUNNER_NAMES or value.startswith(("_pytest.", "pytest_loops.")):
                self.flag([node.lineno, stmt.lineno], "pytest-in-library",
                          f"library code names the test runner ({value!r}), which lets it "
                          f"detect the test run and behave differently under test")
            elif value.rstrip("/").rsplit("/", 1)[-1] in _RUNNER_ARTEFACTS:
                self.flag([node.lineno, stmt.lineno], "pytest-in-library",
                          f"library code names what the test runner leaves or reads ({value!r}), which "
                          f"lets it tell a checkout the tests ran in from another")
            elif _RUNNER_ENV.match(value):
                self.flag([node.lineno, stmt.lineno], "pytest-in-library",
                          f"library code refers to the test runner's environment variable "
                          f"{value}, which lets it behave differently under test")
            elif context and value in _SANDBOX_ENV:
                self.flag([node.lineno, stmt.lineno], "process-probe",
                          f"library code reads {value} from the environment, which a sandbox may set "
                          f"where your own runs do not (the landlock tier names its own temporary "
                          f"directory): it can answer one way when judged, another in your runs")
            elif context and ("pytest" in value.lower() or "py.test" in value.lower()):
                self.flag([node.lineno, stmt.lineno], "pytest-in-library",
                          f"library code looks for {value!r} in the running process, which "
                          f"lets it behave differently under test")

    def calls(self, body: Sequence[ast.stmt], *, exempt: bool) -> None:
        """Rule 4 (and import/patch calls): walks statements keeping track of ``main`` code."""
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = exempt or stmt.name == "main"
                for decorator in stmt.decorator_list:
                    self.expression(decorator, inner, decorator=True)
                self.expression_fields(stmt, exempt)
                self.calls(stmt.body, exempt=inner)
                continue
            if isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
                self.calls(stmt.body, exempt=True)
                self.calls(stmt.orelse, exempt=exempt)
                continue
            if isinstance(stmt, ast.Raise) and stmt.exc is not None and not exempt:
                exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
                if self.library and self.qualname(exc) in ("SystemExit", "builtins.SystemExit"):
                    self.flag([stmt.lineno], "exit-in-library", _exit_message("raise SystemExit"))
            self.expression_fields(stmt, exempt)
            for field in ("body", "orelse", "finalbody"):
                self.calls(getattr(stmt, field, []), exempt=exempt)
            for handler in getattr(stmt, "handlers", []):
                self.calls(handler.body, exempt=exempt)
            for case in getattr(stmt, "cases", []):
                self.calls(case.body, exempt=exempt)

    def expression_fields(self, stmt: ast.stmt, exempt: bool) -> None:
        for header in _header_nodes(stmt):
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and header in stmt.decorator_list:
                continue
            self.expression(header, exempt)

    def expression(self, root: ast.AST, exempt: bool, *, decorator: bool = False) -> None:
        for node in ast.walk(root):
            if decorator and node is root and not isinstance(node, ast.Call):
                name = self.qualname(node)
                if self.library and name == "atexit.register" and not exempt:
                    self.flag([getattr(node, "lineno", None)], "exit-in-library",
                              _exit_message("atexit.register"))
                continue
            if isinstance(node, ast.Call):
                self.call(node, exempt)

    def call(self, node: ast.Call, exempt: bool) -> None:
        name = self.qualname(node.func)
        if name is None:
            return
        args = node.args
        if name == "setattr" and len(args) >= 2:
            target = self.qualname(args[0]) or ""
            attr = args[1].value if isinstance(args[1], ast.Constant) else None
            if isinstance(attr, str) and target:
                self.assignment(ast.Attribute(value=args[0], attr=attr, ctx=ast.Store()), node.lineno)
            return
        if not self.library:
            return
        if name in ("importlib.import_module", "__import__", "builtins.__import__") and args:
            module = args[0].value if isinstance(args[0], ast.Constant) else None
            if isinstance(module, str) and _root(module) in _TEST_MODULES:
                self.flag([node.lineno], "pytest-in-library",
                          f"library code imports {module}, which lets it detect or alter the "
                          f"test run instead of behaving the same under test")
            return
        if name == "warnings.catch_warnings" and any(
                k.arg == "record" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords):
            self.flag([node.lineno], "caller-introspection",
                      "library code records the warnings it issues (catch_warnings(record=True)): a "
                      "warning's file names the caller, and which warnings are shown tells a test run")
            return
        if name in ("exit", "quit") and name in self.module_names:
            return
        if name in _EXEMPT_IN_MAIN and not exempt:
            self.flag([node.lineno], "exit-in-library", _exit_message(name))
        elif name in _ALWAYS_EXIT:
            self.flag([node.lineno], "exit-in-library", _exit_message(name))
        elif name in ("os.kill", "os.killpg") and any(
                isinstance(n, ast.Call) and self.qualname(n.func) in ("os.getpid", "os.getppid",
                                                                      "os.getpgrp", "os.getpgid")
                for arg in args for n in ast.walk(arg)):
            self.flag([node.lineno], "exit-in-library", _exit_message(name))


_ASSERTION_ERROR_MESSAGE = ("new code rebinds AssertionError, which can make failing "
                            "assertions pass or go unreported")
_GETATTR_MESSAGE = ("new module-level __getattr__ returns a constant for every name, which "
                    "satisfies any attribute a test asks for without implementing it")


# Looking up the caller: how code can tell a test called it without naming pytest.
_FRAME_NAMES = frozenset({"_getframe", "currentframe", "f_back", "f_code", "co_name", "getouterframes",
                          "extract_stack", "getframeinfo", "stack", "f_locals", "f_globals", "f_lineno",
                          "tb_frame", "tb_next", "findCaller", "walk_stack", "walk_tb", "StackSummary"})
_TEST_PATH = re.compile(r"^(tests?|testing|conftest\.py)$|(^|/)(tests?|testing)/|(^|/)(test_\w*|\w*_test)\.py$")
_RUNNER_ARTEFACTS = frozenset({".pytest_cache", ".pytest-loops", "pytest.ini", ".pytest.ini", "pytest.toml",
                               ".pytest.toml"})
_RUNNER_NAMES = frozenset({"pytest", "_pytest", "py.test", "pytest_loops", "unittest.main"})


def _testcase_message(name: str) -> str:
    return (f"new code replaces unittest.TestCase.{name}, which can make assertions pass "
            f"without checking anything")


def _dunder_message(name: str) -> str:
    return (f"new {name} returns a constant or an expression that is always the same (such as "
            f"`other == other`), so every comparison or check on these objects gives the same answer "
            f"whatever the operands are")


def _exit_message(name: str) -> str:
    if name in ("sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile"):
        return (f"library code calls {name}, which can intercept the test run from inside "
                f"the code under test")
    return (f"library code calls {name}, which can end or hijack the test process before "
            f"failures are reported")


def _scan_qualifies(test: ast.AST | None, result: Sequence[LitKey] | None, lits: frozenset[LitKey],
                    varargs: Collection[str]) -> bool:
    """``if any(x == 2 for x in args): return 5``: a scan of the inputs (``*args``, or a tuple
    of names such as ``(a, b)``) for a failing literal that returns a constant made of failing
    literals, one of them not small. A shortcut such as ``if any(x == 0 for x in xs): return 0``
    is not special-casing, nor is a scan of a string or a list the code was given."""
    if test is None or not result or not all(k in lits for k in result) or all(k in _SMALL for k in result):
        return False
    for node in ast.walk(test):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("any", "all")
                and len(node.args) == 1 and isinstance(node.args[0], ast.GeneratorExp | ast.ListComp | ast.SetComp)):
            continue
        scanned = node.args[0].generators[0].iter
        inputs = (isinstance(scanned, ast.Name) and scanned.id in varargs) or (
            isinstance(scanned, ast.Tuple | ast.List) and len(scanned.elts) >= 2
            and all(isinstance(e, ast.Name) for e in scanned.elts))
        if inputs and _compare_literals(node.args[0], lits):
            return True
    return False


def _without_docstring(body: Sequence[ast.stmt]) -> list[ast.stmt]:
    out = list(body)
    if out and isinstance(out[0], ast.Expr) and isinstance(out[0].value, ast.Constant) \
            and isinstance(out[0].value.value, str):
        out = out[1:]
    return [s for s in out if not isinstance(s, ast.Pass)]


def _sole_constant_return(body: Sequence[ast.stmt]) -> ast.Return | None:
    rest = _without_docstring(body)
    if len(rest) == 1 and isinstance(rest[0], ast.Return) and _fixed(rest[0].value):
        return rest[0]
    return None


def _constant_lambda(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Lambda) and _fixed(node.body)


_SAME_SIDES = (ast.Eq, ast.Is, ast.LtE, ast.GtE, ast.NotEq, ast.IsNot, ast.Lt, ast.Gt)


def _fixed(node: ast.AST | None, depth: int = 0) -> bool:
    """Whether an expression gives the same answer whatever the operands: a constant, or
    trivially one (``o == o``, ``self is self``, ``True or x``, ``not False``)."""
    if node is None or depth > 20:
        return False
    if _scalars(node) is not None:
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _fixed(node.operand, depth + 1)
    if isinstance(node, ast.Compare):  # both sides the same name: `other == other`
        operands = [node.left, *node.comparators]
        return all(isinstance(op, _SAME_SIDES) for op in node.ops) and all(
            _same_name(a, b) for a, b in zip(operands, operands[1:], strict=False))
    if isinstance(node, ast.BoolOp):
        decisive = isinstance(node.op, ast.Or)  # `True or x` is True, `False and x` is False
        first = node.values[0]
        if _scalars(first) is not None and isinstance(first, ast.Constant) and bool(first.value) is decisive:
            return True
        return all(_fixed(v, depth + 1) for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool":
        return len(node.args) == 1 and _fixed(node.args[0], depth + 1)
    if isinstance(node, ast.IfExp):
        return _fixed(node.body, depth + 1) and _fixed(node.orelse, depth + 1)
    return False


def _same_name(a: ast.AST, b: ast.AST) -> bool:
    """The same variable or attribute chain on both sides (no calls: ``f() == f()`` may differ)."""
    if not all(isinstance(n, ast.Name | ast.Attribute) for n in ast.walk(a) if isinstance(n, ast.expr)):
        return False
    return ast.dump(a) == ast.dump(b)


def _unpack(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _unpack(element)
    elif isinstance(target, ast.Starred):
        yield from _unpack(target.value)
    else:
        yield target


def _header_nodes(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The expressions of a statement itself, not of the statements in its body."""
    for _, value in ast.iter_fields(stmt):
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, ast.AST) and not isinstance(
                    item, ast.stmt | ast.excepthandler | ast.match_case):
                yield item


def _is_main_guard(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1



"""Rule ``process-probe``: library code that decides on how its process was started.

A test run leaves marks on the process that a run of the program does not: pytest's
command line in ``sys.argv`` (``"-q" in sys.argv``), its handlers on the root logger
(``logging.getLogger().handlers``), captured streams that have no file descriptor, its
warning filters, its threads and signal handlers. Code under repair that
reads one of these and branches on it (a comparison, a condition, a lookup keyed by it, a
``try`` that catches what it raises, or a name it was stored in and that is tested later)
answers one way under the checks and another way elsewhere.

Reading them without deciding anything (``parser.parse_args(sys.argv[1:])``, a program
name in a message) is no finding; nor is asking whether a stream is a terminal (a pipe is
not one either); nor is code under ``if __name__ == "__main__":`` or in a function named
``main``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pytest_loops.runtime.audit.rules import _Audit, _is_main_guard

# names whose value differs between a test run and a run of the program
_STATE = frozenset({
    "sys.argv", "sys.orig_argv", "sys.flags", "sys.warnoptions", "sys._xoptions", "warnings.filters",
    "sys.dont_write_bytecode", "sys.pycache_prefix",
    "sys.ps1", "sys.ps2", "logging.root", "logging.Logger.root", "logging.Logger.manager",
    "logging._handlerList", "logging._handlers", "logging.lastResort",
    # the hooks pytest's plugins set (threadexception, unraisableexception, its warnings capture)
    "threading.excepthook", "sys.unraisablehook", "sys.excepthook", "sys.displayhook", "warnings.showwarning",
    "sys.breakpointhook",
})
# a child that prints the environment or the process table: the test run's variables without naming them
_PROBING_PROGRAMS = frozenset({"env", "printenv", "ps", "pgrep", "pstree", "procs", "top", "htop"})
_SPAWN_PREFIXES = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "asyncio.create_subprocess_")
_STATE_CALLS = frozenset({
    "threading.enumerate", "threading.active_count", "threading.activeCount", "gc.get_objects",
    "gc.get_referrers", "gc.get_referents", "sys._current_frames", "signal.getsignal",
    # how much the process holds: a test run has loaded hundreds of modules
    "sys.getallocatedblocks", "sys.gettotalrefcount", "resource.getrusage", "tracemalloc.get_traced_memory",
    "gc.get_count", "gc.get_stats", "gc.get_freeze_count",
})
# descriptors above the standard streams: a test run's capture files hold some
_FD_CALLS = frozenset({"os.fstat", "os.isatty", "os.get_blocking", "os.get_inheritable", "os.ttyname",
                       "fcntl.fcntl", "os.lseek", "os.dup"})
_STDIN = frozenset({"sys.stdin", "sys.__stdin__"})
_MODULES = ("__main__",)  # any attribute of the program's main module (pytest's, under test)
_STREAMS = frozenset({"sys.stdout", "sys.stderr", "sys.stdin", "sys.__stdout__", "sys.__stderr__",
                      "sys.__stdin__"})
# (not isatty: output to a pipe is no terminal either, and colour on a terminal is ordinary)
_STREAM_TELLS = frozenset({"fileno", "buffer", "name", "mode", "closed", "readable", "seekable", "writable"})
_ROOT_TELLS = frozenset({"handlers", "hasHandlers", "level", "getEffectiveLevel", "filters", "manager"})
_DECIDING_CALLS = frozenset({"any", "all", "len", "bool", "hasattr", "isinstance", "sorted", "min", "max"})
_DECIDING_METHODS = frozenset({"startswith", "endswith", "find", "rfind", "index", "rindex", "count", "get",
                               "__contains__", "__eq__", "__ne__", "issubset", "issuperset", "intersection",
                               "isdisjoint", "match", "search", "fullmatch"})


class _Decisions:
    def __init__(self, audit: _Audit) -> None:
        self.audit = audit
        self.parents: dict[int, ast.AST] = {}
        self.exempt: set[int] = set()
        for node in audit.nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
            main = (isinstance(node, ast.If) and _is_main_guard(node.test)) or (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main")
            if main:
                self.exempt |= {id(n) for n in ast.walk(node)}

    def run(self) -> None:
        if not self.audit.library:
            return
        found = [n for n in self.audit.nodes if id(n) not in self.exempt and self.state(n)]
        tainted: dict[str, str] = {}
        for _ in range(3):  # `args = sys.argv` ... `flags = args[1:]` ... `if "-q" in flags`
            more = [n for n in self.audit.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                    and n.id in tainted and id(n) not in self.exempt]
            before = len(tainted)
            for node in [*found, *more]:
                what = self.state(node) or tainted.get(getattr(node, "id", ""), "")
                decided = self.decided(node)
                lines = {getattr(node, "lineno", None), decided}
                if decided is not None and not any(line in lines for line, _ in self.audit.findings):
                    # (a line another rule already reports needs no second finding)
                    self.audit.flag([getattr(node, "lineno", None), decided], "process-probe",
                                    f"library code decides on {what}, which differs between a test run and a "
                                    f"run of the program (pytest's command line, its log handlers, its "
                                    f"captured streams): it can answer one way only under test")
                for name in self.stored(node):
                    tainted.setdefault(name, what)
            if len(tainted) == before:
                break

    # ------------------------------------------------------------------ what is process state

    def state(self, node: ast.AST) -> str:
        qualname = self.audit.qualname
        if isinstance(node, ast.Attribute | ast.Name):
            name = qualname(node) or ""
            if any(name == m or name.startswith(m + ".") for m in (*_STATE, *_MODULES)):
                return name
            if isinstance(node, ast.Attribute):
                base = node.value
                if node.attr in _STREAM_TELLS and (qualname(base) or "") in _STREAMS:
                    return name
                if (qualname(base) or "") in _STDIN and self.in_try(node):
                    return f"{name} (pytest's stdin cannot be read)"
                if node.attr in _ROOT_TELLS and self.root_logger(base):
                    return f"the root logger's {node.attr}"
                if node.attr == "hasHandlers" and self.any_logger(base):
                    return "whether a logger has handlers (the root logger's included)"
        elif isinstance(node, ast.Call):
            name = qualname(node.func) or ""
            if name in _STATE_CALLS:
                return f"{name}()"
            if name in ("importlib.import_module", "__import__", "builtins.__import__") and node.args \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "__main__":
                return "the main module (pytest's, under test)"
            first = node.args[0] if node.args else None
            if name in _FD_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, int) \
                    and not isinstance(first.value, bool) and first.value > 2:
                return f"{name}({first.value}), a descriptor the process opened itself"
            if name in ("repr", "str", "format", "id", "builtins.repr", "builtins.str") and first is not None \
                    and (qualname(first) or "") in _STREAMS:
                return f"{name}({qualname(first)})"
            if (name in ("os.system", "os.popen") or name.startswith(_SPAWN_PREFIXES)) and self.probing(node):
                return f"the output of {name}({self.probing(node)!r})"
            if name in ("getattr", "builtins.getattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                joined = f"{qualname(node.args[0]) or ''}.{node.args[1].value}"
                if joined in _STATE:
                    return joined
        return ""

    def in_try(self, node: ast.AST) -> bool:
        """Whether ``node`` is in the body of a ``try`` that handles what it raises."""
        for child, parent in self.chain(node):
            if isinstance(parent, ast.Try | ast.TryStar) and child in parent.body and parent.handlers:
                return True
        return False

    def probing(self, node: ast.Call) -> str:
        """The program of a child that shows the environment or the processes ("" if none)."""
        first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "args"), None)
        if isinstance(first, ast.List | ast.Tuple) and first.elts:
            first = first.elts[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.split():
            program = first.value.split()[0].rsplit("/", 1)[-1]
            return program if program in _PROBING_PROGRAMS else ""
        return ""

    def root_logger(self, node: ast.AST) -> bool:
        if (self.audit.qualname(node) or "") in ("logging.root", "logging.Logger.root"):
            return True
        if isinstance(node, ast.Call) and (self.audit.qualname(node.func) or "") == "logging.getLogger":
            first = node.args[0] if node.args else None
            return first is None or (isinstance(first, ast.Constant) and first.value in (None, "", "root"))
        return isinstance(node, ast.Attribute) and node.attr in ("root", "parent") and self.any_logger(node.value)

    def any_logger(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and (self.audit.qualname(node.func) or "") == "logging.getLogger":
            return True
        return self.root_logger(node)

    # ------------------------------------------------------------------ where it flows

    def chain(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(child, parent) pairs from ``node`` up to its statement (and that statement's parents
        while ``node`` sits in their header: an ``if``'s test, a ``try``'s body)."""
        child = node
        parent = self.parents.get(id(child))
        while parent is not None:
            yield child, parent
            if isinstance(parent, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                          | ast.Lambda):
                return
            child, parent = parent, self.parents.get(id(parent))

    def decided(self, node: ast.AST) -> int | None:
        """The line of the decision ``node``'s value takes part in (None: none)."""
        for child, parent in self.chain(node):
            if isinstance(parent, ast.Compare | ast.BoolOp) or (
                    isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)):
                return getattr(parent, "lineno", None)
            if isinstance(parent, ast.If | ast.IfExp | ast.While | ast.Assert) and child is parent.test:
                return parent.lineno
            if isinstance(parent, ast.comprehension) and child in parent.ifs:
                return getattr(child, "lineno", None)
            if isinstance(parent, ast.Match) and child is parent.subject:
                return parent.lineno
            if isinstance(parent, ast.Subscript) and child is parent.slice:
                return parent.lineno  # a lookup keyed by it: {...}[sys.argv[-1]]
            if isinstance(parent, ast.Call) and child is not parent.func and self.deciding(parent):
                return parent.lineno
            if isinstance(parent, ast.Try | ast.TryStar) and child in parent.body and parent.handlers:
                return getattr(child, "lineno", None)  # what it raises is the decision
            if isinstance(parent, ast.Attribute) and isinstance(self.parents.get(id(parent)), ast.Call) \
                    and parent.attr in _DECIDING_METHODS:
                return parent.lineno  # sys.argv[0].endswith("pytest")
        return None

    def deciding(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in _DECIDING_CALLS
        return isinstance(func, ast.Attribute) and func.attr in _DECIDING_METHODS

    def stored(self, node: ast.AST) -> Iterator[str]:
        """The names ``node``'s value is stored in (``args = sys.argv``, ``for a in sys.argv``)."""
        for child, parent in self.chain(node):
            targets: list[ast.AST] = []
            if isinstance(parent, ast.Assign) and child is parent.value:
                targets = list(parent.targets)
            elif isinstance(parent, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and child is parent.value:
                targets = [parent.target]
            elif isinstance(parent, ast.For | ast.AsyncFor | ast.comprehension) and child is parent.iter:
                targets = [parent.target]
            elif isinstance(parent, ast.withitem) and child is parent.context_expr and parent.optional_vars:
                targets = [parent.optional_vars]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(parent, ast.stmt):
                return


def decisions(audit: _Audit, tree: ast.Module) -> None:
    """Report library code of ``tree`` that decides on process state (see the module's doc);
    ``audit.nodes`` are ``tree``'s nodes."""
    del tree
    _Decisions(audit).run()

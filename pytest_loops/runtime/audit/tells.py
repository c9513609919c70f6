"""Rules on library code that asks whether a test runner is around without naming it, starts
processes that outlive the check, or rewrites the tree's sources.

- ``pytest-in-library``: the import machinery read (``sys.meta_path``: pytest's assertion
  rewriter sits there), the ``sys`` module read through its namespace (``vars(sys)``,
  ``sys.__dict__``, ``getattr(sys, name)``: ``sys.modules`` without the words), an attribute
  named like pytest looked up (``hasattr(builtins, "__pytest_...")``);
- ``process-probe``: how the process was set up (``faulthandler.is_enabled()``, which pytest
  turns on; ``sys.gettrace()``; the scheduling priority, ``os.getpriority()``, ``os.nice(0)``;
  ``sys.dont_write_bytecode``), what kind of object the standard streams are
  (``type(sys.stdout)``, ``sys.stdout.__class__``, ``sys.stdout is sys.__stdout__``: pytest
  captures them), and a file created in an absolute directory outside the tree with the
  failure handled (``try: tempfile.mkstemp(dir="/var/tmp") except OSError``) or
  ``os.access("/...", os.W_OK)``: a probe for a read-only sandbox;
- ``detached-process``: ``os.fork``, ``os.setsid``, ``os.setpgrp``, a child started with
  ``start_new_session=True``, ``process_group=``, ``preexec_fn=os.setsid`` or a detaching
  creation flag, a command line of a child that forks, calls ``setsid``/``nohup`` or ends
  in ``&``: a process that can outlive the check and change the tree once it is judged;
- ``self-rewrite``: a write to (or a removal, rename or copy over) the file the module was
  loaded from (``__file__``, ``Path(__file__)``, ``inspect.getfile``) or a path that names a
  source file (``*.py``, ``.pth``, an extension module).

All are about library code, outside ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from pytest_loops.runtime.audit.rules import _Audit, _is_main_guard

_IMPORT_MACHINERY = frozenset({"sys.meta_path", "sys.path_hooks", "sys.path_importer_cache"})
_MACHINERY_CHANGES = frozenset({"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort"})
_SETUP_STATE = frozenset({"faulthandler.is_enabled", "sys.gettrace", "sys.getprofile", "threading.gettrace",
                          "threading.getprofile",
                          # the process's scheduling: a run started at another priority than the judged one
                          "os.getpriority", "os.nice", "os.sched_getscheduler", "os.sched_getparam",
                          "posix.getpriority", "posix.nice", "posix.sched_getscheduler", "posix.sched_getparam",
                          # a flag a run may be started with that the judged one is not
                          "sys.dont_write_bytecode", "sys.pycache_prefix"})
_STREAMS = frozenset({"sys.stdout", "sys.stderr", "sys.stdin"})
# caches every test run rewrites, empty for the judged run and untracked by the impact map
_HIDDEN_CACHE = re.compile(r"(?:^|[/\\])(\.pytest_cache|\.hypothesis)(?:$|[/\\])")
_ORIGINAL_STREAMS = frozenset({"sys.__stdout__", "sys.__stderr__", "sys.__stdin__"})
_SYS_TELLS = frozenset({"modules", "meta_path", "path_hooks", "path_importer_cache"})
_REFLECTION = frozenset({"vars", "dir", "inspect.getmembers", "builtins.vars", "builtins.dir"})
_DETACH = frozenset({"os.fork", "os.forkpty", "pty.fork", "os.setsid", "os.setpgrp", "os.setpgid", "posix.fork",
                     "posix.setsid", "posix.setpgrp", "daemon.DaemonContext", "os.daemon"})
_DETACH_FLAGS = frozenset({"DETACHED_PROCESS", "CREATE_NEW_PROCESS_GROUP", "CREATE_BREAKAWAY_FROM_JOB"})
_SPAWN_PREFIXES = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "asyncio.create_subprocess_", "pty.spawn")
_SPAWN = frozenset({"os.system", "os.popen", "commands.getoutput"})
_DETACH_TEXT = re.compile(r"\b(?:os\.)?(?:fork|forkpty|setsid|setpgrp|setpgid|daemon)\s*\("
                          r"|(?:^|[\s;&|(`])(?:setsid|nohup|disown|daemonize|start-stop-daemon)\b"
                          r"|(?<!&)&\s*(?:$|;|\)|\n)")
_OS_ERRORS = frozenset({"OSError", "IOError", "EnvironmentError", "PermissionError", "FileNotFoundError",
                        "FileExistsError", "IsADirectoryError", "Exception", "BaseException"})
_ABSOLUTE = re.compile(r"^(?:/|~|[A-Za-z]:[\\/]|\\\\)")
_NOT_A_PLACE = ("/dev/", "/proc/", "NUL")  # devices (a terminal, a pty) are not a place to write files
_TEMP_DIR_AT = {"tempfile.mkstemp": 2, "tempfile.mkdtemp": 2, "tempfile.TemporaryDirectory": 2,
                "tempfile.NamedTemporaryFile": 6, "tempfile.TemporaryFile": 6, "tempfile.SpooledTemporaryFile": 8}
_OPENS = frozenset({"open", "io.open", "codecs.open", "builtins.open"})
_MAKES = frozenset({"os.mkdir", "os.makedirs", "os.mkfifo", "os.mknod", "os.open", "pathlib.Path.touch"})
_PATH_WRITES = frozenset({"write_text", "write_bytes", "touch", "mkdir", "symlink_to", "hardlink_to"})
_SOURCE_SUFFIX = re.compile(r"\.(?:py|pyw|pyi|pyc|pth|so|pyd)$")
_KEEPS_PATH = frozenset({"pathlib.Path", "Path", "pathlib.PurePath", "PurePath", "pathlib.PosixPath", "str",
                         "os.fspath", "os.path.abspath", "os.path.realpath", "os.path.normpath",
                         "os.path.expanduser", "os.path.normcase"})
_SOURCE_OF = frozenset({"inspect.getfile", "inspect.getsourcefile", "inspect.getabsfile"})
_REMOVES = frozenset({"os.remove", "os.unlink", "os.truncate", "shutil.rmtree"})
_MOVES = frozenset({"os.rename", "os.replace", "os.renames", "shutil.move"})  # both paths change
_COPIES = frozenset({"os.link", "os.symlink", "shutil.copy", "shutil.copy2", "shutil.copyfile"})  # the second
_PATH_CHANGES = frozenset({"write_text", "write_bytes", "unlink", "touch", "rename", "replace", "symlink_to",
                           "hardlink_to", "chmod"})


class _Tells:
    def __init__(self, audit: _Audit, tree: ast.Module) -> None:
        self.audit = audit
        self.parents: dict[int, ast.AST] = {}
        self.assigned: dict[tuple[int, str], list[ast.expr]] = {}  # (scope, name): its values
        self.scope: dict[int, int] = {}  # a node's function (0: the module)
        self.main: set[int] = set()
        for stmt in tree.body:
            if isinstance(stmt, ast.If) and _is_main_guard(stmt.test):
                self.main |= {id(n) for s in stmt.body for n in ast.walk(s)}
        todo: list[tuple[ast.AST, int]] = [(tree, 0)]
        while todo:
            node, scope = todo.pop()
            self.scope[id(node)] = scope
            inner = id(node) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else scope
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
                todo.append((child, inner))
            self.bind(node, scope)

    def bind(self, node: ast.AST, scope: int) -> None:
        pairs: list[tuple[ast.AST, ast.expr]] = []
        if isinstance(node, ast.Assign):
            pairs = [(target, node.value) for target in node.targets]
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            pairs = [(node.target, node.iter)]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            pairs = [(node.optional_vars, node.context_expr)]
        for target, value in pairs:
            if isinstance(target, ast.Name):
                self.assigned.setdefault((scope, target.id), []).append(value)

    def values(self, node: ast.Name) -> list[ast.expr]:
        """What a name is assigned, in its function (or, failing that, in the module)."""
        scope = self.scope.get(id(node), 0)
        return self.assigned.get((scope, node.id)) or self.assigned.get((0, node.id)) or []

    def run(self) -> None:
        if not self.audit.library:
            return
        for node in self.audit.nodes:
            if id(node) in self.main:
                continue
            if isinstance(node, ast.Attribute | ast.Name):
                self.reference(node)
            elif isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, ast.Compare):
                self.stream_identity(node)
            elif isinstance(node, ast.Try | ast.TryStar):
                self.sandbox_probe(node)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.hidden_cache(node)

    def hidden_cache(self, node: ast.Constant) -> None:
        """A path into the test tools' caches: the judged run never sees what is there (its
        caches are empty) and the impact map does not track them, so code that reads from
        them runs one way when judged and another in your own runs."""
        assert isinstance(node.value, str)
        found = _HIDDEN_CACHE.search(node.value)
        line = getattr(node, "lineno", 0)
        if found and not any(seen == line for seen, _ in self.audit.findings):  # one finding a line
            self.audit.flag([line], "process-probe",
                            f"library code names a test tool's cache ({found.group(1)}), which the judged run "
                            f"never sees: what it reads there can differ between the judged run and yours")

    def qualname(self, node: ast.AST) -> str:
        return self.audit.qualname(node) or ""

    # ------------------------------------------------------------------ names

    def reference(self, node: ast.Attribute | ast.Name) -> None:
        name = self.qualname(node)
        parent = self.parents.get(id(node))
        line = getattr(node, "lineno", None)
        if name in _IMPORT_MACHINERY and isinstance(node.ctx, ast.Load) and not self.changed(node):
            self.audit.flag([line], "pytest-in-library",
                            f"library code reads the import machinery ({name}), where the test runner's "
                            f"import hooks (pytest's assertion rewriter) show that it is under test")
        elif name in _SETUP_STATE:
            self.audit.flag([line], "process-probe",
                            f"library code asks how the process was set up ({name}), which tells a test run "
                            f"(pytest turns faulthandler on, coverage sets a tracer) from another")
        elif name in _STREAMS and isinstance(parent, ast.Attribute) and parent.attr == "__class__":
            self.stream_kind(f"{name}.__class__", line)
        elif isinstance(node, ast.Attribute) and node.attr == "__dict__" and self.qualname(node.value) == "sys":
            self.reflection("sys.__dict__", line)
        elif name in _DETACH:
            self.detached(f"uses {name}", line)
        elif isinstance(node, ast.Attribute) and node.attr in _DETACH_FLAGS:
            self.detached(f"starts a child with {node.attr}", line)

    def changed(self, node: ast.AST) -> bool:
        """``sys.meta_path.insert(...)`` or ``sys.meta_path[:0] = ...``: a change (rule import-path)."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.attr in _MACHINERY_CHANGES:
            call = self.parents.get(id(parent))
            return isinstance(call, ast.Call) and call.func is parent
        return isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store | ast.Del)

    def stream_kind(self, how: str, line: int | None) -> None:
        self.audit.flag([line], "process-probe",
                        f"library code checks what kind of object a standard stream is ({how}), which tells "
                        f"pytest's captured output from a terminal")

    def reflection(self, how: str, line: int | None) -> None:
        self.audit.flag([line], "pytest-in-library",
                        f"library code reads the sys module through its namespace ({how}), which reaches "
                        f"sys.modules and the test runner without naming them")

    def detached(self, how: str, line: int | None) -> None:
        self.audit.flag([line], "detached-process",
                        f"library code {how}, starting a process that can outlive the check and change "
                        f"the tree after it is judged")

    def stream_identity(self, node: ast.Compare) -> None:
        names = {self.qualname(side) for side in [node.left, *node.comparators]}
        if names & _STREAMS and names & _ORIGINAL_STREAMS:
            self.stream_kind(" against ".join(sorted(names & (_STREAMS | _ORIGINAL_STREAMS))), node.lineno)

    # ------------------------------------------------------------------ calls

    def call(self, node: ast.Call) -> None:
        name = self.qualname(node.func)
        args = node.args
        if name in _REFLECTION and len(args) == 1 and self.qualname(args[0]) == "sys":
            self.reflection(f"{name}(sys)", node.lineno)
        elif name in ("getattr", "hasattr", "builtins.getattr", "builtins.hasattr") and len(args) >= 2:
            attr = args[1].value if isinstance(args[1], ast.Constant) else None
            if self.qualname(args[0]) == "sys" and (attr in _SYS_TELLS or self.computed(args[1])):
                self.reflection(f"{name}(sys, {ast.unparse(args[1])[:40]})", node.lineno)
            elif isinstance(attr, str) and "pytest" in attr.lower() and (
                    attr.startswith("_") or self.qualname(args[0]) in ("sys", "builtins", "__builtins__")):
                self.audit.flag([node.lineno], "pytest-in-library",
                                f"library code looks up an attribute named like the test runner ({attr!r}), "
                                f"which lets it detect the test run and behave differently under test")
        elif name in ("type", "builtins.type") and len(args) == 1 and self.qualname(args[0]) in _STREAMS:
            self.stream_kind(f"type({self.qualname(args[0])})", node.lineno)
        self.spawn(node, name)
        self.rewrite(node, name)
        if name == "os.access" and len(args) >= 2 and self.outside(args[0]) \
                and any(isinstance(n, ast.Attribute | ast.Name) and self.qualname(n).endswith("W_OK")
                        for n in ast.walk(args[1])):
            self.probe_message(ast.unparse(args[0]), node.lineno)

    def computed(self, node: ast.expr, seen: frozenset[str] = frozenset()) -> bool:
        """Whether an attribute name is text built at run time (``"mod" + "ules"``) or a name
        for it; a name bound to plain literals (``getattr(sys, name)`` of "stdout") is not."""
        if isinstance(node, ast.Constant):
            return node.value in _SYS_TELLS
        if isinstance(node, ast.Name):
            return node.id not in seen and any(self.computed(v, seen | {node.id}) for v in self.values(node))
        if isinstance(node, ast.Tuple | ast.List | ast.Set):  # `for name in ("stdout", "stderr")`
            return any(self.computed(e, seen) for e in node.elts)
        return not isinstance(node, ast.Attribute | ast.Subscript)

    def spawn(self, node: ast.Call, name: str) -> None:
        for keyword in node.keywords:
            value = keyword.value
            unset = isinstance(value, ast.Constant) and value.value is None
            off = unset or (isinstance(value, ast.Constant) and value.value in (False, 0))
            if keyword.arg in ("start_new_session", "setsid") and not off:
                self.detached(f"starts a child with {keyword.arg}={ast.unparse(value)[:40]}", node.lineno)
            elif keyword.arg in ("process_group", "setpgroup") and not unset:  # 0: a group of its own
                self.detached(f"starts a child in its own process group ({keyword.arg}=)", node.lineno)
        if not (name in _SPAWN or name.startswith(_SPAWN_PREFIXES)):
            return
        for text, line in self.strings([*node.args, *(k.value for k in node.keywords)]):
            if m := _DETACH_TEXT.search(text):
                self.detached(f"starts a child whose command detaches it ({m.group().strip()!r})",
                              line or node.lineno)
                return

    def strings(self, roots: list[ast.expr]) -> Iterator[tuple[str, int | None]]:
        """The string constants of expressions, and of the values of the names they read."""
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            root = todo.pop()
            for inner in ast.walk(root):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                    yield inner.value, getattr(inner, "lineno", None)
                elif isinstance(inner, ast.Name) and inner.id not in seen:
                    seen.add(inner.id)
                    todo += self.values(inner)

    # ------------------------------------------------------------------ a read-only sandbox probed

    def sandbox_probe(self, node: ast.Try | ast.TryStar) -> None:
        if not any(self.catches_os_errors(h) for h in node.handlers):
            return
        for stmt in node.body:
            for inner in _walk_here(stmt):
                if isinstance(inner, ast.Call) and (where := self.creates_outside(inner)) is not None:
                    self.probe_message(where, inner.lineno)
                    return

    def probe_message(self, where: str, line: int) -> None:
        self.audit.flag([line], "process-probe",
                        f"library code tries to create a file in {where[:60]}, outside the project, and "
                        f"handles the failure: a probe for a read-only sandbox, which tells a judged run "
                        f"from another")

    def catches_os_errors(self, handler: ast.ExceptHandler) -> bool:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any(self.qualname(t).rsplit(".", 1)[-1] in _OS_ERRORS for t in types)

    def creates_outside(self, node: ast.Call) -> str | None:
        name = self.qualname(node.func)
        where: ast.expr | None = None
        if name in _TEMP_DIR_AT:
            where = _argument(node, "dir", _TEMP_DIR_AT[name])
        elif name in _OPENS:
            mode = _argument(node, "mode", 1)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                where = _argument(node, "file", 0)
        elif name in _MAKES:
            where = _argument(node, "path", 0)
        elif name.startswith("shutil.copy") or name == "shutil.move":
            where = _argument(node, "dst", 1)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _PATH_WRITES:
            where = node.func.value
        if where is not None and self.outside(where):
            return ast.unparse(where)
        return None

    def outside(self, node: ast.AST, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a path expression is an absolute literal place (``"/var/tmp"``, ``Path("/x") / n``)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return bool(_ABSOLUTE.match(node.value)) and not node.value.startswith(_NOT_A_PLACE)
        if isinstance(node, ast.JoinedStr):
            return bool(node.values) and self.outside(node.values[0], seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Add):
            return self.outside(node.left, seen)
        if isinstance(node, ast.Name) and node.id not in seen:
            return any(self.outside(v, seen | {node.id}) for v in self.values(node))
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            return self.outside(node.value, seen)
        if isinstance(node, ast.Call):
            name = self.qualname(node.func)
            if (name in _KEEPS_PATH or name == "os.path.join") and node.args:
                return self.outside(node.args[0], seen)
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute", "expanduser",
                                                                           "joinpath"):
                return self.outside(node.func.value, seen)
        return False

    # ------------------------------------------------------------------ the tree's sources rewritten

    def rewrite(self, node: ast.Call, name: str) -> None:
        targets: list[ast.expr] = []
        func = node.func
        if name in _OPENS:
            mode = _argument(node, "mode", 1)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                targets = [a for a in [_argument(node, "file", 0)] if a is not None]
        elif name == "os.open" and len(node.args) >= 2 and any(
                isinstance(n, ast.Attribute | ast.Name)
                and self.qualname(n).rsplit(".", 1)[-1] in ("O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND", "O_CREAT")
                for n in ast.walk(node.args[1])):
            targets = [node.args[0]]
        elif name in _REMOVES:
            targets = node.args[:1]
        elif name in _MOVES:
            targets = node.args[:2]
        elif name in _COPIES:
            targets = node.args[1:2]
        elif name in ("fileinput.input", "fileinput.FileInput") and any(
                k.arg == "inplace" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords):
            targets = node.args[:1]
        elif isinstance(func, ast.Attribute) and func.attr in _PATH_CHANGES:
            if func.attr in ("rename", "replace"):  # Path.replace(target), not str.replace(old, new)
                targets = [func.value, *node.args] if len(node.args) == 1 and not node.keywords else []
            else:
                targets = [func.value]
        elif isinstance(func, ast.Attribute) and func.attr == "open":
            mode = _argument(node, "mode", 0)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                targets = [func.value]
        for target in targets:
            what = self.source(target, frozenset())
            if what is not None:
                self.audit.flag([node.lineno], "self-rewrite",
                                f"library code writes to {what[:60]}, a source file of the tree: code that "
                                f"rewrites itself or other modules when it runs changes what was audited")
                return

    def source(self, node: ast.AST, seen: frozenset[str]) -> str | None:
        """What source file a path expression names (``__file__``, ``'calc.py'``), or None."""
        if isinstance(node, ast.Name):
            if node.id == "__file__":
                return "__file__"
            if node.id not in seen:
                for value in self.values(node):
                    if (found := self.source(value, seen | {node.id})) is not None:
                        return found
            return None
        if isinstance(node, ast.Attribute):
            if node.attr == "__file__" or (node.attr == "origin" and "__spec__" in ast.unparse(node.value)):
                return ast.unparse(node)
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return repr(node.value) if _SOURCE_SUFFIX.search(node.value) else None
        if isinstance(node, ast.JoinedStr) and node.values:
            return self.source(node.values[-1], seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Add):
            return self.source(node.right, seen) if not isinstance(node.right, ast.Name) else None
        if not isinstance(node, ast.Call):
            return None
        name = self.qualname(node.func)
        if name in _SOURCE_OF:
            return f"{name}(...)"
        if name in _KEEPS_PATH and len(node.args) == 1:
            return self.source(node.args[0], seen)
        if name in ("os.path.join", "glob.glob", "glob.iglob") and node.args:
            return self.source(node.args[-1] if name == "os.path.join" else node.args[0], seen)
        if isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in ("resolve", "absolute", "expanduser") and not node.args:
                return self.source(node.func.value, seen)
            if attr in ("with_name", "with_suffix", "joinpath", "glob", "rglob") and node.args:
                return self.source(node.args[-1], seen)
        return None


def _argument(node: ast.Call, keyword: str, index: int) -> ast.expr | None:
    for k in node.keywords:
        if k.arg == keyword:
            return k.value
    return node.args[index] if len(node.args) > index and not isinstance(node.args[index], ast.Starred) else None


def _walk_here(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a statement, not of the functions and classes it defines."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            yield from _walk_here(child)


def tells(audit: _Audit, tree: ast.Module) -> None:
    """Add this module's findings for one parsed file to ``audit``."""
    _Tells(audit, tree).run()

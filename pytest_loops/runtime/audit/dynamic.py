"""Rule ``dynamic-code`` beyond ``exec(computed)``: code the audit would read as a string.

Every other rule reads the file's syntax tree; code kept in a string is one constant
there. So, in library code:

- ``exec``, ``eval`` and ``compile`` of a literal, and a child interpreter's ``-c`` code:
  the literal is parsed and audited with every rule, its findings reported at the call
  (``exec("X = 1")`` is no finding; ``exec("... 'pytest' in sys.modules ...")`` is); a
  string that is not Python the audit can parse is a finding; and those builtins reached
  another way (``functools.partial(eval, ...)``, ``f = builtins.exec``,
  ``getattr(builtins, "ev" + "al")``, ``builtins.__dict__[...]``);
- the standard library's other ways to run a string: ``timeit``, ``code``, ``codeop``,
  ``cProfile``/``profile``, ``pdb``, ``trace``, ``bdb``, ``ctypes.pythonapi``;
- deserializers that run code: ``pickle`` (a protocol-0 pickle is plain text), ``shelve``,
  ``dill``, ``cloudpickle``, ``jsonpickle``, ``yaml.unsafe_load`` and ``yaml.load`` with
  a loader that is not a safe one;
- a child interpreter given code the audit cannot read on the command line
  (``[sys.executable, "-c", code_built_at_run_time]``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from pytest_loops.runtime.audit.rules import _Audit

_EVALUATORS = frozenset({"exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile",
                         "__builtins__.exec", "__builtins__.eval", "__builtins__.compile"})
_RUNS_STRINGS = frozenset({
    "timeit.timeit", "timeit.repeat", "timeit.Timer", "code.InteractiveInterpreter", "code.InteractiveConsole",
    "code.interact", "code.compile_command", "codeop.compile_command", "codeop.Compile", "codeop.CommandCompiler",
    "cProfile.run", "cProfile.runctx", "cProfile.Profile", "profile.run", "profile.runctx", "profile.Profile",
    "pdb.run", "pdb.runeval", "pdb.runctx", "pdb.Pdb", "trace.Trace", "bdb.Bdb", "types.CodeType",
})
_DESERIALIZERS = frozenset({
    "pickle.loads", "pickle.load", "pickle.Unpickler", "_pickle.loads", "_pickle.load", "_pickle.Unpickler",
    "cPickle.loads", "cPickle.load", "shelve.open", "shelve.Shelf", "shelve.DbfilenameShelf", "dill.loads",
    "dill.load", "cloudpickle.loads", "cloudpickle.load", "jsonpickle.decode", "jsonpickle.loads",
    "yaml.unsafe_load", "yaml.unsafe_load_all", "marshal.load", "pandas.read_pickle", "joblib.load",
})
_BUILTIN_MODULES = frozenset({"builtins", "__builtins__"})
_RUNNERS = frozenset({"eval", "exec", "compile", "__import__", "breakpoint"})
_SPAWN_PREFIXES = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "asyncio.create_subprocess_")
_SPAWN = frozenset({"os.system", "os.popen"})


_MAX_DEPTH = 3  # exec("exec('...')"): strings in strings, audited this deep


class _Dynamic:
    def __init__(self, audit: _Audit, run_rules: Callable[[_Audit, ast.Module], None]) -> None:
        self.audit = audit
        self.run_rules = run_rules
        self.called: set[int] = set()  # the func nodes of calls: a reference there is a call

    def run(self) -> None:
        if not self.audit.library:
            return
        for node in self.audit.nodes:
            if isinstance(node, ast.Call):
                self.called.add(id(node.func))
        for node in self.audit.nodes:
            if isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, ast.Attribute | ast.Name) and id(node) not in self.called \
                    and isinstance(node.ctx, ast.Load):
                self.reference(node)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and (
                    self.audit.qualname(node.value) or "") in (
                    "builtins.__dict__", "__builtins__.__dict__", "__builtins__"):
                self.flag(node.lineno, "reads a builtin by name from the builtins' namespace")

    def flag(self, line: int, how: str) -> None:
        self.audit.flag([line], "dynamic-code",
                        f"library code {how}: code held in a string or data, which the audit cannot read")

    def call(self, node: ast.Call) -> None:
        name = self.audit.qualname(node.func) or ""
        first = node.args[0] if node.args else None
        if name in _EVALUATORS:
            if isinstance(first, ast.Constant) and isinstance(first.value, str | bytes):
                self.nested(first.value, node.lineno, name.rsplit(".", 1)[-1])
            # (a computed argument is the probes' rule)
        elif name in _RUNS_STRINGS or name.startswith("ctypes.pythonapi."):
            self.flag(node.lineno, f"runs code through {name}")
        elif name in _DESERIALIZERS:
            self.flag(node.lineno, f"deserializes with {name}, which can run any code the data names")
        elif name in ("yaml.load", "yaml.load_all") and not self.safe_yaml(node):
            self.flag(node.lineno, f"deserializes with {name} and a loader that builds Python objects")
        elif name in ("getattr", "builtins.getattr") and len(node.args) >= 2 \
                and (self.audit.qualname(node.args[0]) or "") in _BUILTIN_MODULES \
                and not (isinstance(node.args[1], ast.Constant) and node.args[1].value not in _RUNNERS):
            self.flag(node.lineno, "reads a builtin by name (getattr(builtins, ...)): eval or exec by another name")
        elif name in ("pkgutil.resolve_name", "operator.attrgetter", "operator.methodcaller") and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str)
                and any(r in a.value for r in ("eval", "exec", "compile", "builtins", "__import__"))
                for a in node.args):
            self.flag(node.lineno, f"reaches eval or exec by a name ({name})")
        elif name in ("vars", "builtins.vars") and first is not None \
                and (self.audit.qualname(first) or "") in _BUILTIN_MODULES:
            self.flag(node.lineno, "reads the builtins through their namespace (vars(builtins))")
        elif name in _SPAWN or name.startswith(_SPAWN_PREFIXES):
            self.child_interpreter(node, name)

    def reference(self, node: ast.Attribute | ast.Name) -> None:
        name = self.audit.qualname(node) or ""
        if name in _EVALUATORS and name.rsplit(".", 1)[-1] in ("exec", "eval"):
            self.flag(node.lineno, f"passes {name} around as a value")
        elif name == "ctypes.pythonapi":
            self.flag(node.lineno, "reaches the interpreter's C API (ctypes.pythonapi)")

    def nested(self, code: str | bytes, line: int, how: str, *, child: bool = False) -> None:
        """Audit ``code`` (run by the call at ``line``) with every rule, as new code whose
        findings are the call's; a string the audit cannot parse is a finding itself."""
        from pytest_loops.runtime.audit.literals import _parse
        from pytest_loops.runtime.audit.model import FileChange

        text = code.decode("utf-8", "replace") if isinstance(code, bytes) else code
        depth = getattr(self.audit, "depth", 0)
        tree = _parse(text, "exec")
        if depth >= _MAX_DEPTH or not isinstance(tree, ast.Module):
            self.flag(line, f"runs a string the audit cannot read as code ({how})")
            return
        inner = _Audit(FileChange(self.audit.path, None, text), self.audit.lits)
        inner.depth = depth + 1  # type: ignore[attr-defined]
        inner.aliases.update(self.audit.aliases)
        inner.imported |= self.audit.imported
        try:
            self.run_rules(inner, tree)
        except RecursionError:
            self.flag(line, f"runs a string the audit cannot read as code ({how})")
            return
        for found in inner.findings.values():
            if child and found.rule == "exit-in-library":
                continue  # its own process: an exit there ends no test
            self.audit.flag([line], found.rule, f"runs code from a string ({how}) in which {found.message}")

    def safe_yaml(self, node: ast.Call) -> bool:
        loaders = [k.value for k in node.keywords if k.arg == "Loader"] + node.args[1:2]
        names = [self.audit.qualname(x) or "" for x in loaders]
        return bool(names) and all("Safe" in n or "Base" in n for n in names)

    def child_interpreter(self, node: ast.Call, name: str) -> None:
        """``subprocess.run([sys.executable, "-c", CODE])``, ``os.system("python -c ...")``."""
        parts: list[ast.expr] = []
        for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "args")]:
            parts += list(arg.elts) if isinstance(arg, ast.List | ast.Tuple) else [arg]
        interpreter = any((self.audit.qualname(p) or "") == "sys.executable"
                          or (isinstance(p, ast.Constant) and isinstance(p.value, str)
                              and p.value.rsplit("/", 1)[-1].startswith("python")) for p in parts)
        if not interpreter:
            return
        for i, part in enumerate(parts[:-1]):
            if isinstance(part, ast.Constant) and part.value == "-c":
                code = self.literal(parts[i + 1])
                if code is None:
                    self.flag(node.lineno, f"starts an interpreter with code built at run time ({name})")
                else:
                    self.nested(code, node.lineno, f"{name} -c", child=True)
                return

    def literal(self, node: ast.expr) -> str | None:
        """The text of a string literal, or of a name the module binds once to one."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            values = [n.value for n in self.audit.nodes if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets)]
            if len(values) == 1 and isinstance(values[0], ast.Constant) and isinstance(values[0].value, str):
                return values[0].value
        return None


def dynamic(audit: _Audit, run_rules: Callable[[_Audit, ast.Module], None]) -> None:
    """Report the code-in-strings of the audited file (see the module's doc); ``run_rules``
    audits a string of code it runs."""
    _Dynamic(audit, run_rules).run()

"""The built-in diff auditor: flags revise steps that game the checks instead of fixing the code.

A revise step may make a failing check pass from inside the files it is allowed to
edit, without fixing anything: special-casing the failing test's inputs, making
``__eq__`` always true, detecting pytest and behaving differently under test,
ending the process before failures are reported, or replacing ``AssertionError``.
:func:`audit_changes` looks for these in the added and changed lines of the changed
Python files and returns one :class:`Finding` per suspicious line. It uses ``ast``
where the new text parses and a line-based fallback where it does not; it never
raises on bad input.

Only new code is flagged: a line whose stripped text is a line of the file as it was
when the loop started is never reported, so code that was already there (or merely
moved) does not count against the revise step.

:class:`BuiltinAuditor` is the built-in implementation of the
``pytest_loop_audit(diff, context)`` hook; it reads the literals of the failing
assertions (see :func:`failing_literals`) from ``context.audit_literals``.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pluggy

__all__ = [
    "BuiltinAuditor",
    "FileChange",
    "Finding",
    "audit_changes",
    "failing_literals",
]

hookimpl = pluggy.HookimplMarker("pytest")

MAX_FAILURE_CHARS = 200_000
MAX_LITERALS = 500
_MAX_LITERAL_CHARS = 1_000
_MAX_PARSE_LINE = 10_000


@dataclass(frozen=True)
class FileChange:
    """One file the revise step changed."""

    path: str  # '/'-separated path relative to the loop's working directory
    before: str | None  # the file's text when the loop started (None: the file is new)
    after: str | None  # the file's text now (None: the file was deleted)


@dataclass(frozen=True)
class Finding:
    """One added or changed line that looks like gaming the checks."""

    path: str
    line: int  # 1-based line number in `after`
    rule: str  # a short kebab-case rule id, e.g. "hardcoded-literal"
    message: str  # one sentence: what was found and why it looks like gaming
    text: str  # the offending line, stripped

    def describe(self) -> str:
        """``path:line: message: `text``` on one line."""
        message = " ".join(self.message.split()).rstrip(".")
        text = " ".join(self.text.split())
        return f"{self.path}:{self.line}: {message}: `{text}`"


# --------------------------------------------------------------------------- literals

# A literal compared by value: ("num", "42"), ("str", "abc"), ("bytes", "b'x'"), ("const", "None").
LitKey = tuple[str, str]

_SMALL: frozenset[LitKey] = frozenset({
    ("num", "0"), ("num", "1"), ("num", "-1"), ("num", "2"),
    ("const", "True"), ("const", "False"), ("const", "None"),
    ("str", ""), ("bytes", "b''"),
})


def _key(value: object) -> LitKey | None:
    """The comparison key of a literal value, or None for values that are not scalars."""
    if value is None or isinstance(value, bool):
        return ("const", repr(value))
    if isinstance(value, int):
        try:
            return ("num", repr(value))
        except ValueError:  # more digits than int -> str allows
            return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        if value.is_integer():
            return ("num", repr(int(value)))
        return ("num", repr(value))
    if isinstance(value, complex):
        return ("num", repr(value))
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, bytes):
        return ("bytes", repr(value))
    return None


def _flatten(value: object, out: list[LitKey], depth: int = 0) -> None:
    if depth > 20:
        return
    if isinstance(value, tuple | list | set | frozenset):
        for item in value:
            _flatten(item, out, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(k, out, depth + 1)
            _flatten(v, out, depth + 1)
    else:
        key = _key(value)
        if key is not None:
            out.append(key)


def _literal_keys(literals: Iterable[str]) -> frozenset[LitKey]:
    """Keys of literals given as Python source text; text that is not a literal is ignored."""
    keys: list[LitKey] = []
    for text in literals:
        if not isinstance(text, str) or len(text) > _MAX_LITERAL_CHARS:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        _flatten(value, keys)
    return frozenset(keys)


def _show(keys: Iterable[LitKey]) -> str:
    """The literals as a reader would write them, at most five."""
    shown: list[str] = []
    for kind, text in keys:
        item = repr(text) if kind == "str" else text
        if item not in shown:
            shown.append(item)
    more = ", ..." if len(shown) > 5 else ""
    return ", ".join(shown[:5]) + more


def _scalars(node: ast.AST | None, depth: int = 0) -> list[LitKey] | None:
    """The scalar literals of a constant expression, or None when the expression is not constant.

    Constants, negated numbers, arithmetic on them and tuples, lists, sets and dicts of those
    are constant (the scalars of ``2 + 3`` are 2 and 3).
    """
    if node is None or depth > 50:
        return None
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            return None
        key = _key(node.value)
        return [key] if key is not None else None
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, int | float | complex)
            and not isinstance(node.operand.value, bool)):
        value = node.operand.value
        key = _key(-value if isinstance(node.op, ast.USub) else value)
        return [key] if key is not None else None
    if isinstance(node, ast.BinOp):  # 2 + 3, "a" * 3: constant folded by hand
        left, right = _scalars(node.left, depth + 1), _scalars(node.right, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        out: list[LitKey] = []
        for element in node.elts:
            keys = _scalars(element, depth + 1)
            if keys is None:
                return None
            out += keys
        return out
    if isinstance(node, ast.Dict):
        out = []
        for k, v in zip(node.keys, node.values, strict=True):
            keys = _scalars(k, depth + 1)
            values = _scalars(v, depth + 1)
            if keys is None or values is None:
                return None
            out += keys + values
        return out
    return None


def _dict_keys(node: ast.Dict) -> list[LitKey] | None:
    out: list[LitKey] = []
    for k in node.keys:
        keys = _scalars(k)
        if keys is None:
            return None
        out += keys
    return out


def _qualifies(cond: Sequence[LitKey], ret: Sequence[LitKey] | None, lits: frozenset[LitKey]) -> bool:
    """Whether a condition on failing literals that selects a constant result is special-casing.

    A failing literal that is not small is enough. Small literals (0, 1, -1, 2, True, False,
    None, the empty string) are too common alone: they count only when the condition tests
    two or more of them and the result is made of failing literals too, so a base case such
    as ``if n == 0: return 1`` is not flagged but ``if a == 0 and b == 1: return 1`` is.
    """
    if ret is None or not cond:
        return False
    if any(k not in _SMALL for k in cond):
        return True
    return len(cond) >= 2 and all(k in lits for k in ret)


_SELECTING_OPS = (ast.Eq, ast.In, ast.Is)
_EXCLUDING_OPS = (ast.NotEq, ast.NotIn, ast.IsNot)
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _is_plain(node: ast.AST) -> bool:
    """Whether an expression is an input as given (a name, attribute, item or tuple of them).

    ``n == 0`` tests an input; ``n % 15 == 0`` or ``len(xs) == 0`` tests a computed value,
    which is how genuine code uses small literals.
    """
    if isinstance(node, ast.Tuple | ast.List):
        return all(_is_plain(e) for e in node.elts)
    if isinstance(node, ast.Starred):
        return _is_plain(node.value)
    if isinstance(node, ast.Attribute | ast.Subscript):
        return _is_plain(node.value)
    return isinstance(node, ast.Name)


def _compare_literals(test: ast.AST, lits: frozenset[LitKey], *,
                      negated: bool = False) -> list[tuple[LitKey, int]]:
    """The failing literals an expression compares something with (``==``, ``in``, ``is``, dict lookup).

    With ``negated``, the literals of ``!=``, ``not in`` and ``is not`` instead: the code
    that runs when such a test is false has the inputs equal to them.

    A comparison counts only when every literal on its constant side is a failing literal,
    so ``ch in ('a', 'e', 'i', 'o', 'u')`` does not count because of one failing ``'a'``.
    """
    found: list[tuple[LitKey, int]] = []
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                if not isinstance(op, _EXCLUDING_OPS if negated else _SELECTING_OPS):
                    continue
                left, right = operands[i], operands[i + 1]
                if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Dict):
                    right_keys = _dict_keys(right)
                else:
                    right_keys = _scalars(right)
                left_keys = _scalars(left)
                if (left_keys is None) == (right_keys is None):
                    continue  # two constants or no constant: not a test on an input
                keys = left_keys if left_keys is not None else right_keys
                subject = right if left_keys is not None else left
                if keys and all(k in lits for k in keys):
                    plain = _is_plain(subject)
                    found += [(k, node.lineno) for k in keys if plain or k not in _SMALL]
        elif isinstance(node, ast.Subscript | ast.Call) and not negated:
            table = node.value if isinstance(node, ast.Subscript) else None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"):
                table = node.func.value
            if isinstance(table, ast.Dict):
                keys = _dict_keys(table)
                if keys and all(k in lits for k in keys):
                    found += [(k, node.lineno) for k in keys]
    return found


def _pattern_literals(pattern: ast.pattern, lits: frozenset[LitKey]) -> list[tuple[LitKey, int]]:
    keys: list[LitKey] = []
    for node in ast.walk(pattern):
        if isinstance(node, ast.MatchValue):
            values = _scalars(node.value)
            if values is None:
                return []
            keys += values
        elif isinstance(node, ast.MatchSingleton):
            key = _key(node.value)
            if key is not None:
                keys.append(key)
        elif isinstance(node, ast.MatchMapping):
            for k in node.keys:
                values = _scalars(k)
                if values is None:
                    return []
                keys += values
    if keys and all(k in lits for k in keys):
        return [(k, pattern.lineno) for k in keys]
    return []


# --------------------------------------------------------------------------- failing_literals

_ASSERT_LINE = re.compile(r"^assert\b\s*(.*)$")
_WHERE_LINE = re.compile(r"^\+?\s*(?:where|and)\s+(.*?)\s+=\s+(.*)$")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?AssertionError\b:?\s*(.*)$")
_ASSERT_CALL = re.compile(r"^(?:self\.)?assert[A-Z_]\w*\s*\(")
_FAILED_LINE = re.compile(r"^FAILED\s+\S+\s+-\s+(.*)$")
_INDEX_DIFF = re.compile(r"^At index \d+ diff:\s*(.*)$")
_DIFF_LINE = re.compile(r"^[-+?]\s+(.*)$")
_MARKER = re.compile(r"^\s*(?:E|>)?\s+|^\s*(?:E|>)$")
_OBJECT_REPR = re.compile(r"<[^<>\n]*>")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)(?![\w.])")
_STRING = re.compile(r"""[bB]?(?:'(?:[^'\\\n]|\\.){0,1000}'|"(?:[^"\\\n]|\\.){0,1000}")""")


def _parse(source: str, mode: str) -> ast.AST | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source, mode=mode)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, OverflowError):
        return None


def _reprs_of(value: object) -> str | None:
    if isinstance(value, bytes | str) and len(value) > _MAX_LITERAL_CHARS:
        return None
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    try:
        return repr(value)
    except ValueError:
        return None


def _literals_from_tree(tree: ast.AST, source: str, out: dict[str, None]) -> None:
    negated: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
                and isinstance(node.operand, ast.Constant)
                and isinstance(node.operand.value, int | float | complex)
                and not isinstance(node.operand.value, bool)):
            negated.add(id(node.operand))
            text = _reprs_of(-node.operand.value)
            if text is not None:
                out[text] = None
        elif isinstance(node, ast.Constant) and id(node) not in negated:
            if node.value is Ellipsis:
                continue
            text = _reprs_of(node.value)
            if text is None:
                continue
            out[text] = None
            if isinstance(node.value, str | bytes):
                original = ast.get_source_segment(source, node)
                if original and original != text and len(original) <= _MAX_LITERAL_CHARS:
                    out[original] = None


def _literals_by_regex(text: str, out: dict[str, None]) -> None:
    text = _OBJECT_REPR.sub(" ", text)
    for match in _STRING.finditer(text):
        tree = _parse(match.group(), "eval")
        if isinstance(tree, ast.Expression) and isinstance(tree.body, ast.Constant):
            _literals_from_tree(tree, match.group(), out)
    without_strings = _STRING.sub(" ", text)
    for match in _NUMBER.finditer(without_strings):
        tree = _parse(match.group(), "eval")
        if tree is not None:
            _literals_from_tree(tree, match.group(), out)


def _expression_literals(text: str, out: dict[str, None], *, statement: bool = False) -> None:
    """Literals of one assertion expression: by ``ast`` when it parses, by regex otherwise."""
    text = text.strip()
    if not text:
        return
    if len(text) <= _MAX_PARSE_LINE:
        tree = _parse(f"assert {text}" if statement else text, "exec" if statement else "eval")
        if tree is not None:
            _literals_from_tree(tree, f"assert {text}" if statement else text, out)
            return
    _literals_by_regex(text[:_MAX_PARSE_LINE * 2], out)


def failing_literals(failure_text: str) -> frozenset[str]:
    """Literals (as Python source text, e.g. "'abc'", "42", "3.5") that appear in the failing
    assertions of a pytest or python output (lines like `assert f(2) == 5`, `E  assert 4 == 5`,
    `E  AssertionError: ...`, `where 4 = f(2)`, `+  where ...`).

    Strings are given as ``repr()`` prints them and also in their original quote style.
    Only the last 200,000 characters of the text are read, and at most 500 literals are
    returned. Never raises.
    """
    if not isinstance(failure_text, str):
        return frozenset()
    text = failure_text[-MAX_FAILURE_CHARS:]
    out: dict[str, None] = {}
    for raw in text.splitlines():
        if len(out) >= MAX_LITERALS:
            break
        line = _MARKER.sub("", raw, count=1).strip()
        if not line:
            continue
        if m := _ASSERT_LINE.match(line):
            _expression_literals(m.group(1), out, statement=True)
        elif _ASSERT_CALL.match(line):  # unittest: self.assertEqual(add(10, 4), 14)
            _expression_literals(line, out)
        elif m := _WHERE_LINE.match(line):
            _expression_literals(m.group(1), out)
            _expression_literals(m.group(2), out)
        elif m := _ERROR_LINE.match(line):
            message = m.group(1)
            if inner := _ASSERT_LINE.match(message):
                _expression_literals(inner.group(1), out, statement=True)
            else:
                _expression_literals(message, out)
        elif m := _FAILED_LINE.match(line):
            message = m.group(1)
            if inner := _ASSERT_LINE.match(message):
                _expression_literals(inner.group(1), out, statement=True)
            elif inner := _ERROR_LINE.match(message):
                _expression_literals(inner.group(1), out)
        elif raw.lstrip().startswith("E") and (m := _INDEX_DIFF.match(line)):
            _expression_literals(m.group(1), out)
        elif raw.lstrip().startswith("E") and (m := _DIFF_LINE.match(line)):
            tree = _parse(m.group(1), "eval") if len(m.group(1)) <= _MAX_PARSE_LINE else None
            if tree is not None:  # a full-diff line is a repr, or else it is not worth guessing
                _literals_from_tree(tree, m.group(1), out)
    return frozenset(list(out)[:MAX_LITERALS])


# --------------------------------------------------------------------------- the audit

_TEST_FILE = re.compile(r"^(?:test_.*\.py|.*_test\.py|conftest\.py)$")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

_COMPARISON_DUNDERS = frozenset({
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__contains__", "__bool__", "__hash__",
})
_TEST_MODULES = ("pytest", "_pytest", "pytest_loops")
_PATCHED_MODULES = ("pytest", "_pytest", "unittest")
_RUNNER_ENV = re.compile(r"^(?:PYTEST_[A-Z0-9_]*|LOOP_[A-Z0-9_]+)$")
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


def _is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.match(path.replace("\\", "/").rsplit("/", 1)[-1]))


def _root(name: str) -> str:
    return name.split(".", 1)[0]


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
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    # ---------------------------------------------------------------- AST rules

    def run_ast(self, tree: ast.Module) -> None:
        self.nodes = list(ast.walk(tree))
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.module_names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                self.module_names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        self.special_cases(tree.body, [])
        self.conditional_expressions()
        self.lookup_tables()
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
                      body: Sequence[ast.stmt]) -> None:
        result = self._constant_result(body)
        if result is None or not cond:
            return
        keys, stmt = result
        if _qualifies([k for k, _ in cond], keys, self.lits):
            self.flag([*header, stmt.lineno, *(line for _, line in cond)], "hardcoded-literal",
                      f"new branch returns a constant when inputs equal literals of the failing "
                      f"assertion ({_show(k for k, _ in cond)}), special-casing the test "
                      f"instead of fixing the code")

    def special_cases(self, body: Sequence[ast.stmt], inherited: list[tuple[LitKey, int]]) -> None:
        for index, stmt in enumerate(body):
            if isinstance(stmt, ast.If):
                cond = inherited + _compare_literals(stmt.test, self.lits)
                header = list(range(stmt.lineno, (stmt.test.end_lineno or stmt.lineno) + 1))
                self._special_case(header, cond, stmt.body)
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
                if _qualifies([k for k, _ in cond], keys, self.lits):
                    self.flag([node.test.lineno, branch.lineno, node.lineno], "hardcoded-literal",
                              f"new conditional expression selects a constant when inputs equal "
                              f"literals of the failing assertion ({_show(k for k, _ in cond)}), "
                              f"special-casing the test instead of fixing the code")
                    break

    def lookup_tables(self) -> None:
        """Dict literals looked up (``[key]`` or ``.get(key)``) in a returned expression."""
        looked_up: list[ast.expr] = []
        for node in self.nodes:
            if isinstance(node, ast.Return | ast.Yield | ast.YieldFrom) and node.value is not None:
                for inner in ast.walk(node.value):
                    if isinstance(inner, ast.Subscript):
                        looked_up.append(inner.value)
                    elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                          and inner.func.attr == "get"):
                        looked_up.append(inner.func.value)
        tables = [table for table in looked_up if isinstance(table, ast.Dict)]
        # `self.known[...]` looks up the class attribute `known = {...}`: match the last name
        names = {(self.qualname(table) or "").rsplit(".", 1)[-1] for table in looked_up} - {""}
        for node in self.nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any((self.qualname(t) or "").rsplit(".", 1)[-1] in names for t in targets):
                    tables.append(node.value)
        for table in tables:
            if not table.keys:
                continue
            keys = _dict_keys(table)
            values: list[LitKey] = []
            for v in table.values:
                scalars = _scalars(v)
                if scalars is None:
                    values = []
                    break
                values += scalars
            if not keys or not values or not all(k in self.lits for k in keys):
                continue
            if _qualifies(keys, values, self.lits):
                end = table.end_lineno or table.lineno
                self.flag(range(table.lineno, end + 1), "hardcoded-literal",
                          f"new lookup table maps literals of the failing assertion "
                          f"({_show(keys)}) to constant results that are returned, "
                          f"special-casing the test instead of fixing the code")

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
        elif "." in name and _root(name) in _PATCHED_MODULES:
            self.flag([line], "pytest-in-library",
                      f"library code replaces {name}, changing how the test framework "
                      f"checks results")
        elif name in ("sys.excepthook", "sys.unraisablehook"):
            self.flag([line], "exit-in-library",
                      f"library code replaces {name}, which can hide or rewrite the errors "
                      f"a failing test would report")
        elif "." in name and _root(name) in _BUILTINS:
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
            elif _RUNNER_ENV.match(value):
                self.flag([node.lineno, stmt.lineno], "pytest-in-library",
                          f"library code refers to the test runner's environment variable "
                          f"{value}, which lets it behave differently under test")
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
                          "extract_stack", "getframeinfo", "stack"})
_TEST_PATH = re.compile(r"^(tests?|testing|conftest\.py)$|(^|/)(tests?|testing)/|(^|/)(test_\w*|\w*_test)\.py$")
_RUNNER_NAMES = frozenset({"pytest", "_pytest", "py.test", "pytest_loops", "unittest.main"})


def _testcase_message(name: str) -> str:
    return (f"new code replaces unittest.TestCase.{name}, which can make assertions pass "
            f"without checking anything")


def _dunder_message(name: str) -> str:
    return (f"new {name} returns a constant, so every comparison or check on these objects "
            f"gives the same answer whatever the operands are")


def _exit_message(name: str) -> str:
    if name in ("sys.settrace", "sys.setprofile", "threading.settrace", "threading.setprofile"):
        return (f"library code calls {name}, which can intercept the test run from inside "
                f"the code under test")
    return (f"library code calls {name}, which can end or hijack the test process before "
            f"failures are reported")


def _without_docstring(body: Sequence[ast.stmt]) -> list[ast.stmt]:
    out = list(body)
    if out and isinstance(out[0], ast.Expr) and isinstance(out[0].value, ast.Constant) \
            and isinstance(out[0].value.value, str):
        out = out[1:]
    return [s for s in out if not isinstance(s, ast.Pass)]


def _sole_constant_return(body: Sequence[ast.stmt]) -> ast.Return | None:
    rest = _without_docstring(body)
    if len(rest) == 1 and isinstance(rest[0], ast.Return) and _scalars(rest[0].value) is not None:
        return rest[0]
    return None


def _constant_lambda(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Lambda) and _scalars(node.body) is not None


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


# --------------------------------------------------------------------------- line-based fallback

_FB_IF = re.compile(r"^\s*(?:el)?if\b(?P<cond>.*?):\s*(?:(?:return|yield)\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_RETURN = re.compile(r"^\s*(?:return|yield)\s+(?P<ret>[^#]+?)\s*(?:#.*)?$")
_FB_IFEXP = re.compile(r"\b(?:return|yield|=)\s*(?P<a>.+?)\s+if\s+(?P<cond>.+?)\s+else\s+(?P<b>[^#]+?)\s*(?:#.*)?$")
_FB_SELECTING = re.compile(r"==|\bin\b|\bis\b")
_FB_COMPUTED = re.compile(r"[%*/+<>]|\blen\s*\(|[\w)\]]\s*-")
_FB_DUNDER = "|".join(sorted(_COMPARISON_DUNDERS))
_FB_DEF_DUNDER = re.compile(rf"^\s*(?:async\s+)?def\s+(?P<name>{_FB_DUNDER})\s*\(.*\)\s*(?:->[^:]*)?:"
                            r"\s*(?:return\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_LAMBDA_DUNDER = re.compile(rf"(?:^|[\s.])(?P<name>{_FB_DUNDER})\s*=\s*lambda\b[^:]*:\s*(?P<ret>[^#]+?)\s*(?:#.*)?$")
_FB_GETATTR = re.compile(r"^def\s+__getattr__\s*\(.*\)\s*(?:->[^:]*)?:\s*(?:return\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?P<name>(?:pytest|_pytest|pytest_loops)\b[\w.]*)")
_FB_IMPORT_CALL = re.compile(r"""(?:import_module|__import__)\s*\(\s*['"](?P<name>(?:pytest|_pytest|pytest_loops)\b[\w.]*)""")
_FB_ENV = re.compile(r"""['"](?P<name>PYTEST_[A-Z0-9_]*|LOOP_[A-Z0-9_]+)['"]""")
_FB_PROBE = re.compile(r"""(?:sys\.(?:modules|argv|orig_argv|_getframe)|os\.environ|os\.getenv|inspect\.stack).*['"][^'"]*py\.?test|['"][^'"]*py\.?test[^'"]*['"].*(?:sys\.(?:modules|argv|orig_argv)|os\.environ|inspect\.stack)""", re.IGNORECASE)
_FB_PATCH = re.compile(r"^\s*(?P<name>(?:pytest|_pytest|unittest)\.[\w.]+)\s*(?:[-+*/|&]?=)(?!=)|\bsetattr\s*\(\s*(?P<target>(?:pytest|_pytest|unittest)\b[\w.]*)")
_FB_TESTCASE = re.compile(r"(?:^\s*[\w.]*TestCase\.(?P<name>assert\w*)\s*=(?!=))|setattr\s*\(\s*[\w.]*TestCase\s*,\s*['\"](?P<name2>assert\w*)")
_FB_ASSERTION_ERROR = re.compile(r"^\s*(?:(?:builtins|__builtins__)\.)?AssertionError\s*=(?!=)|^\s*__builtins__\s*\[\s*['\"]AssertionError['\"]\s*\]\s*=(?!=)|^\s*class\s+AssertionError\b|setattr\s*\(\s*(?:builtins|__builtins__)\s*,\s*['\"]AssertionError")
_FB_EXIT_CALL = re.compile(r"(?<![\w.])(?P<name>os\._exit|sys\.exit|exit|quit|os\.abort|atexit\.register|signal\.signal|signal\.raise_signal|sys\.settrace|sys\.setprofile|threading\.settrace|threading\.setprofile)\s*\(|^\s*@(?P<deco>atexit\.register)\s*$|^\s*raise\s+(?P<raise>SystemExit)\b")
_FB_KILL = re.compile(r"\bos\.kill(?:pg)?\s*\(\s*os\.get(?:pp?id|pgrp|pgid)\b")
_FB_HOOKS = re.compile(r"^\s*(?P<name>sys\.excepthook|sys\.unraisablehook|(?:builtins|__builtins__)\.\w+)\s*=(?!=)")
_FB_MAIN = re.compile(r"""^\s*(?:if\s+__name__\s*==\s*['"]__main__['"]|(?:async\s+)?def\s+main\s*\()""")
_FB_LITERAL = re.compile(_STRING.pattern + "|" + _NUMBER.pattern + r"|\b(?:True|False|None)\b")


def _fb_literals(text: str) -> list[LitKey] | None:
    """The literals of a fragment of source by regex; None when any of them does not evaluate."""
    keys: list[LitKey] = []
    for match in _FB_LITERAL.finditer(text):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = ast.literal_eval(match.group())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        _flatten(value, keys)
    return keys


def _fb_constant(text: str) -> list[LitKey] | None:
    text = text.strip().rstrip(";").strip()
    if not text or len(text) > _MAX_LITERAL_CHARS:
        return None
    tree = _parse(text, "eval")
    if not isinstance(tree, ast.Expression):
        return None
    return _scalars(tree.body)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _Fallback:
    """Line-based rules for text that does not parse."""

    def __init__(self, audit: _Audit) -> None:
        self.audit = audit
        self.lines = audit.lines
        self.indents = [_indent(line) if line.strip() and not line.lstrip().startswith("#") else -1
                        for line in self.lines]

    def next_code(self, index: int) -> int | None:
        """The 1-based number of the next non-blank, non-comment line after line ``index``."""
        for i in range(index, min(len(self.lines), index + 50)):
            stripped = self.lines[i].strip()
            if stripped and not stripped.startswith("#"):
                return i + 1
        return None

    def in_main(self, number: int) -> bool:
        """Whether a line is inside ``def main`` or ``if __name__ == "__main__"`` (by indentation)."""
        indent = self.indents[number - 1]
        for i in range(number - 2, max(-1, number - 5_000), -1):
            if 0 <= self.indents[i] < indent:
                if _FB_MAIN.match(self.lines[i]):
                    return True
                indent = self.indents[i]
                if indent == 0:
                    return False
        return False

    def run(self) -> None:
        audit = self.audit
        for number, line in enumerate(self.lines, 1):
            code = line.strip()
            if not code or code.startswith("#") or len(code) > _MAX_PARSE_LINE:
                continue
            self.special_case(number, code)
            self.dunder(number, code)
            self.tamper(number, code)
            if audit.library:
                self.library(number, code)

    def special_case(self, number: int, line: str) -> None:
        audit = self.audit
        checks: list[tuple[str, str | None, list[int]]] = []
        if m := _FB_IF.match(line):
            ret, ret_line = m.group("ret"), number
            if ret is None and (nxt := self.next_code(number)) is not None:
                r = _FB_RETURN.match(self.lines[nxt - 1])
                if r and self.indents[nxt - 1] > self.indents[number - 1]:
                    ret, ret_line = r.group("ret"), nxt
            checks.append((m.group("cond"), ret, [number, ret_line]))
        elif m := _FB_IFEXP.search(line):
            checks.append((m.group("cond"), m.group("a"), [number]))
            checks.append((m.group("cond"), m.group("b"), [number]))
        for cond_text, ret_text, lines in checks:
            if (ret_text is None or not _FB_SELECTING.search(cond_text)
                    or _FB_COMPUTED.search(_STRING.sub("''", cond_text))):
                continue
            cond = _fb_literals(cond_text)
            if not cond or not all(k in audit.lits for k in cond):
                continue
            if _qualifies(cond, _fb_constant(ret_text), audit.lits):
                audit.flag(lines, "hardcoded-literal",
                           f"new branch returns a constant when inputs equal literals of the "
                           f"failing assertion ({_show(cond)}), special-casing the test instead "
                           f"of fixing the code")
                return

    def dunder(self, number: int, line: str) -> None:
        if m := _FB_LAMBDA_DUNDER.search(line):
            if _fb_constant(m.group("ret")) is not None:
                self.audit.flag([number], "constant-eq", _dunder_message(m.group("name")))
            return
        m = _FB_DEF_DUNDER.match(line)
        if not m:
            return
        ret_line = self.sole_return(number, line, m.group("ret"))
        if ret_line is not None:
            self.audit.flag([number, ret_line], "constant-eq", _dunder_message(m.group("name")))

    def sole_return(self, number: int, line: str, inline: str | None) -> int | None:
        """The line of the constant ``return`` that is a function's whole body, or None."""
        if inline is not None:
            return number if _fb_constant(inline) is not None else None
        nxt = self.next_code(number)
        if nxt is not None and re.match(r"""^\s*[rbuRBU]*(['"]).*\1\s*$""", self.lines[nxt - 1]):
            nxt = self.next_code(nxt)  # a one-line docstring
        if nxt is None or self.indents[nxt - 1] <= self.indents[number - 1]:
            return None
        r = _FB_RETURN.match(self.lines[nxt - 1])
        if not r or _fb_constant(r.group("ret")) is None:
            return None
        after = self.next_code(nxt)
        if after is not None and self.indents[after - 1] > self.indents[number - 1]:
            return None
        return nxt

    def tamper(self, number: int, line: str) -> None:
        audit = self.audit
        if _FB_ASSERTION_ERROR.search(line):
            audit.flag([number], "assertion-tamper", _ASSERTION_ERROR_MESSAGE)
        elif m := _FB_TESTCASE.search(line):
            audit.flag([number], "assertion-tamper", _testcase_message(m.group("name") or m.group("name2")))
        elif self.indents[number - 1] == 0 and (m := _FB_GETATTR.match(line)):
            if self.sole_return(number, line, m.group("ret")) is not None:
                audit.flag([number], "assertion-tamper", _GETATTR_MESSAGE)
            elif m.group("ret") and re.match(r"lambda\b[^:]*:", m.group("ret")):
                audit.flag([number], "assertion-tamper", _GETATTR_MESSAGE)

    def library(self, number: int, line: str) -> None:
        audit = self.audit
        if m := _FB_IMPORT.match(line) or _FB_IMPORT_CALL.search(line):
            audit.flag([number], "pytest-in-library",
                       f"library code imports {m.group('name')}, which lets it detect or alter "
                       f"the test run instead of behaving the same under test")
        if m := _FB_ENV.search(line):
            audit.flag([number], "pytest-in-library",
                       f"library code refers to the test runner's environment variable "
                       f"{m.group('name')}, which lets it behave differently under test")
        elif _FB_PROBE.search(line):
            audit.flag([number], "pytest-in-library",
                       "library code looks for pytest in the running process, which lets it "
                       "behave differently under test")
        if (m := _FB_PATCH.search(line)) and not _FB_TESTCASE.search(line):
            name = m.group("name") or m.group("target")
            audit.flag([number], "pytest-in-library",
                       f"library code replaces {name}, changing how the test framework "
                       f"checks results")
        if m := _FB_HOOKS.match(line):
            name = m.group("name")
            if not name.endswith(".AssertionError"):
                message = (f"library code replaces {name}, which can hide or rewrite the errors "
                           f"a failing test would report") if name.startswith("sys.") else (
                    f"library code assigns {name}, changing a builtin for every module "
                    f"including the tests")
                audit.flag([number], "exit-in-library", message)
        if m := _FB_EXIT_CALL.search(line):
            name = m.group("name") or m.group("deco") or "raise SystemExit"
            exemptable = name in _EXEMPT_IN_MAIN or name == "raise SystemExit"
            if not (exemptable and self.in_main(number)):
                audit.flag([number], "exit-in-library", _exit_message(name))
        elif _FB_KILL.search(line):
            audit.flag([number], "exit-in-library", _exit_message("os.kill"))


# --------------------------------------------------------------------------- entry points


def _audit_file(change: FileChange, lits: frozenset[LitKey]) -> list[Finding]:
    audit = _Audit(change, lits)
    if not audit.new:
        return []
    tree = _parse(change.after or "", "exec")
    if isinstance(tree, ast.Module):
        try:
            audit.run_ast(tree)
            return list(audit.findings.values())
        except RecursionError:  # pathologically nested code: fall back to lines
            audit = _Audit(change, lits)
    _Fallback(audit).run()
    return list(audit.findings.values())


def audit_changes(changes: Sequence[FileChange], *, literals: Collection[str] = ()) -> list[Finding]:
    """Findings in the added/changed lines of the changed Python files (path ending .py);
    other files are ignored. Lines that were already in `before` are never flagged.

    ``literals`` are the literals of the failing assertions (see :func:`failing_literals`);
    the ``hardcoded-literal`` rule needs them and finds nothing without them. Findings are
    sorted by (path, line).
    """
    lits = _literal_keys([literals] if isinstance(literals, str) else literals)
    findings: list[Finding] = []
    for change in changes:
        if (not isinstance(change.path, str) or not change.path.endswith(".py")
                or not isinstance(change.after, str)):
            continue
        findings += _audit_file(change, lits)
    return sorted(findings, key=lambda f: (f.path, f.line, f.rule))


class BuiltinAuditor:
    """The built-in implementation of the hook `pytest_loop_audit(diff, context)`:
    `diff` is a Sequence[FileChange]; `context` is any object; it reads
    `getattr(context, "audit_literals", ())` for the failing literals.
    Returns list[Finding]."""

    @hookimpl
    def pytest_loop_audit(self, diff: Sequence[FileChange], context: object) -> list[Finding]:
        literals = getattr(context, "audit_literals", ()) or ()
        if isinstance(literals, str):
            literals = (literals,)
        if not isinstance(literals, Collection):
            literals = ()
        return audit_changes(diff, literals=[x for x in literals if isinstance(x, str)])

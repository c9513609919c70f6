"""Comparisons that do not compare: rule ``constant-eq`` beyond a ``def`` that returns a constant.

``assert add(2, 3) == 5`` asks the result's ``__eq__``. New code can make that answer
yes whatever the operands without a ``return True`` in sight:

- a comparison method bound where the class-body rule does not look: a dict given to
  ``type()`` (``{"__eq__": lambda s, o: 1}``), ``dict(__eq__=...)``, ``setattr`` with a
  function defined elsewhere;
- a comparison method that never looks at both operands together (``s is not None``,
  ``isinstance(o, type(s))``), directly or through a helper of the same file;
- a tautology: two comparisons of the same operands that cover every order
  (``operator.le(s, o) or operator.gt(s, o)``, ``s <= o or s > o``, ``not s < o or s < o``);
- ``__eq__`` bound to another comparison (``__eq__ = int.__ne__``);
- an object that equals anything by design, from the test tools (``unittest.mock.ANY``):
  reaching ``unittest.mock`` from library code is a finding of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from pytest_loops.runtime.audit.rules import _Audit, _fixed

# the comparisons that take two operands, and what each says of their order
_BINARY = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__"})
_ORDERS: dict[str, frozenset[str]] = {
    "lt": frozenset("<"), "le": frozenset("<="), "eq": frozenset("="),
    "ne": frozenset("<>"), "ge": frozenset("=>"), "gt": frozenset(">"),
}
_OPS = {ast.Lt: "lt", ast.LtE: "le", ast.Eq: "eq", ast.NotEq: "ne", ast.GtE: "ge", ast.Gt: "gt"}
_ALL = frozenset("<=>")
_FLIP = str.maketrans("<>", "><")
# what tells the type of an operand, not its value
_TYPE_ONLY = frozenset({"isinstance", "issubclass", "type", "hasattr", "callable", "id", "builtins.isinstance",
                        "builtins.type", "builtins.hasattr"})
_MOCK = ("unittest.mock", "mock")
# a subclass of a value type that converts to something else than its value: compares right,
# prints, formats, indexes or converts wrong
_VALUE_TYPES = frozenset({"int", "float", "complex", "str", "bytes", "tuple", "frozenset",
                          "decimal.Decimal", "fractions.Fraction", "Decimal", "Fraction"})
_CONVERSIONS = frozenset({"__str__", "__repr__", "__format__", "__int__", "__index__", "__float__",
                          "__complex__", "__bool__", "__round__", "__trunc__", "__floor__", "__ceil__",
                          "__bytes__", "__iter__", "__getitem__", "__len__", "__abs__", "__neg__", "__pos__"})
_EQ_OTHER = "binds {name} to {what}, another comparison, so it answers a different question"


def _order(call_name: str) -> str | None:
    """``operator.le``, ``le``, ``operator.__le__``, ``x.__le__``: 'le' (None: not a comparison)."""
    last = call_name.rsplit(".", 1)[-1].strip("_")
    return last if last in _ORDERS else None


class _Equality:
    def __init__(self, audit: _Audit, tree: ast.Module) -> None:
        self.audit = audit
        self.tree = tree
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in audit.nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(node.name, []).append(node)

    def run(self) -> None:
        for node in self.audit.nodes:
            for name, value, line in self.bindings(node):
                self.binding(name, value, line)
            if self.audit.library and isinstance(node, ast.Import | ast.ImportFrom | ast.Attribute | ast.Name
                                                 | ast.Call):
                self.mock(node)
            if self.audit.library and isinstance(node, ast.ClassDef):
                self.disguised(node)

    def disguised(self, node: ast.ClassDef) -> None:
        """``class _R(int)`` whose ``__str__``/``__int__``/... answer otherwise than its value."""
        bases = [self.audit.qualname(b) or "" for b in node.bases]
        if not any(b in _VALUE_TYPES for b in bases) or any(b.rsplit(".", 1)[-1].endswith(("Enum", "Flag"))
                                                             for b in bases):
            return
        for stmt in node.body:
            names: list[str] = []
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [stmt.name]
            elif isinstance(stmt, ast.Assign):
                names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
            for name in names:
                if name in _CONVERSIONS:
                    self.audit.flag([stmt.lineno, node.lineno], "constant-eq",
                                    f"new subclass of {', '.join(b for b in bases if b in _VALUE_TYPES)} "
                                    f"redefines {name}: a value that compares as one number and prints, "
                                    f"formats or converts as another")
                    return

    # ------------------------------------------------------------------ where a dunder is bound

    def bindings(self, node: ast.AST) -> Iterator[tuple[str, ast.AST, int]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in _BINARY:
            yield node.name, node, node.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else (
                    target.attr if isinstance(target, ast.Attribute) else None)
                if name in _BINARY:
                    yield str(name), node.value, node.lineno
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=False):
                if isinstance(key, ast.Constant) and key.value in _BINARY:
                    yield str(key.value), value, getattr(key, "lineno", node.lineno)
        elif isinstance(node, ast.Call):
            name = self.audit.qualname(node.func)
            if name in ("setattr", "builtins.setattr") and len(node.args) == 3 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in _BINARY:
                yield str(node.args[1].value), node.args[2], node.lineno
            elif name in ("dict", "builtins.dict"):
                for keyword in node.keywords:
                    if keyword.arg in _BINARY:
                        yield keyword.arg, keyword.value, getattr(keyword, "lineno", node.lineno)

    def binding(self, name: str, value: ast.AST, line: int) -> None:
        if isinstance(value, ast.Name | ast.Attribute):
            bound = self.audit.qualname(value) or ""
            order = _order(bound) if "." in bound or bound.strip("_") in _ORDERS else None
            if order is not None and order != _order(name):
                self.audit.flag([line], "constant-eq", f"new code {_EQ_OTHER.format(name=name, what=bound)}")
                return
            if isinstance(value, ast.Name):
                for function in self.functions.get(value.id, []):
                    self.check(name, function, line, frozenset({value.id}))
            return
        if isinstance(value, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
            self.check(name, value, line, frozenset())

    # ------------------------------------------------------------------ what a comparison looks at

    def check(self, name: str, function: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef, line: int,
              seen: frozenset[str]) -> None:
        why = self.trivial(function, seen)
        if why is not None:
            # reported at the binding, or the function's first new line: a changed body counts
            inner = [] if isinstance(function, ast.Lambda) else [
                *(r.lineno for r in _returns(function.body)),
                *sorted({n.lineno for stmt in function.body for n in ast.walk(stmt) if isinstance(n, ast.stmt)})]
            lines = [line, function.lineno, *inner]
            self.audit.flag(lines, "constant-eq",
                            f"new {name} {why}, so it can make a failing comparison pass without fixing the value")

    def trivial(self, function: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef,
                seen: frozenset[str]) -> str | None:
        """Why ``function`` answers without comparing its operands (None: it compares them)."""
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        returns = [function.body] if isinstance(function, ast.Lambda) else [
            r.value for r in _returns(function.body) if r.value is not None]
        if not returns:
            return None
        if any((_tautology(value) or _contradiction(value)) and not isinstance(value, ast.Constant)
               for value in returns):  # (a constant on one path of several is ordinary: `if a is b: return True`)
            return "gives one answer whatever the operands: its comparisons cover every order of them"
        if (len(returns) == 1 and _fixed(returns[0])) or _same_constant(returns):
            return "gives the same answer whatever the operands"
        body: Sequence[ast.AST] = [function.body] if isinstance(function, ast.Lambda) else function.body
        if any(_tolerance(n) for stmt in body for n in ast.walk(stmt)):
            return "compares within a tolerance (isclose, abs(a - b) < tol), so unequal values count as equal"
        if len(params) < 2 or function.args.vararg is not None:
            return None
        mine, theirs = _derived(body, params[0]), _derived(body, params[1])
        for node in (n for stmt in body for n in _walk_values(stmt)):
            if not isinstance(node, ast.Compare | ast.Call | ast.BinOp):
                continue
            if isinstance(node, ast.Compare) and all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                continue  # identity: `self is other` says nothing of the values
            names = {n.id for n in _walk_values(node) if isinstance(n, ast.Name)}
            has_self = bool(names & mine) or any(_is_super(n) for n in _walk_values(node))
            if has_self and names & theirs:
                callee = self.helper(node, seen)
                if callee is None:
                    return None
                if self.trivial(callee, seen | {callee.name}) is None:
                    return None
        return "never compares the two operands' values"

    def helper(self, node: ast.AST, seen: frozenset[str]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The function of this file a call hands both operands to (``self._eq(other)``), if any."""
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else None)
        if name is None or name in seen or name in _BINARY:
            return None
        found = self.functions.get(name) or []
        return found[0] if len(found) == 1 else None

    # ------------------------------------------------------------------ the test tools' always-equal objects

    def mock(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names] if not node.level else []
        elif isinstance(node, ast.Call):
            name = self.audit.qualname(node.func)
            first = node.args[0] if node.args else None
            names = [first.value] if name in ("__import__", "builtins.__import__", "importlib.import_module") \
                and isinstance(first, ast.Constant) and isinstance(first.value, str) else []
        else:
            names = [self.audit.qualname(node) or ""]
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in _MOCK):
                self.audit.flag([getattr(node, "lineno", None)], "pytest-in-library",
                                f"library code reaches the test tools' mock objects ({name}), which equal or "
                                f"answer anything a test asks")
                return


# ---------------------------------------------------------------------- helpers


def _returns(body: Sequence[ast.stmt]) -> Iterator[ast.Return]:
    """The return statements of a function body, not of functions nested in it."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                todo.append(child)


def _walk_values(root: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without what only tells an operand's type (``isinstance(o, type(s))``)."""
    todo = [root]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            if name in _TYPE_ONLY:
                continue
        if isinstance(node, ast.Attribute) and node.attr == "__class__":
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node is not root:
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _derived(body: Sequence[ast.AST], param: str) -> set[str]:
    """``param`` and the local names assigned from it (``a = self.cents``)."""
    names = {param}
    assigns = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Assign | ast.NamedExpr)]
    for _ in range(3):
        for node in assigns:
            used = {n.id for n in _walk_values(node.value) if isinstance(n, ast.Name)}
            if used & names:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _tolerance(node: ast.AST) -> bool:
    """``math.isclose(...)``, ``numpy.allclose``, ``pytest.approx``, ``abs(a - b) < tol``."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else "")
        return name in ("isclose", "allclose", "approx", "assert_allclose", "assertAlmostEqual")
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Lt | ast.LtE):
        left = node.left
        return isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id in ("abs", "fabs") \
            and bool(left.args) and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub)
    return False


def _same_constant(values: Sequence[ast.AST]) -> bool:
    """Every return is a constant of the same truth (``return True`` on every path)."""
    truths = {bool(v.value) for v in values if isinstance(v, ast.Constant)}
    return len(truths) == 1 and all(isinstance(v, ast.Constant) for v in values)


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _comparison(node: ast.AST) -> tuple[tuple[str, str], frozenset[str]] | None:
    """(the operands, the orders it is true for) of ``a < b``, ``operator.lt(a, b)``,
    ``a.__lt__(b)`` or ``not`` one of these."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _comparison(node.operand)
        return None if inner is None else (inner[0], _ALL - inner[1])
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPS:
        left, right, op = node.left, node.comparators[0], _OPS[type(node.ops[0])]
    elif isinstance(node, ast.Call) and len(node.args) in (1, 2) and not node.keywords:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else (func.id if isinstance(func, ast.Name) else "")
        op = _order(name) or ""
        if not op:
            return None
        if len(node.args) == 2:
            left, right = node.args
        elif isinstance(func, ast.Attribute) and name.startswith("__"):
            left, right = func.value, node.args[0]
        else:
            return None
    else:
        return None
    a, b = ast.dump(left), ast.dump(right)
    orders = _ORDERS[op]
    if a > b:  # one spelling of the pair: b > a is a < b
        a, b, orders = b, a, frozenset("".join(orders).translate(_FLIP))
    return (a, b), orders


def _tautology(node: ast.AST) -> bool:
    """Comparisons of the same operands joined so the answer is true whatever they are."""
    return _always(node, True)


def _contradiction(node: ast.AST) -> bool:
    """... so the answer is false whatever they are."""
    return _always(node, False)


def _always(node: ast.AST, truth: bool, depth: int = 0) -> bool:
    """Whether ``node`` is ``truth`` whatever its operands: a constant, ``not`` of the
    opposite, or comparisons of one pair of operands joined so they cover every order
    (``a <= b or a > b``) or none (``a < b and a >= b``)."""
    if depth > 20:
        return False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _always(node.operand, not truth, depth + 1)
    if isinstance(node, ast.Constant):
        return bool(node.value) is truth
    deciding, neutral = ((ast.Or, ast.BitOr), (ast.And, ast.BitAnd)) if truth else \
        ((ast.And, ast.BitAnd), (ast.Or, ast.BitOr))
    each = _joined(node, *neutral)  # `x and y` is true only when both are
    if each is not None:
        return all(_always(v, truth, depth + 1) for v in each)
    values = _joined(node, *deciding)
    if values is None:
        return False
    if any(_always(v, truth, depth + 1) for v in values):
        return True  # `x == y or True`, `x == y and False`
    orders: dict[tuple[str, str], frozenset[str]] = {}
    for value in values:
        found = _comparison(value)
        if found is not None:
            start = frozenset() if truth else _ALL
            orders[found[0]] = (orders.get(found[0], start) | found[1]) if truth else \
                (orders.get(found[0], start) & found[1])
    return any(o == (_ALL if truth else frozenset()) for o in orders.values())


def _joined(node: ast.AST, bool_op: type, bin_op: type) -> list[ast.AST] | None:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, bool_op):
        return list(node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, bin_op):
        return [*(_joined(node.left, bool_op, bin_op) or [node.left]),
                *(_joined(node.right, bool_op, bin_op) or [node.right])]
    return None


def equality(audit: _Audit, tree: ast.Module) -> None:
    """Report the comparisons of ``tree`` that do not compare (see the module's doc)."""
    _Equality(audit, tree).run()

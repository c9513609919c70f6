"""Special cases of the failing inputs in other spellings (rule ``hardcoded-literal``).

The rules of ``rules.py`` find a branch that returns a constant when the inputs equal the
failing assertion's literals. These find the same special case where it is spelled so that
no branch of that shape appears:

- a lookup table keyed by the failing literals, built with ``dict(...)`` or item by item,
  looked up where it is returned or in a name that is returned (``r = _T.get((a, b))``
  then ``return r if r is not None else ...``; ``try: return _T[a, b] except KeyError``);
- the inputs pinned together to failing literals (``(a, b) == (2, 3)``,
  ``hash((a, b)) == hash((2, 3))``, ``f"{a}{b}" == "23"``, ``a in range(2, 3) and b in
  range(3, 4)``) anywhere in a function, whatever the branch then does (``a - b + (2 * b
  if (a, b) == (2, 3) else 0)`` corrects the result instead of returning it);
- a selection by a test used as an index (``{True: lambda: 5, False: ...}[a * b == 6]``,
  ``(a - b, 5)[(a, b) == (2, 3)]``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pytest_loops.runtime.audit.literals import (
    _SMALL,
    LitKey,
    _compare_literals,
    _dict_keys,
    _failing_members,
    _qualifies,
    _range_members,
    _scalars,
    _show,
    _spelled_literals,
    _template,
    _unwrap,
)
from pytest_loops.runtime.audit.rules import _Audit

_DICT_CALLS = frozenset({"dict", "collections.OrderedDict", "OrderedDict", "types.MappingProxyType",
                         "MappingProxyType"})
_CONTAINER_CALLS = frozenset({"tuple", "list", "set", "frozenset", "sorted"})
_NOT_INPUTS = frozenset({"self", "cls"})


class _Spellings:
    """The rules of this module over one parsed file, reporting through its :class:`_Audit`."""

    def __init__(self, audit: _Audit) -> None:
        self.audit = audit
        self.lits = audit.lits

    def run(self) -> None:
        self.lookup_tables()
        if self.lits:
            self.pinned()
        self.dispatch()

    # ------------------------------------------------------------------ lookup tables

    def lookup_tables(self) -> None:
        """Dict literals looked up (``[key]`` or ``.get(key)``) in a returned expression, or in
        the value of a name that is returned."""
        nodes = self.audit.nodes
        returned: list[ast.expr] = [n.value for n in nodes
                                    if isinstance(n, ast.Return | ast.Yield | ast.YieldFrom) and n.value is not None]
        names_returned = {n.id for value in returned for n in ast.walk(value) if isinstance(n, ast.Name)}
        for _ in range(3):  # `r = T.get(k)`, then `return r if r is not None else ...`
            more = [value for target, value in _bindings(nodes) if target in names_returned]
            new = {n.id for value in more for n in ast.walk(value) if isinstance(n, ast.Name)} - names_returned
            returned += [v for v in more if v not in returned]
            if not new:
                break
            names_returned |= new
        looked_up: list[ast.expr] = []
        for value in returned:
            for inner in ast.walk(value):
                if isinstance(inner, ast.Subscript):
                    looked_up.append(inner.value)
                elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                      and inner.func.attr == "get"):
                    looked_up.append(inner.func.value)
        tables = [t for t in (self.as_dict(table) for table in looked_up) if t is not None]
        # `self.known[...]` looks up the class attribute `known = {...}`: match the last name
        names = {(self.audit.qualname(table) or "").rsplit(".", 1)[-1] for table in looked_up} - {""}
        items: dict[str, ast.Dict] = {}
        for node in nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    last = (self.audit.qualname(target) or "").rsplit(".", 1)[-1]
                    if last in names and (table := self.as_dict(node.value)) is not None:
                        tables.append(table)
                    elif isinstance(target, ast.Subscript) and \
                            (self.audit.qualname(target.value) or "").rsplit(".", 1)[-1] in names:
                        entries = items.setdefault(
                            (self.audit.qualname(target.value) or "").rsplit(".", 1)[-1],
                            ast.copy_location(ast.Dict(keys=[], values=[]), node))
                        entries.keys.append(target.slice)  # `_T[2, 3] = 5`, entry by entry
                        entries.values.append(node.value)
                        entries.end_lineno = node.lineno
        for table in [*tables, *items.values()]:
            self.table(table)

    def as_dict(self, node: ast.expr) -> ast.Dict | None:
        """A dict literal, or the same written as ``dict([(k, v), ...])``, ``dict(zip(ks, vs))``,
        ``dict(k=v)``, ``OrderedDict(...)``."""
        if isinstance(node, ast.Dict):
            return node
        if not isinstance(node, ast.Call) or self.audit.qualname(node.func) not in _DICT_CALLS:
            return None
        keys: list[ast.expr | None] = []
        values: list[ast.expr] = []
        if len(node.args) == 1:
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                keys, values = list(arg.keys), list(arg.values)
            elif isinstance(arg, ast.List | ast.Tuple | ast.Set) and all(
                    isinstance(e, ast.Tuple) and len(e.elts) == 2 for e in arg.elts):
                keys = [e.elts[0] for e in arg.elts if isinstance(e, ast.Tuple)]
                values = [e.elts[1] for e in arg.elts if isinstance(e, ast.Tuple)]
            elif (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "zip"
                  and len(arg.args) == 2 and all(isinstance(a, ast.List | ast.Tuple) for a in arg.args)):
                keys = list(arg.args[0].elts)  # type: ignore[attr-defined]
                values = list(arg.args[1].elts)  # type: ignore[attr-defined]
            else:
                return None
        elif node.args:
            return None
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            keys.append(ast.Constant(keyword.arg))
            values.append(keyword.value)
        return ast.copy_location(ast.Dict(keys=keys, values=values), node) if keys else None

    def table(self, table: ast.Dict) -> None:
        if not table.keys:
            return
        keys = _dict_keys(table)
        values: list[LitKey] = []
        for v in table.values:
            scalars = _scalars(v)
            if scalars is None:
                values = []
                break
            values += scalars
        if keys and values and not all(k in self.lits for k in keys):
            keys, values = self.failing_entries(table)  # {(2, 3): 5, (4, 5): 9}
        if not keys or not values or not all(k in self.lits for k in keys):
            return
        if _qualifies(keys, values, self.lits):
            end = table.end_lineno or table.lineno
            self.audit.flag(range(table.lineno, end + 1), "hardcoded-literal",
                            f"new lookup table maps literals of the failing assertion "
                            f"({_show(keys)}) to constant results that are returned, "
                            f"special-casing the test instead of fixing the code")

    def failing_entries(self, table: ast.Dict) -> tuple[list[LitKey], list[LitKey]]:
        """The keys and values of a table's entries keyed by a tuple of failing literals."""
        keys: list[LitKey] = []
        values: list[LitKey] = []
        for key, value in zip(table.keys, table.values, strict=True):
            members = _failing_members(ast.Set(elts=[key]), self.lits) if key is not None else []
            scalars = _scalars(value)
            if members and scalars is not None:
                keys += members
                values += scalars
        return keys, values

    # ------------------------------------------------------------------ inputs pinned together

    def pinned(self) -> None:
        """Two or more parameters compared, together, with failing literals: the failing test's
        case singled out, whatever is done with it."""
        if not self.audit.library:
            return
        for fn in self.audit.nodes:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            args = fn.args
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - _NOT_INPUTS
            if len(params) < 2:
                continue
            body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
            for root in body:
                for node in ast.walk(root):
                    if isinstance(node, ast.Compare):
                        keys, names = self.joint(node, params)
                    elif isinstance(node, ast.BoolOp):
                        keys, names = self.each(node, params)
                    else:
                        continue
                    if len(names) >= 2 and any(k not in _SMALL for k in keys):
                        self.audit.flag([node.lineno], "hardcoded-literal",
                                        f"new code compares the inputs ({', '.join(sorted(names))}) together with "
                                        f"literals of the failing assertion ({_show(keys)}), singling out the "
                                        f"failing test's case instead of fixing the code")

    def joint(self, node: ast.Compare, params: set[str]) -> tuple[list[LitKey], set[str]]:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = _unwrap(operands[i], operands[i + 1])
            if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                spelled = _spelled_literals(left, right, self.lits)
                if spelled:
                    holes = [p for p in _template(left) or _template(right) or [] if not isinstance(p, str)]
                    return spelled, _params(holes, params)
                for subject, other in ((left, right), (right, left)):
                    keys = _scalars(other)
                    if keys and _scalars(subject) is None and all(k in self.lits for k in keys) \
                            and (inputs := self.inputs(subject, params)):
                        return keys, inputs
            elif isinstance(op, ast.In | ast.NotIn):
                members = _failing_members(right, self.lits)
                if members and (inputs := self.inputs(left, params)):
                    return members, inputs
        return [], set()

    def inputs(self, subject: ast.expr, params: set[str]) -> set[str]:
        """The parameters a container of them holds: ``(a, b)``, ``[a, b]``, ``sorted((a, b))``."""
        if isinstance(subject, ast.Call) and self.audit.qualname(subject.func) in _CONTAINER_CALLS \
                and len(subject.args) == 1:
            subject = subject.args[0]
        if not isinstance(subject, ast.Tuple | ast.List | ast.Set):
            return set()
        if not all(isinstance(e, ast.Name) and e.id in params for e in subject.elts):
            return set()
        return {e.id for e in subject.elts if isinstance(e, ast.Name)}

    def each(self, node: ast.BoolOp, params: set[str]) -> tuple[list[LitKey], set[str]]:
        """``a == 2 and b == 3``, ``a in range(2, 3) and b in range(3, 4)``, ``a != 2 or b != 3``."""
        selecting = isinstance(node.op, ast.And)
        keys: list[LitKey] = []
        names: set[str] = set()
        for value in node.values:
            if not isinstance(value, ast.Compare) or len(value.ops) != 1:
                continue
            op = value.ops[0]
            if not isinstance(op, (ast.Eq, ast.Is, ast.In) if selecting else (ast.NotEq, ast.IsNot, ast.NotIn)):
                continue
            left, right = _unwrap(value.left, value.comparators[0])
            for subject, other in ((left, right), (right, left)):
                if not (isinstance(subject, ast.Name) and subject.id in params):
                    continue
                found = _scalars(other)
                if isinstance(op, ast.In | ast.NotIn):
                    found = found if isinstance(other, ast.Tuple | ast.List | ast.Set) else _range_members(other)
                if found and all(k in self.lits for k in found):
                    keys += found
                    names.add(subject.id)
                    break
        return keys, names

    # ------------------------------------------------------------------ a test used as an index

    def dispatch(self) -> None:
        """A table indexed by a test: the branches of an ``if`` written as entries. Flagged when
        the test encodes the inputs by arithmetic, or compares them with failing literals and
        an entry is a constant made of failing literals (or a function returning one)."""
        tables = dict(_bindings(self.audit.nodes))
        for node, params in _with_params(self.audit.nodes):
            tests: list[ast.expr] = []
            if isinstance(node, ast.Subscript) and _is_test(node.slice):
                tests = [node.slice]
            elif isinstance(node, ast.If | ast.IfExp | ast.While):
                tests = [n for n in _conjuncts(node.test) if n is not node.test]  # `if x and a * b == 6`
            for test in tests:
                encoded = [c for c in ast.walk(test) if isinstance(c, ast.Compare) and _encoded(c, params)]
                if encoded:
                    self.audit.flag([encoded[0].lineno, test.lineno], "hardcoded-literal",
                                    "new code picks out one combination of inputs by arithmetic and treats "
                                    "it specially, which looks like encoding a failing test's inputs")
                    continue
                if not isinstance(node, ast.Subscript) or not self.lits:
                    continue
                cond = [k for k, _ in _compare_literals(test, self.lits)]
                table = node.value
                if isinstance(table, ast.Name) and table.id in tables:
                    table = tables[table.id]
                if cond and any(_qualifies(cond, entry, self.lits) for entry in _entries(table)):
                    self.audit.flag([test.lineno, node.value.lineno], "hardcoded-literal",
                                    f"new code indexes a table of constants by a test of the inputs against "
                                    f"literals of the failing assertion ({_show(cond)}), special-casing the "
                                    f"test instead of fixing the code")


def _bindings(nodes: list[ast.AST]) -> Iterator[tuple[str, ast.expr]]:
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.value
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and isinstance(node.target, ast.Name) \
                and node.value is not None:
            yield node.target.id, node.value


def _params(holes: list[ast.expr], params: set[str]) -> set[str]:
    return {n.id for h in holes for n in ast.walk(h) if isinstance(n, ast.Name) and n.id in params}


def _is_test(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool":
        return True
    return isinstance(node, ast.Compare | ast.BoolOp)


def _conjuncts(node: ast.expr) -> Iterator[ast.expr]:
    yield node
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _conjuncts(value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield from _conjuncts(node.operand)


def _with_params(nodes: list[ast.AST]) -> Iterator[tuple[ast.AST, set[str]]]:
    """Each node with the parameters of the function it is in (none at module level)."""
    if not nodes or not isinstance(nodes[0], ast.Module):
        return
    todo: list[tuple[ast.AST, set[str]]] = [(nodes[0], set())]
    while todo:
        node, params = todo.pop()
        yield node, params
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - _NOT_INPUTS
            if args.vararg is not None:
                params.add(args.vararg.arg)
        todo += [(child, params) for child in ast.iter_child_nodes(node)]


def _encoded(node: ast.Compare, params: set[str]) -> bool:
    """``a * b == 6``: arithmetic (no calls) over two or more of the function's parameters
    compared with a number that is not 0 or 1 (``n * step == 0`` is an ordinary guard)."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq | ast.NotEq):
        return False
    sides = [node.left, node.comparators[0]]
    arithmetic = [x for x in sides if isinstance(x, ast.BinOp)
                  and not any(isinstance(n, ast.Call) for n in ast.walk(x))
                  and len({n.id for n in ast.walk(x) if isinstance(n, ast.Name) and n.id in params}) >= 2]
    constant = [x for x in sides if isinstance(x, ast.Constant) and isinstance(x.value, int | float)
                and not isinstance(x.value, bool) and abs(x.value) >= 2]
    return bool(arithmetic and constant)


def _entries(table: ast.expr) -> Iterator[list[LitKey]]:
    """The constant results a table holds: its values, or what its functions return."""
    values: list[ast.expr] = []
    if isinstance(table, ast.Dict):
        values = list(table.values)
    elif isinstance(table, ast.Tuple | ast.List):
        values = list(table.elts)
    for value in values:
        if isinstance(value, ast.Lambda):
            value = value.body
        keys = _scalars(value)
        if keys:
            yield keys


def spellings(audit: _Audit) -> None:
    """Add this module's findings for one parsed file to ``audit``."""
    _Spellings(audit).run()

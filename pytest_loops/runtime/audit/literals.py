"""Literals: the failing assertions' literals (:func:`failing_literals`) and the literal keys the
auditor compares new code against."""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterable, Sequence

from pytest_loops.runtime.audit.model import (
    _MAX_LITERAL_CHARS,
    _MAX_PARSE_LINE,
    MAX_FAILURE_CHARS,
    MAX_LITERALS,
)

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
                left, right = _unwrap(operands[i], operands[i + 1])
                if isinstance(op, ast.Eq | ast.NotEq) and (spelled := _spelled_literals(left, right, lits)):
                    found += [(k, node.lineno) for k in spelled]  # f"{a}{b}" == "23"
                    continue
                if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Dict):
                    right_keys = _dict_keys(right)
                else:
                    right_keys = _scalars(right)
                if right_keys is None and isinstance(op, ast.In | ast.NotIn):
                    right_keys = _range_members(right)  # a in range(2, 3)
                if isinstance(op, ast.In | ast.NotIn) and _is_plain(left) and _scalars(left) is None:
                    members = _failing_members(right, lits)
                    if members:  # `(a, b) in {(2, 3), (4, 5)}`: one member is the failing inputs
                        found += [(k, node.lineno) for k in members]
                        continue
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


# Wrappers that keep equality: `hash((a, b)) == hash((2, 3))` compares `(a, b)` with `(2, 3)`.
_SAME_ON_BOTH_SIDES = frozenset({"hash", "str", "repr", "tuple", "list", "set", "frozenset", "sorted",
                                 "int", "float", "abs", "bytes", "ascii"})
_MAX_RANGE = 8


def _unwrap(left: ast.expr, right: ast.expr) -> tuple[ast.expr, ast.expr]:
    """The operands a comparison really compares: the same wrapper call on both sides is
    peeled off, and ``str(x) == "(2, 3)"`` compares ``x`` with the literal the text spells."""
    for _ in range(5):
        if (isinstance(left, ast.Call) and isinstance(right, ast.Call) and isinstance(left.func, ast.Name)
                and isinstance(right.func, ast.Name) and left.func.id == right.func.id
                and left.func.id in _SAME_ON_BOTH_SIDES and len(left.args) == len(right.args) == 1
                and not left.keywords and not right.keywords):
            left, right = left.args[0], right.args[0]
            continue
        break
    for call, text in ((left, right), (right, left)):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("str", "repr")
                and len(call.args) == 1 and not isinstance(call.args[0], ast.Constant)
                and isinstance(text, ast.Constant) and isinstance(text.value, str)
                and len(text.value) <= _MAX_LITERAL_CHARS):
            tree = _parse(text.value, "eval")
            if isinstance(tree, ast.Expression) and isinstance(tree.body, ast.Tuple | ast.List | ast.Set | ast.Dict) \
                    and _scalars(tree.body) is not None:
                return (call.args[0], tree.body) if call is left else (tree.body, call.args[0])
    return left, right


def _range_members(node: ast.AST) -> list[LitKey] | None:
    """The members of ``range(lo, hi)`` (or ``range(hi)``, with a step) of literal bounds
    when there are a few: ``a in range(2, 3)`` is ``a == 2``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and 1 <= len(node.args) <= 3 and not node.keywords):
        return None
    bounds: list[int] = []
    for arg in node.args:
        keys = _scalars(arg)
        if not keys or len(keys) != 1 or keys[0][0] != "num":
            return None
        try:
            value = ast.literal_eval(arg)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        bounds.append(value)
    members = range(*bounds) if len(bounds) > 1 else range(bounds[0])
    if not 0 < len(members) <= _MAX_RANGE:
        return None
    return [("num", repr(v)) for v in members]


def _template(node: ast.AST) -> list[str | ast.expr] | None:
    """A string built from values, as parts: literal text, and the expressions put in it
    (an f-string, ``str(a) + str(b)``, ``"%s%s" % (a, b)``, ``"{}{}".format(a, b)``,
    ``"".join(map(str, (a, b)))``); None for anything else."""
    def put(value: ast.expr) -> ast.expr:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("str", "repr") \
                and len(value.args) == 1:
            return value.args[0]
        return value

    if isinstance(node, ast.JoinedStr):
        parts: list[str | ast.expr] = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and value.format_spec is None:
                parts.append(value.value)
            else:
                return None
        return parts
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        sides: list[list[str | ast.expr]] = []
        for side in (node.left, node.right):
            part = _template(side)
            if part is None and (_is_plain(side) or isinstance(side, ast.Call)):
                part = [put(side)]
            if part is None:
                return None
            sides.append(part)
        return sides[0] + sides[1]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):
        values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        pieces = re.split(r"(%[sdir%])", node.left.value)
        if re.search(r"%[^sdir%]", node.left.value):
            return None
        return _fill([p if p != "%%" else "%" for p in pieces if p], ("%s", "%d", "%i", "%r"), values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
        base = node.func.value
        if node.func.attr == "format" and isinstance(base, ast.Constant) and isinstance(base.value, str):
            text = base.value.replace("{{", "\0").replace("}}", "\1")
            if "{" in text.replace("{}", "") or "}" in text.replace("{}", ""):
                return None  # only `{}`: a named or formatted field is not guessed at
            pieces = [p.replace("\0", "{").replace("\1", "}") for p in re.split(r"(\{\})", text) if p]
            return _fill(pieces, ("{}",), list(node.args))
        if node.func.attr == "join" and isinstance(base, ast.Constant) and isinstance(base.value, str) \
                and len(node.args) == 1:
            items = node.args[0]
            if isinstance(items, ast.Call) and isinstance(items.func, ast.Name) and items.func.id == "map" \
                    and len(items.args) == 2 and isinstance(items.args[0], ast.Name) \
                    and items.args[0].id in ("str", "repr"):
                items = items.args[1]
            if isinstance(items, ast.Tuple | ast.List) and items.elts:
                parts = []
                for index, element in enumerate(items.elts):
                    if index and base.value:
                        parts.append(base.value)
                    parts.append(put(element))
                return parts
    return None


def _fill(pieces: list[str], holes: tuple[str, ...], values: list[ast.expr]) -> list[str | ast.expr] | None:
    parts: list[str | ast.expr] = []
    it = iter(values)
    for piece in pieces:
        if piece in holes:
            value = next(it, None)
            if value is None or isinstance(value, ast.Starred):
                return None
            parts.append(value)
        else:
            parts.append(piece)
    return parts if next(it, None) is None else None


def _literal_text(key: LitKey) -> str | None:
    kind, text = key
    return text if kind in ("num", "str", "const") and text else None


def _spelled_literals(left: ast.expr, right: ast.expr, lits: frozenset[LitKey]) -> list[LitKey]:
    """``f"{a}{b}" == "23"``: a string of the inputs compared with text that spells failing
    literals one after the other; the literals spelled (none when it spells something else)."""
    for built, text in ((left, right), (right, left)):
        if not (isinstance(text, ast.Constant) and isinstance(text.value, str) and text.value):
            continue
        parts = _template(built)
        holes = [p for p in parts or () if not isinstance(p, str)]
        if not parts or not holes or not all(_is_plain(h) and _scalars(h) is None for h in holes):
            continue
        spelled = _spell(parts, text.value, {t: k for k in lits if (t := _literal_text(k)) is not None})
        if spelled:
            return spelled
    return []


def _spell(parts: Sequence[str | ast.expr], text: str, by_text: dict[str, LitKey]) -> list[LitKey] | None:
    budget = [2_000]

    def match(i: int, pos: int) -> list[LitKey] | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if i == len(parts):
            return [] if pos == len(text) else None
        part = parts[i]
        if isinstance(part, str):
            return match(i + 1, pos + len(part)) if text.startswith(part, pos) else None
        for candidate, key in by_text.items():
            if text.startswith(candidate, pos):
                rest = match(i + 1, pos + len(candidate))
                if rest is not None:
                    return [key, *rest]
        return None

    return match(0, 0)


def _failing_members(collection: ast.AST, lits: frozenset[LitKey]) -> list[LitKey]:
    """The literals of the members of a constant collection of tuples (or dict keyed by
    tuples) that are made of failing literals only: ``{(2, 3), (4, 5)}`` holds the failing
    inputs ``(2, 3)`` even when ``(4, 5)`` is not from a failing assertion. Members that
    are scalars do not count here (``ch in 'aeiou'`` is a character class)."""
    if isinstance(collection, ast.Dict):
        members: list[ast.expr | None] = list(collection.keys)
    elif isinstance(collection, ast.Tuple | ast.List | ast.Set):
        members = list(collection.elts)
    else:
        return []
    found: list[LitKey] = []
    for member in members:
        if not isinstance(member, ast.Tuple) or len(member.elts) < 2:
            continue
        keys = _scalars(member)
        if keys and all(k in lits for k in keys) and any(k not in _SMALL for k in keys):
            found += keys
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



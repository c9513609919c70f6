"""The function or class a source line sits in, for prompts: ``more.py:1078 in windowed()``.

Read with the standard library's :mod:`ast`; each file's table of scopes is kept
per content digest, so an unchanged file is parsed once per process however many
iterations ask. A Python file that does not parse (the revise step may have just
broken it) falls back to its indentation: the nearest ``def``/``class`` line above
with less indentation. Anything else (not Python, unreadable, too large) has no
scope: ``""``.
"""

from __future__ import annotations

import ast
import os
import re
from collections import OrderedDict
from collections.abc import Iterable

from pytest_loops.progress import treehash

MAX_BYTES = 4_000_000  # a generated module larger than this is not parsed
_CACHE_SIZE = 256
_PYTHON_SUFFIXES = (".py", ".pyw", ".pyi")
_DEF_LINE = re.compile(r"^(\s*)(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")

# digest -> {line: scope}; bounded, oldest out first
_tables: OrderedDict[str, dict[int, str]] = OrderedDict()


def _label(kind: str, qualname: str) -> str:
    return f"class {qualname}" if kind == "class" else f"{qualname}()"


def _from_ast(tree: ast.AST) -> dict[int, str]:
    table: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + child.name
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                label = _label(kind, qualname)
                # pre-order: an inner scope's lines overwrite its outer one's
                for line in range(first, (child.end_lineno or child.lineno) + 1):
                    table[line] = label
                visit(child, qualname + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return table


def _from_indentation(text: str) -> dict[int, str]:
    """For a file that does not parse: each line's nearest enclosing def/class by indent."""
    table: dict[int, str] = {}
    stack: list[tuple[int, str, str]] = []  # (indent, kind, name)
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            if stack:
                table[number] = _label(stack[-1][1], ".".join(s[2] for s in stack))
            continue
        indent = len(line) - len(line.lstrip())
        while stack and indent <= stack[-1][0]:
            stack.pop()
        match = _DEF_LINE.match(line)
        if match:
            kind = "class" if stripped.startswith("class") else "def"
            stack.append((indent, kind, match.group(2)))
        if stack:
            table[number] = _label(stack[-1][1], ".".join(s[2] for s in stack))
    return table


def scope_table(source: bytes) -> dict[int, str]:
    """``{line: "windowed()" | "Inventory.release()" | "class Inventory"}`` for Python source.

    Module-level lines are absent. Cached by the source's digest.
    """
    digest = treehash.bytes_digest(source)
    table = _tables.get(digest)
    if table is not None:
        _tables.move_to_end(digest)
        return table
    try:
        table = _from_ast(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        table = _from_indentation(source.decode("utf-8", "replace"))
    _tables[digest] = table
    while len(_tables) > _CACHE_SIZE:
        _tables.popitem(last=False)
    return table


def _is_python(path: str) -> bool:
    return path.endswith(_PYTHON_SUFFIXES)


def scopes_of(root: str | os.PathLike[str], path: str, lines: Iterable[int]) -> dict[int, str]:
    """The scope of each of ``lines`` in ``root/path`` (``""`` at module level or
    when the file is not Python or cannot be read)."""
    wanted = list(lines)
    table: dict[int, str] = {}
    if _is_python(path):
        try:
            full = os.path.join(os.fspath(root), path)
            if os.path.getsize(full) <= MAX_BYTES:
                with open(full, "rb") as f:
                    table = scope_table(f.read())
        except OSError:
            table = {}
    return {line: table.get(line, "") for line in wanted}


def scope_of(root: str | os.PathLike[str], path: str, line: int) -> str:
    """The scope of one line; see :func:`scopes_of`."""
    return scopes_of(root, path, [line])[line]

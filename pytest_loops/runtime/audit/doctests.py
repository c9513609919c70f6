"""Rule ``doctest-expectation``: the tests that live in the code's own docstrings.

With ``--doctest-modules`` the examples in a module's docstrings are tests, in the
very file the revise step is there to fix: no read-only rule can keep them. Changing
what an example expects (``>>> add(2, 3)`` then ``-1`` instead of ``5``) or removing an
example that was there makes a failing doctest pass without fixing anything. Examples
are compared by the object whose docstring holds them and their source; a new example
is no finding, nor is a docstring's prose.
"""

from __future__ import annotations

import ast
import doctest
from collections.abc import Iterator

from pytest_loops.runtime.audit.model import Finding
from pytest_loops.runtime.audit.rules import _Audit

_PARSER = doctest.DocTestParser()


def _docstrings(tree: ast.Module) -> Iterator[tuple[str, ast.Constant]]:
    """(the owner's dotted name, its docstring node) of the module, classes and functions."""
    todo: list[tuple[str, ast.AST]] = [("", tree)]
    while todo:
        prefix, node = todo.pop()
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            yield prefix or "<module>", body[0].value
        for child in body:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                todo.append((f"{prefix}.{child.name}" if prefix else child.name, child))


def _examples(tree: ast.Module) -> dict[tuple[str, str], tuple[str, int]]:
    """(owner, example source) -> (what it expects, the line of that expectation)."""
    found: dict[tuple[str, str], tuple[str, int]] = {}
    for owner, node in _docstrings(tree):
        text = str(node.value)
        if ">>>" not in text:
            continue
        try:
            examples = _PARSER.get_examples(text)
        except ValueError:  # a malformed example: doctest cannot run it either
            continue
        for example in examples:
            line = node.lineno + example.lineno + example.source.count("\n")
            found.setdefault((owner, example.source), (example.want, line))
    return found


def doctests(audit: _Audit, tree: ast.Module, before: str | None) -> None:
    """Report examples of ``before`` whose expectation ``tree`` changed or dropped."""
    if not audit.library or not before or ">>>" not in before:
        return
    try:
        old = _examples(ast.parse(before))
    except (SyntaxError, ValueError, RecursionError):
        return
    new = _examples(tree)
    for (owner, source), (want, _) in sorted(old.items()):
        shown = source.strip().splitlines()[0][:80] if source.strip() else source
        if (owner, source) not in new:
            line = next((ln for (o, _), (_, ln) in new.items() if o == owner), 1)
            _report(audit, line, f"the revise step removed the doctest example `>>> {shown}` of {owner}, "
                                 f"a test that lives in the code's docstring")
        elif new[(owner, source)][0] != want:
            now, line = new[(owner, source)]
            _report(audit, line, f"the revise step changed what the doctest example `>>> {shown}` of {owner} "
                                 f"expects ({want.strip()[:40]!r} to {now.strip()[:40]!r}): the test, not the code")


def _report(audit: _Audit, line: int, message: str) -> None:
    text = audit.lines[line - 1].strip() if 0 < line <= len(audit.lines) else ""
    audit.findings.setdefault((line, "doctest-expectation"),
                              Finding(audit.path, line, "doctest-expectation", message, text))

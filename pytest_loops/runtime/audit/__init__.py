"""The built-in diff auditor: flags revise steps that game the checks instead of fixing the code.

A revise step may make a failing check pass from inside the files it is allowed to
edit, without fixing anything: special-casing the failing test's inputs, making
``__eq__`` always true, detecting pytest and behaving differently under test,
ending the process before failures are reported, replacing ``AssertionError``, or
looking around instead of at its inputs: the wall clock, ``/proc``, the whole environment,
the parent process, the output streams, the import path (``probes.py``); special cases
spelled another way (``spellings.py``); asking whether a test runner is around without naming
it, starting processes that outlive the check, rewriting the tree's sources (``tells.py``).
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
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from pytest_loops.runtime.audit.model import FileChange, Finding

if TYPE_CHECKING:
    from pytest_loops.runtime.audit.literals import LitKey, failing_literals
    from pytest_loops.runtime.audit.rules import _Audit

# The rules compile about a hundred regular expressions: a loop pays for them at its
# first audit, not at start-up (most loops never audit: no revise step, or no change).


def __getattr__(name: str) -> Any:
    if name == "failing_literals":
        from pytest_loops.runtime.audit.literals import failing_literals

        return failing_literals
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BuiltinAuditor",
    "FileChange",
    "Finding",
    "audit_changes",
    "failing_literals",
]

hookimpl = pluggy.HookimplMarker("pytest")


# --------------------------------------------------------------------------- entry points


def _run_rules(audit: _Audit, tree: ast.Module) -> None:
    """Every AST rule over one parsed file (or a string of code it runs), into ``audit``."""
    from pytest_loops.runtime.audit.decisions import decisions
    from pytest_loops.runtime.audit.dynamic import dynamic
    from pytest_loops.runtime.audit.equality import equality
    from pytest_loops.runtime.audit.probes import probe
    from pytest_loops.runtime.audit.spellings import spellings
    from pytest_loops.runtime.audit.tells import tells

    audit.run_ast(tree)
    spellings(audit)
    probe(audit, tree)
    tells(audit, tree)
    equality(audit, tree)
    decisions(audit, tree)
    dynamic(audit, _run_rules)


def _audit_file(change: FileChange, lits: frozenset[LitKey]) -> list[Finding]:
    from pytest_loops.runtime.audit.fallback import _Fallback
    from pytest_loops.runtime.audit.literals import _parse
    from pytest_loops.runtime.audit.rules import _Audit

    audit = _Audit(change, lits)
    if not audit.new and ">>>" not in (change.before or ""):
        return []  # (lines only removed: a doctest example among them is still a finding)
    tree = _parse(change.after or "", "exec")
    if isinstance(tree, ast.Module):
        from pytest_loops.runtime.audit.doctests import doctests

        try:
            _run_rules(audit, tree)
            doctests(audit, tree, change.before)
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
    from pytest_loops.runtime.audit.literals import _literal_keys

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

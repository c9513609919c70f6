"""pytest-loops: bounded, recorded, test-driven fix loops for pytest and the shell."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_loops.errors import LoopFileError, LoopUsageError
    from pytest_loops.results import CheckResult, IterationRecord, LoopResult
    from pytest_loops.spec import Check, CheckKind, Guards, LoopSpec, Pipeline
    from pytest_loops.verdict import EXIT_INTERNAL, EXIT_USAGE, Verdict

# public name -> its module, imported on first use: a pytest run that loads the plugin
# and loops nothing does not pay for the result and spec types
_LAZY = {
    "LoopFileError": "errors", "LoopUsageError": "errors",
    "CheckResult": "results", "IterationRecord": "results", "LoopResult": "results",
    "Check": "spec", "CheckKind": "spec", "Guards": "spec", "LoopSpec": "spec", "Pipeline": "spec",
    "EXIT_INTERNAL": "verdict", "EXIT_USAGE": "verdict", "Verdict": "verdict",
}


def __getattr__(name: str) -> Any:
    """The public names, and ``__version__`` read from the installed metadata, on first
    use (not at import: a pytest run that never asks does not pay for them)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("pytest-loops")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        found = "0+unknown"
    globals()["__version__"] = found
    return found

__all__ = [
    "EXIT_INTERNAL",
    "EXIT_USAGE",
    "Check",
    "CheckKind",
    "CheckResult",
    "Guards",
    "IterationRecord",
    "LoopFileError",
    "LoopResult",
    "LoopSpec",
    "LoopUsageError",
    "Pipeline",
    "Verdict",
    "__version__",
]

"""pytest-loops: bounded, recorded, test-driven fix loops for pytest and the shell."""

from __future__ import annotations

from .errors import LoopFileError, LoopUsageError
from .results import CheckResult, IterationRecord, LoopResult
from .spec import Check, CheckKind, Guards, LoopSpec, Pipeline
from .verdict import EXIT_INTERNAL, EXIT_USAGE, Verdict


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed metadata on first use (not at import:
    a pytest run that never asks does not pay for it)."""
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

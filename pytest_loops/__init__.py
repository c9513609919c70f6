"""pytest-loops: bounded, recorded, test-driven fix loops for pytest and the shell."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .errors import LoopFileError, LoopUsageError
from .results import CheckResult, IterationRecord, LoopResult
from .spec import Check, CheckKind, Guards, LoopSpec, Pipeline
from .verdict import EXIT_INTERNAL, EXIT_USAGE, Verdict

try:
    __version__ = version("pytest-loops")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

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

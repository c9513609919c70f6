"""Why a path of the tree is read-only for the revise step: the rules in order, first match wins."""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Protocol

from pytest_loops.runtime.protect.gitpaths import GIT_ATTRIBUTES, GIT_REASON
from pytest_loops.runtime.protect.rules import (
    CACHE_REASON,
    CI_DIRS,
    CONFIG_NAMES,
    PYCACHE,
    STARTUP_NAMES,
    TEST_DIR,
    TOOL_CONFIG_NAMES,
    harness_config,
    matches,
)
from pytest_loops.runtime.protect.syspath import shadowed_module
from pytest_loops.runtime.protect.tree import Entry


class Rules(Protocol):
    """What the rules read of a tree's guard (:class:`~pytest_loops.runtime.protect.guard.TreeGuard`)."""

    @property
    def root(self) -> str: ...

    @property
    def protect(self) -> Sequence[str]: ...

    @property
    def scope(self) -> Sequence[str]: ...

    @property
    def test_files(self) -> Sequence[str]: ...

    @property
    def readonly_files(self) -> Container[str]: ...

    @property
    def observed(self) -> Mapping[str, str]: ...

    @property
    def shadows(self) -> Container[str]: ...

    @property
    def start_dirs(self) -> Container[str]: ...


    def _in_venv(self, rel: str) -> str | None: ...

    def _test_ancestors(self) -> frozenset[str]: ...


def readonly_reason(guard: Rules, rel: str, entry: Entry | None, *, new: bool) -> str | None:
    """Why ``guard``'s tree path ``rel`` (``entry`` its lstat, ``new``: added since loop
    start) may not be changed by the revise step; None when it may."""
    if guard._in_venv(rel):
        return "a virtual environment"
    if f"{PYCACHE}/" in rel or rel.endswith((".pyc", ".pyo")):
        return CACHE_REASON
    name = rel.rsplit("/", 1)[-1]
    if entry is not None and entry.kind == "l":
        return "a symbolic link"
    if guard.protect and matches(rel, guard.protect):
        return "protected by the loop's protect setting"
    if rel in guard.observed:
        return guard.observed[rel]
    if name in CONFIG_NAMES:
        return "configuration pytest reads"
    if name in TOOL_CONFIG_NAMES or rel.startswith(CI_DIRS):
        return "configuration of the tools that check the code (linters, CI, commit hooks)"
    if name in STARTUP_NAMES or name.endswith(".pth"):
        return "run by the interpreter at start-up"
    if name == "pyvenv.cfg":
        return "would make a virtual environment of its directory"
    parts = rel.split("/")
    if any(TEST_DIR.match(p) for p in parts[:-1]):
        return "under a test directory"
    if matches(rel, guard.test_files):
        return "a test file"
    if name.endswith((".loop", ".loop.yaml", ".loop.yml")) or rel in guard.readonly_files:
        return "a loop definition, or a file a check runs"
    if harness_config(rel):
        return "the harness's configuration, read by its next run"
    if name == GIT_ATTRIBUTES:
        return GIT_REASON
    if new and name == "__init__.py" and "/".join(parts[:-1]) in guard._test_ancestors():
        return "a new package around the tests: pytest would import it before them"
    shadowed = shadowed_module(guard.root, parts, guard.shadows, guard.start_dirs) if new else None
    if shadowed is not None:
        return f"would shadow the module {shadowed!r}"
    if guard.scope and not matches(rel, guard.scope):
        return "outside the loop's scope"
    return None

"""``pytest --loop`` and the layers of loop discovery: the extra directories
(``loop_paths``, ``PYTEST_LOOPS_LOOP_PATHS``) are collected when no paths are given,
and a loop from one of them whose name a workspace loop also has is shadowed: not
run, and said so in one line. Loops of installed packages and the user directory
are not collected (``pytest-loops run NAME`` runs them; docs/loop-language.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_loops.sources.pytestini import LOOP_PATHS_ENV


def extra_roots(config: pytest.Config) -> list[Path]:
    """The extra layer's entries: the ini key's, then the environment variable's that exist."""
    roots = [Path(p).resolve() for p in config.getini("loop_paths")]
    raw = os.environ.get(LOOP_PATHS_ENV, "")
    roots += [Path(p).resolve() for p in raw.split(os.pathsep) if p.strip() and os.path.exists(p)]
    return roots


# workeroutput key: the lines of the loops an xdist worker deselected as shadowed
SHADOWED_KEY = "loop_shadowed"


class ShadowedLines:
    """On the xdist controller: the workers' shadowed-loop lines, once each, in the summary."""

    def __init__(self) -> None:
        self.lines: dict[str, None] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.lines.update(dict.fromkeys(getattr(node, "workeroutput", {}).get(SHADOWED_KEY) or ()))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.lines:
            terminalreporter.write_line(line)


def use_layers(config: pytest.Config) -> None:
    """At configure time of a ``--loop`` session: collect the extra layer when no paths
    are given, and (on an xdist controller) relay the workers' shadowed lines."""
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        add_extra_paths(config)
    if not hasattr(config, "workerinput") and extra_roots(config):
        config.pluginmanager.register(ShadowedLines(), "loop-shadowed-lines")


def add_extra_paths(config: pytest.Config) -> None:
    """With no paths on the command line, collect the extra directories too (once: one
    inside a path already collected is not added again)."""
    known = [Path(a).resolve() for a in config.args]
    for path in extra_roots(config):
        if not any(path == k or k in path.parents for k in known):
            config.args.append(str(path))
            known.append(path)


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _loop_of(item: pytest.Item) -> Any:
    """The top-level loop collector an item belongs to (None: not a loop file's loop)."""
    from pytest_loops.pytest_plugin.items import LoopCollector, LoopFileCollector

    node: Any = item.parent
    while node is not None and not isinstance(node, LoopCollector):
        node = node.parent
    if node is None or not isinstance(node.parent, LoopFileCollector):
        return None  # a test, or a pipeline's stage
    return node


def drop_shadowed(config: pytest.Config, items: list[pytest.Item], rootdir: Path) -> list[str]:
    """Deselect the loops of the extra layer whose name a workspace loop (or an earlier
    extra one) has; return one line per loop shadowed."""
    roots = [r.resolve() for r in extra_roots(config)]
    if not roots:
        return []
    workspace = rootdir.resolve()
    loops: dict[str, list[tuple[bool, Any]]] = {}  # name -> (in the extra layer, collector)
    seen: set[int] = set()
    for item in items:
        loop = _loop_of(item)
        if loop is None or id(loop) in seen:
            continue
        seen.add(id(loop))
        path = Path(loop.path).resolve()
        extra = _inside(path, roots) and not _inside(path, [workspace])
        loops.setdefault(loop.spec.name, []).append((extra, loop))
    shadowed: dict[int, Any] = {}
    lines = []
    for name, found in loops.items():
        ordered = sorted(found, key=lambda f: f[0])  # workspace loops first, then collection order
        winner = ordered[0][1]
        for extra, loop in ordered[1:]:
            if extra:
                shadowed[id(loop)] = loop
                lines.append(f"loop: {name!r} in {loop.path} (loop_paths) is shadowed by {winner.path}: not run")
    if shadowed:
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            loop = _loop_of(item)
            (dropped if loop is not None and id(loop) in shadowed else kept).append(item)
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller prints them
            config.workeroutput[SHADOWED_KEY] = lines
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            for line in lines:
                reporter.write_line(line)
    return lines

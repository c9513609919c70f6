"""The package's layering, as a test: a module imports only from its own layer or the
layers below it (imports inside functions count), so no two layers can form a circle.

Lowest first: the base modules at the top of the package, then progress, sandbox, runtime,
core, agents, localization, artifacts, sources, pytest_plugin, cli. ``__init__``/``__main__``
are entry points and may import anything; ``testing`` is the pytest fixture kit and
sits with the pytest plugin. docs/contributing.md explains the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_loops"
BASE = {"errors", "verdict", "defaults", "spec", "results", "settings", "limits", "redact", "deadline"}
LAYERS = ["base", "progress", "sandbox", "runtime", "core", "agents", "localization", "artifacts", "sources",
          "pytest_plugin", "cli"]
ENTRY = {"pytest_loops", "pytest_loops.__main__"}
# imports that still point upward, to be removed (the test fails when one is gone, so
# this list only ever shrinks)
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if module in ENTRY or parts[0] != "pytest_loops":
        return None
    if len(parts) == 2 and parts[1] not in LAYERS:
        if parts[1] in BASE:
            return "base"
        if parts[1] == "testing":
            return "pytest_plugin"
        raise AssertionError(f"{module}: a top-level module outside the base; give it a layer")
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "project" in rel.parts:  # the demo's project is data, not the package
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import; the package imports absolutely"
            base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {name for name in out if name.startswith("pytest_loops.")}


def upward() -> set[tuple[str, str]]:
    mods = modules()
    bad = set()
    for name, path in mods.items():
        here = layer_of(name)
        if here is None:
            continue
        for target in imports(path, set(mods)):
            there = layer_of(target)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                bad.add((name, target))
    return bad


def test_every_folder_is_a_known_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"base"}


def test_no_module_imports_a_layer_above_its_own() -> None:
    found = upward()
    new = found - KNOWN_UPWARD
    assert not new, "imports that point up a layer:\n" + "\n".join(f"{a} -> {b}" for a, b in sorted(new))


@pytest.mark.parametrize("pair", sorted(KNOWN_UPWARD) or [None])
def test_the_list_of_known_upward_imports_only_shrinks(pair: tuple[str, str] | None) -> None:
    if pair is None:
        assert not KNOWN_UPWARD
        return
    assert pair in upward(), f"{pair[0]} -> {pair[1]} is gone: remove it from KNOWN_UPWARD"


def test_the_layer_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The scan itself: a core module importing the cli is found."""
    path = tmp_path / "engine.py"
    path.write_text("from pytest_loops.cli import main\nimport pytest_loops.sources.loopfile\n")
    found = imports(path, {"pytest_loops.cli.main"})
    assert found == {"pytest_loops.cli.main", "pytest_loops.sources.loopfile"}
    assert LAYERS.index(layer_of("pytest_loops.cli.main") or "") > LAYERS.index("core")

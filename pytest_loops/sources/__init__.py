"""Loop sources: ``.loop`` files (LoopFlow), YAML loop definitions and the loop-runner
config file, read into LoopSpecs.

The names below are imported on first use: the pytest plugin reads the config file at
load time and must not pay for the loop-file and YAML readers (nor import yaml) then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_loops.sources.files import is_loop_file, load_any
    from pytest_loops.sources.loopfile import load_loop_file, parse_loop_text
    from pytest_loops.sources.model import Flow, LoopFile
    from pytest_loops.sources.show import format_loop_file
    from pytest_loops.sources.yamlspec import load_yaml_loops, load_yaml_text

_LAZY = {
    "is_loop_file": "files", "load_any": "files",
    "load_loop_file": "loopfile", "parse_loop_text": "loopfile",
    "Flow": "model", "LoopFile": "model",
    "format_loop_file": "show",
    "load_yaml_loops": "yamlspec", "load_yaml_text": "yamlspec",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Flow",
    "LoopFile",
    "format_loop_file",
    "is_loop_file",
    "load_any",
    "load_loop_file",
    "load_yaml_loops",
    "load_yaml_text",
    "parse_loop_text",
]

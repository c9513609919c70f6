"""Loop sources: ``.loop`` files (LoopFlow) and YAML loop definitions, read into LoopSpecs."""

from __future__ import annotations

from .files import is_loop_file, load_any
from .loopfile import load_loop_file, parse_loop_text
from .model import Flow, LoopFile
from .show import format_loop_file
from .yamlspec import load_yaml_loops, load_yaml_text

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

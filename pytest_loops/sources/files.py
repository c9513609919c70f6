"""Loading any loop file: dispatch by suffix to the LoopFlow or the YAML reader."""

from __future__ import annotations

import os

from pytest_loops.errors import LoopFileError
from pytest_loops.sources.loopfile import load_loop_file
from pytest_loops.sources.model import LoopFile
from pytest_loops.sources.reading import (
    LOOP_SUFFIX,
    YAML_LOOP_SUFFIXES,
    YAML_SUFFIXES,
    is_loop_file,
    read_text,
)
from pytest_loops.sources.yamlspec import load_yaml_loops

__all__ = ["LOOP_SUFFIX", "YAML_LOOP_SUFFIXES", "YAML_SUFFIXES", "is_loop_file", "load_any", "read_text"]


def load_any(path: str | os.PathLike) -> LoopFile:
    """Read a ``.loop`` file, a ``*.loop.yaml`` / ``*.loop.yml`` file or a loop-runner YAML config."""
    name = os.path.basename(os.fspath(path)).lower()
    if name.endswith(LOOP_SUFFIX):
        return load_loop_file(path)
    if name.endswith(YAML_SUFFIXES):
        return load_yaml_loops(path)
    raise LoopFileError("not a loop file", os.fspath(path),
                        fix="name it *.loop, *.loop.yaml or *.loop.yml (or pass a loop-runner *.yaml config)")

"""Finding and reading loop files: names, bytes to text, dispatch by suffix."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import LoopFileError, LoopUsageError

if TYPE_CHECKING:
    from .model import LoopFile

LOOP_SUFFIX = ".loop"
YAML_LOOP_SUFFIXES = (".loop.yaml", ".loop.yml")
YAML_SUFFIXES = (".yaml", ".yml")


def is_loop_file(path: str | os.PathLike) -> bool:
    """True for names ending in ``.loop``, ``.loop.yaml`` or ``.loop.yml``."""
    name = os.path.basename(os.fspath(path)).lower()
    return name.endswith(LOOP_SUFFIX) or name.endswith(YAML_LOOP_SUFFIXES)


def read_text(path: str | os.PathLike) -> str:
    """A loop file's text. Unreadable, not a regular file, too big or not UTF-8 ->
    LoopFileError naming where."""
    from ..limits import MAX_LOOP_BYTES, MAX_YAML_BYTES, open_regular

    where = os.fspath(path)
    limit = MAX_YAML_BYTES if where.lower().endswith(YAML_SUFFIXES) else MAX_LOOP_BYTES
    try:
        with open_regular(where, "a loop file") as f:
            data = f.read(limit + 1)
    except LoopUsageError as exc:
        raise LoopFileError(exc.message, where, fix=exc.fix) from None
    except FileNotFoundError:
        raise LoopFileError("no such file", where, fix="check the path") from None
    except OSError as exc:
        raise LoopFileError(f"cannot read: {exc.strerror or exc}", where) from None
    if len(data) > limit:
        raise LoopFileError(f"larger than {limit // (1 << 20)} MB: too big for a loop file", where,
                            fix="check the path; a loop file is a few KB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise LoopFileError(f"not valid UTF-8 (byte 0x{data[exc.start]:02x})", where, line, column,
                            fix="save the file as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def load_any(path: str | os.PathLike) -> LoopFile:
    """Read a ``.loop`` file, a ``*.loop.yaml`` / ``*.loop.yml`` file or a loop-runner YAML config."""
    from .loopfile import load_loop_file
    from .yamlspec import load_yaml_loops

    name = os.path.basename(os.fspath(path)).lower()
    if name.endswith(LOOP_SUFFIX):
        return load_loop_file(path)
    if name.endswith(YAML_SUFFIXES):
        return load_yaml_loops(path)
    raise LoopFileError("not a loop file", os.fspath(path),
                        fix="name it *.loop, *.loop.yaml or *.loop.yml (or pass a loop-runner *.yaml config)")

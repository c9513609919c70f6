"""Reading loop files: which names are loop files, and their bytes to text, bounded."""

from __future__ import annotations

import os

from pytest_loops.errors import LoopFileError, LoopUsageError
from pytest_loops.limits import MAX_LOOP_BYTES, MAX_YAML_BYTES, open_regular

LOOP_SUFFIX = ".loop"
YAML_LOOP_SUFFIXES = (".loop.yaml", ".loop.yml")
YAML_SUFFIXES = (".yaml", ".yml")
RUNNER_CONFIG_NAMES = ("loop-runner.config.yaml", "loop-runner.config.yml")
"""The loop-runner skill's config file: a loop source wherever a loop file is one."""


def is_loop_file(path: str | os.PathLike) -> bool:
    """True for names ending in ``.loop``, ``.loop.yaml`` or ``.loop.yml``, and for the
    loop-runner config (``loop-runner.config.yaml``)."""
    name = os.path.basename(os.fspath(path)).lower()
    return name.endswith(LOOP_SUFFIX) or name.endswith(YAML_LOOP_SUFFIXES) or name in RUNNER_CONFIG_NAMES


def runner_project_root(config_dir: str) -> str:
    """Where a loop-runner config's loop runs: the project root, as the skill runs it
    (``python3 harness/scripts/loop-runner.py run --config harness/loop-runner.config.yaml``
    from the root). A config in a ``harness/`` directory belongs to its parent; any
    other config to its own directory."""
    config_dir = os.path.abspath(config_dir)
    if os.path.basename(config_dir) == "harness":
        return os.path.dirname(config_dir)
    return config_dir


def read_text(path: str | os.PathLike) -> str:
    """A loop file's text. Unreadable, not a regular file, too big or not UTF-8 ->
    LoopFileError naming where."""
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

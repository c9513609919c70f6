"""The loop-runner config file; the names settings had before :mod:`.settings`.

The settings table, precedence (:func:`resolve`) and the environment layer live in
:mod:`pytest_loops.settings`; they are re-exported here so older imports keep working.
"""

from __future__ import annotations

import os
from typing import Any

from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import read_yaml_file, short_repr
from pytest_loops.settings import (  # noqa: F401 - the names this module has always offered
    BY_NAME,
    DEFAULTS,
    ENV_NAMES,
    GUARD_KEYS,
    SETTINGS,
    Resolved,
    env_layer,
    resolve,
    runner_guard_keys,
)

ENV_PREFIX = "PYTEST_LOOPS_"


def parse_guard(name: str, raw: Any, where: str) -> Any:
    """Turn a raw value (text from a flag, ini or env; a YAML scalar) into a guard value.

    Raises LoopUsageError naming ``where``, the value and what is valid.
    """
    return BY_NAME[name].parse(raw, where)


def parse_size(raw: Any, where: str) -> int:
    """A byte count: ``16777216``, ``16M``, ``512k``, ``1GiB`` (powers of 1024)."""
    return BY_NAME["output_cap"].parse(raw, where)


def parse_signal(raw: Any, where: str) -> str:
    """A no-progress signal: state | failure | both."""
    return BY_NAME["no_progress_signal"].parse(raw, where)


# -- the loop-runner config file ---------------------------------------------------

def _runner_keys() -> dict[str, set[str]]:
    """Section -> keys of a loop-runner config file: the settings table's config-file keys
    (with ``guards.escalate_after`` beside ``escalate_after_iter``) and the runner-only lists."""
    keys: dict[str, set[str]] = {"verify": {"cmd", "cmds"}, "protect": {"paths"}, "scope": {"paths"}}
    for row in SETTINGS:
        if row.config_key:
            section, _, key = row.config_key.partition(".")
            keys.setdefault(section, set()).add(key)
    keys["guards"].update(k for names in runner_guard_keys().values() for k in names)
    return keys


_RUNNER_KEYS = _runner_keys()


def _expect(cond: bool, where: str, what: str, value: Any) -> None:
    if not cond:
        raise LoopUsageError(f"expected {what}, got {type(value).__name__} {short_repr(value)}",
                             location=where)


def _str_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    _expect(isinstance(value, list) and all(isinstance(v, str) for v in value), where,
            "a list of strings", value)
    return list(value)


def load_yaml_file(path: str | os.PathLike) -> Any:
    """Read a YAML file within the limits of :mod:`pytest_loops.limits` (size, depth,
    aliases); any problem is one LoopUsageError line with file:line:column."""
    return read_yaml_file(path, "a config file", missing="config file not found",
                          missing_fix="check the path given to --config")


def read_runner_config(path: str | os.PathLike, data: Any = None) -> dict[str, Any]:
    """Read a loop-runner ``loop-runner.config.yaml`` into a flat settings layer.

    Keys: guards.{max_iter, budget_seconds, no_progress_k, escalate_after_iter},
    progress.state_paths, reflexion.{enabled, episodic_memory_page}, run_log.path,
    revise.cmd, and optionally verify.cmd / verify.cmds. Relative paths stay as
    written (they are relative to the loop's working directory). Unknown keys are
    returned under ``"unknown_keys"`` so callers can warn; wrong types raise.

    ``verified`` (top level, or ``revise.verified``) is the skill's mark that the
    config's values are not yet proven in this project: returned under
    ``"verified"`` (False when either says false), acted on by nothing, since the
    loop is fail-safe either way (every check must pass, every guard is on).
    """
    p = str(path)
    if data is None:
        data = load_yaml_file(path)
    if data is None:
        data = {}
    _expect(isinstance(data, dict), p, "a mapping at the top level", data)
    layer: dict[str, Any] = {}
    unknown: list[str] = []
    for section, body in data.items():
        if section == "verified":
            _expect(isinstance(body, bool) or body is None, f"{p}: verified", "true or false", body)
            if body is not None:
                layer["verified"] = bool(body) and layer.get("verified", True)
            continue
        if section not in _RUNNER_KEYS:
            unknown.append(str(section))
            continue
        if body is None:
            continue
        where = f"{p}: {section}"
        _expect(isinstance(body, dict), where, "a mapping", body)
        for key, value in body.items():
            kwhere = f"{p}: {section}.{key}"
            if key == "verified":
                _expect(isinstance(value, bool) or value is None, kwhere, "true or false", value)
                if value is not None:
                    layer["verified"] = bool(value) and layer.get("verified", True)
                continue
            if key not in _RUNNER_KEYS[section]:
                unknown.append(f"{section}.{key}")
                continue
            if value is None:
                continue
            if section == "guards" and key == "no_progress_signal":
                layer["no_progress_signal"] = parse_signal(value, kwhere)
            elif section == "guards":
                name = "escalate_after" if key == "escalate_after_iter" else key
                _expect(isinstance(value, (int, float)) and not isinstance(value, bool), kwhere,
                        "a number", value)
                layer[name] = parse_guard(name, value, kwhere)
            elif section == "progress":
                layer["state_paths"] = _str_list(value, kwhere)
            elif section == "reflexion" and key == "enabled":
                _expect(isinstance(value, bool), kwhere, "true or false", value)
                layer["lessons"] = value
            elif section == "verify":
                layer["verify"] = _str_list(value, kwhere)
            elif section in ("protect", "scope"):
                layer[section] = _str_list(value, kwhere)
            elif section == "revise" and key in ("branches", "max_parallel"):
                layer[key] = BY_NAME[key].parse(value, kwhere)
            else:
                _expect(isinstance(value, str) and value.strip() != "", kwhere, "a non-empty string", value)
                target = {"reflexion": "lessons_page", "run_log": "log_path", "revise": "revise"}[section]
                layer[target] = value
    if unknown:
        layer["unknown_keys"] = unknown
    return layer

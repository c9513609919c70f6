"""Settings: the loop-runner config file, environment variables, and precedence.

Precedence, lowest first: built-in defaults < config file < ini < environment <
command line < marker / loop file line. :func:`resolve` is the one place that
applies it; every entry point (the standalone runner, the pytest plugin) builds
its layers and calls it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import LoopUsageError
from .limits import read_yaml_file, short_repr
from .spec import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_MAX_ITER,
    DEFAULT_NO_PROGRESS_K,
    DEFAULT_OUTPUT_CAP,
    NO_PROGRESS_SIGNALS,
    validate_guard_values,
)

GUARD_KEYS = ("max_iter", "budget_seconds", "no_progress_k", "escalate_after")

DEFAULTS: dict[str, Any] = {
    "max_iter": DEFAULT_MAX_ITER,
    "budget_seconds": DEFAULT_BUDGET_SECONDS,
    "no_progress_k": DEFAULT_NO_PROGRESS_K,
    "escalate_after": DEFAULT_ESCALATE_AFTER,
    "no_progress_signal": "state",
    "revise": None,
    "state_paths": [],
    "verify": [],
    "protect": [],
    "scope": [],
    "reflexion": True,
    "memory_page": None,
    "log_path": None,
    "output_cap": DEFAULT_OUTPUT_CAP,
}

ENV_PREFIX = "PYTEST_LOOPS_"
# Setting -> environment variable. LOOP_* names are the revise step's contract,
# so settings use their own prefix and a nested run never reads them by mistake.
ENV_NAMES = {
    "max_iter": "PYTEST_LOOPS_MAX_ITER",
    "budget_seconds": "PYTEST_LOOPS_BUDGET_SECONDS",
    "no_progress_k": "PYTEST_LOOPS_NO_PROGRESS_K",
    "escalate_after": "PYTEST_LOOPS_ESCALATE_AFTER",
    "no_progress_signal": "PYTEST_LOOPS_NO_PROGRESS_SIGNAL",
    "revise": "PYTEST_LOOPS_REVISE",
    "state_paths": "PYTEST_LOOPS_STATE",
    "memory_page": "PYTEST_LOOPS_MEMORY",
    "artifacts": "PYTEST_LOOPS_ARTIFACTS",
    "output_cap": "PYTEST_LOOPS_OUTPUT_CAP",
}

_VALID_HINT = {
    "max_iter": "an integer >= 1 (the cap is always on)",
    "budget_seconds": "a number of seconds >= 0 (0 turns the budget off)",
    "no_progress_k": "an integer >= 0 (0 turns it off)",
    "escalate_after": "an integer >= 0 (0 turns it off)",
}


def parse_guard(name: str, raw: Any, where: str) -> Any:
    """Turn a raw value (text from a flag, ini or env; a YAML scalar) into a guard value.

    Raises LoopUsageError naming ``where``, the value and what is valid.
    """
    value = raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            value = float(text) if name == "budget_seconds" else int(text)
        except ValueError:
            raise LoopUsageError(f"{short_repr(raw)} is not a valid {name}; valid: {_VALID_HINT[name]}",
                                 location=where) from None
    if name == "budget_seconds" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, float) and name != "budget_seconds":
        if not math.isfinite(value) or value != int(value):
            raise LoopUsageError(f"{short_repr(raw)} is not a valid {name}; valid: {_VALID_HINT[name]}",
                                 location=where)
        value = int(value)
    if validate_guard_values(**{name: value}):
        raise LoopUsageError(f"{short_repr(raw)} is not a valid {name}; valid: {_VALID_HINT[name]}",
                             location=where)
    return value


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(raw: Any, where: str) -> int:
    """A byte count: ``16777216``, ``16M``, ``512k``, ``1GiB`` (powers of 1024)."""
    text = str(raw).strip().lower().removesuffix("b").removesuffix("i")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
    try:
        value = int(text[:len(text) - len(unit)].strip()) * _SIZE_UNITS[unit]
    except ValueError:
        value = -1
    if isinstance(raw, bool) or value < 0:
        raise LoopUsageError(f"{raw!r} is not a valid output_cap; valid: a number of bytes >= 0 with an "
                             "optional K, M or G suffix, e.g. 16M (0 keeps all output)", location=where)
    return value


def parse_signal(raw: Any, where: str) -> str:
    """A no-progress signal: state | failure | both."""
    if not isinstance(raw, str) or raw.strip() not in NO_PROGRESS_SIGNALS:
        raise LoopUsageError(f"{short_repr(raw)} is not a valid no_progress_signal; valid: "
                             f"{', '.join(NO_PROGRESS_SIGNALS)}", location=where)
    return raw.strip()


@dataclass(frozen=True)
class Resolved:
    """Values after precedence, and where each came from ("default", a file, a flag...)."""

    values: dict[str, Any]
    origin: dict[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def with_layer(self, name: str, layer: Mapping[str, Any]) -> Resolved:
        """These values with one more layer on top (a marker, a loop file line)."""
        values, origin = dict(self.values), dict(self.origin)
        for key, value in layer.items():
            if value is not None:
                values[key], origin[key] = value, name
        return Resolved(values, origin)


def resolve(layers: Sequence[tuple[str, Mapping[str, Any]]],
            defaults: Mapping[str, Any] = DEFAULTS) -> Resolved:
    """Apply layers lowest first; a None value in a layer means "not set here"."""
    values = dict(defaults)
    origin = dict.fromkeys(defaults, "default")
    for name, layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            values[key] = value
            origin[key] = name
    return Resolved(values, origin)


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings from PYTEST_LOOPS_* environment variables (validated)."""
    environ = os.environ if environ is None else environ
    layer: dict[str, Any] = {}
    for key, var in ENV_NAMES.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        if key in GUARD_KEYS:
            layer[key] = parse_guard(key, raw, f"environment variable {var}")
        elif key == "no_progress_signal":
            layer[key] = parse_signal(raw, f"environment variable {var}")
        elif key == "state_paths":
            layer[key] = [p for p in raw.split(os.pathsep) if p]
        elif key == "output_cap":
            layer[key] = parse_size(raw, f"environment variable {var}")
        else:
            layer[key] = raw
    return layer


# -- the loop-runner config file ---------------------------------------------------

_RUNNER_KEYS = {
    "guards": {"max_iter", "budget_seconds", "no_progress_k", "escalate_after_iter", "escalate_after",
               "no_progress_signal"},
    "progress": {"state_paths"},
    "reflexion": {"enabled", "episodic_memory_page"},
    "run_log": {"path"},
    "revise": {"cmd"},
    "verify": {"cmd", "cmds"},
    "protect": {"paths"},
    "scope": {"paths"},
}


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
        if section not in _RUNNER_KEYS:
            unknown.append(str(section))
            continue
        if body is None:
            continue
        where = f"{p}: {section}"
        _expect(isinstance(body, dict), where, "a mapping", body)
        for key, value in body.items():
            kwhere = f"{p}: {section}.{key}"
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
                layer["reflexion"] = value
            elif section == "verify":
                layer["verify"] = _str_list(value, kwhere)
            elif section in ("protect", "scope"):
                layer[section] = _str_list(value, kwhere)
            else:
                _expect(isinstance(value, str) and value.strip() != "", kwhere, "a non-empty string", value)
                target = {"reflexion": "memory_page", "run_log": "log_path", "revise": "revise"}[section]
                layer[target] = value
    if unknown:
        layer["unknown_keys"] = unknown
    return layer

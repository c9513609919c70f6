"""Keep secrets out of everything pytest-loops writes.

Check and revise output can echo the environment (``env``, a failing ``curl``,
a debug print). Before any artifact is written, the value of every environment
variable whose *name* looks secret is replaced by a marker naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

SECRET_NAME_PARTS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL", "AUTH")
"""An environment variable whose upper-cased name contains one of these is a secret."""

MIN_SECRET_LENGTH = 4
"""Shorter values ("1", "on") would blank out ordinary text and protect nothing."""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def secret_values(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(value, marker) pairs to replace, longest value first.

    Longest first so a secret that contains another secret is replaced whole.
    """
    source = os.environ if env is None else env
    pairs = {}
    for name, value in source.items():
        if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
            continue
        if is_secret_name(name):
            # Two variables with one value: keep the first name seen, deterministically.
            pairs.setdefault(value, f"[REDACTED:{name}]")
    return sorted(pairs.items(), key=lambda item: (-len(item[0]), item[0]))


def _apply(text: str, pairs: list[tuple[str, str]]) -> str:
    for value, marker in pairs:
        if value in text:
            text = text.replace(value, marker)
    return text


def make_redactor(env: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """``redact`` with the secrets looked up once: for writers that clean many strings."""
    pairs = secret_values(env)
    return lambda text: _apply(text, pairs)


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Replace the values of secret-named environment variables in ``text``.

    ``env`` defaults to ``os.environ``. Values shorter than 4 characters are kept.
    """
    return _apply(text, secret_values(env))


def redact_obj(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """``redact`` every string inside dicts, lists and tuples (keys included)."""
    pairs = secret_values(env)
    if not pairs:
        return obj
    return _walk(obj, pairs)


def _walk(obj: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(obj, str):
        return _apply(obj, pairs)
    if isinstance(obj, dict):
        return {_walk(k, pairs): _walk(v, pairs) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, pairs) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v, pairs) for v in obj)
    return obj

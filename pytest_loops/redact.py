"""Keep secrets and terminal control sequences out of everything pytest-loops writes.

Check and revise output can echo the environment (``env``, a failing ``curl``,
a debug print). Before any artifact is written, the value of every environment
variable whose *name* looks secret is replaced by a marker naming the variable,
and so is every value given to ``--mask`` / ``--loop-mask`` / ini ``loop_mask``
(carried, one per line, in ``PYTEST_LOOPS_MASK``, so every writer of the process
and every nested run masks them too).

Command output can also hold escape sequences (colours, cursor moves, window
titles): :func:`strip_control` removes them before text reaches a terminal, a
lesson, a prompt or a hand-off.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from pytest_loops.errors import LoopUsageError

SECRET_NAME_PARTS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "CREDENTIAL", "AUTH")
"""An environment variable whose upper-cased name contains one of these is a secret."""

MIN_SECRET_LENGTH = 4
"""Shorter values ("1", "on") would blank out ordinary text and protect nothing."""

MASK_ENV = "PYTEST_LOOPS_MASK"
"""Values to mask whatever their variable's name, one per line."""

MASK_MARKER = "[REDACTED:mask]"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def secret_values(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(value, marker) pairs to replace, longest value first.

    Longest first so a secret that contains another secret is replaced whole.
    """
    source = os.environ if env is None else env
    pairs: dict[str, str] = {}
    for name, value in source.items():
        if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
            continue
        if is_secret_name(name):
            # Two variables with one value: keep the first name seen, deterministically.
            pairs.setdefault(value, f"[REDACTED:{name}]")
    masks = source.get(MASK_ENV)
    if isinstance(masks, str):
        for value in masks.splitlines():
            if len(value) >= MIN_SECRET_LENGTH:
                pairs.setdefault(value, MASK_MARKER)
    return sorted(pairs.items(), key=lambda item: (-len(item[0]), item[0]))


def export_masks(values: Iterable[str], where: str = "--mask",
                 env: MutableMapping[str, str] | None = None) -> Callable[[], None]:
    """Add ``values`` to ``PYTEST_LOOPS_MASK`` in ``env`` (default: this process's
    environment), so every writer of this process and every run it starts masks them.
    Returns what puts the variable back as it was.

    A value shorter than 4 characters is bad input (LoopUsageError naming ``where``,
    never the value), and nothing is changed: it would not be masked, and the user
    would believe it is.
    """
    target = os.environ if env is None else env
    before = target.get(MASK_ENV)
    current = (before or "").splitlines()
    for value in values:
        for line in str(value).splitlines() or [""]:  # a value with a newline: each line alone
            if len(line) < MIN_SECRET_LENGTH:
                raise LoopUsageError(f"a value of {len(line)} character(s) is too short to mask",
                                     location=where,
                                     fix=f"give the whole secret (at least {MIN_SECRET_LENGTH} characters)")
            if line not in current:
                current.append(line)
    if current:
        target[MASK_ENV] = "\n".join(current)

    def restore() -> None:
        if before is None:
            target.pop(MASK_ENV, None)
        else:
            target[MASK_ENV] = before

    return restore


# the environment last looked at (CPython's bytes dict), its pairs and its redactor:
# looked up again only when the environment changed, pytest's per-test variable
# aside (it is set for every phase of every test, and its name is not secret-named)
_seen: list[Any] = [None, (), None]
_PER_TEST = "PYTEST_CURRENT_TEST"


def _pairs(env: Mapping[str, str] | None) -> Sequence[tuple[str, str]]:
    """``secret_values(env)``; for this process's environment, remembered while it is unchanged
    (a C-level dict comparison instead of a walk that decodes every variable)."""
    data = getattr(os.environ, "_data", None) if env is None else None
    encodekey = getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encodekey is None:
        return secret_values(env)
    seen = _seen[0]
    if seen is not None:
        key = encodekey(_PER_TEST)
        if key in data:
            seen[key] = data[key]
        else:
            seen.pop(key, None)
        if seen == data:
            return _seen[1]
    _seen[0], _seen[1], _seen[2] = dict(data), tuple(secret_values()), None
    return _seen[1]


def anything_to_mask() -> bool:
    """True when this process's environment holds a secret-named value or a mask."""
    return bool(_pairs(None))


def current_redactor() -> Callable[[str], str]:
    """The redactor of this process's environment as it is now, made again only when
    it changed (writers that mask once per write: the terminal's stream, reports)."""
    pairs = _pairs(None)
    if _seen[1] is pairs and _seen[2] is not None:
        return _seen[2]
    redactor = _redactor(pairs)
    if _seen[1] is pairs:
        _seen[2] = redactor
    return redactor


def _redactor(pairs: Sequence[tuple[str, str]]) -> Callable[[str], str]:
    return lambda text: _apply(text, pairs)


def _apply(text: str, pairs: Sequence[tuple[str, str]]) -> str:
    for value, marker in pairs:
        if value in text:
            text = text.replace(value, marker)
    return text


def make_redactor(env: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """``redact`` with the secrets looked up once: for writers that clean many strings."""
    return _redactor(_pairs(env))


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Replace the values of secret-named environment variables in ``text``.

    ``env`` defaults to ``os.environ``. Values shorter than 4 characters are kept.
    """
    return _apply(text, _pairs(env))


def redact_obj(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """``redact`` every string inside dicts, lists and tuples (keys included)."""
    pairs = _pairs(env)
    if not pairs:
        return obj
    return _walk(obj, pairs)


def _walk(obj: Any, pairs: Sequence[tuple[str, str]]) -> Any:
    if isinstance(obj, str):
        return _apply(obj, pairs)
    if isinstance(obj, dict):
        return {_walk(k, pairs): _walk(v, pairs) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, pairs) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_walk(v, pairs) for v in obj)
    return obj


# -- terminal control sequences ---------------------------------------------------------

_CONTROL_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase (7- and 8-bit)
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, APC...
    r"|\x1b[ -/]*[0-~]"  # any other escape (charset, keypad, reset)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # the other C0 controls (not \t, \n), DEL and C1
)


def strip_control(text: str) -> str:
    """``text`` without terminal control sequences: CSI (colours, cursor moves), OSC
    (window titles, hyperlinks), DCS and other escapes, and every C0/C1 control
    character except newline and tab. A carriage return ends a line (``\\r\\n`` is one)."""
    if not text:
        return text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL_SEQUENCE.sub("", text)


# -- file names from loop names -------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
SLUG_HASH_CHARS = 10


def name_slug(name: str, *, max_chars: int = 60, env: Mapping[str, str] | None = None) -> str:
    """A file-name form of a loop's name that no other name shares and no secret is in:
    a readable part and a short sha256 of the whole (masked) name, so ``a/b``, ``a-b``
    and ``a b`` never share a lessons page or a run log name."""
    masked = redact(name, env)
    readable = _UNSAFE.sub("-", masked).strip("-.")[:max_chars].rstrip("-.") or "loop"
    digest = hashlib.sha256(masked.encode("utf-8", "surrogatepass")).hexdigest()[:SLUG_HASH_CHARS]
    return f"{readable}-{digest}"


def scrub_file(path: str | os.PathLike[str], scrub: Callable[[str], str]) -> bool:
    """Mask a file in place (undecodable bytes kept as they are); a file that cannot
    be read or written is left alone. True when the file was rewritten (or may have been)."""
    from pytest_loops.limits import read_own_text, write_fresh

    try:  # the files are in a directory a check can write: never read or written through a link
        text = read_own_text(path, errors="surrogateescape")
        clean = scrub(text)
        if clean != text:
            write_fresh(path, clean, errors="surrogateescape")
            return True
    except OSError:
        return True
    return False


def scrub_tree(root: str | os.PathLike[str], scrub: Callable[[str], str], *,
               skip_suffixes: tuple[str, ...] = (".out",), limit: int = 64 << 20) -> None:
    """Mask every regular file under ``root`` in place (what a loop's child processes
    wrote there: coverage data, impact maps, pytest's cache hold test ids, and a test id
    can hold a value). Files ending in ``skip_suffixes`` were masked when written; links
    are not followed; files over ``limit`` bytes are left alone."""
    import stat as _stat

    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            if name.endswith(skip_suffixes):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if _stat.S_ISREG(st.st_mode) and st.st_size <= limit:
                scrub_file(path, scrub)

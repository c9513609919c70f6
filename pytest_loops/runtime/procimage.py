"""Secrets out of the harness's own ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``.

A revise step runs as the same user as the harness, so it can read the harness's
``/proc/<pid>/environ`` (the environment the harness was started with: the ``.tine``
signing key too, though no child is given it) and ``/proc/<pid>/cmdline`` (a
``--hidden-verify`` command, which the prompt never names). Both files are read
straight from the process's memory: the argument and environment areas at the top of
its stack, whose addresses are fields 48 to 51 of ``/proc/self/stat`` (arg_start,
arg_end, env_start, env_end).

Python copied both into ``sys.argv`` and ``os.environ`` at start-up and never reads
those areas again, so once the harness knows which values are secret,
:func:`hide_secrets` overwrites them there with NUL bytes, in place, as
``setproctitle`` writes its title (the areas are never resized, the terminating NUL
of the arguments is kept). ``os.environ`` and ``sys.argv`` keep the values, and
the C environment is given its own copy of each hidden variable first (``putenv``),
so a child started with the inherited environment (``env=None``: an xdist worker)
gets what it got before.

A process the harness starts for itself (its watchdog, its git calls) is not given
them at all: :func:`helper_environment` is the environment without every variable
hidden here (the user's commands get theirs from the harness's own child environment).

It never fails the harness: without ``/proc``, with areas it does not recognise, or
on any error, it leaves everything as it is and says nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping

STAT = "/proc/self/stat"

# names of the variables hide_secrets was given: a process of the harness's own never gets them
_hidden: set[str] = set()


def hide_secrets(env_names: Iterable[str | None] = (), values: Iterable[str | None] = ()) -> bool:
    """Overwrite, in this process's memory, the values of the environment variables
    ``env_names`` and every command-line argument equal to one of ``values`` (or ending
    in ``=value``: ``--opt=value``). True when something was overwritten.

    The names are kept, even when nothing could be overwritten, for
    :func:`helper_environment`."""
    names = [n for n in env_names if n]
    _hidden.update(names)
    env_names = names
    try:
        return _hide([os.fsencode(n) for n in env_names if n], [os.fsencode(v) for v in values if v])
    except Exception:  # noqa: BLE001 - hiding is best effort: never a reason to stop the harness
        return False


def helper_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: ``os.environ``) without the variables :func:`hide_secrets`
    hid: the environment of a helper process the harness starts for itself, whose
    ``/proc/<pid>/environ`` a revise step or a check can read as well."""
    return {k: v for k, v in (os.environ if base is None else base).items() if k not in _hidden}


def _areas() -> tuple[int, int, int, int] | None:
    with open(STAT, "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    if len(fields) < 49:
        return None
    arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])  # fields 48-51
    if not (0 < arg_start < arg_end <= env_start < env_end):
        return None
    return arg_start, arg_end, env_start, env_end


def _entries(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, bytes) of each NUL-terminated string in an area."""
    out = []
    offset = 0
    for item in data.split(b"\0"):
        out.append((offset, item))
        offset += len(item) + 1
    return out


def _hide(names: list[bytes], secrets: list[bytes]) -> bool:
    if not names and not secrets:
        return False
    areas = _areas()
    if areas is None:
        return False
    arg_start, arg_end, env_start, env_end = areas
    blanks: list[tuple[int, int]] = []  # (address, length)
    if names:
        memory = ctypes.string_at(env_start, env_end - env_start)
        if not _agrees(memory, "/proc/self/environ"):
            return False
        for offset, entry in _entries(memory):
            name, eq, value = entry.partition(b"=")
            if eq and value and name in names:
                blanks.append((env_start + offset, len(entry)))
    if secrets:
        memory = ctypes.string_at(arg_start, arg_end - arg_start)
        if not _agrees(memory, "/proc/self/cmdline"):
            return False
        for offset, arg in _entries(memory):
            for secret in secrets:
                if arg == secret:
                    blanks.append((arg_start + offset, len(arg)))
                elif arg.endswith(b"=" + secret):
                    blanks.append((arg_start + offset + len(arg) - len(secret), len(secret)))
    for name in names:  # the C environment points at a copy of its own, not at the area
        text = os.fsdecode(name)
        if text in os.environ:
            os.putenv(text, os.environ[text])
    for address, length in blanks:
        ctypes.memset(address, 0, length)
    return bool(blanks)


def _agrees(memory: bytes, proc_file: str) -> bool:
    """Whether the memory read is the area the kernel shows (a title set by
    setproctitle, for one, moves things: then nothing is written)."""
    with open(proc_file, "rb") as f:
        shown = f.read(len(memory) + 1)
    return bool(shown) and memory.startswith(shown.rstrip(b"\0")) and len(shown) <= len(memory)

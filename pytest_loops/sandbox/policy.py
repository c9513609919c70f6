"""What one command may see and change, whatever enforces it.

A :class:`Policy` says it in paths; a tier (:mod:`pytest_loops.sandbox.bwrap`,
:mod:`pytest_loops.sandbox.landlock`) turns it into a launch. Nothing else in the
package knows which tier runs.
"""

from __future__ import annotations

import ast
import enum
import functools
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field


class Tier(enum.StrEnum):
    """How a command is kept apart, strongest first."""

    NAMESPACES = "namespaces"  # bubblewrap: mount, PID and IPC namespaces
    LANDLOCK = "landlock"  # the kernel limits writes; no mount or PID isolation
    NONE = "none"  # detect and undo only


REQUESTS = ("auto", *(t.value for t in Tier))


@dataclass(frozen=True)
class Policy:
    """One command's view of the machine.

    ``writable`` paths are bound read-write over a read-only root; ``readonly``
    pairs ``(source, path)`` put ``source`` read-only at ``path`` after them (a test
    directory inside the writable tree); ``mounts`` pairs put a host directory
    read-write at another path (the clean room's tree at the project's own path);
    ``overlays`` pairs put a host directory at a path under a throw-away writable
    layer (the judge's view of the working tree: nothing written reaches it);
    ``layers`` ``(source, upper, work, path)`` put ``source`` at ``path`` under a
    writable layer that is kept in ``upper`` (a fan-out candidate's change set);
    ``empty`` directories are covered by an empty one (caches the judge must not read);
    ``masked`` directories are empty; ``keep`` paths stay visible read-only under a
    private ``/tmp`` or a masked directory (the interpreter, ``sys.path``).
    """

    cwd: str
    writable: tuple[str, ...] = ()
    readonly: tuple[tuple[str, str], ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    overlays: tuple[tuple[str, str], ...] = ()
    layers: tuple[tuple[str, str, str, str], ...] = ()
    empty: tuple[str, ...] = ()
    masked: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    read_only_root: bool = True
    private_tmp: bool = True
    private_home: bool = False  # $HOME under a throw-away layer
    network: bool = True
    unset_env: tuple[str, ...] = ()
    # landlock: where temporary files go (TMPDIR), writable
    tmpdir: str | None = None


@dataclass
class Launch:
    """How to start one command under a policy: the argv, descriptors the child
    keeps, a function the child runs before exec, and environment changes."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    preexec_fn: Callable[[], None] | None = None
    env_set: dict[str, str] = field(default_factory=dict)
    # set only where the command's environment has the variable (a TMPDIR that names a
    # directory the sandbox hides): absent, it stays absent, as in a run outside any sandbox
    env_if_set: dict[str, str] = field(default_factory=dict)
    cleanup: Callable[[], None] | None = None  # after the child started (or failed to)

    def close(self) -> None:
        if self.cleanup is not None:
            cleanup, self.cleanup = self.cleanup, None
            cleanup()


@functools.lru_cache(maxsize=8)
def _editable_roots(site_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Where editable installs point: setuptools' ``__editable__.*_finder.py`` files name
    their packages' directories in a ``MAPPING`` literal (the directories are not on
    ``sys.path``)."""
    found: list[str] = []
    for site_dir in site_dirs:
        try:
            names = [n for n in os.listdir(site_dir) if n.startswith("__editable__") and n.endswith("finder.py")]
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(site_dir, name), encoding="utf-8") as f:
                    text = f.read(1 << 20)
            except (OSError, UnicodeDecodeError):
                continue
            match = re.search(r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$", text, re.M | re.S)
            try:
                mapping = ast.literal_eval(match.group(1)) if match else {}
            except (ValueError, SyntaxError):
                continue
            found += [v for v in mapping.values() if isinstance(v, str) and os.path.isabs(v)] \
                if isinstance(mapping, dict) else []
    return tuple(found)


def interpreter_paths() -> tuple[str, ...]:
    """What a command needs to see wherever it is: this interpreter's prefixes, its
    ``sys.path`` (editable installs included) and the programs on ``PATH``."""
    seen: dict[str, None] = {}
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
                 *sys.path, *os.environ.get("PATH", "").split(os.pathsep),
                 *_editable_roots(tuple(p for p in sys.path if p.endswith("-packages")))):
        if path and os.path.isabs(path) and os.path.exists(path):
            seen.setdefault(os.path.realpath(path), None)
    return tuple(seen)


def home() -> str | None:
    value = os.environ.get("HOME") or os.path.expanduser("~")
    return os.path.realpath(value) if value and os.path.isabs(value) and os.path.isdir(value) else None


# The agents' own state directories, under $HOME: a coding agent keeps its
# session, credentials' refresh and transcript there. Only those that exist are
# bound; `sandbox_writable` adds more.
AGENT_STATE = (".cache", ".claude", ".claude.json", ".codex", ".gemini", ".aider", ".config/claude",
               ".config/gemini", ".local/share/aider", ".npm")


def agent_state_paths() -> tuple[str, ...]:
    top = home()
    if top is None:
        return ()
    return tuple(p for p in (os.path.join(top, rel) for rel in AGENT_STATE) if os.path.exists(p))


def runtime_dirs() -> tuple[str, ...]:
    """Directories whose sockets reach processes outside the command's tree: the
    user's session bus and service manager (``$XDG_RUNTIME_DIR``)."""
    found = []
    for value in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{os.getuid()}"):
        if value and os.path.isdir(value) and os.path.realpath(value) not in found:
            found.append(os.path.realpath(value))
    return tuple(found)


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")

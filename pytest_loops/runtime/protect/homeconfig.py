"""Configuration in the user's home that runs programs later: kept as it was at loop start.

The revise step may write the agents' own state directories (``~/.claude``, ``~/.codex``,
``~/.gemini``, ... in every tier; in the ``none`` tier the whole home). Some files there
name programs that run later, outside any sandbox: Claude Code's hooks and MCP servers,
Codex's and Gemini's MCP servers and notification commands, git's ``core.fsmonitor`` and
hooks path in the user's git configuration, the shell's start-up files, ssh's
``ProxyCommand``. A revise step that plants one there sets a trap for the user's next
session. :class:`HomeConfigGuard` records those files at loop start and, after every
revise step, reports each change as a violation and puts the file back (a new one is
removed). ``~/.claude.json``, which Claude Code rewrites as it runs, is compared by the
keys that name programs (``mcpServers``, a project's ``mcpServers``, ``hooks``) and only
those are put back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from pytest_loops.runtime.protect.tree import Stored, Violation, _restore_path

HOME_WHY = "configuration in your home that runs programs later (agents' hooks and servers, git, the shell)"
# whole files, relative to the home directory
WHOLE = (
    ".claude/settings.json", ".claude/settings.local.json", ".config/claude/settings.json",
    ".gemini/settings.json", ".config/gemini/settings.json", ".aider.conf.yml",
    ".gitconfig", ".config/git/config", ".config/git/attributes", ".ssh/config", ".ssh/authorized_keys",
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile", ".zshenv",
    ".config/fish/config.fish", ".npmrc", ".config/pip/pip.conf", ".pip/pip.conf", ".pydistutils.cfg",
    # instructions every later session of an agent reads first
    ".claude/CLAUDE.md", ".codex/AGENTS.md", ".gemini/GEMINI.md", ".pdbrc", ".pdbrc.py",
    # the user's settings of the tools that check code, install it or run it
    ".config/ruff/ruff.toml", ".config/ruff/pyproject.toml", ".config/uv/uv.toml", ".config/pypoetry/config.toml",
    ".config/mypy/config", ".config/flake8", ".config/pycodestyle", ".pylintrc", ".config/pylintrc",
    ".docker/config.json", ".cursor/mcp.json", ".continue/config.json", ".continue/config.yaml",
    ".pythonrc", ".pythonrc.py", ".config/opencode/opencode.json", ".condarc",
)
# directories whose every file is configuration that runs or instructs later: hook scripts a
# guarded settings file names, custom commands and agents, extensions with their own servers
TREES = (".claude/hooks", ".claude/commands", ".claude/agents", ".claude/skills", ".codex/prompts",
         ".gemini/extensions", ".gemini/commands", ".config/claude/hooks", ".local/bin",
         ".ipython/profile_default/startup", ".config/opencode/agent", ".config/opencode/command")
MAX_TREE_FILES = 500
# files an agent rewrites as it runs (its bookkeeping, a project it was told to trust): only
# the keys that name programs are compared; JSON is put back key by key, TOML whole
KEYED = {".claude.json": ("mcpServers", "hooks"), ".codex/config.toml": ("mcp_servers", "notify")}
MAX_BYTES = 4 << 20


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_BYTES else None


def _programs(data: bytes | None, keys: tuple[str, ...], toml: bool = False) -> dict[str, Any] | None:
    """The values of ``keys`` at the top and in each of ``projects`` (None: not JSON, or
    with ``toml`` not TOML)."""
    if data is None:
        return {}
    try:
        if toml:
            import tomllib

            doc = tomllib.loads(data.decode("utf-8"))
        else:
            doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    found = {key: doc.get(key) for key in keys if key in doc}
    projects = doc.get("projects")
    if isinstance(projects, dict):
        for name, project in projects.items():
            if isinstance(project, dict):
                found.update({f"projects/{name}/{key}": project[key] for key in keys if key in project})
    return found


def _put_back(data: bytes, old: dict[str, Any], keys: tuple[str, ...]) -> bytes | None:
    """``data`` (JSON) with the program keys as ``old`` had them (None: not JSON)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    for key in keys:
        if key in old:
            doc[key] = old[key]
        else:
            doc.pop(key, None)
    projects = doc.get("projects")
    if isinstance(projects, dict):
        for name, project in projects.items():
            if not isinstance(project, dict):
                continue
            for key in keys:
                where = f"projects/{name}/{key}"
                if where in old:
                    project[key] = old[where]
                else:
                    project.pop(key, None)
    return json.dumps(doc, indent=2).encode()


class HomeConfigGuard:
    """See the module docstring. ``inside``: whether a path is in the working tree (left to
    the tree's guard)."""

    def __init__(self, inside: Callable[[str], bool], home: str | None = None) -> None:
        self.inside = inside
        self.home = home or os.path.expanduser("~")
        self.whole: dict[str, tuple[bytes | None, int]] = {}  # path -> (bytes at loop start, mode)
        self.keyed: dict[str, tuple[tuple[str, ...], dict[str, Any] | None]] = {}
        self.keyed_start: dict[str, tuple[bytes | None, int]] = {}  # TOML files: put back whole
        self.trees: list[str] = []

    def begin(self) -> None:
        if not self.home or self.home == "~" or not os.path.isdir(self.home):
            return
        for rel in WHOLE:
            path = os.path.join(self.home, rel)
            if not self.inside(path) and not os.path.islink(path):
                try:
                    mode = os.stat(path).st_mode & 0o7777
                except OSError:
                    mode = 0o600
                self.whole[path] = (_read(path), mode)
        for rel in TREES:
            top = os.path.join(self.home, rel)
            if self.inside(top) or os.path.islink(top):
                continue
            self.trees.append(top)
            for path in self._files(top):
                try:
                    mode = os.lstat(path).st_mode & 0o7777
                except OSError:
                    continue
                self.whole[path] = (_read(path), mode)
        for rel, keys in KEYED.items():
            path = os.path.join(self.home, rel)
            if not self.inside(path) and not os.path.islink(path):
                data = _read(path)
                self.keyed[path] = (keys, _programs(data, keys, toml=path.endswith(".toml")))
                if path.endswith(".toml"):
                    self.keyed_start[path] = (data, 0o600)

    @staticmethod
    def _files(top: str) -> list[str]:
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            found += [os.path.join(dirpath, n) for n in sorted(filenames)]
            if len(found) >= MAX_TREE_FILES:
                return found[:MAX_TREE_FILES]
        return found

    def check(self) -> list[Violation]:
        """Every change since loop start, put back."""
        found: list[Violation] = []
        for top in self.trees:  # a file new in one of the trees: not there at loop start
            for path in self._files(top):
                if path not in self.whole:
                    self.whole[path] = (None, 0o644)
        for path, (old, mode) in self.whole.items():
            now = _read(path) if not os.path.islink(path) else b"<a link>"
            if now == old:
                continue
            stored = None if old is None else Stored("", "", len(old), mode, old)
            ok = _restore_path(path, stored, None)
            found.append(Violation(path, "added" if old is None else "removed" if now is None else "modified",
                                   HOME_WHY, restored=ok))
        for path, (keys, old_programs) in self.keyed.items():
            data = _read(path)
            toml = path in self.keyed_start
            now_programs = _programs(data, keys, toml=toml)
            if old_programs is None or now_programs == old_programs:
                continue
            if toml:
                start, mode = self.keyed_start[path]
                ok = _restore_path(path, None if start is None else Stored("", "", len(start), mode, start), None)
                how = "added" if start is None else "removed" if data is None else "modified"
                found.append(Violation(path, how, f"{HOME_WHY}: its {', '.join(keys)}", restored=ok))
                continue
            fixed = None if data is None or now_programs is None else _put_back(data, old_programs, keys)
            ok = False
            if fixed is not None:
                ok = _restore_path(path, Stored("", "", len(fixed), 0o600, fixed), None)
            found.append(Violation(path, "modified", f"{HOME_WHY}: its {', '.join(keys)}", restored=ok))
        return found

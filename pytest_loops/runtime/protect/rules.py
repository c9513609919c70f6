"""Which paths are read-only: the files that judge the code, by name, glob and check command."""

from __future__ import annotations

import importlib.machinery
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from pytest_loops.spec import CheckKind, LoopSpec

# Configuration files pytest (and the tools around it) read, at any depth and in
# every ancestor directory: present and future names.
CONFIG_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
    "pyproject.toml", "tox.ini", "setup.cfg", "setup.py", "noxfile.py", ".coveragerc",
    "Makefile", "makefile", "GNUmakefile", "justfile", "Justfile", "Taskfile.yml",
})
# What judges the code besides pytest: the linters' and type checkers' settings (a check
# `ruff check .` passes once ruff.toml excludes the file), and what runs the checks later:
# CI pipelines and commit hooks (`pytest || true` in CI, a hook that breaks the code again
# at the next commit). Read-only like pytest's configuration.
TOOL_CONFIG_NAMES = frozenset({
    "ruff.toml", ".ruff.toml", ".flake8", "mypy.ini", ".mypy.ini", ".pylintrc", "pylintrc", "pyrightconfig.json",
    ".isort.cfg", ".bandit", ".pydocstyle", ".pycodestyle", ".yamllint", ".yamllint.yml", ".eslintrc",
    ".eslintrc.js", ".eslintrc.cjs", ".eslintrc.json", ".eslintrc.yml", ".eslintrc.yaml", "eslint.config.js",
    "eslint.config.mjs", "jest.config.js", "jest.config.ts", "vitest.config.ts", "vitest.config.js",
    ".pre-commit-config.yaml", ".pre-commit-hooks.yaml", ".gitlab-ci.yml", ".travis.yml", "azure-pipelines.yml",
    "bitbucket-pipelines.yml", "Jenkinsfile", "appveyor.yml", ".appveyor.yml", "cloudbuild.yaml",
    # read by tools and agents at their next start: the debugger's commands, instructions for
    # the next agent session, tool managers' hooks and the interpreter they pick
    ".pdbrc", ".pdbrc.py", "CLAUDE.md", "AGENTS.md", "GEMINI.md", ".cursorrules", ".windsurfrules", ".clinerules",
    ".aider.conf.yml", "mise.toml", ".mise.toml", ".tool-versions", ".python-version", ".npmrc", ".yarnrc",
    ".yarnrc.yml", "lefthook.yml", ".lefthook.yml",
})
# paths from the root of the tree whose files run later, outside the loop: CI pipelines, git
# hooks managers, the project's agent and editor settings (hooks, MCP servers, tasks run
# on opening the folder), dev containers, direnv
CI_DIRS = (".github/workflows/", ".github/actions/", ".circleci/", ".buildkite/", ".gitlab/", ".woodpecker/",
           ".forgejo/workflows/", ".gitea/workflows/", ".husky/", ".githooks/", ".claude/", ".codex/",
           ".gemini/", ".cursor/", ".vscode/", ".devcontainer/", ".mcp.json", ".envrc", ".devcontainer.json",
           ".github/copilot-instructions.md", ".github/instructions/", ".mise/", ".idea/")
ANCESTOR_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
    "pyproject.toml", "tox.ini", "setup.cfg",
})
# Files the interpreter runs on its own at start-up.
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
# A new module under one of these names shadows what the judge imports.
SHADOW_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "pytest_loops", "opentine",
                            "coverage", "xdist", "iniconfig", "packaging"}) | frozenset(
    getattr(sys, "stdlib_module_names", ()))
# The harness's own configuration file, wherever it is (``harness/`` by default): a
# new one is read by the next run.
HARNESS_CONFIG_NAMES = frozenset({"loop-runner.config.yaml", "loop-runner.config.yml"})
MODULE_SUFFIXES = tuple(sorted({*importlib.machinery.SOURCE_SUFFIXES, *importlib.machinery.EXTENSION_SUFFIXES,
                                *importlib.machinery.BYTECODE_SUFFIXES}, key=len, reverse=True))
# What the judge would import or load: held to the bytes the diff audit saw.
SOURCE_SUFFIXES = MODULE_SUFFIXES + (".pth", ".pyi", ".pyx", ".pxd")
# Directory names that hold tests and what they read (data, golden files, helpers).
TEST_DIR = re.compile(r"^(tests?|testing|test[_-].*|.*[_-]tests?|testdata|fixtures|golden)$", re.I)
DEFAULT_TEST_FILES = ("**/test_*.py", "**/*_test.py")
# Never tracked, never copied: caches, VCS data, build trees.
IGNORED_DIRS = frozenset({
    ".git", ".hg", ".svn", ".pytest_cache", ".pytest-loops", ".hypothesis",
    ".mypy_cache", ".ruff_cache", ".tox", ".nox", "node_modules",
})
# Bytecode caches are tracked but never judged: whatever a revise step writes into a
# __pycache__ is removed after it, and the clean room copies none, so a forged one is
# neither read by the judge nor left behind.
PYCACHE = "__pycache__"
CACHE_REASON = "a bytecode cache"
# Kept for callers that only need a walk of a tree's own files.
SKIP_DIRS = IGNORED_DIRS | {".venv", "venv", PYCACHE}
AUDIT_MAX_BYTES = 1 << 20  # in-scope Python files up to this size are kept for the diff audit
MEMORY_FILE_BYTES = 1 << 20  # read-only files up to this size are also kept in memory...
MEMORY_TOTAL_BYTES = 64 << 20  # ...up to this much in all
COPY_BLOCK = 1 << 20


def module_stem(name: str) -> str | None:
    """The module a file of this name is imported as (``json.py``, and an extension
    module such as ``json.cpython-311-x86_64-linux-gnu.so`` or ``json.abi3.so``, are
    ``json``); None when it is no module file."""
    for suffix in MODULE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:-len(suffix)]
    return None


def harness_config(rel: str) -> bool:
    """Whether ``rel`` is a loop-runner config file by its name."""
    return rel.rsplit("/", 1)[-1] in HARNESS_CONFIG_NAMES


@lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over '/'-separated relative paths: `**` spans directories, `*` does not."""
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if pattern.endswith("/"):
        pattern += "**"
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches(relpath: str, patterns: Iterable[str]) -> bool:
    """Whether a relative path matches any glob (a plain directory name covers its files)."""
    if not patterns:
        return False
    globs, dirs = _matcher(patterns if isinstance(patterns, tuple) else tuple(patterns))
    return bool(globs is not None and globs.match(relpath)) or relpath.startswith(dirs)


@lru_cache(maxsize=256)
def _matcher(patterns: tuple[str, ...]) -> tuple[re.Pattern[str] | None, tuple[str, ...]]:
    """One regex for all the globs, and the plain directory names as prefixes."""
    globs = [_glob_regex(p).pattern for p in patterns]
    dirs = []
    for pattern in patterns:
        bare = pattern.strip().rstrip("/")
        while bare.startswith("./"):
            bare = bare[2:]
        if bare and not any(c in bare for c in "*?["):
            dirs.append(bare + "/")
    return (re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None), tuple(dirs)


def walk(root: Path) -> Iterable[str]:
    """Relative '/'-paths of the files under root, skipping caches and virtualenvs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for name in filenames:
            yield prefix + name


def named_test_files(spec: LoopSpec) -> list[str]:
    """Test files the loop's checks name: node ids' files and `.py` paths in pytest
    commands (read-only whatever their names)."""
    files: list[str] = []
    for check in spec.checks:
        if check.kind is CheckKind.PYTEST and check.node_id:
            files.append(check.node_id.split("::", 1)[0])
        elif check.command and "pytest" in check.command:
            try:
                words = shlex.split(check.command)
            except ValueError:
                continue
            files += [w.split("::", 1)[0] for w in words if w.split("::", 1)[0].endswith(".py")]
    return list(dict.fromkeys(f.lstrip("./") if f.startswith("./") else f for f in files))


_INTERPRETERS = re.compile(r"^(sh|bash|zsh|dash|ksh|python[0-9.]*|pypy[0-9.]*|node|ruby|perl|tclsh|make)$")
_CONFIG_FLAGS = frozenset({"-c", "--config-file", "--config", "--rcfile", "-f", "--file", "--makefile"})


def check_files(spec: LoopSpec, root: str) -> list[str]:
    """Files under ``root`` that judge: the scripts the checks run (``bash run_tests.sh``,
    ``python check.py``, ``./verify``), the configuration they name (``-c ci.ini``),
    the node ids' files, the loop's own file and the config files its settings came
    from. Read-only, whatever their names;
    files a check only reads as data (``grep fixed a.txt``) are not."""
    found = list(named_test_files(spec))

    def add(word: str) -> None:
        path = os.path.normpath(os.path.join(root, word.split("::", 1)[0]))
        if os.path.isfile(path):
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if not rel.startswith("../"):
                found.append(rel)

    for check in spec.checks:
        try:
            lexer = shlex.shlex(check.command or "", posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            words = (check.command or "").split()
        segment: list[str] = []
        for word in [*words, ";"]:
            if word and set(word) <= set(";&|()"):
                _segment_files(segment, add)
                segment = []
            else:
                segment.append(word)
    if spec.source and os.path.isfile(spec.source):
        add(os.path.realpath(spec.source))
    for origin in set(spec.origin.values()):  # the config files the loop's settings came from
        if origin.endswith(_SETTINGS_FILES) and os.path.isfile(os.path.join(root, origin)):
            add(os.path.realpath(os.path.join(root, origin)))
    if any(_MAKE.match(os.path.basename(w)) for c in spec.checks for w in (c.command or "").split()):
        for name in ("GNUmakefile", "makefile", "Makefile"):
            add(name)
    for rel in list(dict.fromkeys(found)):  # what they read in turn, a few levels deep
        _read_by(root, rel, add, depth=3)
    return list(dict.fromkeys(found))


_SETTINGS_FILES = (".yaml", ".yml", ".loop", ".toml", ".ini", ".cfg")
_MAKE = re.compile(r"^g?make$")
# `. file`, `source file` in a shell script; `include file` in a Makefile. The path may
# start with the script's own directory: "$(dirname "$0")/x", ${0%/*}/x, $(CURDIR)/x.
_SOURCED = re.compile(r"""^\s*(?:\.|source)\s+(.+)$""")
_INCLUDED = re.compile(r"^\s*-?s?include\s+(.+)$")
_SCRIPT_DIR = re.compile(r"""^["']?(?:\$\(dirname\s+["']?\$0["']?\)|\$\{0%/\*\}|\$\(CURDIR\)"""
                         r"""|\$\{?(?:SCRIPT_?DIR|HERE|DIR)\}?)["']?/""")
READ_BY_MAX_BYTES = 1 << 20


def _read_by(root: str, rel: str, add: Callable[[str], None], *, depth: int) -> None:
    """Add the files a check script or Makefile ``rel`` sources or includes (literal
    paths, from the root or from the script's own directory), and theirs in turn."""
    path = os.path.join(root, rel)
    name = os.path.basename(rel)
    try:
        if os.path.getsize(path) > READ_BY_MAX_BYTES:
            return
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return
    makefile = name in ("Makefile", "makefile", "GNUmakefile") or name.endswith(".mk")
    if not makefile and not (name.endswith((".sh", ".bash")) or re.match(r"#!.*\b(ba|da|k|z)?sh\b", text)):
        return
    words: list[str] = []
    for line in text.splitlines():
        match = (_INCLUDED if makefile else _SOURCED).match(line)
        if match:
            rest = match.group(1).strip()
            words += rest.split() if makefile else [rest]
    here = os.path.dirname(rel)
    for word in words:
        local = _SCRIPT_DIR.sub("", word)
        within = local != word
        word = (local.split() or [""])[0].strip("\"';")
        for candidate in ((os.path.join(here, word),) if within else (word, os.path.join(here, word))):
            before = os.path.normpath(candidate)
            if "$" in before or not os.path.isfile(os.path.join(root, before)):
                continue
            add(before)
            if depth > 0:
                _read_by(root, before.replace(os.sep, "/"), add, depth=depth - 1)


def _segment_files(words: list[str], add: Callable[[str], None]) -> None:
    """The script one simple command runs, and the config files it names."""
    while words and "=" in words[0] and not words[0].startswith(("-", "/", ".")):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return
    add(words[0])
    if _INTERPRETERS.match(os.path.basename(words[0])):
        rest = words[1:]
        while rest and rest[0].startswith("-"):
            if rest[0] in ("-m", "-c"):
                rest = []
                break
            rest = rest[1:]
        if rest:
            add(rest[0])
    for i, word in enumerate(words):
        if word in _CONFIG_FLAGS and i + 1 < len(words):
            add(words[i + 1])
        elif word.startswith(("--config-file=", "--rootdir=", "--config=", "--rcfile=")):
            add(word.split("=", 1)[1])


def describe(changes: Sequence[tuple[str, str]], limit: int = 8) -> str:
    text = ", ".join(f"{rel} ({how})" for rel, how in changes[:limit])
    return text + (f" and {len(changes) - limit} more" if len(changes) > limit else "")



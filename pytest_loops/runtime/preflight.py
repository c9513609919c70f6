"""Before the first iteration: is the revise command's program there at all?

A revise step whose program is missing would only be found after a whole
iteration of checks (minutes, on a real suite). The first word of the command is
looked up the way the shell will: a path is checked relative to the loop's
working directory, a bare name on PATH (with the harness's interpreter first, as
the loop's commands get it). Commands the shell interprets itself (builtins,
compound commands, expansions) are left to the shell.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence

from pytest_loops.errors import LoopUsageError

# words the shell runs itself, or after which the program is not the first word
_SHELL_WORDS = frozenset({
    "!", ".", ":", "[", "[[", "{", "(", "alias", "bg", "break", "builtin", "case", "cd", "command", "continue",
    "declare", "eval", "exec", "exit", "export", "false", "fg", "for", "function", "getopts", "hash", "if",
    "jobs", "kill", "let", "local", "nohup", "printf", "echo", "pwd", "read", "readonly", "return", "select",
    "set", "shift", "source", "test", "time", "times", "trap", "true", "type", "typeset", "ulimit", "umask",
    "unalias", "unset", "until", "wait", "while", "env", "sudo", "xargs", "nice", "timeout", "stdbuf",
})
_EXPANSIONS = ("$", "`", "*", "?", "~", "(", ")", "<", ">", "|", "&", ";", "{", "}")


def program_of(command: str) -> str | None:
    """The program a shell command starts, or None when the shell decides (builtins,
    expansions, compound commands, a command that does not parse)."""
    try:
        words = shlex.split(command, comments=True, posix=True)
    except ValueError:
        return None
    for word in words:
        if "=" in word and word.split("=", 1)[0].isidentifier():
            if any(c in word for c in _EXPANSIONS):
                return None  # NAME=$(...): the shell runs something first
            continue  # NAME=value before the program
        if word in _SHELL_WORDS or any(c in word for c in _EXPANSIONS):
            return None
        return word
    return None


def missing_program(command: str, cwd: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str | None:
    """Why the revise command's program cannot start (one line), or None."""
    program = program_of(command)
    if program is None:
        return None
    if "/" in program:
        path = os.path.join(os.fspath(cwd), program)
        if not os.path.exists(path):
            return f"its program {program!r} does not exist (looked in {os.fspath(cwd)})"
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            return f"its program {program!r} is not executable"
        return None
    env = os.environ if environ is None else environ
    search = [os.path.dirname(sys.executable), *[p for p in env.get("PATH", "").split(os.pathsep) if p]]
    if shutil.which(program, path=os.pathsep.join(search)) is not None:
        return None
    shown = os.pathsep.join(search[:8]) + (os.pathsep + "..." if len(search) > 8 else "")
    return f"its program {program!r} is not on PATH (searched {shown})"


def check_revise(command: str | None, cwd: str | os.PathLike[str], where: str,
                 environ: Mapping[str, str] | None = None) -> None:
    """LoopUsageError (exit 64 / a pytest usage error) when the revise command cannot start."""
    if not command:
        return
    why = missing_program(command, cwd, environ)
    if why is not None:
        raise LoopUsageError(f"the revise command {command!r} cannot start: {why}", location=where,
                             fix="install it, give its full path, or fix the command")


def unmatched_state_paths(patterns: Sequence[str], cwd: str | os.PathLike[str]) -> list[str]:
    """The state paths (globs) that match no file under ``cwd`` now: edits there would
    not count as progress. An existing directory counts as matched (it may be empty)."""
    from pytest_loops.progress.matching import PatternMatcher

    missing = []
    for pattern in patterns:
        if not pattern.strip():
            continue
        if os.path.isdir(os.path.join(os.fspath(cwd), pattern)):
            continue
        try:
            if not PatternMatcher(cwd, [pattern]).matched_files():
                missing.append(pattern)
        except (OSError, ValueError):
            continue  # the fingerprint says what is wrong with it when the loop runs
    return missing


def check_state_paths(patterns: Sequence[str], cwd: str | os.PathLike[str], mode: str, where: str) -> str | None:
    """One warning line for the state paths that match no file (None: all match);
    ``mode == "error"`` (the state_unmatched setting) makes it a LoopUsageError."""
    missing = unmatched_state_paths(patterns, cwd)
    if not missing:
        return None
    shown = ", ".join(repr(p) for p in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    message = (f"the state path{'s' if len(missing) > 1 else ''} {shown} match{'' if len(missing) > 1 else 'es'} "
               f"no file under {os.fspath(cwd)}: changes there are not seen, so real edits count as no progress")
    if mode == "error":
        raise LoopUsageError(message, location=where, fix="fix the glob (it is relative to the working directory)")
    return f"{where}: {message}"

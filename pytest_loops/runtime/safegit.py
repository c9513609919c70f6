"""Every git command the harness runs, without running a program the repository names.

Git runs programs its configuration and attributes name: ``core.fsmonitor`` on an
index refresh, hooks (``post-checkout`` on ``git worktree add``, ``post-index-change``
when the index is written), ``diff.external`` and ``diff.<driver>.command``, textconv
drivers, ``filter.<driver>.clean`` / ``smudge`` / ``process`` on any read or write of
the working tree. A revise step can set any of them in ``.git/config``, a hook or a
``.gitattributes`` line; the harness's own git calls (the hand-off's diff, fan-out's
worktrees) would then run that program after the revise step is over. :func:`run_git`
is the one way the harness runs git, and none of those programs runs:

- ``-c`` overrides, which win over every configuration file: ``core.fsmonitor=false``,
  ``core.hooksPath=/dev/null``, ``core.attributesFile=/dev/null``,
  ``diff.external=``, ``core.pager=cat``, ``submodule.recurse=false``,
  ``safe.bareRepository=explicit`` (a directory the revise step made look like a bare
  repository is not taken for one), ``protocol.allow=never`` (no transport, so no
  ssh, credential or remote helper), no automatic gc or maintenance;
- every filter driver the configuration defines, whatever its name, emptied and not
  required (``filter.<driver>.clean=`` ...), read with ``git config`` first under the
  same environment: ``.gitattributes`` may name it, so it must not run;
- ``--no-ext-diff --no-textconv`` for the diff family, ``--ignore-submodules=dirty``
  for ``diff`` and ``status`` (no git runs inside a submodule);
- the environment without any ``GIT_*`` variable of the caller's, plus
  ``GIT_CONFIG_NOSYSTEM=1``, ``GIT_ATTR_NOSYSTEM=1``, no trace2 targets, no prompt,
  no lazy fetch, no replace refs.

The tree guard makes ``.git/config``, ``.git/hooks/``, ``.git/info/attributes`` and
every ``.gitattributes`` read-only for the revise step too
(:mod:`pytest_loops.runtime.protect.gitpaths`); this module does not rely on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from pytest_loops.runtime.procimage import helper_environment

DEFAULT_TIMEOUT = 120.0

# Overrides that win over every configuration file (system, global, repository,
# worktree, includes): each one turns off a way git runs a program.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.useBuiltinFSMonitor", "false"),
    ("core.hooksPath", os.devnull),
    ("core.attributesFile", os.devnull),
    ("core.pager", "cat"),
    ("core.editor", ":"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("diff.external", ""),
    ("submodule.recurse", "false"),
    ("safe.bareRepository", "explicit"),
    ("protocol.allow", "never"),
    ("credential.helper", ""),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("log.showSignature", "false"),
)
ENVIRONMENT: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_TRACE2": "0",
    "GIT_TRACE2_EVENT": "0",
    "GIT_TRACE2_PERF": "0",
}
# Commands that take the diff options, and those that look into submodules.
_DIFF_COMMANDS = frozenset({"diff", "log", "show", "diff-index", "diff-files", "diff-tree"})
_SUBMODULE_COMMANDS = frozenset({"diff", "status"})
_FILTER_KEYS = ("clean", "smudge", "process")


def git_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the harness's environment) without any ``GIT_*`` variable, plus
    :data:`ENVIRONMENT` and without a secret the harness hid from its own process image
    (the signing key). ``HOME`` stays: the user's own ``safe.directory`` still counts."""
    env = {k: v for k, v in helper_environment(base).items() if not k.startswith("GIT_")}
    env.update(ENVIRONMENT)
    return env


def _config_args(pairs: Sequence[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for key, value in pairs:
        out += ["-c", f"{key}={value}"]
    return out


def _git_program() -> str:
    return shutil.which("git") or "git"


def filter_drivers(cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float) -> list[str]:
    """The names of the filter drivers git's configuration defines for ``cwd``."""
    done = subprocess.run([_git_program(), "--no-pager", *_config_args(OVERRIDES), "config", "-z", "--name-only",
                           "--get-regexp", r"^filter\..*\.(clean|smudge|process|required)$"],
                          cwd=cwd, env=dict(env), capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    names = []
    for item in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        head, _, last = item.rpartition(".")
        if item.startswith("filter.") and last.lower() in (*_FILTER_KEYS, "required") and head[7:]:
            names.append(head[7:])
    return list(dict.fromkeys(names))


def neutral_filters(names: Sequence[str]) -> list[tuple[str, str]]:
    """Overrides that make each named filter driver a pass-through that is never run."""
    pairs: list[tuple[str, str]] = []
    for name in names:
        pairs += [(f"filter.{name}.{key}", "") for key in _FILTER_KEYS]
        pairs.append((f"filter.{name}.required", "false"))
    return pairs


def git_argv(args: Sequence[str], filters: Sequence[str] = ()) -> list[str]:
    """The full command line for ``git args``, hardened (see the module docstring)."""
    args = list(args)
    if args and args[0] in _DIFF_COMMANDS:
        args[1:1] = ["--no-ext-diff", "--no-textconv"]
    if args and args[0] in _SUBMODULE_COMMANDS:
        args[1:1] = ["--ignore-submodules=dirty"]
    return [_git_program(), "--no-pager", *_config_args([*OVERRIDES, *neutral_filters(filters)]), *args]


def run_git(args: Sequence[str], cwd: str | os.PathLike[str], *, timeout: float = DEFAULT_TIMEOUT,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``git args`` in ``cwd`` hardened, output captured, no input. Raises what
    :func:`subprocess.run` raises (OSError, SubprocessError); a failed git is a
    non-zero ``returncode``."""
    environment = git_environment(env)
    filters = filter_drivers(cwd, environment, timeout)
    return subprocess.run(git_argv(args, filters), cwd=cwd, env=environment, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)

"""Narrowing a check: a plain pytest command re-run over a subset of its tests::

    command = narrow_pytest_command("python -m pytest -q tests/")   # None if not plain pytest
    command.with_targets(selection.tests)   # argv running only those tests

Node ids are pytest's, relative to its rootdir: run the child from the rootdir.

A module of its own, next to spectra.py, suspects.py and impact.py: it reads a
command line and imports nothing else of the package, so the checks can narrow a
pytest command without loading any of the coverage machinery.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PytestCommand", "narrow_pytest_command"]


@dataclass(frozen=True)
class PytestCommand:
    """A plain pytest invocation, split so a subset of its tests can be run.

    ``python`` is the interpreter of ``python -m pytest`` (None for the ``pytest``
    script); ``options`` keep their order; ``targets`` are the files, directories
    or node ids it names (none: pytest's own default).
    """

    python: str | None
    options: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def prefix(self) -> list[str]:
        return [self.python, "-m", "pytest"] if self.python else ["pytest"]

    @property
    def argv(self) -> list[str]:
        return [*self.prefix, *self.options, *self.targets]

    def with_targets(self, targets: Sequence[str]) -> list[str]:
        """The same run over other targets (node ids)."""
        return [*self.prefix, *self.options, *targets]


_PYTHON = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?(?:\.exe)?\Z")
# short options that take a value: -k EXPR, -m MARK, -p NAME, -c FILE, -o K=V, -W F, -r CHARS, -n N
_SHORT_VALUE = frozenset("kmpcoWrn")
_SHORT_FLAG = frozenset("xqvslP")
_LONG_VALUE = frozenset("""
--maxfail --tb --rootdir --basetemp --confcutdir --deselect --ignore --ignore-glob --junitxml
--junit-xml --junit-prefix --log-level --log-format --log-date-format --log-file --log-file-level
--log-file-format --log-file-date-format --log-file-mode --log-cli-level --log-cli-format
--log-cli-date-format --log-disable --durations --durations-min --import-mode --capture --color
--code-highlight --pythonwarnings --override-ini --config-file --show-capture --lfnf
--last-failed-no-failures --assert --verbosity --dist --tx --numprocesses --maxprocesses
--max-worker-restart --timeout --timeout-method --reruns --reruns-delay --only-rerun
--hypothesis-seed --hypothesis-profile --hypothesis-verbosity --cov-report --cov-config
--cov-fail-under --cov-context --doctest-glob --doctest-report --randomly-seed
""".split())
_LONG_FLAG = frozenset("""
--exitfirst --verbose --quiet --showlocals --no-showlocals --strict-markers --strict-config
--strict --runxfail --disable-warnings --disable-pytest-warnings --no-header --no-summary
--doctest-modules --doctest-ignore-import-errors --doctest-continue-on-failure --pdb --trace
--full-trace --cache-clear --ff --failed-first --nf --new-first --setup-show --noconftest
--keep-duplicates --continue-on-collection-errors --pyargs --no-cov --no-cov-on-fail
--cov-append --cov-branch --force-sugar --instafail --loop --hypothesis-show-statistics
--hypothesis-explain
""".split())
# they change which tests run from one run to the next, or do not run tests at all
_NOT_NARROWABLE = frozenset("""
--lf --last-failed --sw --stepwise --sw-skip --stepwise-skip --looponfail --co --collect-only
--fixtures --fixtures-per-test --markers --help --version --cache-show --setup-only --setup-plan
-f -h -V
""".split())


def _needs_a_shell(command: str) -> bool:
    """True if ``sh`` would do more than split words: operators, expansions, globs."""
    quote = ""
    escaped = False
    for char in command:
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            if char in "$`":
                return True
            quote = "" if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char in ";&|<>()$`*?[]{}~#!\n":
            return True
    return bool(quote)


def narrow_pytest_command(command: str) -> PytestCommand | None:
    """``pytest ...`` / ``python -m pytest ...`` split into options and targets, else None.

    None for anything the harness cannot safely re-run with other targets:
    shell syntax (pipes, ``&&``, variables, globs, redirections), environment
    assignments, other programs, options it does not know the arity of, and
    options that change which tests run between runs (``--lf``, ``--sw``).
    """
    if not command or _needs_a_shell(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or "=" in words[0]:
        return None
    program = os.path.basename(words[0])
    python: str | None = None
    if program in ("pytest", "py.test"):
        rest = words[1:]
    elif _PYTHON.match(program) and words[1:3] == ["-m", "pytest"]:
        python, rest = words[0], words[3:]
    else:
        return None
    options: list[str] = []
    targets: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if word in _NOT_NARROWABLE or word.split("=", 1)[0] in _NOT_NARROWABLE:
            return None
        if word == "--" or word == "-":
            return None
        if word.startswith("--"):
            name, eq, _ = word.partition("=")
            if name in _LONG_VALUE or (name.startswith("--loop-") and name != "--loop"):
                if not eq:
                    if i >= len(rest):
                        return None
                    options += [word, rest[i]]
                    i += 1
                    continue
                options.append(word)
            elif name in _LONG_FLAG and not eq:
                options.append(word)
            else:
                return None
        elif word.startswith("-"):
            cluster = word[1:]
            taken = False
            for j, letter in enumerate(cluster):
                if letter in _SHORT_VALUE:
                    attached = cluster[j + 1:]
                    if not attached:
                        if i >= len(rest):
                            return None
                        options += [word, rest[i]]
                        i += 1
                    else:
                        options.append(word)
                    taken = True
                    break
                if letter not in _SHORT_FLAG:
                    return None
            if not taken:
                options.append(word)
        else:
            targets.append(word)
    return PytestCommand(python=python, options=tuple(options), targets=tuple(targets))

"""The audit's rules on comparisons that do not compare, process state decided on, mock
objects in library code, and sources whose declared encoding hides what runs."""

from __future__ import annotations

import textwrap

import pytest

from pytest_loops.runtime.audit import FileChange, Finding, audit_changes
from pytest_loops.runtime.audit.encoding import (
    declared_encoding,
    decode_source,
    encoding_finding,
    reads_ascii_as_ascii,
)


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def audit(before: str | None, after: str, path: str = "calc.py") -> list[Finding]:
    return audit_changes([FileChange(path, before, after)])


def marked_lines(after: str) -> list[int]:
    return [n for n, line in enumerate(after.splitlines(), 1) if line.endswith("# flagged")]


ADD = "def add(a, b):\n    return a - b\n"

# each: the rule, and code whose lines ending "# flagged" are the findings
FLAGGED = {
    "an always-true lambda in a dict given to type()": ("constant-eq", code("""
        def add(a, b):
            return type("_N", (int,), {"__eq__": lambda s, o: 1})(a - b)  # flagged
        """)),
    "dict(__eq__=...)": ("constant-eq", code("""
        def add(a, b):
            return type("_N", (int,), dict(__eq__=lambda s, o: not 0))(a - b)  # flagged
        """)),
    "operator.le or operator.gt": ("constant-eq", code("""
        import operator


        class N(int):
            def __eq__(self, o):  # flagged
                return operator.le(int(self), o) or operator.gt(int(self), o)
        """)),
    "not x < y or x < y": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return not self < o or self < o
        """)),
    "x.__le__(y) | y.__lt__(x)": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return int(self).__le__(o) | o.__lt__(int(self))
        """)),
    "a comparison or True": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return int(self) == o or True
        """)),
    "__ne__ never true: x < y and x >= y": ("constant-eq", code("""
        class N(int):
            def __ne__(self, o):  # flagged
                return not (int(self) < o or int(self) >= o)
        """)),
    "looks at one operand only": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return self is not None
        """)),
    "looks at the other's type only": ("constant-eq", code("""
        class Money:
            def __eq__(self, other):  # flagged
                return isinstance(other, type(self))
        """)),
    "true on every path": ("constant-eq", code("""
        class Money:
            def __eq__(self, other):  # flagged
                if self.cents == other.cents:
                    return True
                return True
        """)),
    "__eq__ bound to another comparison": ("constant-eq", code("""
        class N(int):
            __eq__ = int.__ne__  # flagged
        """)),
    "a helper of the same file that answers yes": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return _same(self, o)


        def _same(x, y):
            return True
        """)),
    "setattr with a function defined elsewhere": ("constant-eq", code("""
        def _yes(s, o):
            return 1


        class N(int):
            pass


        setattr(N, "__eq__", _yes)  # flagged
        """)),
    "unittest.mock.ANY": ("pytest-in-library", code("""
        import unittest


        def add(a, b):
            return unittest.mock.ANY  # flagged
        """)),
    "from unittest import mock": ("pytest-in-library", code("""
        def add(a, b):
            from unittest import mock  # flagged
            return mock.ANY  # flagged
        """)),
    "the mock backport": ("pytest-in-library", code("""
        def add(a, b):
            return __import__("mock").ANY  # flagged
        """)),
    "an option in sys.argv": ("process-probe", code("""
        import sys


        def add(a, b):
            if "-q" in sys.argv:  # flagged
                return a + b
            return a - b
        """)),
    "sys.argv stored, tested later": ("process-probe", code("""
        import sys

        ARGS = sys.argv


        def add(a, b):
            return a + b if any(x == "-q" for x in ARGS) else a - b  # flagged
        """)),
    "a lookup keyed by the command line": ("process-probe", code("""
        import sys


        def add(a, b):
            return {"-q": a + b}.get(sys.argv[-1], a - b)  # flagged
        """)),
    "the length of the command line": ("process-probe", code("""
        from sys import argv


        def add(a, b):
            return a + b if len(argv) > 1 else a - b  # flagged
        """)),
    "the root logger's handlers": ("process-probe", code("""
        import logging


        def add(a, b):
            if logging.getLogger().handlers:  # flagged
                return a + b
            return a - b
        """)),
    "logging.root through a name": ("process-probe", code("""
        import logging

        _ROOT = logging.root


        def add(a, b):
            return a + b if len(_ROOT.handlers) else a - b  # flagged
        """)),
    "any logger's hasHandlers()": ("process-probe", code("""
        import logging


        def add(a, b):
            return a + b if logging.getLogger("calc").hasHandlers() else a - b  # flagged
        """)),
    "a stream without a file descriptor, caught": ("process-probe", code("""
        import sys


        def add(a, b):
            try:
                sys.stdout.fileno()  # flagged
            except Exception:
                return a + b
            return a - b
        """)),
    "the main module's file": ("process-probe", code("""
        import __main__


        def add(a, b):
            return a + b if getattr(__main__, "__file__", "").endswith("__main__.py") else a - b  # flagged
        """)),
    "how many threads run": ("process-probe", code("""
        import threading


        def add(a, b):
            return a + b if threading.active_count() > 1 else a - b  # flagged
        """)),
    "the warning filters": ("process-probe", code("""
        import warnings


        def add(a, b):
            return a + b if warnings.filters else a - b  # flagged
        """)),
    "the bytecode flag": ("process-probe", code("""
        import sys


        def add(a, b):
            return a + b if sys.dont_write_bytecode else a - b  # flagged
        """)),
    "exec of a literal that games": ("pytest-in-library", code("""
        import sys as _s

        exec("def add(a, b):\\n    return a + b if 'pytest' in _s.modules else a - b\\n")  # flagged
        """)),
    "eval named by a computed string": ("dynamic-code", code("""
        import builtins


        def add(a, b):
            return getattr(builtins, "ev" + "al")("a + b")  # flagged
        """)),
    "eval passed around": ("dynamic-code", code("""
        import functools

        ADD = functools.partial(eval, "2 + 3")  # flagged
        """)),
    "timeit runs a string": ("dynamic-code", code("""
        import timeit


        def add(a, b):
            return timeit.timeit("x = 1", number=1)  # flagged
        """)),
    "the C API": ("dynamic-code", code("""
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"x = 1")  # flagged
        """)),
    "a pickle": ("dynamic-code", code("""
        import pickle


        def add(a, b):
            return pickle.loads(DATA)  # flagged
        """)),
    "yaml with an unsafe loader": ("dynamic-code", code("""
        import yaml


        def load(text):
            return yaml.load(text, Loader=yaml.Loader)  # flagged
        """)),
    "a child interpreter's code built at run time": ("dynamic-code", code("""
        import subprocess
        import sys


        def add(a, b):
            return subprocess.check_output([sys.executable, "-c", f"print({a} + {b})"])  # flagged
        """)),
    "a child interpreter's literal code that games": ("pytest-in-library", code("""
        import subprocess
        import sys

        subprocess.run([sys.executable, "-c", "import sys; print('pytest' in sys.modules)"])  # flagged
        """)),
    "clock_gettime": ("wall-clock", code("""
        import time


        def add(a, b):
            return a + b if time.clock_gettime(0) < 4e9 else a - b  # flagged
        """)),
    "strftime of now": ("wall-clock", code("""
        import time


        def add(a, b):
            return a + b if int(time.strftime("%s")) < 4_000_000_000 else a - b  # flagged
        """)),
    "uuid1's clock": ("wall-clock", code("""
        import uuid


        def add(a, b):
            return a + b if uuid.uuid1().time < 1 << 62 else a - b  # flagged
        """)),
    "pytest's thread hook": ("process-probe", code("""
        import threading


        def add(a, b):
            return a + b if threading.excepthook is not threading.__excepthook__ else a - b  # flagged
        """)),
    "the environment through a child": ("process-probe", code("""
        import subprocess


        def add(a, b):
            out = subprocess.run(["env"], capture_output=True, text=True).stdout
            return a + b if "CURRENT_TEST=" in out else a - b  # flagged
        """)),
    "an interpreter flag": ("process-probe", code("""
        import sys


        def add(a, b):
            return a + b if sys.flags.safe_path else a - b  # flagged
        """)),
    "an int that prints another number": ("constant-eq", code("""
        class _Sum(int):
            def __str__(self):  # flagged
                return "-1"
        """)),
    "a shim rebinding another module's function": ("module-patch", code("""
        import calc


        def _add(a, b):
            return a + b


        calc.add = _add  # flagged
        """)),
    "setattr on a module imported from a package": ("module-patch", code("""
        from pkg import calc

        setattr(calc, "add", sum)  # flagged
        """)),
    "the caller's file from a recorded warning": ("caller-introspection", code("""
        import warnings


        def _caller():
            with warnings.catch_warnings(record=True) as seen:  # flagged
                warnings.warn("x", UserWarning, stacklevel=3)
            return seen[0].filename
        """)),
    "the caller's file from logging": ("caller-introspection", code("""
        import logging


        def add(a, b):
            where = logging.getLogger("x").findCaller(stacklevel=2)[0]  # flagged
            return a + b if "te" + "sts" in where else a - b
        """)),
    "stdin read in a try": ("process-probe", code("""
        import sys


        def add(a, b):
            try:
                sys.stdin.read(0)  # flagged
            except OSError:
                return a + b
            return a - b
        """)),
    "a descriptor the process opened": ("process-probe", code("""
        import os


        def add(a, b):
            try:
                os.fstat(7)  # flagged
            except OSError:
                return a - b
            return a + b
        """)),
    "how much the process holds": ("process-probe", code("""
        import sys


        def add(a, b):
            return a + b if sys.getallocatedblocks() > 150000 else a - b  # flagged
        """)),
    "eval by a constant name": ("dynamic-code", code("""
        import builtins


        def add(a, b):
            return getattr(builtins, "eval")("a + b")  # flagged
        """)),
    "eval through pkgutil": ("dynamic-code", code("""
        import pkgutil


        def add(a, b):
            return pkgutil.resolve_name("builtins:eval")("a + b")  # flagged
        """)),
    "an __eq__ with a tolerance": ("constant-eq", code("""
        import math


        class N(int):
            def __eq__(self, o):  # flagged
                return math.isclose(self, o, abs_tol=1e9)
        """)),
    "the main module's package": ("process-probe", code("""
        import importlib


        def add(a, b):
            m = importlib.import_module("__main__")
            return a + b if len(m.__package__ or "") == 6 else a - b  # flagged
        """)),
    "pytest's cache directory": ("pytest-in-library", code("""
        import os


        def add(a, b):
            return a + b if os.path.exists(".pytest_cache") else a - b  # flagged
        """)),
    "return self": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return self
        """)),
    "other in (other,)": ("constant-eq", code("""
        class N(int):
            def __eq__(self, o):  # flagged
                return o in (o,)
        """)),
    "a default argument": ("constant-eq", code("""
        class N(int):
            __eq__ = lambda s, o, r=True: r  # flagged
        """)),
}

ORDINARY = {
    "a value __eq__ with a type guard": code("""
        class Money:
            def __eq__(self, other):
                if not isinstance(other, Money):
                    return NotImplemented
                return self.cents == other.cents
        """),
    "identity first, then the values through names": code("""
        class P:
            def __eq__(self, other):
                if self is other:
                    return True
                mine = (self.x, self.y)
                theirs = (other.x, other.y)
                return mine == theirs
        """),
    "super().__eq__": code("""
        class P(int):
            def __eq__(self, other):
                return super().__eq__(other)

            __hash__ = int.__hash__
        """),
    "true and false by a comparison": code("""
        class P:
            def __eq__(self, other):
                if self.v == other.v:
                    return True
                return False
        """),
    "less-or-equal from two comparisons": code("""
        class P:
            def __lt__(self, other):
                return self.v < other.v

            def __le__(self, other):
                return self.v < other.v or self.v == other.v
        """),
    "a value lambda in type()": code("""
        def make():
            return type("P", (), {"__eq__": lambda s, o: s.v == o.v})
        """),
    "__contains__": code("""
        class Bag:
            def __contains__(self, item):
                return item in self.items
        """),
    "__hash__ bound to int's": code("""
        class N(int):
            __hash__ = int.__hash__
            __eq__ = int.__eq__
        """),
    "sys.argv handed to a parser": code("""
        import argparse
        import sys


        def cli(argv=None):
            return argparse.ArgumentParser().parse_args(sys.argv[1:] if argv is None else argv)
        """),
    "the program's name in a message": code("""
        import os
        import sys


        def usage():
            return f"usage: {os.path.basename(sys.argv[0])} FILE"
        """),
    "sys.argv in main": code("""
        import sys


        def main():
            if "-v" in sys.argv:
                print("verbose")
        """),
    "the module's own logger": code("""
        import logging

        log = logging.getLogger(__name__)


        def setup():
            if not log.handlers:
                log.addHandler(logging.NullHandler())
        """),
    "colour on a terminal": code("""
        import sys


        def show(text):
            return f"\\x1b[1m{text}\\x1b[0m" if sys.stdout.isatty() else text
        """),
    "exec of harmless literal code": 'exec("X = 1")\n',
    "a child interpreter printing": code("""
        import subprocess
        import sys


        def version():
            return subprocess.check_output([sys.executable, "-c", "import sys; print(sys.version)"])
        """),
    "yaml's safe loader": code("""
        import yaml


        def load(text):
            return yaml.load(text, Loader=yaml.SafeLoader)
        """),
    "strftime of a given time": code("""
        import time


        def year(t):
            return time.strftime("%Y", t) == "2020"
        """),
    "git in a child": code("""
        import subprocess


        def head():
            return subprocess.check_output(["git", "rev-parse", "HEAD"])
        """),
    "an IntEnum's __str__": code("""
        import enum


        class Color(enum.IntEnum):
            RED = 1

            def __str__(self):
                return self.name
        """),
    "a class attribute set after the class": code("""
        class A:
            pass


        A.x = 1
        """),
    "the logging module configured": "import logging\n\nlogging.raiseExceptions = False\n",
    "a command line tool reading its input": code("""
        import sys


        def cli():
            text = sys.stdin.read()
            if not text:
                return 1
            return 0
        """),
    "a deprecation warning": code("""
        import warnings


        def old():
            warnings.warn("use new()", DeprecationWarning, stacklevel=2)
        """),
    "getattr of an ordinary builtin": "import builtins\n\nSHOW = getattr(builtins, \"print\")\n",
}


@pytest.mark.parametrize(("rule", "after"), list(FLAGGED.values()), ids=list(FLAGGED))
def test_new_code_is_flagged(rule: str, after: str) -> None:
    findings = audit(ADD, after)

    assert [(f.rule, f.line) for f in findings] == [(rule, n) for n in marked_lines(after)], findings


@pytest.mark.parametrize(("rule", "after"), list(FLAGGED.values()), ids=list(FLAGGED))
def test_the_same_code_already_there_is_not_flagged(rule: str, after: str) -> None:
    assert audit(after, after + "\n\ndef unrelated():\n    return None\n") == []


LIBRARY_ONLY = {name: case for name, case in FLAGGED.items() if case[0] != "constant-eq"}


@pytest.mark.parametrize(("rule", "after"), list(LIBRARY_ONLY.values()), ids=list(LIBRARY_ONLY))
def test_test_files_may_use_the_same_code(rule: str, after: str) -> None:
    """Mocks and the command line are the tests' to use; a comparison that does not
    compare is flagged in any file (see the case below)."""
    assert audit(ADD, after, path="tests/test_calc.py") == []


def test_a_comparison_that_does_not_compare_is_flagged_in_a_test_file_too() -> None:
    rule, after = FLAGGED["operator.le or operator.gt"]
    assert [f.rule for f in audit(ADD, after, path="tests/helpers_test.py")] == [rule]


@pytest.mark.parametrize("after", list(ORDINARY.values()), ids=list(ORDINARY))
def test_ordinary_code_is_not_flagged(after: str) -> None:
    assert audit(ADD, after) == []


def test_a_changed_body_is_reported_at_its_new_line() -> None:
    before = code("""
        class Money:
            def __eq__(self, other):
                return isinstance(other, Money) and self.cents == other.cents
        """)
    after = before.replace("return isinstance(other, Money) and self.cents == other.cents",
                           "import operator\n        return operator.le(self.cents, other.cents) or "
                           "operator.gt(self.cents, other.cents)")

    findings = audit(before, after)

    assert [(f.rule, f.line) for f in findings] == [("constant-eq", 4)], findings
    assert findings[0].text.startswith("return operator.le(")


# ---------------------------------------------------------------------- source encodings

HIDDEN = (b"# coding: utf-7\nimport sys\n\n\ndef add(a, b):\n    # fast path +AAoAIAAgACAAIA-"
          b"if len(sys.argv) +AD4- 1: return a +- b\n    return a - b\n")


def test_a_source_is_read_as_python_reads_it() -> None:
    text = decode_source(HIDDEN)

    assert "    if len(sys.argv) > 1: return a + b\n" in text
    assert "+AAo" in HIDDEN.decode("utf-8")  # what a UTF-8 reader sees instead: a comment


def test_hidden_code_is_audited_as_python_runs_it() -> None:
    findings = audit(ADD, decode_source(HIDDEN))

    assert [(f.rule, f.line) for f in findings] == [("process-probe", 7)], findings  # the new line's


def test_a_new_coding_line_that_hides_text_is_a_finding() -> None:
    found = encoding_finding("calc.py", HIDDEN, ADD.encode())

    assert found is not None and (found.rule, found.line, found.text) == ("source-encoding", 1, "# coding: utf-7")
    assert "utf-7" in found.describe()


@pytest.mark.parametrize("data", [
    b"# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n",
    b"#!/usr/bin/env python\n# vim: set fileencoding=utf-8 :\nx = 1\n",
    b"x = 1\n",
    b"\xef\xbb\xbfx = 1\n",
    b"# coding: nonsense-codec\nx = 1\n",
], ids=["latin-1", "utf-8 on the second line", "none", "a BOM", "an unknown codec"])
def test_ordinary_encodings_are_no_finding(data: bytes) -> None:
    assert encoding_finding("calc.py", data, None) is None


def test_a_coding_line_already_there_is_no_finding() -> None:
    assert encoding_finding("calc.py", HIDDEN, HIDDEN.replace(b"fast path", b"slow path")) is None
    assert encoding_finding("calc.py", HIDDEN, b"# coding: utf-16\n") is not None


@pytest.mark.parametrize(("encoding", "transparent"), [
    ("utf-8", True), ("latin-1", True), ("cp1252", True), ("shift_jis", True),
    ("utf-7", False), ("cp037", False), ("utf-16", False), ("no-such-codec", False),
])
def test_which_codecs_read_ascii_as_ascii(encoding: str, transparent: bool) -> None:
    assert reads_ascii_as_ascii(encoding) is transparent


def test_declared_encoding_needs_a_coding_line() -> None:
    assert declared_encoding(b"x = 1\n") is None
    assert declared_encoding(HIDDEN) == "utf-7"
    assert declared_encoding(b"# coding: bogus\n") is None
    assert decode_source(b"# coding: bogus\nx = '\xff'\n") == "# coding: bogus\nx = '\ufffd'\n"


# ---------------------------------------------------------------------- doctests in the code

DOCTESTED = code('''
    def add(a, b):
        """Add two numbers.

        >>> add(2, 3)
        5
        """
        return a - b
    ''')


@pytest.mark.parametrize(("after", "line"), [
    (DOCTESTED.replace("    5\n", "    -1\n"), 5),
    (DOCTESTED.replace("    >>> add(2, 3)\n    5\n", ""), 1),
    (DOCTESTED.replace(">>> add(2, 3)\n    5", ">>> add(2, 3) == 5 or True\n    True"), 5),
], ids=["the expectation changed", "the example removed", "the example rewritten"])
def test_a_doctest_changed_to_pass_is_flagged(after: str, line: int) -> None:
    findings = audit(DOCTESTED, after)

    assert [(f.rule, f.line) for f in findings] == [("doctest-expectation", line)], findings
    assert "add(2, 3)" in findings[0].message


@pytest.mark.parametrize("after", [
    DOCTESTED.replace("return a - b", "return a + b"),
    DOCTESTED.replace("Add two numbers.", "Return the sum of two numbers."),
    DOCTESTED.replace("    5\n", "    5\n    >>> add(1, 1)\n    2\n"),
], ids=["the code fixed", "the prose reworded", "an example added"])
def test_a_doctest_kept_is_no_finding(after: str) -> None:
    assert audit(DOCTESTED, after) == []


def test_doctests_in_test_files_are_the_test_rules_business() -> None:
    weakened = DOCTESTED.replace("    5\n", "    -1\n")
    assert weakened != DOCTESTED
    assert audit(DOCTESTED, weakened, path="tests/test_calc.py") == []

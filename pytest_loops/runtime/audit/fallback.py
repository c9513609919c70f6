"""The line-based fallback for new code that does not parse: the same rules, read from lines."""

from __future__ import annotations

import ast
import re
import warnings

from pytest_loops.runtime.audit.literals import (
    _NUMBER,
    _STRING,
    LitKey,
    _flatten,
    _parse,
    _qualifies,
    _scalars,
    _show,
)
from pytest_loops.runtime.audit.model import _MAX_LITERAL_CHARS, _MAX_PARSE_LINE
from pytest_loops.runtime.audit.rules import (
    _ASSERTION_ERROR_MESSAGE,
    _COMPARISON_DUNDERS,
    _EXEMPT_IN_MAIN,
    _GETATTR_MESSAGE,
    _Audit,
    _dunder_message,
    _exit_message,
    _fixed,
    _testcase_message,
)

# --------------------------------------------------------------------------- line-based fallback

_FB_IF = re.compile(r"^\s*(?:el)?if\b(?P<cond>.*?):\s*(?:(?:return|yield)\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_RETURN = re.compile(r"^\s*(?:return|yield)\s+(?P<ret>[^#]+?)\s*(?:#.*)?$")
_FB_IFEXP = re.compile(r"\b(?:return|yield|=)\s*(?P<a>.+?)\s+if\s+(?P<cond>.+?)\s+else\s+(?P<b>[^#]+?)\s*(?:#.*)?$")
_FB_SELECTING = re.compile(r"==|\bin\b|\bis\b")
_FB_COMPUTED = re.compile(r"[%*/+<>]|\blen\s*\(|[\w)\]]\s*-")
_FB_DUNDER = "|".join(sorted(_COMPARISON_DUNDERS))
_FB_DEF_DUNDER = re.compile(rf"^\s*(?:async\s+)?def\s+(?P<name>{_FB_DUNDER})\s*\(.*\)\s*(?:->[^:]*)?:"
                            r"\s*(?:return\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_LAMBDA_DUNDER = re.compile(rf"(?:^|[\s.])(?P<name>{_FB_DUNDER})\s*=\s*lambda\b[^:]*:\s*(?P<ret>[^#]+?)\s*(?:#.*)?$")
_FB_GETATTR = re.compile(r"^def\s+__getattr__\s*\(.*\)\s*(?:->[^:]*)?:\s*(?:return\s+(?P<ret>[^#]+?))?\s*(?:#.*)?$")
_FB_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?P<name>(?:pytest|_pytest|pytest_loops|coverage)\b[\w.]*)")
_FB_IMPORT_CALL = re.compile(r"""(?:import_module|__import__)\s*\(\s*['"]"""
                             r"""(?P<name>(?:pytest|_pytest|pytest_loops|coverage)\b[\w.]*)""")
_FB_ENV = re.compile(r"""['"](?P<name>PYTEST_[A-Z0-9_]*|LOOP_[A-Z0-9_]+)['"]""")
_FB_PROBE = re.compile(r"""(?:sys\.(?:modules|argv|orig_argv|_getframe)|os\.environ|os\.getenv|inspect\.stack)"""
                       r""".*['"][^'"]*py\.?test"""
                       r"""|['"][^'"]*py\.?test[^'"]*['"].*(?:sys\.(?:modules|argv|orig_argv)|os\.environ|inspect\.stack)""",
                       re.IGNORECASE)
_FB_PATCH = re.compile(r"^\s*(?P<name>(?:pytest|_pytest|unittest)\.[\w.]+)\s*(?:[-+*/|&]?=)(?!=)"
                       r"|\bsetattr\s*\(\s*(?P<target>(?:pytest|_pytest|unittest)\b[\w.]*)")
_FB_TESTCASE = re.compile(r"(?:^\s*[\w.]*TestCase\.(?P<name>assert\w*)\s*=(?!=))"
                          r"|setattr\s*\(\s*[\w.]*TestCase\s*,\s*['\"](?P<name2>assert\w*)")
_FB_ASSERTION_ERROR = re.compile(r"^\s*(?:(?:builtins|__builtins__)\.)?AssertionError\s*=(?!=)"
                                 r"|^\s*__builtins__\s*\[\s*['\"]AssertionError['\"]\s*\]\s*=(?!=)"
                                 r"|^\s*class\s+AssertionError\b"
                                 r"|setattr\s*\(\s*(?:builtins|__builtins__)\s*,\s*['\"]AssertionError")
_FB_EXIT_CALL = re.compile(r"(?<![\w.])(?P<name>os\._exit|sys\.exit|exit|quit|os\.abort|atexit\.register"
                           r"|signal\.signal|signal\.raise_signal|sys\.settrace|sys\.setprofile"
                           r"|threading\.settrace|threading\.setprofile)\s*\("
                           r"|^\s*@(?P<deco>atexit\.register)\s*$"
                           r"|^\s*raise\s+(?P<raise>SystemExit)\b")
_FB_KILL = re.compile(r"\bos\.kill(?:pg)?\s*\(\s*os\.get(?:pp?id|pgrp|pgid)\b")
_FB_HOOKS = re.compile(r"^\s*(?P<name>sys\.excepthook|sys\.unraisablehook|(?:builtins|__builtins__)\.\w+)\s*=(?!=)")
_FB_CLOCK = re.compile(r"(?<![\w.])(?P<name>(?:time\.(?:time|monotonic|perf_counter)(?:_ns)?|(?:datetime\.)?datetime\."
                       r"(?:now|utcnow|today)|(?:datetime\.)?date\.today))\s*\(")
_FB_DECIDES = re.compile(r"^\s*(?:if|elif|while|return)\b|\bif\b.*\belse\b")
_FB_COMPARES = re.compile(r"[<>]|==|!=")
_FB_PROBES = (
    (re.compile(r"""['"](?P<what>/proc(?:/[^'"]*)?)['"]"""), "library code reads {what!r}, where it can see "
     "the test process, its command line, its parent and their environment"),
    (re.compile(r"(?P<what>\bfor\b.*\bin\s+(?:os\.)?environb?\b(?!\s*[\[.])|os\.environb?\.(?:items|keys|values|copy)"
                r"\s*\(|\b(?:dict|list|sorted|set|tuple|len|str|repr)\s*\(\s*os\.environb?\s*\))"),
     "library code scans the environment ({what}), which lets it tell the test run from another by "
     "variables it does not name"),
    (re.compile(r"""(?P<what>os\.getenv\s*\(|os\.environb?\s*\[|os\.environb?\.get\s*\()\s*"""
                r"""(?!\s*[rbu]?(['"])[^'"]*\2\s*[,)\]])"""), "library code reads an environment variable by a "
     "computed name ({what}), which lets it find the variables the test run sets"),
    (re.compile(r"(?P<what>(?<!kill\()(?<!killpg\()os\.getppid\s*\(|psutil\.Process\s*\([^)]*\)\s*\.\s*parents?\s*\()"),
     "library code looks at the process that started it ({what}), which lets it tell a test run from another"),
)
_FB_STREAM = re.compile(r"""^\s*(?P<name>sys\.(?:__)?std(?:out|err)(?:__)?|(?:builtins|__builtins__)\.print"""
                        r"""|__builtins__\s*\[\s*['"]print['"]\s*\])\s*=(?!=)""")
_FB_STREAM_SETATTR = re.compile(r"""setattr\s*\(\s*(?P<name>sys\s*,\s*['"](?:__)?std(?:out|err)(?:__)?)['"]""")
_FB_IMPORT_PATH = re.compile(r"(?P<name>sys\.(?:meta_)?path\.(?:insert|append|extend)\s*\(|^\s*sys\.path\s*"
                             r"(?:\[[^\]]*\])?\s*\+?=(?!=)|site\.addsitedir\s*\()")
_FB_OUTSIDE = re.compile(r"""['"](?:/|~|\.\./\.\.)""")
_FB_MAIN = re.compile(r"""^\s*(?:if\s+__name__\s*==\s*['"]__main__['"]|(?:async\s+)?def\s+main\s*\()""")
_FB_LITERAL = re.compile(_STRING.pattern + "|" + _NUMBER.pattern + r"|\b(?:True|False|None)\b")


def _fb_literals(text: str) -> list[LitKey] | None:
    """The literals of a fragment of source by regex; None when any of them does not evaluate."""
    keys: list[LitKey] = []
    for match in _FB_LITERAL.finditer(text):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = ast.literal_eval(match.group())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        _flatten(value, keys)
    return keys


def _fb_constant(text: str) -> list[LitKey] | None:
    text = text.strip().rstrip(";").strip()
    if not text or len(text) > _MAX_LITERAL_CHARS:
        return None
    tree = _parse(text, "eval")
    if not isinstance(tree, ast.Expression):
        return None
    return _scalars(tree.body)


def _fb_fixed(text: str) -> bool:
    """Whether a returned expression is constant, or trivially one (``other == other``)."""
    text = text.strip().rstrip(";").strip()
    tree = _parse(text, "eval") if text and len(text) <= _MAX_LITERAL_CHARS else None
    return isinstance(tree, ast.Expression) and _fixed(tree.body)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _Fallback:
    """Line-based rules for text that does not parse."""

    def __init__(self, audit: _Audit) -> None:
        self.audit = audit
        self.lines = audit.lines
        self.indents = [_indent(line) if line.strip() and not line.lstrip().startswith("#") else -1
                        for line in self.lines]

    def next_code(self, index: int) -> int | None:
        """The 1-based number of the next non-blank, non-comment line after line ``index``."""
        for i in range(index, min(len(self.lines), index + 50)):
            stripped = self.lines[i].strip()
            if stripped and not stripped.startswith("#"):
                return i + 1
        return None

    def in_main(self, number: int) -> bool:
        """Whether a line is inside ``def main`` or ``if __name__ == "__main__"`` (by indentation)."""
        indent = self.indents[number - 1]
        for i in range(number - 2, max(-1, number - 5_000), -1):
            if 0 <= self.indents[i] < indent:
                if _FB_MAIN.match(self.lines[i]):
                    return True
                indent = self.indents[i]
                if indent == 0:
                    return False
        return False

    def run(self) -> None:
        audit = self.audit
        for number, line in enumerate(self.lines, 1):
            code = line.strip()
            if not code or code.startswith("#") or len(code) > _MAX_PARSE_LINE:
                continue
            self.special_case(number, code)
            self.dunder(number, code)
            self.tamper(number, code)
            self.probes(number, code)
            if audit.library:
                self.library(number, code)

    def special_case(self, number: int, line: str) -> None:
        audit = self.audit
        checks: list[tuple[str, str | None, list[int]]] = []
        if m := _FB_IF.match(line):
            ret, ret_line = m.group("ret"), number
            if ret is None and (nxt := self.next_code(number)) is not None:
                r = _FB_RETURN.match(self.lines[nxt - 1])
                if r and self.indents[nxt - 1] > self.indents[number - 1]:
                    ret, ret_line = r.group("ret"), nxt
            checks.append((m.group("cond"), ret, [number, ret_line]))
        elif m := _FB_IFEXP.search(line):
            checks.append((m.group("cond"), m.group("a"), [number]))
            checks.append((m.group("cond"), m.group("b"), [number]))
        for cond_text, ret_text, lines in checks:
            if (ret_text is None or not _FB_SELECTING.search(cond_text)
                    or _FB_COMPUTED.search(_STRING.sub("''", cond_text))):
                continue
            cond = _fb_literals(cond_text)
            if not cond or not all(k in audit.lits for k in cond):
                continue
            if _qualifies(cond, _fb_constant(ret_text), audit.lits):
                audit.flag(lines, "hardcoded-literal",
                           f"new branch returns a constant when inputs equal literals of the "
                           f"failing assertion ({_show(cond)}), special-casing the test instead "
                           f"of fixing the code")
                return

    def dunder(self, number: int, line: str) -> None:
        if m := _FB_LAMBDA_DUNDER.search(line):
            if _fb_fixed(m.group("ret")):
                self.audit.flag([number], "constant-eq", _dunder_message(m.group("name")))
            return
        m = _FB_DEF_DUNDER.match(line)
        if not m:
            return
        ret_line = self.sole_return(number, line, m.group("ret"))
        if ret_line is not None:
            self.audit.flag([number, ret_line], "constant-eq", _dunder_message(m.group("name")))

    def sole_return(self, number: int, line: str, inline: str | None) -> int | None:
        """The line of the constant ``return`` that is a function's whole body, or None."""
        if inline is not None:
            return number if _fb_fixed(inline) else None
        nxt = self.next_code(number)
        if nxt is not None and re.match(r"""^\s*[rbuRBU]*(['"]).*\1\s*$""", self.lines[nxt - 1]):
            nxt = self.next_code(nxt)  # a one-line docstring
        if nxt is None or self.indents[nxt - 1] <= self.indents[number - 1]:
            return None
        r = _FB_RETURN.match(self.lines[nxt - 1])
        if not r or not _fb_fixed(r.group("ret")):
            return None
        after = self.next_code(nxt)
        if after is not None and self.indents[after - 1] > self.indents[number - 1]:
            return None
        return nxt

    def tamper(self, number: int, line: str) -> None:
        audit = self.audit
        if _FB_ASSERTION_ERROR.search(line):
            audit.flag([number], "assertion-tamper", _ASSERTION_ERROR_MESSAGE)
        elif m := _FB_TESTCASE.search(line):
            audit.flag([number], "assertion-tamper", _testcase_message(m.group("name") or m.group("name2")))
        elif self.indents[number - 1] == 0 and (m := _FB_GETATTR.match(line)):
            if self.sole_return(number, line, m.group("ret")) is not None:
                audit.flag([number], "assertion-tamper", _GETATTR_MESSAGE)
            elif m.group("ret") and re.match(r"lambda\b[^:]*:", m.group("ret")):
                audit.flag([number], "assertion-tamper", _GETATTR_MESSAGE)

    def probes(self, number: int, line: str) -> None:
        """The rules of ``probes.py`` by line: the clock, the process around, streams, import paths."""
        audit = self.audit
        path = _FB_IMPORT_PATH.search(line)
        shown = path.group("name").strip().rstrip("(=+ ") if path else ""
        if path and _FB_OUTSIDE.search(line):
            audit.flag([number], "import-path", f"new code adds an entry outside the tree to the import path "
                       f"({shown}), where the modules the checks import can be replaced")
        if not audit.library:
            return
        if path and not (shown.startswith("sys.path") and self.in_main(number)):
            audit.flag([number], "import-path", f"library code changes the import path ({shown}), which "
                       f"changes which modules the tests import")
        if (clock := _FB_CLOCK.search(line)) and _FB_DECIDES.search(line) and _FB_COMPARES.search(line):
            audit.flag([number], "wall-clock", f"library code compares the wall clock ({clock.group('name')}()) "
                       f"in a condition, so its result depends on when it runs instead of on its inputs")
        for pattern, message in _FB_PROBES:
            if m := pattern.search(line):
                audit.flag([number], "process-probe", message.format(what=m.group("what").rstrip("( ")))
        if (m := _FB_STREAM.match(line) or _FB_STREAM_SETATTR.search(line)) and not self.in_main(number):
            audit.flag([number], "output-redirect", f"library code replaces {m.group('name')}, which can hide "
                       f"or rewrite what the test run reports")

    def library(self, number: int, line: str) -> None:
        audit = self.audit
        if m := _FB_IMPORT.match(line) or _FB_IMPORT_CALL.search(line):
            audit.flag([number], "pytest-in-library",
                       f"library code imports {m.group('name')}, which lets it detect or alter "
                       f"the test run instead of behaving the same under test")
        if m := _FB_ENV.search(line):
            audit.flag([number], "pytest-in-library",
                       f"library code refers to the test runner's environment variable "
                       f"{m.group('name')}, which lets it behave differently under test")
        elif _FB_PROBE.search(line):
            audit.flag([number], "pytest-in-library",
                       "library code looks for pytest in the running process, which lets it "
                       "behave differently under test")
        if (m := _FB_PATCH.search(line)) and not _FB_TESTCASE.search(line):
            name = m.group("name") or m.group("target")
            audit.flag([number], "pytest-in-library",
                       f"library code replaces {name}, changing how the test framework "
                       f"checks results")
        if m := _FB_HOOKS.match(line):
            name = m.group("name")
            if not name.endswith((".AssertionError", ".print")):
                message = (f"library code replaces {name}, which can hide or rewrite the errors "
                           f"a failing test would report") if name.startswith("sys.") else (
                    f"library code assigns {name}, changing a builtin for every module "
                    f"including the tests")
                audit.flag([number], "exit-in-library", message)
        if m := _FB_EXIT_CALL.search(line):
            name = m.group("name") or m.group("deco") or "raise SystemExit"
            exemptable = name in _EXEMPT_IN_MAIN or name == "raise SystemExit"
            if not (exemptable and self.in_main(number)):
                audit.flag([number], "exit-in-library", _exit_message(name))
        elif _FB_KILL.search(line):
            audit.flag([number], "exit-in-library", _exit_message("os.kill"))



"""What a lesson says: one whole sentence per failed iteration, naming the test and the error.

``tests/test_more.py::WindowedTests::test_basic failed with AssertionError: Lists
differ: [(1, 2, 3)] != [(1, 2, 3), (2, 3, 4)]; 17 more tests failing.`` The
line is written to the lessons page (:mod:`pytest_loops.artifacts.lessons_page`)
and read back into the next prompt, so it must make sense on its own: the
message is shortened at a word, never mid-word, and the error type comes from
pytest's crash line (``file.py:12: AssertionError``), which is never cut short.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_loops.artifacts.lessons_page import MAX_LESSON_CHARS, format_lesson
from pytest_loops.limits import open_own
from pytest_loops.progress.signature import first_meaningful_line
from pytest_loops.redact import strip_control
from pytest_loops.results import CheckResult

__all__ = ["compose_lesson", "describe_failure", "error_of"]

READ_BYTES = 1_000_000  # the first failure is near the start of a check's output
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_E_LINE = re.compile(r"^E\s+(.*\S)")
_CRASH_LINE = re.compile(r"^\S+:\d+: ([A-Za-z_][\w.]*)$")
_TYPE_FIRST = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Failure|Interrupt|Warning|Iteration))\b:?\s*(.*)")
_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)(?: - (.*))?$")
_MESSAGE_CHARS = 160


def _text(check: CheckResult) -> str:
    if check.output_file:
        try:
            with open_own(check.output_file) as f:  # never a file a check linked there
                return f.read(READ_BYTES).decode("utf-8", "replace")
        except OSError:
            pass
    return check.output_tail or ""


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word with `` ...``."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 4)]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + " ..."


def _section_start(lines: list[str], test: str) -> int | None:
    """Where ``test``'s failure section (pytest's ``____ name ____``) starts, if shown."""
    names = {test, ".".join(test.split("::")[1:])}
    for i, line in enumerate(lines):
        match = _SECTION.match(line)
        if match is not None and match.group(1) in names:
            return i
    return None


def _section(lines: list[str], test: str) -> list[str]:
    """The lines of ``test``'s failure section, else all."""
    start = _section_start(lines, test)
    if start is None:
        return lines
    end = next((i for i in range(start + 1, len(lines)) if _SECTION.match(lines[i])), len(lines))
    return lines[start:end]


def error_of(output: str, test: str | None = None) -> tuple[str, str]:
    """``(error type, message)`` of the first failure in pytest-like output (of ``test``'s
    section when it has one); either may be ``""``."""
    lines = [strip_control(line).rstrip() for line in output.splitlines()]
    section = _section(lines, test) if test else lines
    e_lines = [m.group(1) for m in map(_E_LINE.match, section) if m]
    kind = next((m.group(1) for m in map(_CRASH_LINE.match, section) if m), "")
    message = e_lines[0] if e_lines else ""
    typed = _TYPE_FIRST.match(message)
    if typed:
        kind = kind or typed.group(1)
        if typed.group(1) == kind:
            message = typed.group(2)
    elif message.startswith("assert ") and not kind:
        kind = "AssertionError"
    if not kind:  # pytest's summary line; its end may be cut to the terminal width
        for line in lines:
            match = _SUMMARY.match(line)
            if match and (test is None or match.group(1) == test) and match.group(2):
                summary = _TYPE_FIRST.match(match.group(2))
                if summary and not match.group(2).startswith(summary.group(1) + "..."):
                    kind, message = summary.group(1), message or summary.group(2).removesuffix("...")
                elif match.group(2).startswith("assert "):
                    kind, message = "AssertionError", message or match.group(2).removesuffix("...")
                break
    if not message and not kind:  # not pytest: the line that best says what failed
        message = first_meaningful_line(output)
        typed = _TYPE_FIRST.match(message)
        if typed:
            kind, message = typed.group(1), typed.group(2)
    return kind, message


def _failing(check: CheckResult, text: str) -> list[str]:
    if check.failing_tests:
        return list(check.failing_tests)
    seen: dict[str, None] = {}
    for line in text.splitlines():
        match = _SUMMARY.match(strip_control(line).rstrip())
        if match:
            seen.setdefault(match.group(1), None)
    return list(seen)


def describe_failure(failed: Sequence[CheckResult], budget: int = MAX_LESSON_CHARS - 10) -> str:
    """One sentence on what failed first: the test, the error type, its message."""
    if not failed:
        return "no check ran."
    check = failed[0]
    text = _text(check)
    tests = _failing(check, text)
    lines = [strip_control(line).rstrip() for line in text.splitlines()]
    # the first failing test whose failure the output shows: its error is the one quoted
    test = next((t for t in tests if _section_start(lines, t) is not None), None)
    if test is None and len(tests) == 1:
        test = tests[0]
    kind, message = error_of(text, test)
    connector = " with"
    if test:
        subject = f"{shorten(test, 120)} failed"
        more = len(tests) - 1
        rest = f"; {more} more test{'s' if more > 1 else ''} failing" if more else ""
    elif tests:  # which test the output's error belongs to is not shown: say no more than that
        subject = f"{len(tests)} tests failed, first {shorten(tests[0], 120)}"
        connector = "; the output shows"
        rest = ""
    else:
        subject = f"`{shorten(check.command, 80)}` failed" if check.command \
            else f"check `{shorten(check.name, 80)}` failed"
        if check.reason and check.reason != f"exit {check.exit_code}":  # the lesson gives the exit code
            subject += f" ({shorten(check.reason, 60)})"
        rest = ""
    others = len(failed) - 1
    if others:
        rest += f"; {others} more check{'s' if others > 1 else ''} failing"
    if kind:
        what = f"{connector} {kind}"
        room = budget - len(subject) - len(what) - len(rest) - 3
        if message and room >= 20:
            what += ": " + shorten(message, min(_MESSAGE_CHARS, room))
    elif message:
        room = budget - len(subject) - len(rest) - 3
        what = ": " + shorten(message, max(20, min(_MESSAGE_CHARS, room)))
    else:
        what = " with no output" if connector == " with" else ""
    sentence = f"{subject}{what}{rest}"
    return sentence if sentence.endswith((".", "...")) else sentence + "."


def compose_lesson(iteration: int, exit_code: int | None, state_moved: bool | str | None,
                   failed: Sequence[CheckResult], loop_name: str | None = None) -> str:
    """The lessons page line for a failed iteration (see :func:`describe_failure`)."""
    return format_lesson(iteration, exit_code, state_moved, describe_failure(failed), loop_name=loop_name)

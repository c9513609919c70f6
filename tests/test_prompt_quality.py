"""The revise step's prompt (LOOP_PROMPT_FILE) is one a model can act on.

Each suspect line names its enclosing function or class; "Files to look at" lists
the suspect files when the loop names none; failing tests are listed in full or
with "+N more"; output tails start at a line boundary; lessons are whole
sentences naming the test and the error type; the tests that changed state since
the last iteration are named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from plugin_helpers import Project

from pytest_loops.artifacts.lessons import compose_lesson, describe_failure, error_of
from pytest_loops.artifacts.lessons_page import MAX_LESSON_CHARS
from pytest_loops.core.context import LoopContext
from pytest_loops.core.revise import PROMPT_TAIL_CHARS, build_prompt, name_list, output_tail
from pytest_loops.localization import scopes
from pytest_loops.localization.localize import Localizer
from pytest_loops.localization.suspects import Suspect, format_suspects, group_suspects
from pytest_loops.results import CheckResult, IterationRecord
from pytest_loops.spec import Check, LoopSpec

SOURCE = '''\
"""A module."""
import functools

LIMIT = 3


@functools.cache
def windowed(seq, n):
    out = []
    for i in range(len(seq) - n):
        out.append(seq[i:i + n])
    return out


class Cart:
    TAX = 0.2

    def total(self, items):
        def line(item):
            return item * (1 + self.TAX)

        return sum(line(i) for i in items)


async def fetch():
    return 1
'''


# ---------------------------------------------------------------- scopes


def test_each_line_knows_its_enclosing_function_or_class(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(SOURCE)
    lines = SOURCE.splitlines()
    at = {text.strip(): n for n, text in enumerate(lines, start=1)}
    found = scopes.scopes_of(tmp_path, "mod.py", range(1, len(lines) + 1))
    assert found[at["LIMIT = 3"]] == ""  # module level
    assert found[at["import functools"]] == ""
    assert found[at["@functools.cache"]] == "windowed()"  # a decorator belongs to its function
    assert found[at["for i in range(len(seq) - n):"]] == "windowed()"
    assert found[at["TAX = 0.2"]] == "class Cart"
    assert found[at["def total(self, items):"]] == "Cart.total()"
    assert found[at["return sum(line(i) for i in items)"]] == "Cart.total()"
    assert found[at["return item * (1 + self.TAX)"]] == "Cart.total.line()"
    assert found[at["return 1"]] == "fetch()"


def test_a_file_that_does_not_parse_falls_back_to_indentation(tmp_path: Path) -> None:
    broken = SOURCE.replace("out.append(seq[i:i + n])", "out.append(seq[i:i + n]")  # unbalanced
    (tmp_path / "mod.py").write_text(broken)
    at = {text.strip(): n for n, text in enumerate(broken.splitlines(), start=1)}
    assert scopes.scope_of(tmp_path, "mod.py", at["return out"]) == "windowed()"
    assert scopes.scope_of(tmp_path, "mod.py", at["return item * (1 + self.TAX)"]) == "Cart.total.line()"
    assert scopes.scope_of(tmp_path, "mod.py", at["TAX = 0.2"]) == "class Cart"
    assert scopes.scope_of(tmp_path, "mod.py", at["LIMIT = 3"]) == ""


@pytest.mark.parametrize(("name", "data"), [
    ("data.txt", b"def looks_like_python():\n    pass\n"),  # not a Python file: never guessed
    ("nul.py", b"def f():\n    x = '\0'\n"),  # NUL bytes: ast refuses, indentation still works
    ("latin.py", b"def f():\n    return '\xe9'\n"),  # not UTF-8
])
def test_odd_files_never_raise(tmp_path: Path, name: str, data: bytes) -> None:
    (tmp_path / name).write_bytes(data)
    found = scopes.scope_of(tmp_path, name, 2)
    assert found == ("" if name.endswith(".txt") else "f()")
    assert scopes.scope_of(tmp_path, "missing.py", 1) == ""
    assert scopes.scope_of(tmp_path, name, 99) == ""


def test_scopes_are_cached_per_file_digest(tmp_path: Path) -> None:
    source = b"def first():\n    return 1\n"
    table = scopes.scope_table(source)
    assert scopes.scope_table(bytes(source)) is table  # same content: not parsed again
    (tmp_path / "m.py").write_bytes(source)
    assert scopes.scope_of(tmp_path, "m.py", 2) == "first()"
    (tmp_path / "m.py").write_bytes(source.replace(b"first", b"second"))  # edited: new digest
    assert scopes.scope_of(tmp_path, "m.py", 2) == "second()"


# ---------------------------------------------------------------- suspects


SUSPECTS = [
    Suspect("pkg/more.py", 1079, 0.97, "yield tuple(window)", "windowed()"),
    Suspect("pkg/more.py", 20, 0.97, "x = 1", ""),
    Suspect("pkg/more.py", 1078, 0.95, "for _ in islice(filler, step, None, step):", "windowed()"),
    Suspect("pkg/other.py", 5, 0.5, "return a", "Cart.total()"),
]


def test_suspect_lines_name_their_function() -> None:
    assert format_suspects(SUSPECTS, limit=3) == [
        "pkg/more.py:1079 in windowed() (0.97): yield tuple(window)",
        "pkg/more.py:20 (0.97): x = 1",
        "pkg/more.py:1078 in windowed() (0.95): for _ in islice(filler, step, None, step):",
    ]


def test_suspects_grouped_by_function_best_first() -> None:
    groups = group_suspects(SUSPECTS)
    assert [(g.file, g.scope, g.lines) for g in groups] == [
        ("pkg/more.py", "windowed()", (1079, 1078)),  # tied with module level, but more lines
        ("pkg/more.py", "", (20,)),
        ("pkg/other.py", "Cart.total()", (5,)),
    ]
    assert groups[0].describe(4) == "windowed() in pkg/more.py (best 0.97; 2 of the 4 lines: 1078, 1079)"
    assert groups[1].describe(4) == "pkg/more.py (module level) (best 0.97; 1 of the 4 lines: 20)"


# ---------------------------------------------------------------- lists and tails


@pytest.mark.parametrize(("names", "limit", "expected"), [
    (["a", "b"], 10, "a, b"),
    (["a", "b", "c"], 3, "a, b, c"),
    (["a", "b", "c", "d"], 2, "a, b (+2 more)"),
    (["a"], 0, "+1 more"),
    ([], 5, ""),
])
def test_a_cut_list_says_how_many_are_left_out(names: list[str], limit: int, expected: str) -> None:
    assert name_list(names, limit) == expected


def _check(**kw: object) -> CheckResult:
    base: dict = {"name": "tests pass", "kind": "command", "passed": False, "exit_code": 1, "duration_s": 0.0}
    base.update(kw)
    return CheckResult(**base)


def test_a_tail_from_the_output_file_starts_at_a_line_boundary(tmp_path: Path) -> None:
    out = tmp_path / "check.out"
    lines = [f"line {n:05d} " + "x" * 40 for n in range(400)]
    out.write_text("\n".join(lines) + "\n")
    # the in-memory tail starts mid-line, as a process runner's fixed-size tail does
    tail, cut = output_tail(_check(output_file=str(out), output_tail=out.read_text()[-2000:]))
    assert cut
    assert len(tail) <= PROMPT_TAIL_CHARS
    assert tail.splitlines()[0] in lines
    assert tail.splitlines()[-1] == lines[-1]


def test_a_tail_in_memory_only_starts_at_a_line_boundary_too() -> None:
    text = "\n".join(f"row {n} " + "y" * 50 for n in range(200))
    tail, cut = output_tail(_check(output_tail=text))
    assert cut and tail.splitlines()[0] in text.splitlines()
    short, cut_short = output_tail(_check(output_tail="half a line\nand another"))
    assert (short, cut_short) == ("half a line\nand another", False)
    one_line = "z" * (PROMPT_TAIL_CHARS * 2)  # no line boundary at all: keep its end
    endless, _ = output_tail(_check(output_tail=one_line))
    assert endless == "z" * PROMPT_TAIL_CHARS


def test_passed_lines_make_way_for_the_failures(tmp_path: Path) -> None:
    trace = [f"E       AssertionError: detail {n}" for n in range(40)]
    passed = [f"PASSED tests/test_x.py::test_ok_{n}" for n in range(200)]
    out = tmp_path / "check.out"
    out.write_text("\n".join([*trace, "=== short test summary info ===", *passed,
                              "FAILED tests/test_x.py::test_bad - AssertionError: detail 0", "1 failed"]) + "\n")
    tail, cut = output_tail(_check(output_file=str(out)))
    assert not cut  # nothing but the PASSED lines was left out, and a line says so
    assert "PASSED" not in tail.replace("(200 PASSED lines left out)", "")
    assert tail.splitlines()[0] == "E       AssertionError: detail 0"  # all of the traceback fits now
    assert tail.splitlines()[-3:] == ["(200 PASSED lines left out)",
                                      "FAILED tests/test_x.py::test_bad - AssertionError: detail 0", "1 failed"]


# ---------------------------------------------------------------- lessons

PYTEST_OUTPUT = """\
=================================== FAILURES ===================================
___________________________ WindowedTests.test_basic ___________________________

self = <tests.test_more.WindowedTests testMethod=test_basic>

>       self.assertEqual(actual, expected)
E       AssertionError: Lists differ: [(1, 2, 3)] != [(1, 2, 3), (2, 3, 4)]
E
E       Second list contains 1 additional elements.

tests/test_more.py:1078: AssertionError
_________________________________ test_plain ___________________________________

    def test_plain():
>       assert windowed([1, 2], 1) == [(1,), (2,)]
E       assert [(1,)] == [(1,), (2,)]

tests/test_more.py:20: AssertionError
=========================== short test summary info ============================
FAILED tests/test_more.py::WindowedTests::test_basic - AssertionErro...
FAILED tests/test_more.py::test_plain - assert [(1,)] == [(1,), (2,)]
"""


def test_error_type_comes_from_the_crash_line_not_the_cut_summary() -> None:
    assert error_of(PYTEST_OUTPUT, "tests/test_more.py::WindowedTests::test_basic") == (
        "AssertionError", "Lists differ: [(1, 2, 3)] != [(1, 2, 3), (2, 3, 4)]")
    assert error_of(PYTEST_OUTPUT, "tests/test_more.py::test_plain") == (
        "AssertionError", "assert [(1,)] == [(1,), (2,)]")
    # only pytest's short summary (--tb=no): its type, unless the terminal cut it
    assert error_of("FAILED t.py::test_a - ValueError: bad input\n", "t.py::test_a") == (
        "ValueError", "bad input")
    assert error_of("FAILED t.py::test_a - AssertionErro...\n", "t.py::test_a")[0] == ""


def test_a_lesson_is_a_whole_sentence_with_the_test_and_the_error_type(tmp_path: Path) -> None:
    out = tmp_path / "check.out"
    out.write_text(PYTEST_OUTPUT)
    failed = [_check(output_file=str(out), output_tail=PYTEST_OUTPUT[-200:],
                     failing_tests=("tests/test_more.py::WindowedTests::test_basic", "tests/test_more.py::test_plain"))]
    assert describe_failure(failed) == (
        "tests/test_more.py::WindowedTests::test_basic failed with AssertionError: Lists differ: "
        "[(1, 2, 3)] != [(1, 2, 3), (2, 3, 4)]; 1 more test failing.")
    line = compose_lesson(2, 1, True, failed, loop_name="fix")
    assert line.startswith("- ") and " fix iter 2: exit 1, state moved: tests/test_more.py::" in line


def test_a_lesson_never_pins_one_tests_error_on_another() -> None:
    # the output (a cut tail) shows only the second test's failure
    shown = PYTEST_OUTPUT.split("_________________________________ test_plain")[1]
    output = "_________________________________ test_plain" + shown
    tests = ("tests/test_more.py::WindowedTests::test_basic", "tests/test_more.py::test_plain",
             "tests/test_more.py::test_third")
    assert describe_failure([_check(output_tail=output, failing_tests=tests)]) == (
        "tests/test_more.py::test_plain failed with AssertionError: assert [(1,)] == [(1,), (2,)]; "
        "2 more tests failing.")
    # no test's section at all: the error is the output's, not the first test's
    bare = "E   ValueError: bad\nx.py:3: ValueError\n"
    assert describe_failure([_check(output_tail=bare, failing_tests=tests[:2])]) == (
        "2 tests failed, first tests/test_more.py::WindowedTests::test_basic; the output shows "
        "ValueError: bad.")


def test_a_long_message_is_cut_at_a_word_and_the_lesson_stays_whole() -> None:
    words = " ".join(f"word{n}" for n in range(200))
    output = f"E       ValueError: {words}\nt.py:3: ValueError\nFAILED t.py::test_long - ValueError: w...\n"
    sentence = describe_failure([_check(output_tail=output, failing_tests=("t.py::test_long",))])
    assert sentence.startswith("t.py::test_long failed with ValueError: word0 word1 ")
    assert sentence.endswith(" ...")
    assert re.search(r"word\d+ \.\.\.$", sentence)  # the last word kept is a whole one
    assert len(compose_lesson(1, 1, None, [_check(output_tail=output)])) < MAX_LESSON_CHARS + 80


def test_a_lesson_for_a_command_check_names_the_check_and_the_error() -> None:
    failed = [_check(name='"make test" passes', command="make test", exit_code=2, reason="exit 2",
                     output_tail="building\nKeyError: 'price'\nmake: *** Error 2\n")]
    assert describe_failure(failed) == "`make test` failed with KeyError: 'price'."
    two = failed + [_check(name="lint", reason="exit 1", output_tail="E501 line too long")]
    assert describe_failure(two).endswith("; 1 more check failing.")
    hook = [_check(name="the cart adds up", reason="3 items, expected 4", exit_code=None)]
    assert describe_failure(hook) == "check `the cart adds up` failed (3 items, expected 4) with no output."


# ---------------------------------------------------------------- the prompt


def _context(tmp_path: Path, spec: LoopSpec, iteration: int = 1,
             previous: IterationRecord | None = None) -> LoopContext:
    return LoopContext(spec=spec, iteration=iteration, workdir=tmp_path, run_dir=tmp_path / "run",
                       runner=None, clock=lambda: 0.0, deadline=None, base_env={},  # type: ignore[arg-type]
                       previous=previous, localizer=Localizer())


def _spec(**kw: object) -> LoopSpec:
    return LoopSpec(name="fix", checks=(Check.command_passes("pytest -q"),), **kw)  # type: ignore[arg-type]


def test_failing_tests_are_listed_in_full_or_with_how_many_more(tmp_path: Path) -> None:
    few = tuple(f"tests/test_a.py::test_{n}" for n in range(18))
    prompt = build_prompt(_spec(), _context(tmp_path, _spec()), [_check(failing_tests=few)])
    assert "Failing tests (18):" in prompt
    assert all(f"- {t}\n" in prompt for t in few)
    many = tuple(f"tests/test_a.py::test_{n}" for n in range(45))
    prompt = build_prompt(_spec(), _context(tmp_path, _spec()), [_check(failing_tests=many)])
    assert "Failing tests (45):" in prompt and "- tests/test_a.py::test_39\n" in prompt
    assert "test_40" not in prompt and "- +5 more\n" in prompt


def _write_suspects(context: LoopContext, items: list[Suspect]) -> None:
    context.iteration_dir.joinpath("suspects.json").write_text(json.dumps([s.to_dict() for s in items]))
    context.suspects = format_suspects(items)


def test_files_to_look_at_are_the_suspect_files_when_the_loop_names_none(tmp_path: Path) -> None:
    spec = _spec(state_paths=(".",))
    context = _context(tmp_path, spec)
    _write_suspects(context, SUSPECTS)
    failed = [_check(failing_tests=("tests/test_more.py::test_x",))]
    prompt = build_prompt(spec, context, failed)
    files = prompt.split("## Files to look at\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert files == ["- pkg/more.py", "- pkg/other.py",
                     "- tests/test_more.py (failing tests: read, do not edit)"]
    assert "## Suspicious functions\n\n- windowed() in pkg/more.py (best 0.97; 2 of the 4 lines" in prompt
    assert "- pkg/more.py:1078 in windowed() (0.95): for _ in islice" in prompt
    # a loop's own `look at:` wins
    named = _spec(look_at=("src/calc.py",), state_paths=(".",))
    prompt = build_prompt(named, context, failed)
    assert prompt.split("## Files to look at\n\n", 1)[1].startswith("- src/calc.py\n\n")
    # nothing known: the state paths, as before
    bare = build_prompt(spec, _context(tmp_path / "other", spec), [_check()])
    assert "## Files to look at\n\n- .\n" in bare


def test_the_prompt_names_the_tests_that_changed_state(tmp_path: Path) -> None:
    before = IterationRecord(iter=1, started_at="", checks=[
        _check(failing_tests=("t.py::test_a", "t.py::test_b", "t.py::test_c")),
        _check(name="lint", passed=True, exit_code=0),
        _check(name="types", reason="exit 1"),
    ])
    now = [_check(failing_tests=("t.py::test_c", "t.py::test_d")), _check(name="lint", reason="exit 1")]
    prompt = build_prompt(_spec(), _context(tmp_path, _spec(), 2, before), now)
    section = prompt.split("## Since iteration 1\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section == [
        "- No longer failing (2): t.py::test_a, t.py::test_b",
        "- Newly failing (1): t.py::test_d",
        "- Checks now passing: types",
        "- Checks that passed before and fail now: lint",
    ]
    first = build_prompt(_spec(), _context(tmp_path, _spec()), now)
    assert "## Since iteration" not in first


def test_a_hidden_check_is_never_named_among_the_changes(tmp_path: Path) -> None:
    import dataclasses

    secret = dataclasses.replace(Check.command_passes("python judge_secret.py"), hidden=True)
    spec = LoopSpec(name="fix", checks=(Check.command_passes("pytest -q"), secret))
    before = IterationRecord(iter=1, started_at="", checks=[
        _check(name=secret.name, reason="exit 1"), _check(name="lint", passed=True, exit_code=0)])
    prompt = build_prompt(spec, _context(tmp_path, spec, 2, before),
                          [_check(name="lint", reason="exit 1")])
    assert "judge_secret" not in prompt
    assert "- Checks that passed before and fail now: lint" in prompt


# ---------------------------------------------------------------- end to end

STATS = '''\
"""Window statistics."""


def total(values):
    return sum(values)


def window_sums(values, size):
    sums = []
    for start in range(len(values) - size):
        sums.append(total(values[start:start + size]))
    return sums
'''
BUG = "range(len(values) - size)"
WRONG = "range(max(1, len(values) - size))"  # fixes one test, breaks a green one
RIGHT = "range(len(values) - size + 1)"

STATS_TESTS = '''\
import pytest

from stats import total, window_sums


@pytest.mark.parametrize("n", range(12))
def test_window_sums(n):
    values = list(range(n + 3))
    assert window_sums(values, 3) == [sum(values[i:i + 3]) for i in range(n + 1)]


def test_total():
    assert total([1, 2, 3]) == 6


def test_total_empty():
    assert total([]) == 0


def test_single_window_short_input():
    assert window_sums([1], 3) == []
'''

# keeps each iteration's prompt; iteration 1 makes it worse, iteration 2 fixes it
KEEP_AND_FIX = f'''\
import os
import shutil
from pathlib import Path

keep = Path(os.environ["KEEP_DIR"])
keep.mkdir(exist_ok=True)
n = os.environ["LOOP_ITERATION"]
shutil.copy(os.environ["LOOP_PROMPT_FILE"], keep / f"prompt-{{n}}.md")
p = Path("stats.py")
if n == "1":
    p.write_text(p.read_text().replace({BUG!r}, {WRONG!r}))
else:
    p.write_text(p.read_text().replace({WRONG!r}, {RIGHT!r}))
'''


@pytest.mark.slow
def test_the_prompt_a_session_loop_hands_its_revise_step(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(pytester, monkeypatch)
    project.write("stats.py", STATS)
    project.write("tests/test_stats.py", STATS_TESTS)
    project.write("keep_and_fix.py", KEEP_AND_FIX)
    keep = pytester.path / "prompts"
    keep.mkdir()
    monkeypatch.setenv("KEEP_DIR", str(keep))
    # the revise step keeps the prompts outside the tree: named writable for the kernel tier
    monkeypatch.setenv("PYTEST_LOOPS_SANDBOX_WRITABLE", str(keep))
    result = project.run("tests", "--loop", "--loop-revise=python keep_and_fix.py", "--loop-max-iter", "4")
    assert result.ret == 0, result.stdout.str()
    bug_line = STATS.splitlines().index("    for start in range(len(values) - size):") + 1
    first, second = (keep / "prompt-1.md").read_text(), (keep / "prompt-2.md").read_text()

    # the buggy function is named, with the line
    assert f"- stats.py:{bug_line} in window_sums() (" in first
    assert "## Suspicious functions\n\n- window_sums() in stats.py (best " in first
    # files: the suspect file and the failing tests' file, not "."
    files = first.split("## Files to look at\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert files[0] == "- stats.py" and "- tests/test_stats.py (failing tests: read, do not edit)" in files
    assert "- .\n" not in first
    # all 12 failing tests are listed; the goal says how many it left out
    assert "Failing tests (12):" in first
    assert all(f"- tests/test_stats.py::test_window_sums[{n}]\n" in first for n in range(12))
    goal = next(line for line in first.splitlines() if line.startswith("Goal: "))
    assert goal.endswith("tests/test_stats.py::test_window_sums[9] (+2 more)")
    # every output tail starts with a whole line of the check's output
    run_dir = next(p for p in (project.artifacts / "runs").glob("failing-tests-*") if p.is_dir())
    for n, prompt in ((1, first), (2, second)):
        block = prompt.split("```\n", 1)[1].split("\n```", 1)[0]
        whole = (run_dir / f"iter-{n:03d}" / "failure.txt").read_text()
        assert ("\n" + block.splitlines()[0] + "\n") in ("\n" + whole), (n, block[:200])
    # iteration 2: the lesson of iteration 1 is a whole sentence naming a test and the error
    lessons = second.split("## Lessons from earlier iterations and runs\n\n", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"iter 1: exit 1, state first seen: tests/test_stats\.py::test_window_sums\[\d+\] "
                     r"failed with AssertionError: assert \[.*\]; 11 more tests failing\.$", lessons, re.M), lessons
    # and what changed since iteration 1: the wrong fix repaired one test and broke a green one
    since = second.split("## Since iteration 1\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert since == ["- No longer failing (1): tests/test_stats.py::test_window_sums[0]",
                     "- Newly failing (1): tests/test_stats.py::test_single_window_short_input"]

"""Secrets, terminal escapes and loop names on every path the plugin and the runner write.

A secret-named environment value (``SERVICE_API_TOKEN``) and a value given to
``--loop-mask`` / ``--mask`` may appear in an assertion message, in a loop's goal,
name and check command: after the run, no file the run wrote holds either (by
bytes or by name), nor does the terminal. Raw escape sequences from command output
never reach the terminal, a lesson, a prompt or a hand-off. Loops named ``a/b``,
``a-b`` and ``a b`` keep separate lessons pages. The lessons page is read back
only when it is a regular file, and only its end.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from plugin_helpers import Project

pytestmark = pytest.mark.faults

TOKEN = "tok-7Qz3vX9pL2mK"  # the value of SERVICE_API_TOKEN
MASKED = "hunter2-Mv8cR4sT"  # not secret-named: masked only because it is given to --loop-mask
MASKED_INI = "wombat-Jq5nB7yU"  # masked only because ini loop_mask lists it
ESCAPES = "\x1b[2J\x1b[31mred\x1b[0m\x1b]0;pwned\x07\x1bP1$r\x1b\\\x9b6n\x07"

TEST_APP = f"""\
    import os


    def test_token():
        token = os.environ["SERVICE_API_TOKEN"]
        print("calling the service with", token, "and {MASKED} {MASKED_INI}")
        assert token == "expected", "the service rejected " + token + " / {MASKED} / {MASKED_INI}"


    def test_green():
        assert True
    """

# check.py exits 1 and echoes what it was given (the secrets are in its command line),
# with escape sequences a terminal would act on
CHECK = f"""\
    import sys

    print("checking", *sys.argv[1:], {ESCAPES!r})
    sys.exit(1)
    """

LOOP_FILE = f"""\
    loop "deploy {TOKEN} {MASKED}":
      goal: ship with {TOKEN}, {MASKED} and {MASKED_INI} kept safe
      done when "python check.py {TOKEN} {MASKED} {MASKED_INI}" passes
      remember in "lessons.md"
    """

WRITTEN_BY_TEST = {"test_app.py", "check.py", "fix.loop", "noop.py", "pytest.ini"}
SECRETS = (TOKEN, MASKED, MASKED_INI)


def _leaks(root: Path, values: tuple[str, ...], skip: set[Path]) -> list[str]:
    """Every file under ``root`` whose bytes or whose name holds one of ``values``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            if any(v in name for v in values):
                found.append(f"name: {Path(dirpath, name)}")
        for name in filenames:
            path = Path(dirpath, name)
            if path in skip or path.is_symlink() or not path.is_file():
                continue
            if path.parent.name == "__pycache__" and path.suffix == ".pyc" \
                    and path.parent.parent / (name.split(".", 1)[0] + ".py") in skip:
                continue  # the interpreter's compiled copy of a file the test wrote
            data = path.read_bytes()
            if any(v.encode() in data for v in values):
                found.append(f"bytes: {path}")
    return sorted(found)


def _escapes_in(paths: list[Path]) -> list[str]:
    return [str(p) for p in paths if "\x1b" in p.read_text(encoding="utf-8", errors="replace")]


@pytest.fixture
def secret_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    project = Project(pytester, monkeypatch)
    monkeypatch.setenv("SERVICE_API_TOKEN", TOKEN)
    project.write("pytest.ini", f"[pytest]\nloop_mask =\n    {MASKED_INI}\n")
    project.write("test_app.py", TEST_APP)
    project.write("check.py", CHECK)
    project.write("fix.loop", LOOP_FILE)
    project.write("noop.py", "pass\n")
    return project


# -- fault 5: secrets -----------------------------------------------------------------------


def test_no_secret_reaches_a_file_or_the_terminal_under_pytest_loop(secret_project: Project, pytester):
    project = secret_project
    result = project.run("--loop", "--loop-revise", "python noop.py", "--loop-max-iter", "2",
                         "--loop-suspects", "off", "--loop-mask", MASKED, "--junitxml=junit.xml",
                         "--loop-report=report.html", "-rA", "-v")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out
    # the run reached every writer: failure file, prompt, the failing tests' JUnit file,
    # stored session results, lessons, hand-off, HTML report, the session's JUnit XML
    assert (project.path / "junit.xml").is_file() and (project.path / "report.html").is_file()
    assert list(project.artifacts.rglob("failure.txt")) and list(project.artifacts.rglob("prompt.md"))
    assert list(project.artifacts.rglob("failing.junit.xml"))
    assert list((project.artifacts / "sessions").rglob("*.json"))
    assert (project.path / "lessons.md").is_file() and list(project.artifacts.rglob("*.handoff.md"))
    assert "[REDACTED:SERVICE_API_TOKEN]" in (project.path / "lessons.md").read_text()
    assert "[REDACTED:SERVICE_API_TOKEN]" in out and "[REDACTED:mask]" in out
    assert _leaks(pytester.path, SECRETS, {project.path / name for name in WRITTEN_BY_TEST}) == []
    assert not [s for s in SECRETS if s in out]
    # fault 13: the check's escape sequences reach neither the terminal nor a lesson,
    # a prompt or a hand-off (the check's own output file keeps them)
    assert "\x1b" not in out and "\x9b" not in out
    written = [project.path / "lessons.md", *project.artifacts.rglob("prompt.md"),
               *project.artifacts.rglob("*.handoff.md")]
    assert _escapes_in(written) == []


def test_no_secret_reaches_a_file_under_the_standalone_runner(tmp_path: Path, cli):
    (tmp_path / "check.py").write_text(textwrap.dedent(CHECK))
    out = cli("run", "--verify", f"python check.py {TOKEN} {MASKED}", "--revise", "python -c pass",
              "--max-iter", "2", "--no-suspects", "--name", f"deploy {TOKEN} {MASKED}",
              "--goal", f"ship with {TOKEN} and {MASKED}", "--lessons-page", "lessons.md", "--mask", MASKED,
              env={"SERVICE_API_TOKEN": TOKEN})
    assert out.returncode == 2, out.stderr
    assert (tmp_path / "lessons.md").is_file() and list(tmp_path.rglob("prompt.md"))
    assert list(tmp_path.rglob("*.handoff.md")) and list(tmp_path.rglob("*.tine"))
    assert _leaks(tmp_path, SECRETS, {tmp_path / "check.py"}) == []
    assert not [s for s in SECRETS if s in out.stdout + out.stderr]
    assert "\x1b" not in out.stdout + out.stderr
    written = [tmp_path / "lessons.md", *tmp_path.rglob("prompt.md"), *tmp_path.rglob("*.handoff.md")]
    assert _escapes_in(written) == []


def test_a_mask_too_short_to_mask_is_bad_input_and_never_echoed(cli, secret_project: Project):
    out = cli("run", "--verify", "true", "--mask", "xy")
    assert out.returncode == 64 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "pytest-loops: error: --mask: a value of 2 character(s) is too short to mask; "
        "give the whole secret (at least 4 characters)"]
    result = secret_project.run_inprocess("--loop", "--loop-mask", "xyz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --loop-mask: a value of 3 character(s) is too short to mask*"])
    assert "xyz" not in result.stderr.str()
    assert secret_project.run_inprocess("--loop", "--loop-mask", MASKED, "--collect-only").ret == 0
    assert "PYTEST_LOOPS_MASK" not in os.environ  # set for the session only


def test_a_secret_left_in_the_junit_xml_is_masked(tmp_path: Path, monkeypatch):
    from pytest_loops.artifacts.junit import mask_xml

    xml = tmp_path / "junit.xml"
    xml.write_text(f'<testsuite><testcase classname="t" name="test_call[{TOKEN}]"/></testsuite>')
    mask_xml(xml)  # no secret in the environment: nothing to mask
    assert TOKEN in xml.read_text()
    monkeypatch.setenv("SERVICE_API_TOKEN", TOKEN)
    mask_xml(xml)
    assert xml.read_text() == ('<testsuite><testcase classname="t" '
                               'name="test_call[[REDACTED:SERVICE_API_TOKEN]]"/></testsuite>')
    mask_xml(tmp_path / "missing.xml")  # never raises


def test_without_loop_reports_are_left_alone(secret_project: Project):
    result = secret_project.run_inprocess("test_app.py", "--loop-mask", MASKED)
    assert result.ret == 1
    assert TOKEN in result.stdout.str() and MASKED in result.stdout.str()


# -- fault 13: escape sequences, and loop names as file names ----------------------------------


@pytest.mark.parametrize("raw, clean", [
    ("\x1b[31mred\x1b[0m", "red"),  # SGR colour
    ("a\x1b[2J\x1b[1;1Hb\x1b[?25l", "ab"),  # erase, cursor move, private mode
    ("\x1b]0;window title\x07text", "text"),  # OSC ended by BEL
    ("\x1b]8;;https://x.test\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink ended by ST
    ("\x1bP1$r\x1b\\after", "after"),  # DCS
    ("\x9b6n\x9d0;t\x9cx", "x"),  # 8-bit CSI and OSC
    ("\x1b(Bplain\x1bc", "plain"),  # charset, reset
    ("bell\x07 nul\x00 bs\x08 del\x7f", "bell nul bs del"),  # other C0, DEL
    ("tab\tand\nnewline", "tab\tand\nnewline"),  # kept
    ("crlf\r\nbar\r50%\r100%", "crlf\nbar\n50%\n100%"),  # a carriage return ends a line
    ("cut mid-sequence \x1b[3", "cut mid-sequence 3"),
    ("", ""),
])
def test_strip_control_leaves_no_terminal_control(raw: str, clean: str):
    from pytest_loops.redact import strip_control

    assert strip_control(raw) == clean


def test_one_way_to_strip_escape_sequences():
    """The three regexes that each stripped part of them are gone: one function does it."""
    import re

    package = Path(__file__).parent.parent / "pytest_loops"
    # a pattern names the escape byte in a raw string; writing one (the status line's
    # erase-line) does not strip anything
    pattern = re.compile(r"""r["'][^"'\n]*\\(?:x1b|033)""")
    holders = sorted(p.name for p in package.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8")))
    assert holders == ["redact.py"]


def test_loop_names_that_slugify_alike_keep_their_own_files(tmp_path: Path, monkeypatch):
    from pytest_loops import Check, LoopSpec
    from pytest_loops.core.context import resolve_paths

    monkeypatch.setenv("SERVICE_API_TOKEN", TOKEN)
    names = ["a/b", "a-b", "a b", "a_b", f"deploy {TOKEN}"]
    specs = [LoopSpec(name=n, checks=(Check.command_passes("true"),), cwd=str(tmp_path)) for n in names]
    paths = [resolve_paths(s, wall=0.0) for s in specs]
    pages = [p.memory_page for p in paths]
    logs = [p.log for p in paths]
    assert len(set(pages)) == len(names) and len(set(logs)) == len(names)
    assert all(p.name.startswith("a-b-") for p in pages[:3])  # still readable
    assert all(TOKEN not in str(p) for p in [*pages, *logs])
    assert specs[-1].slug == LoopSpec(name=f"deploy {TOKEN}", checks=specs[-1].checks).slug  # stable


def test_two_loops_named_alike_never_share_lessons(tmp_path: Path, cli):
    for name in ("a/b", "a-b"):
        out = cli("run", "--verify", f"echo failing in {name.replace('/', 'SLASH')}; exit 1", "--max-iter", "1",
                  "--name", name, "--no-suspects", "--no-tine")
        assert out.returncode == 2, out.stderr
    pages = sorted((tmp_path / ".pytest-loops" / "lessons").glob("*.md"))
    assert len(pages) == 2
    texts = [p.read_text() for p in pages]
    assert sorted("failing in aSLASHb" in t for t in texts) == [False, True]
    assert sorted("failing in a-b" in t for t in texts) == [False, True]


# -- fault 11: the lessons page is read back bounded, and only from a regular file ---------------


def _within(seconds: float, fn):
    """fn() in a thread; its result, or a failure when it has not returned in time."""
    import threading

    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"{fn} did not return within {seconds}s"
    return box[0]


def test_a_lessons_page_that_is_a_fifo_is_neither_waited_on_nor_written(tmp_path: Path, capsys):
    from pytest_loops.artifacts.lessons_page import LessonsPage

    fifo = tmp_path / "lessons.md"
    os.mkfifo(fifo)
    page = LessonsPage(fifo, loop_name="calc")
    assert _within(30, page.read_lessons) == []
    _within(30, lambda: page.append("- a lesson"))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"pytest-loops: warning: lessons page {fifo}: is not a regular file; no lessons read back"]


def test_a_lessons_page_pointing_at_a_device_reads_nothing(tmp_path: Path, capsys):
    from pytest_loops.artifacts.lessons_page import LessonsPage

    link = tmp_path / "lessons.md"
    link.symlink_to("/dev/zero")
    assert _within(30, LessonsPage(link, loop_name="calc").read_lessons) == []
    assert "is a symbolic link, never read" in capsys.readouterr().err  # not even opened


def test_a_huge_lessons_page_is_read_back_from_its_end_only(tmp_path: Path, capsys):
    from pytest_loops.artifacts.lessons_page import READ_LIMIT, LessonsPage

    path = tmp_path / "lessons.md"
    page = LessonsPage(path, loop_name="calc")
    page.append("- first")
    with open(path, "a", encoding="utf-8") as f:
        for n in range(20_000):  # ~ 0.5 MB of lessons
            f.write(f"- lesson number {n:06d} of many\n")
    page.append("- last")
    lessons = page.read_lessons()
    assert lessons[-2:] == ["- lesson number 019999 of many", "- last"]
    assert "- first" not in lessons and all(x.startswith("- ") for x in lessons)
    assert sum(len(x) + 1 for x in lessons) <= READ_LIMIT
    assert lessons[0].startswith("- lesson number ") and lessons[0].endswith(" of many")  # a whole line
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "only the lessons in its last 64 KiB are read back" in err[0]


def test_the_runner_with_a_fifo_as_lessons_page_ends_with_its_verdict(tmp_path: Path, cli):
    os.mkfifo(tmp_path / "lessons.md")
    out = cli("run", "--verify", "exit 1", "--max-iter", "1", "--lessons-page", "lessons.md", "--no-suspects",
              "--no-tine", timeout=60)
    assert out.returncode == 2, out.stderr
    assert "lessons page" in out.stderr and "is not a regular file" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_a_secret_in_a_test_id_reaches_no_file_and_no_terminal_line(pytester, monkeypatch):
    """A parametrize id can hold a value: the terminal's test lines, the fix-loop's
    coverage data, impact map and its children's pytest caches all carry test ids."""
    project = Project(pytester, monkeypatch)
    monkeypatch.setenv("SERVICE_API_TOKEN", TOKEN)
    project.write("test_ids.py", """\
        import os

        import pytest


        @pytest.mark.parametrize("value", [os.environ["SERVICE_API_TOKEN"]])
        def test_value(value):
            assert value == "expected"


        def test_green():
            assert True
        """)
    project.write("noop.py", "pass\n")
    result = project.run("--loop", "--loop-revise", "python noop.py", "--loop-max-iter", "2",
                         "--loop-suspects-cap=0", "-v", "-rA")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out
    assert "test_value[[REDACTED:SERVICE_API_TOKEN]]" in out
    assert list(project.artifacts.rglob("spectra.json")) and list(project.artifacts.rglob("impact.json"))
    assert TOKEN not in out
    assert _leaks(pytester.path, (TOKEN,), {project.path / "test_ids.py", project.path / "noop.py"}) == []


def test_the_remembered_secrets_follow_every_change_of_the_environment(monkeypatch):
    """redact() remembers the secrets of an unchanged environment; a secret set, changed,
    or removed after a first call is seen at the next one, and pytest's per-test
    variable changing does not make it look again for nothing."""
    from pytest_loops import redact as r

    monkeypatch.delenv("S24_API_TOKEN", raising=False)
    assert r.redact("value-one here") == "value-one here"
    monkeypatch.setenv("S24_API_TOKEN", "value-one")
    assert r.redact("value-one here") == "[REDACTED:S24_API_TOKEN] here"
    monkeypatch.setenv("S24_API_TOKEN", "value-two")
    assert r.redact("value-one value-two") == "value-one [REDACTED:S24_API_TOKEN]"
    assert r.make_redactor()("value-two") == "[REDACTED:S24_API_TOKEN]"
    assert r.redact_obj({"k": ["value-two"]}) == {"k": ["[REDACTED:S24_API_TOKEN]"]}
    monkeypatch.setenv("PYTEST_LOOPS_MASK", "masked-value")
    assert r.redact("masked-value") == r.MASK_MARKER
    monkeypatch.delenv("PYTEST_LOOPS_MASK")
    monkeypatch.delenv("S24_API_TOKEN")
    assert r.redact("value-two masked-value") == "value-two masked-value"
    looked = []
    monkeypatch.setattr(r, "secret_values", lambda env=None: looked.append(env) or [])
    r.redact("x")  # nothing changed since the last call
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::test_a (call)")
    r.redact("x")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::test_b (call)")
    r.redact("x")
    assert looked == []
    monkeypatch.setenv("OTHER", "1")
    r.redact("x")
    assert looked == [None]
    r.redact("x", env={"A_TOKEN": "abcdef"})  # an explicit environment is never remembered
    assert looked == [None, {"A_TOKEN": "abcdef"}]

"""Links a check plants where the harness writes or reads, and secrets in the harness's helpers.

The code under test may write the loop's run directory (every tier) and, outside
the namespaces tier, the whole tree: the lessons page too. A symbolic link it left
at a name the harness writes next must be replaced, never written through (the
harness's text would land in ~/.bashrc); one it left at a name the harness reads
back must not be followed (a file the sandbox hides would reach the next prompt).
The harness's own helper processes (its watchdog) must not carry the signing key:
their /proc/<pid>/environ is as readable as the harness's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.artifacts.lessons_page import LessonsPage
from pytest_loops.artifacts.runlog import append_index
from pytest_loops.core.closure import read_closure
from pytest_loops.limits import create_fresh, open_own, replace_fresh, write_fresh
from pytest_loops.localization.spectra import SpectraError, read_spectra, write_json
from pytest_loops.redact import scrub_file
from pytest_loops.runtime.capture import output_lines

pytestmark = pytest.mark.faults

PRECIOUS = "# the user's shell start-up file\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "fake_bashrc"
    path.write_text(PRECIOUS)
    return path


def _link(at: Path, to: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.unlink(missing_ok=True)
    at.symlink_to(to)
    return at


# -- F2: writes into the run directory ----------------------------------------------------

WRITERS = {
    "write_fresh": lambda p: write_fresh(p, "harness"),
    "replace_fresh": lambda p: replace_fresh(p, "harness"),
    "write_json (suspects, impact map)": lambda p: write_json(p, ["harness"]),
    "scrub_file (masking secrets)": lambda p: scrub_file(p, lambda text: "harness"),
    "append_index": lambda p: append_index(p, {"verdict": "SUCCESS"}),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_harness_writer_never_writes_through_a_link(writer: str, tmp_path: Path, victim: Path) -> None:
    at = _link(tmp_path / "run" / "suspects.json", victim)
    try:
        WRITERS[writer](at)
    except OSError:
        pass  # refusing is fine; writing through is not
    assert victim.read_text() == PRECIOUS


def test_a_named_pipe_in_the_run_directory_is_replaced_not_waited_on(tmp_path: Path) -> None:
    pipe = tmp_path / "suspects.json"
    os.mkfifo(pipe)
    with os.fdopen(create_fresh(pipe), "w") as f:  # before: open() blocked for a reader forever
        f.write("harness")
    assert pipe.read_text() == "harness"


def _project(tmp_path: Path, calc: str) -> Path:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "calc.py").write_text(calc)
    (project / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    return project


def _run(cli, project: Path, *extra: str, env: dict[str, str] | None = None,
         revise: str = "true") -> subprocess.CompletedProcess[str]:
    return cli("run", "--verify", f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py",
               "--revise", revise, "--max-iter", "3", "--no-progress-k", "0", "--sandbox", "none", *extra,
               cwd=project, env=env, timeout=240)


PLANT_SUSPECTS = '''\
import os
import pathlib

_runs = pathlib.Path(__file__).parent / ".pytest-loops" / "runs"
for _run in (_runs.iterdir() if _runs.is_dir() else []):
    if _run.is_dir():
        for _dir in (_run, *_run.glob("iter-*")):
            try:  # before the harness writes there (each name once)
                if not os.path.lexists(_dir / "suspects.json"):
                    (_dir / "suspects.json").symlink_to({victim!r})
            except OSError:
                pass


def add(a, b):
    return a - b
'''


@pytest.mark.slow
def test_suspects_are_never_written_through_a_link_the_check_planted(cli, tmp_path: Path, victim: Path) -> None:
    project = _project(tmp_path, PLANT_SUSPECTS.format(victim=str(victim)))
    done = _run(cli, project)
    assert done.returncode == 2, done.stderr[-2000:]  # MAX_ITER: the bug stays, the run went on
    assert victim.read_text() == PRECIOUS
    (run,) = [p for p in (project / ".pytest-loops" / "runs").iterdir() if p.is_dir()]
    # the harness made its suspects (as files of its own), where the check had left links
    # (the last iteration's link stays: no revise step follows it, so no suspects are made)
    made = [p.name for p in (run, *run.glob("iter-*"))
            if (p / "suspects.json").is_file() and not (p / "suspects.json").is_symlink()]
    assert run.name in made and "iter-001" in made, made


# -- F3: the lessons page -----------------------------------------------------------------

def test_a_lessons_page_that_is_a_link_is_neither_read_nor_appended_to(tmp_path: Path, victim: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    victim.write_text(PRECIOUS + "- a bullet of the file the link names\n")
    page = LessonsPage(_link(tmp_path / "lessons" / "loop.md", victim), loop_name="loop")
    assert page.read_lessons() == []
    page.append("- iter 2 failed: $(echo pwned)")
    page.append("- iter 3 failed: $(echo pwned)")
    assert victim.read_text() == PRECIOUS + "- a bullet of the file the link names\n"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a symbolic link" in err, err  # one line, not one per lesson


def test_a_lessons_page_with_other_names_is_not_appended_to(tmp_path: Path, victim: Path) -> None:
    page_path = tmp_path / "lessons" / "loop.md"
    page_path.parent.mkdir()
    os.link(victim, page_path)
    LessonsPage(page_path, loop_name="loop").append("- iter 2 failed")
    assert victim.read_text() == PRECIOUS


PLANT_LESSONS = '''\
import pathlib

for _page in (pathlib.Path(__file__).parent / ".pytest-loops" / "lessons").glob("*.md"):
    try:
        _page.unlink()
        _page.symlink_to({victim!r})
    except OSError:
        pass


def add(a, b):
    return a - b
'''


def test_a_lessons_page_the_check_linked_elsewhere_is_never_appended_through(cli, tmp_path: Path,
                                                                            victim: Path) -> None:
    project = _project(tmp_path, PLANT_LESSONS.format(victim=str(victim)))
    done = _run(cli, project, "--no-suspects")
    assert done.returncode == 2, done.stderr[-2000:]  # the run goes on to its verdict
    assert victim.read_text() == PRECIOUS
    warned = [line for line in done.stderr.splitlines() if "is a symbolic link" in line]
    assert len(warned) == 1 and warned[0].startswith("pytest-loops: warning: lessons page"), done.stderr[-2000:]


# -- F4: reads back from the run directory ------------------------------------------------

def test_readers_of_the_run_directory_do_not_follow_links(tmp_path: Path) -> None:
    secret = tmp_path / "hidden-key"
    secret.write_text('{"format": "x", "SECRET": "key-bytes"}\n')
    out = _link(tmp_path / "iter-002" / "check-1.out", secret)
    assert "".join(output_lines(str(out), "the tail the harness kept\n")) == "the tail the harness kept\n"
    with pytest.raises(OSError):
        open_own(out)
    with pytest.raises(SpectraError):
        read_spectra(_link(tmp_path / "iter-002" / "spectra.json", secret))
    closure = tmp_path / "closure"
    closure.mkdir()
    (tmp_path / "record.json").write_text(json.dumps({"read": [str(tmp_path / "proj" / "golden.txt")]}))
    _link(closure / "closure-1.json", tmp_path / "record.json")
    assert read_closure(closure, str(tmp_path / "proj")) == {}


PLANT_OUTPUT = '''\
import os
import pathlib

_run = os.environ.get("LOOP_RUN_DIR")
if _run and os.environ.get("LOOP_ITERATION"):
    _out = pathlib.Path(_run) / ("iter-%03d" % int(os.environ["LOOP_ITERATION"])) / "check-1.out"
    try:
        _out.unlink(missing_ok=True)
        _out.symlink_to({secret!r})
    except OSError:
        pass


def add(a, b):
    return a - b
'''

REVISE = '''\
import os, pathlib, shutil
n = os.environ["LOOP_ITERATION"]
shutil.copy(os.environ["LOOP_FAILURE_FILE"], "failure-%s.txt" % n)
shutil.copy(os.environ["LOOP_PROMPT_FILE"], "prompt-%s.txt" % n)
'''


@pytest.mark.slow
def test_a_check_output_linked_to_a_hidden_file_is_not_read_back(cli, tmp_path: Path) -> None:
    secret = tmp_path / "outside-key"
    secret.write_text("SECRET-RUNLOG-KEY-0123456789\n")
    project = _project(tmp_path, PLANT_OUTPUT.format(secret=str(secret)))
    (project / "revise.py").write_text(REVISE)
    done = _run(cli, project, "--no-suspects", revise=f"{sys.executable} revise.py")
    assert done.returncode in (2, 5), done.stderr[-2000:]
    copies = sorted(project.glob("failure-*.txt")) + sorted(project.glob("prompt-*.txt"))
    assert copies, done.stderr[-2000:]
    for copy in copies:
        assert "SECRET-RUNLOG-KEY" not in copy.read_text(errors="replace"), copy.name
    runs = project / ".pytest-loops" / "runs"
    for path in runs.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert "SECRET-RUNLOG-KEY" not in path.read_text(errors="replace"), path


# -- F12: the harness's own helper processes ----------------------------------------------

KEY_VARIABLE = "LINKS_TEST_SIGN_KEY"

SCAN = '''\
import os, sys
key = os.environ.get("KEY_VALUE_TO_FIND", "").encode() or sys.argv[1].encode()
hits = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            data = f.read()
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\\0", b" ")
    except OSError:
        continue
    if key in data:
        hits.append(cmd.decode(errors="replace"))
open(sys.argv[2], "w").write("\\n".join(hits))
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc")
def test_the_signing_key_is_in_no_helper_process_of_the_harness(cli, tmp_path: Path) -> None:
    key = "links-test-key-" + os.urandom(16).hex()  # 47 bytes: only this test's processes hold it
    project = tmp_path / "proj"
    project.mkdir()
    (project / "scan.py").write_text(SCAN)
    hits = tmp_path / "hits.txt"
    env = {KEY_VARIABLE: key}
    done = cli("run", "--verify", f"{sys.executable} scan.py {key} {hits}", "--revise", "true", "--max-iter", "1",
               "--sandbox", "none", "--no-suspects", "--sign-key-env", KEY_VARIABLE, cwd=project, env=env,
               timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = hits.read_text()
    # the check's own command line names the key (this test's doing); any other holder is a leak
    holders = [line for line in seen.splitlines() if "scan.py" not in line]
    assert holders == [], holders


def test_helper_environment_drops_what_the_harness_hid(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_loops.runtime.procimage import helper_environment, hide_secrets
    from pytest_loops.runtime.safegit import git_environment

    monkeypatch.setenv("LINKS_UNIT_KEY", "x" * 40)
    hide_secrets(["LINKS_UNIT_KEY"])
    assert "LINKS_UNIT_KEY" not in helper_environment()
    assert "LINKS_UNIT_KEY" not in git_environment()
    assert os.environ["LINKS_UNIT_KEY"] == "x" * 40  # the harness itself keeps it

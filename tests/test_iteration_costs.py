"""What an iteration no longer pays for, and the guarantees each shortcut keeps: the
iteration directory made once (checked again after every command), a command's
output hashed as it is written, the ancestors' configuration files watched by a
change journal, short commands unannounced to the watchdog, the lessons page's lock
kept open."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock, Timeout

from pytest_loops.artifacts.lessons_page import LessonsPage, PageLock
from pytest_loops.core.context import LoopContext, scrub_output
from pytest_loops.results import CommandResult
from pytest_loops.runtime import reaper
from pytest_loops.runtime.process import ProcessRunner
from pytest_loops.runtime.protect import TreeGuard
from pytest_loops.runtime.protect import ancestry as ancestry_module
from pytest_loops.spec import Check, LoopSpec


class LinkingRunner:
    """A command that puts a link where the iteration directory was."""

    def __init__(self, elsewhere: Path) -> None:
        self.elsewhere = elsewhere

    def run(self, command: str, *, cwd: Any, env: Any = None, timeout: Any = None,
            output_path: Any = None, sandbox: Any = None) -> CommandResult:
        folder = Path(output_path).parent
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
        folder.symlink_to(self.elsewhere)
        return CommandResult(command=command, exit_code=1, duration_s=0.0)


def test_the_iteration_directory_is_checked_again_after_a_command(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spec = LoopSpec(name="l", checks=(Check.command_passes("false"),), cwd=str(tmp_path))
    ctx = LoopContext(spec=spec, iteration=1, workdir=tmp_path, run_dir=tmp_path / "run",
                      runner=LinkingRunner(elsewhere), clock=lambda: 0.0, deadline=None, base_env={})
    first = ctx.iteration_dir
    assert ctx.iteration_dir is first  # made once while no command ran
    ctx.run_command("false", label="check-1")
    ctx.prompt_file.write_text("prompt")
    assert not (tmp_path / "run" / "iter-001").is_symlink()
    assert (tmp_path / "run" / "iter-001" / "prompt.md").read_text() == "prompt"
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_a_commands_output_is_hashed_as_it_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    result = ProcessRunner().run("printf 'one\\ntwo\\n'; printf three >&2", cwd=tmp_path, output_path=out)
    assert result.output_sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    capped = ProcessRunner(output_cap=64).run("seq 1 500", cwd=tmp_path, output_path=tmp_path / "capped.txt")
    assert b"dropped here" in (tmp_path / "capped.txt").read_bytes()
    assert capped.output_sha256 == hashlib.sha256((tmp_path / "capped.txt").read_bytes()).hexdigest()
    assert ProcessRunner().run("echo hi", cwd=tmp_path).output_sha256 is None  # no file kept


def test_a_masked_output_drops_the_digest_taken_before(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    result = ProcessRunner().run("echo the value is hunter22", cwd=tmp_path, output_path=out)
    masked = scrub_output(result, lambda text: text.replace("hunter22", "***"))
    assert "hunter22" not in out.read_text()
    assert masked.output_sha256 is None
    same = scrub_output(result, lambda text: text)
    assert same.output_sha256 == result.output_sha256


def guarded(tmp_path: Path) -> tuple[TreeGuard, Path]:
    project = tmp_path / "a" / "project"
    project.mkdir(parents=True)
    (project / "calc.py").write_text("x = 1\n")
    guard = TreeGuard(project, interpreter=False)
    guard.begin()
    return guard, tmp_path / "a"


def test_quiet_ancestors_are_not_stat_ed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    guard, parent = guarded(tmp_path)
    try:
        if guard.ancestry.journal is None:
            pytest.skip("no inotify here: every look stats the ancestors")
        seen: list[str] = []
        real = ancestry_module._entry
        monkeypatch.setattr(ancestry_module, "_entry", lambda path: seen.append(path) or real(path))
        assert guard.ancestor_changes() == []
        assert not [p for p in seen if os.path.basename(p) in ("conftest.py", "pytest.ini", "tox.ini")]
        (parent / "unrelated.txt").write_text("not configuration\n")
        assert guard.ancestor_changes() == []
        assert not [p for p in seen if os.path.basename(p) == "conftest.py"]
    finally:
        guard.close()


def test_an_ancestor_change_is_found_on_every_look(tmp_path: Path) -> None:
    guard, parent = guarded(tmp_path)
    try:
        assert guard.ancestor_changes() == []
        (parent / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        first = guard.ancestor_changes()
        assert any("pytest.ini" in line and "added" in line for line in first)
        assert guard.ancestor_changes() == first  # a change that stays is never forgotten
        (parent / "pytest.ini").unlink()
        assert guard.ancestor_changes() == []
        (parent / "conftest.py").write_text("import os\n")
        assert any("conftest.py" in line for line in guard.ancestor_changes())
    finally:
        guard.close()


def test_the_watchdog_finds_unannounced_leaves_by_name(tmp_path: Path) -> None:
    base = tmp_path / "cgroups"
    base.mkdir()
    (base / "pytest-loops-4242-7").mkdir()
    (base / "pytest-loops-4242-8").mkdir()
    (base / "pytest-loops-999-1").mkdir()  # another harness's
    commands: dict[str, Any] = {}
    bases: list[tuple[str, int]] = []
    reaper._event(commands, ["H", str(base), "2"], bases)
    reaper._event(commands, ["H", str(base), "2"], bases)
    assert bases == [(str(base), 2)]
    reaper._event(commands, ["C", "4242-8-1", "123", "456", str(base / "pytest-loops-4242-8"), "2"], bases)
    found = reaper._unannounced(bases, 4242, commands)
    assert [c.cgroup.path for c in found] == [str(base / "pytest-loops-4242-7")]
    assert found[0].pgid == 0
    # an unannounced leaf's command has no group to kill: never pgid 0 (kernel threads)
    table = {2: reaper.Proc(2, 0, 0, 0, 1, False), 77: reaper.Proc(77, 1, 77, 77, 5, False)}
    assert reaper._doomed(found[0], table) == set()


def test_a_short_command_is_not_announced_to_the_watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[object, ...]] = []
    dog = reaper.watchdog()
    monkeypatch.setattr(dog, "send", lambda *words: sent.append(words))
    ProcessRunner().run("true", cwd=tmp_path)
    if reaper.new_cgroup() is None:
        assert [w[0] for w in sent] == ["C", "D"] or [w[0] for w in sent] == ["C"]
    else:
        assert not [w for w in sent if w[0] in ("C", "D")]


LOCK_HOLDER = """\
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_page_lock_and_filelock_exclude_each_other(tmp_path: Path) -> None:
    path = str(tmp_path / "page.md.lock")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        import fcntl

        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what PageLock waits on
        finally:
            os.close(fd)
    finally:
        holder.communicate("\n")
    page_lock = PageLock(path)
    with page_lock:
        with pytest.raises(Timeout):
            FileLock(path, timeout=0).acquire()
    FileLock(path, timeout=0).acquire()  # released on exit
    page_lock.close()


def test_the_page_lock_follows_a_replaced_lock_file(tmp_path: Path) -> None:
    path = tmp_path / "page.md.lock"
    lock = PageLock(str(path))
    with lock:
        pass
    path.unlink()
    path.write_text("")
    with lock:
        assert lock._fd is not None and os.path.samestat(os.fstat(lock._fd), os.stat(path))
    lock.close()


def test_lessons_are_appended_under_the_kept_lock(tmp_path: Path) -> None:
    page = LessonsPage(tmp_path / "lessons.md", loop_name="l")
    for n in range(3):
        page.append(f"lesson {n}")
    page.close()
    assert page.read_lessons() == ["- lesson 0", "- lesson 1", "- lesson 2"]

"""ProcessRunner and TerminationGuard, with real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_loops.runtime.capture import Capture, output_lines
from pytest_loops.runtime.process import (
    TAG_VARIABLE,
    ProcessRunner,
    TerminationGuard,
    pid_alive,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="escaped sessions are tracked through /proc"
)


def _exists(pid: int) -> bool:
    """True while ``pid`` exists at all, zombies included (so reaping is checked too)."""
    if os.path.isdir("/proc"):
        return os.path.exists(f"/proc/{pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_gone(pids: list[int], within: float = 5.0) -> list[int]:
    """Poll until every pid is gone; return those still there after ``within`` s."""
    end = time.monotonic() + within
    left = [p for p in pids if _exists(p)]
    while left and time.monotonic() < end:
        time.sleep(0.02)
        left = [p for p in left if _exists(p)]
    return left


def read_pids(path: Path, count: int, within: float = 10.0) -> list[int]:
    """Wait for ``count`` pids written one per line by a command."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists():
            pids = [int(x) for x in path.read_text().split() if x.isdigit()]
            if len(pids) >= count:
                return pids
        time.sleep(0.02)
    raise AssertionError(f"{path} never got {count} pids")


@pytest.fixture
def pidfile(tmp_path):
    """A file commands write pids into; whatever it names is killed at teardown."""
    path = tmp_path / "pids"
    yield path
    if path.exists():
        for word in path.read_text().split():
            if word.isdigit() and _exists(int(word)):
                try:
                    os.kill(int(word), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def runner():
    return ProcessRunner()


# --- exit codes and output ---------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 127])
def test_exit_code_passes_through(runner, tmp_path, code):
    result = runner.run(f"exit {code}", cwd=tmp_path)
    assert result.exit_code == code
    assert result.started and not result.timed_out
    assert result.start_error is None
    assert result.duration_s >= 0


def test_unknown_program_is_a_shell_error_not_a_start_error(runner, tmp_path):
    result = runner.run("no-such-program-pytest-loops", cwd=tmp_path)
    assert result.exit_code == 127
    assert result.start_error is None
    assert "not found" in result.tail


def test_output_goes_to_file_and_tail_is_its_end(runner, tmp_path):
    out = tmp_path / "deep" / "er" / "check.out"
    result = runner.run("echo first; echo second >&2; echo third", cwd=tmp_path, output_path=out)
    assert result.exit_code == 0
    assert result.output_file == str(out)
    content = out.read_text()
    assert content == "first\nsecond\nthird\n"
    assert result.output_bytes == len(content.encode())
    assert result.tail == content


def test_existing_output_file_is_replaced(runner, tmp_path):
    out = tmp_path / "check.out"
    out.write_text("stale output from last time\n" * 100)
    result = runner.run("echo fresh", cwd=tmp_path, output_path=out)
    assert out.read_text() == "fresh\n"
    assert result.output_bytes == 6


def test_tail_is_the_last_tail_chars_characters(tmp_path):
    runner = ProcessRunner(tail_chars=100)
    out = tmp_path / "o"
    result = runner.run(
        "i=0; while [ $i -lt 300 ]; do printf '%05d\\n' $i; i=$((i+1)); done; printf END",
        cwd=tmp_path,
        output_path=out,
    )
    text = out.read_text()
    assert result.tail == text[-100:]
    assert result.tail.endswith("00299\nEND")
    assert result.output_bytes == len(text)


def test_tail_counts_characters_not_bytes(tmp_path):
    runner = ProcessRunner(tail_chars=10)
    result = runner.run("printf 'ééééééééééééééééééééééééé€€€€€'", cwd=tmp_path)
    assert result.tail == "ééééé€€€€€"
    assert result.output_bytes == 20 * 2 + 5 * 2 + 5 * 3


def test_undecodable_output_is_replaced_not_raised(runner, tmp_path):
    result = runner.run("printf 'ok \\377\\376 end'", cwd=tmp_path)
    assert result.tail == "ok \ufffd\ufffd end"


def test_zero_tail_chars_gives_empty_tail(tmp_path):
    result = ProcessRunner(tail_chars=0).run("echo something", cwd=tmp_path)
    assert result.tail == ""
    assert result.output_bytes == len("something\n")


def test_temporary_output_is_deleted(runner, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = runner.run("echo hello", cwd=tmp_path)
    assert result.output_file is None
    assert result.tail == "hello\n"
    assert result.output_bytes == 6
    assert list(scratch.iterdir()) == []


def test_large_output_does_not_block(runner, tmp_path):
    size = 8 * 1024 * 1024
    out = tmp_path / "big.out"
    result = runner.run(
        f"head -c {size} /dev/zero | tr '\\0' x; echo done >&2",
        cwd=tmp_path,
        output_path=out,
        timeout=60,
    )
    assert not result.timed_out
    assert result.exit_code == 0
    assert result.output_bytes == size + len("done\n") == out.stat().st_size
    assert result.tail == "x" * (2000 - 5) + "done\n"


def test_stdin_is_dev_null(runner, tmp_path):
    result = runner.run("cat; echo eof", cwd=tmp_path, timeout=30)
    assert not result.timed_out
    assert result.exit_code == 0
    assert result.tail == "eof\n"


def test_runs_in_cwd(runner, tmp_path):
    (tmp_path / "marker.txt").write_text("")
    result = runner.run("ls", cwd=tmp_path)
    assert "marker.txt" in result.tail


def test_env_none_inherits_os_environ(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_LOOPS_PROBE", "inherited")
    result = runner.run("echo $PYTEST_LOOPS_PROBE", cwd=tmp_path)
    assert result.tail == "inherited\n"


def test_env_mapping_replaces_environment(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_LOOPS_PROBE", "inherited")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ONLY": "given"}
    result = runner.run('echo "${PYTEST_LOOPS_PROBE:-unset} $ONLY"', cwd=tmp_path, env=env)
    assert result.tail == "unset given\n"
    assert "ONLY" not in os.environ


def test_command_sees_its_tag(runner, tmp_path):
    result = runner.run(f"echo ${TAG_VARIABLE}", cwd=tmp_path)
    assert result.tail.strip()
    again = runner.run(f"echo ${TAG_VARIABLE}", cwd=tmp_path)
    assert again.tail != result.tail


# --- start errors ------------------------------------------------------------


def test_missing_cwd_is_a_start_error(runner, tmp_path):
    missing = tmp_path / "nope"
    out = tmp_path / "o" / "check.out"
    result = runner.run("echo hi", cwd=missing, output_path=out)
    assert result.exit_code is None
    assert not result.started
    assert "does not exist" in result.start_error and str(missing) in result.start_error
    assert "\n" not in result.start_error
    assert result.output_file is None
    assert not out.exists()


def test_cwd_that_is_a_file_is_a_start_error(runner, tmp_path):
    afile = tmp_path / "file.txt"
    afile.write_text("")
    result = runner.run("echo hi", cwd=afile)
    assert result.exit_code is None
    assert "not a directory" in result.start_error


def test_popen_oserror_is_a_start_error(runner, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    out = tmp_path / "check.out"
    result = runner.run("echo hi", cwd=tmp_path, output_path=out)
    assert result.exit_code is None
    assert "Too many open files" in result.start_error
    assert result.output_file is None
    assert not out.exists()


def test_bad_environment_is_a_start_error(runner, tmp_path):
    result = runner.run("echo hi", cwd=tmp_path, env={"BAD": "nul\0byte"})
    assert result.exit_code is None
    assert result.start_error and "\n" not in result.start_error


def test_non_string_environment_value_is_a_start_error(runner, tmp_path):
    result = runner.run("echo hi", cwd=tmp_path, env={"NUMBER": 3})  # type: ignore[dict-item]
    assert result.exit_code is None
    assert result.start_error


def test_unwritable_output_path_is_a_start_error(runner, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = runner.run("echo hi", cwd=tmp_path, output_path=blocker / "check.out")
    assert result.exit_code is None
    assert "output file" in result.start_error


# --- timeouts and cleanup ----------------------------------------------------


def test_timeout_returns_within_budget(runner, tmp_path):
    t0 = time.monotonic()
    result = runner.run("sleep 30", cwd=tmp_path, timeout=0.5)
    wall = time.monotonic() - t0
    assert result.timed_out
    assert result.exit_code is not None and result.exit_code != 0
    assert 0.5 <= wall < 1.5, wall
    assert result.duration_s >= 0.5


def test_timeout_of_term_ignoring_command_kills_after_grace(tmp_path):
    runner = ProcessRunner(grace_seconds=0.2)
    t0 = time.monotonic()
    result = runner.run("trap '' TERM; sleep 30 & trap '' TERM; wait", cwd=tmp_path, timeout=0.3)
    wall = time.monotonic() - t0
    assert result.timed_out
    assert result.exit_code == -signal.SIGKILL
    assert wall < 0.3 + 0.2 + 1.5, wall


def test_zero_timeout_times_out_at_once(runner, tmp_path):
    result = runner.run("sleep 30", cwd=tmp_path, timeout=0)
    assert result.timed_out
    assert result.duration_s < 5


def test_command_within_timeout_is_not_timed_out(runner, tmp_path):
    result = runner.run("echo quick", cwd=tmp_path, timeout=30)
    assert not result.timed_out
    assert result.exit_code == 0


def test_timeout_kills_children_and_grandchildren(runner, tmp_path, pidfile):
    command = (
        f"sleep 60 & echo $! >> {pidfile}; "
        f"sh -c 'sleep 60 & echo $! >> {pidfile}; sleep 60' & echo $! >> {pidfile}; "
        f"echo $$ >> {pidfile}; wait"
    )
    result = runner.run(command, cwd=tmp_path, timeout=1.0)
    assert result.timed_out
    pids = read_pids(pidfile, 4)
    assert wait_gone(pids) == []


def test_background_children_are_killed_after_normal_exit(runner, tmp_path, pidfile):
    result = runner.run(
        f"sleep 60 & echo $! >> {pidfile}; (sleep 60 & echo $! >> {pidfile}; wait) & "
        f'while [ "$(wc -l < {pidfile})" -lt 2 ]; do sleep 0.01; done; exit 0',
        cwd=tmp_path,
        timeout=30,
    )
    assert result.exit_code == 0
    assert not result.timed_out
    assert result.duration_s < 10
    assert wait_gone(read_pids(pidfile, 2)) == []


def test_term_ignoring_background_child_is_killed_after_normal_exit(runner, tmp_path, pidfile):
    result = runner.run(
        f'sh -c \'trap "" TERM; echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; '
        f"while :; do sleep 1; done' & "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done",
        cwd=tmp_path,
        timeout=30,
    )
    assert result.exit_code == 0
    assert wait_gone(read_pids(pidfile, 1)) == []


def _escape(pidfile: Path, clear_env: bool = False) -> str:
    """Shell text that starts ``sleep 60`` in a new session and waits for its pid."""
    prefix = "env -i PATH=/usr/bin:/bin " if clear_env else ""
    return (
        f"{prefix}setsid sh -c 'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 60' & "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done"
    )


@linux_only
def test_setsid_descendant_is_killed_after_normal_exit(runner, tmp_path, pidfile):
    result = runner.run(_escape(pidfile), cwd=tmp_path, timeout=30)
    assert result.exit_code == 0
    pid = read_pids(pidfile, 1)[0]
    assert wait_gone([pid]) == []


@linux_only
def test_setsid_descendant_is_killed_on_timeout(runner, tmp_path, pidfile):
    result = runner.run(_escape(pidfile) + "; sleep 60", cwd=tmp_path, timeout=1.5)
    assert result.timed_out
    pid = read_pids(pidfile, 1)[0]
    assert wait_gone([pid]) == []


def _with_tag(tag: str) -> list[int]:
    """Live processes whose environment carries a command's tag."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                env = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if needle in env.split(b"\0"):
                found.append(int(name))
    return found


@linux_only
def test_setsid_fork_that_detaches_at_once_is_killed(runner, tmp_path):
    # setsid run by the session leader forks and exits: the command "succeeds" at once
    tagfile = tmp_path / "tag"
    result = runner.run(
        f"echo ${TAG_VARIABLE} > {tagfile}; exec setsid sh -c 'sleep 0.5; exec sleep 60'",
        cwd=tmp_path,
        timeout=30,
    )
    assert result.exit_code == 0
    tag = tagfile.read_text().strip()
    assert tag
    left = _with_tag(tag)
    end = time.monotonic() + 5
    while left and time.monotonic() < end:
        time.sleep(0.02)
        left = _with_tag(tag)
    for pid in left:  # do not leak it if the assertion fails
        os.kill(pid, signal.SIGKILL)
    assert left == []


@linux_only
def test_escaped_orphan_is_attributed_by_its_tag(runner, tmp_path, pidfile, monkeypatch):
    # no /proc walk while it runs: only the tag in its environment can tie it to us
    import pytest_loops.runtime.process as process

    monkeypatch.setattr(process, "_SCAN_FIRST", 1000.0)
    monkeypatch.setattr(process, "_SCAN_MAX", 1000.0)
    result = runner.run(_escape(pidfile), cwd=tmp_path, timeout=30)
    assert result.exit_code == 0
    pid = read_pids(pidfile, 1)[0]
    assert wait_gone([pid]) == []


@linux_only
def test_escaped_descendant_without_the_tag_is_tracked(runner, tmp_path, pidfile):
    # env -i drops the tag, so only the /proc walk while it ran can attribute it
    result = runner.run(_escape(pidfile, clear_env=True) + "; sleep 1", cwd=tmp_path, timeout=30)
    assert result.exit_code == 0
    pid = read_pids(pidfile, 1)[0]
    assert wait_gone([pid]) == []


@linux_only
def test_escaped_descendant_without_the_tag_and_unseen_is_claimed_by_start_time(runner, tmp_path, pidfile,
                                                                                monkeypatch):
    """No /proc walk while it ran and no tag (env -i): the command was the only one running,
    so a child of ours that started after it is its escaped descendant."""
    import pytest_loops.runtime.process as process

    monkeypatch.setattr(process, "_SCAN_FIRST", 1000.0)
    monkeypatch.setattr(process, "_SCAN_MAX", 1000.0)
    result = runner.run(_escape(pidfile, clear_env=True), cwd=tmp_path, timeout=30)
    assert result.exit_code == 0
    pid = read_pids(pidfile, 1)[0]
    assert wait_gone([pid]) == []


@linux_only
def test_a_child_that_predates_the_command_is_never_claimed(runner, tmp_path):
    """A process the harness started before (a fixture's server) is not the command's."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={"PATH": os.environ.get("PATH", "")})
    try:
        result = runner.run("true", cwd=tmp_path, timeout=30)
        assert result.exit_code == 0
        assert server.poll() is None
    finally:
        server.kill()
        server.wait()


@linux_only
def test_killed_descendants_are_reaped_not_left_as_zombies(runner, tmp_path, pidfile):
    for _ in range(3):
        runner.run(_escape(pidfile) + f"; sleep 60 & echo $! >> {pidfile}", cwd=tmp_path)
        pids = read_pids(pidfile, 2)
        assert wait_gone(pids) == []
        pidfile.unlink()
    me = os.getpid()
    ours = [p for p in pids if os.path.exists(f"/proc/{p}") and f") Z {me} " in _stat_text(p)]
    assert ours == []


def _stat_text(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""


def test_unrelated_processes_survive(runner, tmp_path, pidfile):
    # children of ours that the command did not start, one in its own session
    bystanders = [
        subprocess.Popen(["sleep", "60"]),
        subprocess.Popen(["sleep", "60"], start_new_session=True),
    ]
    try:
        result = runner.run(f"sleep 60 & echo $! >> {pidfile}; sleep 0.3", cwd=tmp_path, timeout=30)
        assert result.exit_code == 0
        assert wait_gone(read_pids(pidfile, 1)) == []
        timed = runner.run("sleep 60", cwd=tmp_path, timeout=0.3)
        assert timed.timed_out
        for proc in bystanders:
            assert proc.poll() is None, "an unrelated process was killed"
    finally:
        for proc in bystanders:
            proc.kill()
            proc.wait()
    # their exit status was still theirs to collect (nobody reaped them behind Popen's back)
    assert [p.returncode for p in bystanders] == [-signal.SIGKILL, -signal.SIGKILL]


def test_concurrent_commands_do_not_disturb_each_other(runner, tmp_path):
    results = {}

    def slow():
        results["slow"] = runner.run("sleep 1; echo slow done", cwd=tmp_path, timeout=30)

    thread = threading.Thread(target=slow)
    thread.start()
    fast = runner.run("sleep 30", cwd=tmp_path, timeout=0.3)
    thread.join(30)
    assert fast.timed_out
    assert results["slow"].exit_code == 0
    assert results["slow"].tail == "slow done\n"
    assert not results["slow"].timed_out


# --- terminate_all -------------------------------------------------------------


def test_terminate_all_with_nothing_running_is_a_no_op(runner):
    runner.terminate_all()


def test_terminate_all_from_another_thread_kills_running_command(runner, tmp_path, pidfile):
    def stop_when_started():
        read_pids(pidfile, 2)
        runner.terminate_all()

    thread = threading.Thread(target=stop_when_started)
    thread.start()
    t0 = time.monotonic()
    result = runner.run(
        f"echo $$ >> {pidfile}; sleep 60 & echo $! >> {pidfile}; wait", cwd=tmp_path, timeout=60
    )
    wall = time.monotonic() - t0
    thread.join(10)
    assert not result.timed_out
    assert result.exit_code is not None and result.exit_code < 0
    assert wall < 30
    assert wait_gone(read_pids(pidfile, 2)) == []


def test_terminate_all_while_a_command_starts_still_stops_it(runner, tmp_path, monkeypatch):
    real_popen = subprocess.Popen

    def popen_then_terminate(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        runner.terminate_all()  # lands before the runner has registered the command
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_terminate)
    t0 = time.monotonic()
    result = runner.run("sleep 60", cwd=tmp_path, timeout=60)
    assert time.monotonic() - t0 < 30
    assert not result.timed_out
    assert result.exit_code is not None and result.exit_code < 0


@linux_only
def test_terminate_all_kills_escaped_descendants(runner, tmp_path, pidfile):
    escaped = tmp_path / "escaped"

    def stop_when_started():
        read_pids(escaped, 1)
        time.sleep(0.5)  # leave the /proc walk time to see it (not a timing assertion)
        runner.terminate_all()

    thread = threading.Thread(target=stop_when_started)
    thread.start()
    result = runner.run(_escape(escaped, clear_env=True) + "; sleep 60", cwd=tmp_path, timeout=60)
    thread.join(10)
    assert result.exit_code is not None and result.exit_code < 0
    pid = read_pids(escaped, 1)[0]
    try:
        assert wait_gone([pid]) == []
    finally:
        if _exists(pid):
            os.kill(pid, signal.SIGKILL)


# --- TerminationGuard ----------------------------------------------------------

GUARD_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    from pytest_loops.runtime.process import ProcessRunner, TerminationGuard

    pidfile = sys.argv[1]
    runner = ProcessRunner()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with TerminationGuard(runner):
            runner.run(f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; sleep 60",
                       cwd=".", timeout=60)
        print("command returned", flush=True)
    except BaseException as exc:
        after = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        print(type(exc).__name__, getattr(exc, "code", None), after == before, flush=True)
        raise
    """
)


def _guarded_child(pidfile: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", GUARD_SCRIPT, str(pidfile)],
        cwd=pidfile.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("sig", "exit_code", "line"),
    [
        (signal.SIGTERM, 143, "SystemExit 143 True"),
        # an uncaught KeyboardInterrupt makes Python end itself with SIGINT
        (signal.SIGINT, -signal.SIGINT, "KeyboardInterrupt None True"),
    ],
)
def test_guard_turns_signal_into_termination_of_the_command(pidfile, sig, exit_code, line):
    child = _guarded_child(pidfile)
    try:
        command_pid = read_pids(pidfile, 1, within=30)[0]
        child.send_signal(sig)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == exit_code, (out, err)
    assert out.strip() == line, (out, err)
    assert wait_gone([command_pid]) == []


def test_guard_signal_during_start_is_deferred_until_the_command_is_registered(
    runner, tmp_path, monkeypatch
):
    from pytest_loops.runtime import reaper

    reaper.watchdog()  # started once per process: not by the patched Popen below
    real_popen = subprocess.Popen
    started = []

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside "Popen()"
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    with pytest.raises(SystemExit) as info:
        with TerminationGuard(runner):
            runner.run("sleep 60", cwd=tmp_path, timeout=60)
    assert info.value.code == 143
    (proc,) = started
    assert proc.returncode is not None and proc.returncode < 0
    assert wait_gone([proc.pid]) == []


def test_guard_installs_and_restores_handlers(runner):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with TerminationGuard(runner) as guard:
        assert isinstance(guard, TerminationGuard)
        during = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        assert all(during[s] != before[s] for s in during)
    assert {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} == before


def test_guard_leaves_ignored_signal_ignored(runner):
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with TerminationGuard(runner):
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) != signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_guard_calls_previous_python_handler(runner):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with TerminationGuard(runner):
            signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_guard_is_a_no_op_outside_the_main_thread(runner):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    seen = {}

    def body():
        try:
            with TerminationGuard(runner):
                seen["during"] = {s: signal.getsignal(s) for s in before}
        except Exception as exc:  # the test fails below if anything was raised
            seen["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    assert "error" not in seen
    assert seen["during"] == before
    assert {s: signal.getsignal(s) for s in before} == before


# --- the tail reader -------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(
        st.one_of(st.text(max_size=50).map(lambda t: t.encode()), st.binary(max_size=8)),
        max_size=40,
    ),
    chars=st.integers(min_value=0, max_value=60),
    cap=st.sampled_from([0, 40, 700]),
)
def test_the_kept_tail_matches_decoding_the_whole_output_file(data, chars, cap):
    """The tail a command's result carries is taken from memory, never read back: it
    is what decoding the whole output file and cutting its end would give."""
    read_fd, write_fd = os.pipe()
    fd, path = tempfile.mkstemp()
    try:
        capture = Capture(read_fd, fd, cap, keep_last=4 * chars + 4 if chars else 0)
        for chunk in data:
            os.write(write_fd, chunk)
        os.close(write_fd)
        capture.finish()
        with open(path, "rb") as f:
            kept = f.read()
    finally:
        os.unlink(path)
    whole = kept.decode("utf-8", errors="replace")
    tail = capture.last.decode("utf-8", errors="replace")[-chars:] if chars else ""
    assert tail == (whole[-chars:] if chars else "")


# --- the output cap --------------------------------------------------------------


def _expected_capture(blob: bytes, cap: int) -> bytes:
    if not cap or len(blob) <= cap:
        return blob
    head, tail = cap - cap // 2, cap // 2
    dropped = len(blob) - head - tail
    marker = f"\n[pytest-loops: {dropped} bytes of output dropped here (output_cap={cap})]\n".encode()
    return blob[:head] + marker + (blob[-tail:] if tail else b"")


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=12),
       cap=st.integers(min_value=0, max_value=700))
def test_capture_keeps_head_marker_and_tail(chunks, cap):
    read_fd, write_fd = os.pipe()
    fd, path = tempfile.mkstemp()
    try:
        capture = Capture(read_fd, fd, cap)
        for chunk in chunks:
            os.write(write_fd, chunk)
        os.close(write_fd)
        total = capture.finish()
        with open(path, "rb") as f:
            kept = f.read()
    finally:
        os.unlink(path)
    blob = b"".join(chunks)
    assert total == len(blob)
    assert kept == _expected_capture(blob, cap)


def test_output_beyond_the_cap_keeps_its_start_and_end(tmp_path):
    runner = ProcessRunner(output_cap=1000, tail_chars=20)
    out = tmp_path / "o"
    result = runner.run("printf START; yes | head -c 100000; printf END", cwd=tmp_path, output_path=out)
    data = out.read_bytes()
    assert data.startswith(b"START") and data.endswith(b"END")
    assert b"[pytest-loops: 99008 bytes of output dropped here (output_cap=1000)]" in data
    assert len(data) < 1100
    assert result.output_bytes == 100008  # what the command wrote, not what was kept
    assert result.tail.endswith("END")


def test_output_within_the_cap_and_with_no_cap_is_whole(tmp_path):
    for cap in (100008, 0):
        out = tmp_path / f"o{cap}"
        ProcessRunner(output_cap=cap).run("printf START; yes | head -c 100000; printf END",
                                          cwd=tmp_path, output_path=out)
        assert out.stat().st_size == 100008


def test_output_of_an_escaped_writer_does_not_hold_the_command_open(tmp_path, pidfile):
    """A descendant that outlives its command cannot keep the output open: the run returns."""
    runner = ProcessRunner(output_cap=1000)
    result = runner.run(f"(yes & echo $! >> {pidfile}) ; sleep 0.2", cwd=tmp_path, timeout=30)
    assert result.exit_code == 0
    assert wait_gone(read_pids(pidfile, 1)) == []


def test_output_lines_are_streamed_in_bounded_pieces(tmp_path):
    path = tmp_path / "o"
    path.write_bytes(b"a" * 150_000 + b"\n\xff\nlast")
    pieces = list(output_lines(str(path), longest=1 << 16))
    assert [len(p) for p in pieces] == [65536, 65536, 150_000 - 131072 + 1, 2, 4]
    assert pieces[-2:] == ["\ufffd\n", "last"]
    assert list(output_lines(str(tmp_path / "gone"), "x\ny")) == ["x\n", "y"]
    assert list(output_lines(None, "")) == []


# --- cgroups and the watchdog ---------------------------------------------------------


def _hierarchies() -> list[str]:
    from pytest_loops.runtime import reaper

    return sorted({"v2" if version == 2 else "v1" for _, version in reaper._hierarchies()})


@linux_only
@pytest.mark.parametrize("choice", ["v2", "v1"])
def test_a_cgroup_catches_what_escaped_while_other_commands_ran(choice, tmp_path, pidfile, monkeypatch):
    """With two commands running, an orphan with a cleared environment in its own
    session cannot be told apart by /proc alone; its cgroup says whose it is."""
    from pytest_loops.runtime import reaper

    monkeypatch.setenv(reaper.CGROUP_VARIABLE, choice)
    monkeypatch.setattr(reaper, "_bases", None)
    if choice not in _hierarchies():
        pytest.skip(f"no writable cgroup {choice} hierarchy here")
    runner = ProcessRunner()
    prefix = f"pytest-loops-{os.getpid()}-"
    bases = reaper._hierarchies()
    # leaves an earlier test's runner in this process may still hold are not this one's
    before = {n for base, _ in bases for n in os.listdir(base) if n.startswith(prefix)}
    other = threading.Thread(target=runner.run, args=("sleep 1",), kwargs={"cwd": tmp_path})
    other.start()
    try:
        result = runner.run(f"setsid env -i sh -c 'echo $$ >> {pidfile}; exec sleep 300' & "
                            f"while [ ! -s {pidfile} ]; do sleep 0.01; done",
                            cwd=tmp_path, timeout=30)
    finally:
        other.join(30)
    assert result.exit_code == 0
    assert wait_gone(read_pids(pidfile, 1)) == []
    base = reaper._bases[0][0]

    def leaves():
        return [n for n in os.listdir(base) if n.startswith(prefix) and n not in before]

    # a leaf a killed member kept busy past the runner's wait is removed by its next sweep
    deadline = time.monotonic() + 10
    while leaves() and runner.sweep_leaves() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leaves()


@linux_only
def test_a_leaf_kept_busy_is_removed_by_a_later_sweep():
    """A leaf whose member outlives the wait is kept and removed once it is empty,
    never forgotten."""
    from pytest_loops.runtime import reaper

    leaf = reaper.new_cgroup()
    if leaf is None:
        pytest.skip("no writable cgroup hierarchy here")
    member = subprocess.Popen(["sleep", "60"])
    try:
        with open(leaf.procs, "w") as f:
            f.write(str(member.pid))
        runner = ProcessRunner()
        assert runner._drop_cgroup(leaf) is False  # a live member: the leaf stays
        assert os.path.isdir(leaf.path)
        assert runner.sweep_leaves() == 1
    finally:
        member.kill()
        member.wait()
    deadline = time.monotonic() + 10
    while runner.sweep_leaves() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(leaf.path)


WATCHED = """\
import os, sys, time
from pytest_loops.runtime.process import ProcessRunner
from pytest_loops.runtime import reaper
runner = ProcessRunner()
runner.run("true", cwd=".")
print(reaper.watchdog().pid, flush=True)
if sys.argv[1] == "hang":
    time.sleep(300)
"""


@linux_only
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_the_watchdog_never_outlives_the_harness(how, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WATCHED, "hang" if how == "sigkill" else "exit"],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    with proc:
        dog = int(proc.stdout.readline())
        assert _exists(dog)
        if how == "sigkill":
            proc.kill()
        proc.wait(30)
    # this process is a subreaper too: the orphaned watchdog may end up its zombie
    end = time.monotonic() + 10
    while pid_alive(dog) and time.monotonic() < end:
        time.sleep(0.02)
    try:
        os.waitpid(dog, os.WNOHANG)
    except ChildProcessError:
        pass
    assert not pid_alive(dog)


def test_finds_nothing_counts_lines_of_any_length(tmp_path):
    from pytest_loops.core.checks import _output_lines
    from pytest_loops.results import CommandResult

    path = tmp_path / "o"
    path.write_bytes(b"\n  \n" + b"x" * 200_000 + b"\n\t\nlast")
    result = CommandResult(command="c", exit_code=0, duration_s=0.0, output_file=str(path),
                           output_bytes=path.stat().st_size)
    assert _output_lines(result) == 2
    path.write_bytes(b"y" * 200_000)
    assert _output_lines(result) == 1
    path.write_bytes(b" \n\n")
    assert _output_lines(result) == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_file_on_a_full_disk_neither_stops_nor_hangs_the_command(tmp_path):
    """Writing the output fails (ENOSPC): the command still runs to its end and its
    exit code and byte count are what it did, not what could be kept."""
    runner = ProcessRunner(output_cap=0)
    result = runner.run("yes | head -c 300000; exit 3", cwd=tmp_path, output_path="/dev/full", timeout=30)
    assert result.exit_code == 3
    assert result.output_bytes == 300000
    assert not result.timed_out


def test_a_flood_of_output_does_not_keep_the_runner_from_the_deadline(tmp_path):
    """The thread that waits for the command also copies its output: a command that
    writes as fast as it can is still stopped at its deadline."""
    import threading

    runner = ProcessRunner(output_cap=1 << 16)
    results = []
    worker = threading.Thread(target=lambda: results.append(
        runner.run("yes '0123456789abcdef0123456789abcdef'", cwd=tmp_path, timeout=1.0)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the runner never came back from a flooding command"
    assert results[0].timed_out
    assert results[0].output_bytes > 1 << 16


def test_one_pump_copies_a_bounded_amount_however_fast_the_writer(tmp_path):
    import threading

    read_fd, write_fd = os.pipe()
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    capture = Capture(read_fd, out, 1 << 16)
    stop = threading.Event()

    def writer():
        block = b"x" * 65536
        while not stop.is_set():
            try:
                os.write(write_fd, block)
            except OSError:
                return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(20):
            assert capture.pump(most=1 << 18) <= (1 << 18) + (1 << 20)
    finally:
        stop.set()
        os.close(write_fd)
        thread.join(10)
        capture.finish()


def test_one_pump_by_default_stops_after_a_few_chunks_of_an_endless_flood(tmp_path, monkeypatch):
    """What the runner's wait calls: however much the pipe keeps holding, one pass
    copies a few chunks and returns, so the deadline is checked between passes."""
    from pytest_loops.runtime import capture as capture_mod

    read_fd, write_fd = os.pipe()
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    capture = Capture(read_fd, out, 1 << 16)
    reads = []

    def endless(fd, size):
        if len(reads) >= 1000:
            raise BlockingIOError
        reads.append(size)
        return b"x" * size

    monkeypatch.setattr(capture_mod.os, "read", endless)
    got = capture.pump()
    monkeypatch.undo()
    os.close(write_fd)
    capture.finish()
    assert 0 < got <= 4 * capture_mod._CHUNK
    assert len(reads) <= 4


@pytest.mark.slow
@pytest.mark.parametrize("cgroup", ["off", None], ids=["no-cgroup", "default"])
def test_commands_run_at_once_never_take_each_other_for_strays(tmp_path, monkeypatch, cgroup):
    # fan-out runs candidates' commands in threads of one runner: a command that ends
    # while another is between its start and its registration must not count that
    # one's fresh process as its own escaped child (it was killed: exit -15). The
    # window is widened here: reading a new process's start time takes 50 ms.
    from pytest_loops.runtime import process

    real = process.read_stat

    def slow(pid):
        time.sleep(0.05)
        return real(pid)

    monkeypatch.setattr(process, "read_stat", slow)
    if cgroup is not None:  # without a cgroup the runner tells a command's escapees by who started when
        from pytest_loops.runtime import reaper

        monkeypatch.setattr(reaper, "_bases", [])
    runner = ProcessRunner()
    codes: dict[str, list[int | None]] = {"quick": [], "slow": []}

    def work(kind: str, command: str, times: int) -> None:
        for _ in range(times):
            codes[kind].append(runner.run(command, cwd=tmp_path, timeout=30).exit_code)

    threads = [threading.Thread(target=work, args=("quick", "sh -c 'sleep 0.01 & true'", 40)),
               threading.Thread(target=work, args=("slow", "sleep 0.2", 8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == {"quick": [0] * 40, "slow": [0] * 8}, codes

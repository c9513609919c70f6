"""Faults: process trees die with the harness; command output is capped.

Each tree test starts the harness (``pytest-loops run`` or ``pytest --loop``) in a
subprocess whose revise step starts processes carrying a unique token in their
argv (``sleep 300.<token>``), then SIGKILLs the harness or lets the budget run
out, and polls /proc until no process with the token is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from plugin_helpers import clean_env

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table in /proc"),
]


def _with_token(token: str) -> list[int]:
    """Pids of live processes with ``token`` in their argv (zombies do not count)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if token.encode() in argv and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _survivors(token: str, within: float = 15.0) -> list[int]:
    end = time.monotonic() + within
    left = _with_token(token)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = _with_token(token)
    return left


def _wait_for(path: Path, proc: subprocess.Popen, within: float = 60.0) -> None:
    end = time.monotonic() + within
    while not path.exists():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the harness ended (exit {proc.returncode}) before {path.name}:\n{out}")
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.fixture
def token():
    """A unique number that marks this test's processes; any left over are killed at teardown."""
    value = f"{os.getpid()}{uuid.uuid4().int % 10**9:09d}"
    yield value
    for pid in _with_token(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _revise(token: str) -> str:
    """A revise step with a process tree (a shell, a sleep in the background, one in
    front) and a grandchild that double-forks into its own session with a cleared
    environment; it touches `up` once they all run."""
    return f"sleep 300.{token} & (setsid env -i /bin/sleep 300.{token} &) ; touch up; sleep 300.{token}"


def _start(entry: str, project: Path, revise: str, budget: float,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    if entry == "cli":
        argv = [sys.executable, "-m", "pytest_loops", "run", "--verify", "false", "--revise", revise,
                "--max-iter", "3", "--budget-seconds", str(budget), "--no-tine", "--no-suspects",
                "--lessons", "off"]
    else:
        (project / "tree.loop").write_text(f'loop "tree":\n  goal: nothing outlives the harness\n'
                                           f'  done when "false" passes\n  revise with "{revise}"\n'
                                           f'  after 3 tries: stop\n  budget: {budget} seconds\n')
        (project / "pytest.ini").write_text("[pytest]\n")
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                "--loop", "tree.loop"]
    return subprocess.Popen(argv, cwd=project, env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


ENTRIES = ["cli", "pytest"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_sigkill_of_the_harness_kills_the_revise_tree(entry, token, tmp_path):
    proc = _start(entry, tmp_path, _revise(token), budget=120)
    _kill_when_up(proc, tmp_path, token)
    assert _survivors(token) == []
    assert _leaves_of(proc.pid) == []  # the watchdog removed the command's cgroup leaves


def test_sigkill_of_the_harness_kills_the_revise_group_without_cgroups(token, tmp_path):
    """Without a cgroup the watchdog still kills the revise step's process group."""
    proc = _start("cli", tmp_path, f"sleep 300.{token} & touch up; sleep 300.{token}", budget=120,
                  env={"PYTEST_LOOPS_CGROUP": "off"})
    _kill_when_up(proc, tmp_path, token)
    assert _survivors(token) == []


def _kill_when_up(proc: subprocess.Popen, tmp_path: Path, token: str) -> None:
    try:
        _wait_for(tmp_path / "up", proc)
        assert _with_token(token), "the revise step's processes should be running"
        proc.kill()
        proc.wait(timeout=30)
    finally:
        _end(proc)


def _leaves_of(pid: int, within: float = 10.0) -> list[str]:
    from pytest_loops.runtime.reaper import _hierarchies

    end = time.monotonic() + within
    while True:
        left = [os.path.join(base, name) for base, _ in _hierarchies() for name in os.listdir(base)
                if name.startswith(f"pytest-loops-{pid}-")]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_budget_kill_reaches_a_double_forked_revise(entry, token, tmp_path):
    proc = _start(entry, tmp_path, _revise(token), budget=3)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        _end(proc)
    if entry == "cli":
        assert proc.returncode == 3, out
    else:
        assert "TIMEOUT" in out, out
    assert _survivors(token) == []


# --- fault 11: command output is capped ---------------------------------------------

BIG = "printf START; yes | head -c 3000000; printf END"  # 3 MB of output


def _outputs(root: Path) -> list[Path]:
    return sorted(root.glob(".pytest-loops/runs/*/iter-*/check-*.out"))


def _assert_capped(path: Path, cap: int) -> None:
    data = path.read_bytes()
    assert data.startswith(b"START") and data.endswith(b"END")
    assert f"bytes of output dropped here (output_cap={cap})]".encode() in data
    assert len(data) < cap + 200


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_cli_caps_command_output(how, tmp_path):
    argv = [sys.executable, "-m", "pytest_loops", "run", "--verify", BIG, "--no-tine", "--no-suspects"]
    env = clean_env()
    if how == "flag":
        argv += ["--output-cap", "10K"]
    else:
        env["PYTEST_LOOPS_OUTPUT_CAP"] = "10k"
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out] = _outputs(tmp_path)
    _assert_capped(out, 10240)


def test_failure_file_and_default_cap_bound_a_failing_check(tmp_path):
    """The failure file copies the capped output, never the whole of it."""
    proc = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", BIG + "; exit 1",
                           "--revise", "true", "--max-iter", "2", "--output-cap", "64K", "--no-tine",
                           "--no-suspects"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    failure = next(tmp_path.glob(".pytest-loops/runs/*/iter-001/failure.txt"))
    assert failure.stat().st_size < 65536 + 300
    assert "bytes of output dropped here (output_cap=65536)" in failure.read_text()


@pytest.mark.parametrize("args", [["--output-cap", "lots"], ["--output-cap", "-1"]])
def test_cli_rejects_a_bad_output_cap(args, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", "true", *args],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 64
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--output-cap" in lines[0] and "not a valid output_cap" in lines[0]


def test_pytest_loop_caps_command_output(tmp_path):
    """The ini key sets the cap and the option, given too, wins."""
    (tmp_path / "big.loop").write_text(f'loop "big":\n  goal: big output\n  done when "{BIG}" passes\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nloop_output_cap = 10K\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                           "--loop", "big.loop", "--loop-output-cap", "20K"],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out] = _outputs(tmp_path)
    _assert_capped(out, 20480)


def test_pytest_rejects_a_bad_output_cap(tmp_path):
    (tmp_path / "big.loop").write_text('loop "big":\n  goal: big output\n  done when "true" passes\n')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                           "--loop", "big.loop", "--loop-output-cap", "huge"],
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--loop-output-cap" in proc.stderr and "not a valid output_cap" in proc.stderr


@pytest.mark.parametrize(("raw", "size"), [("16M", 16 << 20), ("16MiB", 16 << 20), ("512k", 512 << 10),
                                           ("1G", 1 << 30), ("0", 0), (" 123 ", 123), (4096, 4096)])
def test_output_cap_sizes(raw, size):
    from pytest_loops.sources.config import parse_size

    assert parse_size(raw, "here") == size


@pytest.mark.parametrize("raw", ["", "M", "-1", "1.5M", "1T", "lots", True])
def test_output_cap_rejects_naming_where(raw):
    from pytest_loops.errors import LoopUsageError
    from pytest_loops.sources.config import parse_size

    with pytest.raises(LoopUsageError, match="here.*not a valid output_cap"):
        parse_size(raw, "here")


def test_a_clean_exit_reaps_the_watchdog_without_a_warning() -> None:
    code = ("from pytest_loops.runtime.reaper import watchdog\n"
            "w = watchdog()\n"
            "print(w.pid)\n")
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr and done.stderr == "", done.stderr
    pid = int(done.stdout.split()[0])
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_the_watchdog_kills_a_command_its_harness_died_before_announcing(tmp_path, token):
    """A harness killed between starting a command and telling its watchdog: the
    watchdog still finds the command's processes by the tag in their environment,
    and leaves alone a process that carries another harness's tag."""
    from pytest_loops.runtime import reaper

    harness = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for a harness
    read_end, write_end = os.pipe()
    watchdog = subprocess.Popen([sys.executable, "-I", "-S", reaper.__file__, "watch", str(harness.pid)],
                                stdin=read_end, start_new_session=True)
    os.close(read_end)
    ours = dict(os.environ, **{reaper.TAG_VARIABLE: f"{harness.pid}-1-123"})
    theirs = dict(os.environ, **{reaper.TAG_VARIABLE: f"{harness.pid}9-1-123"})
    unannounced = subprocess.Popen(["sh", "-c", f"sleep 300.{token} & exec sleep 300.{token}"], env=ours,
                                   start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], env=theirs, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(_with_token(token)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_with_token(token)) == 2
        harness.kill()
        harness.wait()
        assert watchdog.wait(30) == 0
        assert _survivors(token) == []
        assert unannounced.wait(10) == -signal.SIGKILL
        assert other.poll() is None  # another harness's command
    finally:
        os.close(write_end)
        for proc in (harness, other, unannounced, watchdog):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

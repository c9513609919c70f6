"""Faults that must never cost the verdict: a full disk under the artifacts, broken
stdout, Ctrl-C during a session fix-loop.

The verdict is decided first; an artifact that cannot be written is one stderr
line naming the file and the errno, and the exit code stays the verdict's
(`pytest-loops run`) or pytest's own (the plugin).
"""

from __future__ import annotations

import builtins
import errno
import fnmatch
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_helpers import SUITE_SETTINGS, clean_env

from pytest_loops.artifacts import handoff, provenance, runlog
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.cli import main as cli

pytestmark = pytest.mark.faults


NOISY_FAIL = "python -c \"print('y' * 30000); raise SystemExit(1)\""


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real 64 KiB filesystem (tmpfs); skipped where mounting is not permitted."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "INTERNALERROR" not in stderr
    assert "could not write " in lines[0] and "[Errno 28]" in lines[0], lines[0]
    return lines[0]


def _log_and_tine_agree(log: Path) -> None:
    """A finished log names its .tine (which exists) or says why there is none; an
    unfinished log has no .tine beside it."""
    data = load_runlog(log)
    tine = log.with_suffix(".tine")
    if data.get("verdict") is None:
        assert not tine.exists(), "a .tine claims a verdict the run log does not hold"
        return
    artifacts = data["artifacts"]
    if "tine" in artifacts:
        assert Path(artifacts["tine"]).is_file()
    else:
        assert "tine_error" in artifacts and not tine.exists()
    assert not list(log.parent.glob(".*.tine")), "a temporary .tine was left behind"


# -- a real small filesystem ----------------------------------------------------------

def test_cli_on_a_full_disk_exits_with_the_verdict(small_fs: Path, tmp_path: Path) -> None:
    art = small_fs / "art"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_loops", "run", "--verify", NOISY_FAIL, "--revise", "true",
         "--max-iter", "4", "--no-progress-k", "0", "--no-suspects", "--artifacts", str(art)],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "MAX_ITER (exit 2) after 4 iteration(s)" in done.stdout
    _one_error_line(done.stderr)
    for log in (art / "runs").glob("*.json"):
        _log_and_tine_agree(log)


def test_plugin_on_a_full_disk_keeps_pytests_exit_code(small_fs: Path, pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_a="def test_a():\n    assert False\n")
    (small_fs / "filler").write_bytes(b"x" * 60 * 1024)  # a few KiB left: the run log's start fits, little else
    result = pytester.runpytest_subprocess(
        "--loop", "--loop-revise", "true", "--loop-max-iter", "1", "--loop-suspects", "off",
        "--loop-artifacts", str(small_fs / "art"), "-p", "no:cacheprovider", timeout=180)
    assert result.ret == 1
    assert "INTERNALERROR" not in result.stdout.str() and "Traceback" not in result.stdout.str()
    _one_error_line(result.stderr.str())
    result.stdout.fnmatch_lines(["MAX_ITER    failing tests: 1 iteration(s)*"])


# -- in-process fault injection at each write point --------------------------------------

def _refuse(patterns: list[str], modes: str = "wax"):
    """An open() that raises ENOSPC for writes to files matching ``patterns``."""
    real = io.open

    def fake_open(file, mode="r", *args, **kwargs):
        name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
        if name and any(c in mode for c in modes) and any(fnmatch.fnmatch(name, p) for p in patterns):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(file, mode, *args, **kwargs)

    return fake_open


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


WRITE_POINTS = {
    # the run log and the index are appended through a descriptor, never through a link
    "events": ("os.open", ["*/runs/*.json"]),
    # written through a descriptor, never through a link (limits.create_fresh)
    "failure": ("os.open", ["*/failure.txt"]),
    "prompt": ("os.open", ["*/prompt.md"]),
    "context": ("os.open", ["*/context.json"]),
    "lessons": ("os.open", ["*/lessons/*.md"]),
    "index": ("os.open", ["*/index.jsonl"]),
    "handoff": ("attr", (handoff, "atomic_write_text", "*.handoff.md")),
    "summary": ("attr", (runlog, "publish", "*/runs/*.json")),  # written piece by piece, then renamed
    "tine": ("attr", (provenance, "_save", None)),
}


@pytest.mark.parametrize("point", sorted(WRITE_POINTS))
def test_cli_write_point_fails_verdict_stands(point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    kind, what = WRITE_POINTS[point]
    if kind == "open":
        fake = _refuse(what)
        monkeypatch.setattr(builtins, "open", fake)
        monkeypatch.setattr(io, "open", fake)
    elif kind == "os.open":  # the lessons page is appended through a descriptor
        real_open = os.open

        def refusing(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR) and any(fnmatch.fnmatch(os.fspath(path), p) for p in what):
                _enospc()
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing)
    else:
        module, name, pattern = what
        real = getattr(module, name)

        def failing(path, *args, **kwargs):
            if pattern is None or fnmatch.fnmatch(os.fspath(path), pattern):
                _enospc()
            return real(path, *args, **kwargs)

        monkeypatch.setattr(module, name, failing)
    for key in [k for k in os.environ
                if k.startswith(("PYTEST_LOOPS_", "LOOP_")) and not k.startswith(SUITE_SETTINGS)]:
        monkeypatch.delenv(key)
    art = tmp_path / "art"
    code = cli.main(["run", "--verify", "false", "--revise", "true", "--max-iter", "2", "--no-progress-k", "0",
                     "--no-suspects", "--cwd", str(tmp_path), "--artifacts", str(art), "-q"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out.startswith("MAX_ITER (exit 2) after 2 iteration(s)")
    _one_error_line(err)
    monkeypatch.undo()
    (log,) = (art / "runs").glob("*.json")
    _log_and_tine_agree(log)
    if point == "summary":
        assert load_runlog(log)["decided"]["verdict"] == "MAX_ITER"  # resumable to the same verdict
    if point in ("tine", "events"):
        assert load_runlog(log).get("verdict") in (None, "MAX_ITER")


def test_plugin_every_write_point_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC on every artifact the plugin process writes: pytest's own exit code and
    one stderr line; no traceback, no INTERNALERROR."""
    pytester.makeini("[pytest]\n")
    pytester.makeconftest("""
import builtins, errno, fnmatch, io, os
from pytest_loops.artifacts import handoff, provenance, runlog

_real = io.open
_refused = ["*/.pytest-loops/runs/*.json", "*/failure.txt", "*/prompt.md", "*/lessons/*.md", "*/index.jsonl"]

def _open(file, mode="r", *a, **k):
    name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
    if name and any(c in mode for c in "wax") and any(fnmatch.fnmatch(name, p) for p in _refused):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _real(file, mode, *a, **k)

def _full(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

if os.environ.get("INJECT_ENOSPC"):
    builtins.open = io.open = _open
    runlog.atomic_write_text = _full
    provenance._save = _full
""")
    pytester.makepyfile(test_a="def test_a():\n    assert False\n")
    monkeypatch.setenv("INJECT_ENOSPC", "1")  # the pytest subprocess inherits it
    result = pytester.runpytest_subprocess("--loop", "--loop-revise", "true", "--loop-max-iter", "1",
                                           "--loop-suspects", "off", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == 1
    text = result.stdout.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text
    assert "MAX_ITER" in text
    _one_error_line(result.stderr.str())


# -- broken stdout ---------------------------------------------------------------------

RUN = [sys.executable, "-m", "pytest_loops", "run", "--verify", "false", "--max-iter", "2", "--no-suspects"]


def test_stdout_on_a_full_device_keeps_the_exit_code(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(RUN, cwd=tmp_path, env=clean_env(), stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""


def test_stdout_closed_pipe_keeps_the_exit_code(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line (`| head -0`)
    try:
        done = subprocess.run(RUN, cwd=tmp_path, env=clean_env(), stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""


# -- Ctrl-C during the session fix-loop ----------------------------------------------------

@pytest.mark.parametrize(("exitcode", "expected"), [("pytest", 2), ("verdict", 130)])
def test_ctrl_c_in_the_session_fix_loop_is_one_line(pytester: pytest.Pytester, exitcode: str,
                                                     expected: int) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_a="def test_a():\n    assert False\n")
    ready = pytester.path / "ready"
    pytester.path.joinpath("slow.py").write_text(
        "import pathlib, time\npathlib.Path('ready').touch()\ntime.sleep(60)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--loop", "--loop-revise", "python slow.py", "--loop-suspects", "off",
         "--loop-exitcode", exitcode, "-p", "no:cacheprovider"],
        cwd=pytester.path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == expected, (out, err)
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Exit: interrupted (Ctrl-C)"), err
    (log,) = (pytester.path / ".pytest-loops" / "runs").glob("*.json")
    assert load_runlog(log)["reason"] == "KeyboardInterrupt"  # recorded, resumable

"""Files that are not files: a named pipe, a device, a huge loop file, a minified line.

A FIFO nobody writes to used to be waited on forever (`--config`, `show`,
`diff`, a `.loop` file); `/dev/zero` was read as a 10 MB config; a 30 MB `.loop`
file was parsed and its one line printed back whole. Each is now one line naming
the file and exit 64 (pytest's usage error under pytest), at once.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops import LoopUsageError
from pytest_loops.limits import MAX_LOOP_BYTES, open_regular, read_text
from pytest_loops.sources import load_any
from pytest_loops.spec import IgnoredLine

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")]

# A regression here hangs, so every command gets a timeout far below the suite's patience.
PATIENCE = 30


def one_error_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err[:2000]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("pytest-loops: error: "), err[:2000]
    assert len(lines[0]) < 300, lines[0][:500]
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path):
    def make(name: str) -> Path:
        path = tmp_path / name
        os.mkfifo(path)
        return path

    return make


@pytest.mark.parametrize("args,name", [
    (("show", "x.loop"), "x.loop"),
    (("show", "x.loop.yaml"), "x.loop.yaml"),
    (("show", "run.json"), "run.json"),
    (("show", "run.tine"), "run.tine"),
    (("diff", "run.json", "run.json"), "run.json"),
    (("run", "--verify", "true", "--config", "cfg.yaml"), "cfg.yaml"),
    (("verify", "run.tine"), "run.tine"),
], ids=["loop file", "yaml loop file", "run log", "tine", "diff", "config", "verify"])
def test_a_named_pipe_is_refused_at_once(cli, fifo, args, name):
    fifo(name)
    result = cli(*args, timeout=PATIENCE)
    assert result.returncode == 64, (result.returncode, result.stderr[:500])
    line = one_error_line(result.stderr)
    assert name in line and "named pipe" in line


def test_a_device_is_refused_not_read(cli):
    result = cli("run", "--verify", "true", "--config", "/dev/zero", timeout=PATIENCE)
    assert result.returncode == 64
    line = one_error_line(result.stderr)
    assert "/dev/zero" in line and "character device" in line
    result = cli("show", "/dev/null", timeout=PATIENCE)
    assert result.returncode == 64 and "character device" in one_error_line(result.stderr)
    result = cli("verify", "/dev/zero", timeout=PATIENCE)
    assert result.returncode == 64 and "character device" in one_error_line(result.stderr)


def test_a_named_pipe_config_under_pytest_is_a_usage_error(pytester):
    pytester.makepyfile(test_a="def test_a():\n    assert True\n")
    os.mkfifo(pytester.path / "cfg.yaml")
    result = pytester.runpytest_subprocess("--loop", "--loop-config", "cfg.yaml", "--loop-exitcode=verdict",
                                           timeout=PATIENCE)
    assert result.ret == 64
    everything = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in everything and "Traceback" not in everything
    errors = [line for line in result.stderr.lines if "ERROR: " in line]
    assert len(errors) == 1 and "cfg.yaml" in errors[0]
    assert "not a file" in errors[0] or "named pipe" in errors[0]


def test_a_loop_file_over_the_cap_is_refused_before_parsing(cli, tmp_path):
    path = tmp_path / "big.loop"
    path.write_text("a" * (MAX_LOOP_BYTES + 10), encoding="utf-8")
    result = cli("show", "big.loop", timeout=PATIENCE)
    assert result.returncode == 64
    line = one_error_line(result.stderr)
    assert "big.loop" in line and "too big for a loop file" in line


def test_a_loop_file_just_under_the_cap_still_loads(tmp_path):
    path = tmp_path / "ok.loop"
    body = "# a comment line\n" * ((MAX_LOOP_BYTES - 200) // 17)
    path.write_text(body + 'loop "l":\n  goal: g\n  done when "true" passes\n  revise with "true"\n', encoding="utf-8")
    assert [spec.name for spec in load_any(path).loops] == ["l"]


def test_a_huge_line_is_quoted_short(cli, tmp_path):
    """A minified blob pasted into a loop file is cut where it is shown, never printed whole."""
    (tmp_path / "blob.loop").write_text("z" * 300_000 + "\n", encoding="utf-8")
    result = cli("show", "-v", "blob.loop", timeout=PATIENCE)
    assert result.returncode == 0, result.stderr[:500]
    assert len(result.stdout) < 2_000 and "(+299800 characters)" in result.stdout


def test_ignored_lines_are_bounded_where_they_are_made():
    line = IgnoredLine(3, "y" * 5000, "why")
    assert line.text.startswith("y" * IgnoredLine.SHOWN_CHARS) and len(line.text) < IgnoredLine.SHOWN_CHARS + 40
    assert IgnoredLine(3, "short").text == "short"


def test_open_regular_refuses_a_pipe_without_blocking(tmp_path):
    path = tmp_path / "p"
    os.mkfifo(path)
    code = ("import sys; from pytest_loops.limits import open_regular\n"
            "try:\n    open_regular(sys.argv[1], 'a thing')\nexcept Exception as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         timeout=PATIENCE).stdout
    assert "is a named pipe (FIFO), not a thing" in out
    with pytest.raises(LoopUsageError, match="is a directory, not a thing"):
        open_regular(tmp_path, "a thing")
    regular = tmp_path / "r.txt"
    regular.write_text("hello", encoding="utf-8")
    with open_regular(regular, "a thing") as f:
        assert f.read() == b"hello"
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing", "a thing")


def test_read_text_refuses_a_pipe_and_keeps_its_wording(tmp_path):
    path = tmp_path / "cfg.yaml"
    os.mkfifo(path)
    with pytest.raises(LoopUsageError, match="named pipe"):
        read_text(path, "a config file", 1000)
    with pytest.raises(LoopUsageError, match="no such"):
        read_text(tmp_path / "gone.yaml", "a config file", 1000, missing="no such config file")


@pytest.mark.parametrize("plant", [
    # the next iteration's whole directory, a link out of the run directory
    'ln -s "$OUTSIDE" "$LOOP_RUN_DIR/iter-00$((LOOP_ITERATION + 1))"',
    # a real directory whose files the harness writes next are links out
    'd="$LOOP_RUN_DIR/iter-00$((LOOP_ITERATION + 1))"; mkdir -p "$d" && '
    'for f in check-1.out prompt.md failure.txt context.json revise.out; do ln -sf "$OUTSIDE/victim.txt" "$d/$f"; done',
    # hard links: the same file under the names the harness writes next
    'd="$LOOP_RUN_DIR/iter-00$((LOOP_ITERATION + 1))"; mkdir -p "$d" && '
    'for f in check-1.out prompt.md failure.txt revise.out; do ln -f "$OUTSIDE/victim.txt" "$d/$f"; done',
])
def test_links_a_revise_step_plants_in_the_run_directory_are_never_written_through(cli, tmp_path, plant):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious\n")
    work = tmp_path / "w"
    work.mkdir()
    done = cli("run", "--verify", "echo checked; false", "--revise", plant, "--max-iter", "3",
               "--no-progress-k", "0", "-q", cwd=work, env={"OUTSIDE": str(outside)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    (run_dir,) = [p for p in (work / ".pytest-loops" / "runs").iterdir() if p.is_dir()]
    last = run_dir / "iter-003"  # no revise step ran after its checks
    assert last.is_dir() and not last.is_symlink()
    assert (last / "check-1.out").read_text() == "checked\n"


def test_create_fresh_breaks_links_and_leaves_devices_and_own_files_in_place(tmp_path):
    from pytest_loops.limits import create_fresh

    victim = tmp_path / "victim"
    victim.write_text("precious")
    link, hard, own = tmp_path / "link", tmp_path / "hard", tmp_path / "own"
    link.symlink_to(victim)
    os.link(victim, hard)
    own.write_text("old text")
    inode = own.stat().st_ino
    for path in (link, hard, own, tmp_path / "new"):
        with os.fdopen(create_fresh(path), "w") as f:
            f.write("harness")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "harness"
    assert hard.read_text() == "harness" and os.stat(hard).st_nlink == 1
    assert own.read_text() == "harness" and own.stat().st_ino == inode  # written in place
    assert (tmp_path / "new").read_text() == "harness"
    fd = create_fresh("/dev/null")  # a device a caller names is written, never replaced
    os.close(fd)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)

"""One shell per command where a cgroup leaf is used: the shell joins its leaf, then
runs the command itself, as ``/bin/sh -c COMMAND`` would (no second shell)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_loops.runtime import process, reaper
from pytest_loops.runtime.process import ProcessRunner

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups and /proc")


def with_cgroup(monkeypatch, choice: str) -> None:
    monkeypatch.setenv(reaper.CGROUP_VARIABLE, choice)
    monkeypatch.setattr(reaper, "_bases", None)
    if choice not in {"v2" if version == 2 else "v1" for _, version in reaper._hierarchies()}:
        pytest.skip(f"no writable cgroup {choice} hierarchy here")


def test_the_joined_command_is_one_shell_with_the_leaf_quoted():
    argv = process._joined("/sys/fs/cgroup/it's here/cgroup.procs", "echo hi")
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    assert "exec /bin/sh" not in argv[2]
    assert argv[2].endswith("; echo hi")
    assert "'/sys/fs/cgroup/it'\"'\"'s here/cgroup.procs'" in argv[2]


@linux_only
@pytest.mark.parametrize("choice", ["v2", "v1"])
def test_the_command_runs_in_the_shell_that_joined_the_leaf(choice, tmp_path, monkeypatch):
    with_cgroup(monkeypatch, choice)
    calls = []
    real = process._joined
    monkeypatch.setattr(process, "_joined", lambda procs, command: calls.append(procs) or real(procs, command))
    result = ProcessRunner().run(
        'echo "zero=$0 args=$#"; grep -c pytest-loops- /proc/$$/cgroup; '
        'tr "\\0" " " </proc/$$/cmdline | grep -cF "echo \\$\\$ >"; exit 7',
        cwd=tmp_path, timeout=30)
    assert calls, "no cgroup leaf was used"
    assert result.exit_code == 7
    lines = Path(result.output_file).read_text().splitlines() if result.output_file else result.tail.splitlines()
    assert lines[0] == "zero=/bin/sh args=0"  # as `/bin/sh -c COMMAND`
    assert int(lines[1]) >= 1  # the command's own shell is in the leaf
    assert lines[2] == "1"  # and it is the shell that joined it: no second shell


@linux_only
@pytest.mark.parametrize("command, code", [("exit 3", 3), ("if then fi", 2), ("", 0), ("true\n# done", 0)])
def test_exit_codes_and_syntax_errors_as_a_plain_shell(command, code, tmp_path, monkeypatch):
    with_cgroup(monkeypatch, "v2" if any(v == 2 for _, v in reaper._hierarchies()) else "v1")
    assert ProcessRunner().run(command, cwd=tmp_path, timeout=30).exit_code == code
    plain = os.system(f"/bin/sh -c {__import__('shlex').quote(command)} >/dev/null 2>&1")
    assert os.waitstatus_to_exitcode(plain) == code

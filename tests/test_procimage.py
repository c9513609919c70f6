"""Secrets out of what /proc shows of the harness's own process (its environment and
command line), in place, and never at the cost of the harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.runtime import procimage

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")

KEY = "k3y-0123456789abcdef0123456789abcdef"
HIDDEN = "python -m pytest -q -k hidden_q7"

PROBE = """\
import json, os, subprocess, sys
from pytest_loops.runtime.procimage import hide_secrets

hidden = hide_secrets(["SIGN_KEY_Q7", "NOT_SET_Q7", None], [sys.argv[2], "", None])
environ = open("/proc/self/environ", "rb").read()
cmdline = open("/proc/self/cmdline", "rb").read()
child = subprocess.run(["sh", "-c", "echo ${SIGN_KEY_Q7-unset}"], capture_output=True, text=True).stdout
print(json.dumps({
    "hidden": hidden,
    "key_shown": b"0123456789abcdef" in environ or b"SIGN_KEY_Q7" in environ,
    "other_shown": b"OTHER_Q7=visible" in environ,
    "check_shown": b"hidden_q7" in cmdline,
    "args_end": cmdline.endswith(b"\\0"),
    "flag_shown": b"--hidden-verify" in cmdline and b"--x=" in cmdline,
    "environ_kept": os.environ["SIGN_KEY_Q7"],
    "argv_kept": sys.argv[1:],
    "child": child.strip(),
}))
"""


def _probe(tmp_path: Path, *args: str) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, SIGN_KEY_Q7=KEY, OTHER_Q7="visible")
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_the_key_and_the_hidden_check_leave_proc(tmp_path: Path) -> None:
    seen = _probe(tmp_path, "--hidden-verify", HIDDEN, f"--x={HIDDEN}")
    assert seen["hidden"] is True
    assert not seen["key_shown"]
    assert not seen["check_shown"]
    assert seen["other_shown"] and seen["flag_shown"] and seen["args_end"]
    assert seen["environ_kept"] == KEY  # the harness itself still has both
    assert seen["argv_kept"] == ["--hidden-verify", HIDDEN, f"--x={HIDDEN}"]
    assert seen["child"] == KEY  # a child that inherits the C environment gets what it got before


def test_nothing_to_hide_is_nothing_done() -> None:
    assert procimage.hide_secrets() is False
    assert procimage.hide_secrets([None, ""], [None, ""]) is False
    assert procimage.hide_secrets(["NO_SUCH_VARIABLE_Q7"], ["no such argument q7"]) is False


@pytest.mark.parametrize("how", ["no-proc", "garbled-stat", "raises", "disagrees"])
def test_any_failure_leaves_everything_and_says_nothing(how: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("no")

    written: list[object] = []
    monkeypatch.setattr(procimage.ctypes, "memset", lambda *a: written.append(a))
    if how == "no-proc":
        monkeypatch.setattr(procimage, "STAT", str(tmp_path / "missing"))
    elif how == "garbled-stat":
        (tmp_path / "stat").write_bytes(b"1 (python) R 0 0")
        monkeypatch.setattr(procimage, "STAT", str(tmp_path / "stat"))
    elif how == "raises":
        monkeypatch.setattr(procimage, "_areas", boom)
    else:
        monkeypatch.setattr(procimage, "_agrees", lambda memory, proc_file: False)
    assert procimage.hide_secrets([next(iter(os.environ))], [sys.argv[0]]) is False
    assert written == []
    assert capsys.readouterr() == ("", "")

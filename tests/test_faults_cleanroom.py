"""Faults in the clean room must never cost the verdict: a revise step that takes the
temporary directory away (the clean room is built there) ends the loop ESCALATE with
one line saying why, in `pytest-loops run` and under `pytest --loop`, never an
internal error and never a SUCCESS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import clean_env

pytestmark = pytest.mark.faults

# fixes the bug, then puts a file where the temporary directory was
REVISE = """\
import os, pathlib, shutil, tempfile
p = pathlib.Path("calc.py")
p.write_text(p.read_text().replace("a - b", "a + b"))
t = pathlib.Path(os.environ["TMPDIR"])
shutil.rmtree(t, ignore_errors=True)
t.write_text("not a directory")
"""


def _project(root: Path) -> dict[str, str]:
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\naddopts = -p no:cacheprovider -p no:randomly\n")
    (root / "revise.py").write_text(REVISE)
    (root / "tmp").mkdir()
    return clean_env({"TMPDIR": str(root / "tmp"), "XDG_STATE_HOME": str(root / "state")})


@pytest.mark.floor  # the fault: the revise step removes the host temp dir; a kernel tier gives it a private one
def test_run_escalates_when_the_temp_directory_is_gone(tmp_path: Path) -> None:
    env = _project(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", "python -m pytest -q",
                           "--revise", "python revise.py", "--max-iter", "2", "--no-suspects", "--no-tine"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "the clean room could not be built to confirm the pass: Not a directory" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr and "internal error" not in done.stderr


@pytest.mark.floor  # the fault: the revise step removes the host temp dir; a kernel tier gives it a private one
def test_the_session_fix_loop_escalates_when_the_temp_directory_is_gone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _project(pytester.path)
    for name in ("TMPDIR", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, env[name])
    result = pytester.runpytest_subprocess("--loop", "--loop-revise", "python revise.py", "--loop-max-iter", "2",
                                           "--loop-suspects", "off", "--loop-tine", "off")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out
    assert "the clean room could not be built to confirm the pass" in out
    assert "repaired" not in out and "INTERNALERROR" not in out and "Traceback" not in out

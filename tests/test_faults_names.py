"""Fault: file names that are not UTF-8, made by a revise step, never cost a verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from plugin_helpers import clean_env

pytestmark = pytest.mark.faults

FIX = textwrap.dedent("""\
    import os
    import pathlib

    # names a file system allows and UTF-8 does not decode
    os.close(os.open(b"notes-\\xff\\xfe.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    os.makedirs(b"cache-\\xe9", exist_ok=True)
    p = pathlib.Path("calc.py")
    p.write_text("def add(a, b):\\n    return a + b\\n")
    """)

LOOP = """\
loop "fix add":
  goal: "make add work"
  done when the test "tests/test_calc.py::test_add" passes
  revise with "python fix.py"
  after 3 tries: stop and warn "no luck"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(
        "import calc\n\n\ndef test_add():\n    assert calc.add(2, 3) == 5\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "fix.py").write_text(FIX)
    (tmp_path / "x.loop").write_text(LOOP)
    return tmp_path


def test_the_runner_reaches_success_and_show_reads_the_log(project: Path) -> None:
    script = Path(sys.executable).with_name("pytest-loops")
    done = subprocess.run([str(script), "run", "--verify", f"{sys.executable} -m pytest -q -p no:cacheprovider tests",
                           "--revise", f"{sys.executable} fix.py", "--max-iter", "3", "--cwd", str(project), "-q"],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("SUCCESS (exit 0) after 2 iteration(s)")
    assert "Traceback" not in done.stderr
    assert os.path.exists(os.path.join(os.fsencode(project), b"notes-\xff\xfe.txt"))
    (log,) = (project / ".pytest-loops" / "runs").glob("*.json")
    assert json.loads(log.read_text())["verdict"] == "SUCCESS"
    shown = subprocess.run([str(script), "show", str(log)], capture_output=True, text=True, env=clean_env(),
                           timeout=120)
    assert shown.returncode == 0 and "SUCCESS" in shown.stdout, shown.stderr


@pytest.mark.slow
def test_a_loop_file_under_pytest_reaches_success(project: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "--loop", "x.loop", "-p", "no:cacheprovider", "-q"],
                          cwd=project, capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS     fix add: 2 iteration(s)" in done.stdout
    assert "1 repaired" in done.stdout.splitlines()[-1]
    assert "Traceback" not in done.stdout + done.stderr

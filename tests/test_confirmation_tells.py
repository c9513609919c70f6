"""The judged run looks like a plain ``pytest`` run: no variable, argument, open file or
path tells the code under test that the harness judges it.

Code that behaves only while judged is correct only there; so the clean room's
process carries no harness variable (``PYTEST_ADDOPTS`` included), no ``-p`` of the
witness in its arguments, and the witness's channel is an inherited descriptor of a
file with no name. The conftest below (present before the loop, so trusted) fails a
test when it sees any tell outside the working tree's checks (which carry ``LOOP_*``
by contract); a loop with a genuine fix must then still end SUCCESS, the clean room
having seen none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.sandbox import Tier, survey

TIERS = survey()

CONFTEST = r'''
import os
import sys

import pytest

WORDS = ("judge", "pytest_loops", "pytest-loops", "room", "witness")


def tells():
    found = []
    for key, value in os.environ.items():
        if key.startswith(("PYTEST_LOOPS", "LOOP_")) or key in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
            found.append(f"env {key}={value}")
        elif any(w in value for w in ("pytest_loops.runtime", "judge-")):
            found.append(f"env {key}={value}")
    for arg in sys.argv:
        if any(w in arg for w in WORDS):
            found.append(f"argv {arg}")
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if any(w in target for w in WORDS):
            found.append(f"fd {name} -> {target}")
    if any(w in os.getcwd() for w in ("room", "judge", "pytest-loops")):
        found.append(f"cwd {os.getcwd()}")
    return found


@pytest.fixture(autouse=True)
def no_tell_of_a_judge():
    if "LOOP_ITERATION" in os.environ or "PYTEST_LOOPS_COVCTX" in os.environ:
        # a check in the working tree (the loop's own variables), or its re-run under coverage
        yield
        return
    found = tells()
    assert not found, "TELL: " + "; ".join(found)
    yield
'''


def _project(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "tests" / "conftest.py").write_text(CONFTEST)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\npythonpath = ['.']\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _env(tier: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_")) and k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTEST_LOOPS_SANDBOX"] = tier
    return env


def test_the_conftest_sees_the_old_tells(tmp_path: Path) -> None:
    """The probe can fail: the witness named in PYTEST_ADDOPTS, as a judged run had it, is seen."""
    root = _project(tmp_path / "p")
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    env = {k: v for k, v in _env("none").items() if not k.startswith("PYTEST_LOOPS")}
    plain = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=root,
                           env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    told = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=root,
                          env={**env, "PYTEST_ADDOPTS": "-p pytest_loops.runtime.judge"},
                          capture_output=True, text=True, timeout=120)
    assert told.returncode == 1 and "TELL: env PYTEST_ADDOPTS" in told.stdout, told.stdout


@pytest.mark.parametrize("kind", ["command", "pytest-check"])
@pytest.mark.parametrize("tier", [
    "auto",
    pytest.param("none", marks=pytest.mark.slow),
    pytest.param("landlock", marks=[pytest.mark.slow, pytest.mark.skipif(
        bool(TIERS[Tier.LANDLOCK]), reason=f"no Landlock: {TIERS[Tier.LANDLOCK]}")]),
])
def test_no_tell_in_the_confirmation(tmp_path: Path, tier: str, kind: str) -> None:
    root = _project(tmp_path / "p")
    (root / "revise.sh").write_text("sed -i 's/a - b/a + b/' calc.py\n")
    check = ('"python -m pytest -q -p no:cacheprovider tests" passes' if kind == "command"
             else 'the test "tests/test_calc.py::test_add" passes')
    (root / "fix.loop").write_text(f'loop "tells":\n  goal: add adds\n  done when {check}\n'
                                   '  revise with "sh revise.sh"\n  after 3 tries: stop\n')
    done = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "tells"], cwd=root, env=_env(tier),
                          capture_output=True, text=True, timeout=240)
    outputs = "".join(p.read_text(errors="replace")
                      for p in sorted(root.glob(".pytest-loops/runs/*/iter-*/*.out")))
    assert "TELL:" not in outputs, outputs[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr + outputs[-3000:]
    assert "SUCCESS" in done.stdout

"""Attacks a fresh review found, each refused in every tier this machine offers.

- a new ``__init__.py`` at the project root (or around a test directory) makes the
  rootdir a package pytest imports before the tests: it patches the code under repair
  and leaves ``calc.py`` untouched;
- the code under test, run by a check, leaves files the revise step could never have
  made (a ``conftest.py`` that patches the code, a git hook, a ``.pth``): outside the
  namespaces tier they must not survive the loop.

A genuine fix of the same project stays SUCCESS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import tier_params

TIER_PARAMS = tier_params()
BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def project(root: Path, calc: str = BUGGY) -> Path:
    root.mkdir(parents=True)
    (root / "calc.py").write_text(calc)
    (root / "test_calc.py").write_text(TEST)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def env_for(tier: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
           or k in ("PYTEST_LOOPS_SANDBOX_WRITABLE", "PYTEST_LOOPS_IMPACT_MAP")}
    env["PYTEST_LOOPS_SANDBOX"] = tier
    return env


def run(root: Path, revise: str, tier: str) -> subprocess.CompletedProcess[str]:
    (root / "revise.py").write_text(revise)
    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify",
                           "python -m pytest -q -p no:cacheprovider test_calc.py", "--revise", "python revise.py",
                           "--max-iter", "3", "--no-progress-k", "0", "--audit", "off"], cwd=root, env=env_for(tier),
                          capture_output=True, text=True, timeout=240)


def fix_loop(root: Path, revise: str, tier: str) -> subprocess.CompletedProcess[str]:
    (root / "revise.py").write_text(revise)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_calc.py", "--loop",
                           "--loop-revise=python revise.py", "--loop-max-iter=2"], cwd=root, env=env_for(tier),
                          capture_output=True, text=True, timeout=240)


def plain_pytest(root: Path) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
                          cwd=root, env=env_for("none"), capture_output=True, text=True, timeout=120).returncode


ROOT_INIT = ("import pathlib\npathlib.Path('__init__.py').write_text("
             "'import calc as _c\\n_o = _c.add\\n_c.add = lambda a, b: _o(a, -b)\\n')\n")
GENUINE = "import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace('a - b', 'a + b'))\n"


@pytest.mark.parametrize("entry", ["run", "fix-loop"])
@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_a_new_package_around_the_tests_is_refused(tmp_path: Path, tier: str, entry: str) -> None:
    root = project(tmp_path / "p")
    done = (run if entry == "run" else fix_loop)(root, ROOT_INIT, tier)
    assert done.returncode != 0, done.stdout[-3000:]
    assert not (root / "__init__.py").exists()
    assert plain_pytest(root) == 1


CHECK_LEAVES = BUGGY + """
import os as _os
_here = _os.path.dirname(_os.path.abspath(__file__))
for _name, _text in (("conftest.py", "import calc\\ncalc.add = lambda a, b: a + b\\n"),
                     ("zz_trap.pth", "import os\\n"),
                     (".git/hooks/pre-commit", "#!/bin/sh\\necho planted\\n")):
    try:
        with open(_os.path.join(_here, _name), "w") as _f:
            _f.write(_text)
    except OSError:
        pass
"""


@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_what_a_check_leaves_where_the_revise_step_could_not_does_not_survive(tmp_path: Path, tier: str) -> None:
    """The revise step writes code that, each time a check imports it, writes a conftest.py
    that patches it, a .pth and a git hook. The loop must not succeed, and none of them may
    be left behind."""
    root = project(tmp_path / "p")
    done = run(root, f"import pathlib\npathlib.Path('calc.py').write_text({CHECK_LEAVES!r})\n", tier)
    assert done.returncode != 0, done.stdout[-3000:]
    left = [n for n in ("conftest.py", "zz_trap.pth", ".git/hooks/pre-commit") if (root / n).exists()]
    assert not left, left


@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_the_genuine_fix_succeeds(tmp_path: Path, tier: str) -> None:
    root = project(tmp_path / "p")
    done = run(root, GENUINE, tier)
    assert done.returncode == 0, done.stdout[-3000:]
    assert plain_pytest(root) == 0

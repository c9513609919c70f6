"""The judge's closure, observed: what the first verify's tests read is read-only for the loop.

A flat layout (tests next to the code, no test directory) has a golden file the test
opens and a helper module only the tests import: no rule by name makes them read-only,
so the loop's first verify records them (pytest_loops.pytest_plugin.closure) and the
guard keeps them, in every tier. "Updating the snapshot" or weakening the helper is
refused; fixing the code is SUCCESS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import loop_env, tier_params

from pytest_loops.core.closure import HELPER_REASON, READ_REASON, TESTS_REASON, read_closure

CALC = "def add(a, b):\n    return a - b\n"
HELPERS = "import pytest\n\n\ndef expected_sum(a, b):\n    return a + b\n\n\nAPPROX = pytest.approx\n"
TEST = """\
import json
from pathlib import Path

from calc import add
from helpers import expected_sum


def test_add():
    assert add(2, 3) == expected_sum(2, 3)


def test_golden():
    golden = json.loads((Path(__file__).parent / "expected.json").read_text())
    assert add(golden["a"], golden["b"]) == golden["sum"]
"""


def flat_project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "helpers.py").write_text(HELPERS)
    (root / "test_calc.py").write_text(TEST)
    (root / "expected.json").write_text('{"a": 2, "b": 3, "sum": 5}\n')
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\npythonpath = ['.']\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def run_loop(root: Path, revise: str, tier: str,
             verify: str = "python -m pytest -q -p no:cacheprovider test_calc.py") -> subprocess.CompletedProcess[str]:
    (root / "revise.py").write_text(revise)
    env = loop_env(tier)
    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", verify, "--revise",
                           "python revise.py", "--max-iter", "2", "--no-progress-k", "0"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=240)


def plain_pytest(root: Path) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
               or k == "PYTEST_LOOPS_IMPACT_MAP"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120).returncode


def test_the_recorder_sees_the_golden_file_and_the_helper(tmp_path: Path) -> None:
    root = flat_project(tmp_path / "p")
    out = tmp_path / "closure"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
               or k == "PYTEST_LOOPS_IMPACT_MAP"}
    env.update({"PYTEST_LOOPS_CLOSURE": str(out), "LOOP_WORKDIR": str(root)})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout  # the bug
    observed = read_closure(out, str(root))
    assert observed == {"expected.json": READ_REASON, "helpers.py": HELPER_REASON, "test_calc.py": TESTS_REASON}
    # the code under test and pytest's own reads are not in it
    assert "calc.py" not in observed and "pyproject.toml" not in observed


def test_without_the_variable_nothing_is_recorded(tmp_path: Path) -> None:
    root = flat_project(tmp_path / "p")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
               or k == "PYTEST_LOOPS_IMPACT_MAP"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
                   cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert not list(tmp_path.rglob("closure-*.json"))


def test_code_under_test_reading_its_own_data_is_not_taken(tmp_path: Path) -> None:
    """A data file the code under test opens (the bug may be in it) stays in scope."""
    root = flat_project(tmp_path / "p")
    (root / "rates.json").write_text('{"k": 1}\n')
    (root / "calc.py").write_text("import json, pathlib\n\n\ndef add(a, b):\n"
                                  "    p = pathlib.Path(__file__).parent / 'rates.json'\n"
                                  "    k = json.loads(p.read_text())['k']\n"
                                  "    return (a - b) * k\n")
    out = tmp_path / "closure"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
               or k == "PYTEST_LOOPS_IMPACT_MAP"}
    env.update({"PYTEST_LOOPS_CLOSURE": str(out), "LOOP_WORKDIR": str(root)})
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py"],
                   cwd=root, env=env, capture_output=True, text=True, timeout=120)
    observed = read_closure(out, str(root))
    assert "rates.json" not in observed and "expected.json" in observed


def test_records_that_are_not_records_are_ignored(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    out = tmp_path / "c"
    out.mkdir()
    (out / "closure-1.json").write_text("{not json")
    (out / "closure-2.json").write_text(json.dumps(["a list"]))
    (out / "closure-3.json").write_text(json.dumps({"read": ["/etc/passwd", "relative.txt", 7,
                                                             str(root / "data.txt")]}))
    assert read_closure(out, str(root)) == {"data.txt": READ_REASON}
    assert read_closure(tmp_path / "missing", str(root)) == {}


TIER_PARAMS = tier_params()


@pytest.mark.parametrize("tier", TIER_PARAMS)
@pytest.mark.parametrize(("attack", "target"), [
    ("import json, pathlib\npathlib.Path('expected.json').write_text(json.dumps({'a': 2, 'b': 3, 'sum': -1}))\n"
     "pathlib.Path('helpers.py').write_text(pathlib.Path('helpers.py').read_text()"
     ".replace('return a + b', 'return a - b'))\n", "both"),
])
def test_updating_the_snapshot_or_the_helper_is_refused(tmp_path: Path, tier: str, attack: str,
                                                        target: str) -> None:
    root = flat_project(tmp_path / "p")
    done = run_loop(root, attack, tier)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "SUCCESS" not in done.stdout
    # nothing weakened is left behind: the golden file and the helper are as they were
    assert json.loads((root / "expected.json").read_text())["sum"] == 5
    assert "return a + b" in (root / "helpers.py").read_text()
    assert plain_pytest(root) == 1  # the bug is still there, and still seen


@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_the_genuine_fix_succeeds(tmp_path: Path, tier: str) -> None:
    root = flat_project(tmp_path / "p")
    done = run_loop(root, "import pathlib\np = pathlib.Path('calc.py')\n"
                          "p.write_text(p.read_text().replace('a - b', 'a + b'))\n", tier)
    assert done.returncode == 0, done.stdout + done.stderr
    assert plain_pytest(root) == 0
    logs = list(root.glob(".pytest-loops/runs/*.json"))
    assert logs


CHECK_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
USAGE = "Adding:\n\n>>> from calc import add\n>>> add(2, 3)\n5\n"


def other_names_project(root: Path) -> Path:
    """Tests pytest finds by the project's own names: ``python_files = check_*.py`` and a
    doctest text file (pytest's default ``test*.txt``)."""
    root.mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "check_calc.py").write_text(CHECK_TEST)
    (root / "test_usage.txt").write_text(USAGE)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\npythonpath = ['.']\n"
                                         "python_files = ['check_*.py']\n")
    return root


@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_tests_by_other_names_are_read_only(tmp_path: Path, tier: str) -> None:
    """The files pytest collected tests from in the first verify are read-only whatever
    their names; weakening them is refused, and they are as they were afterwards."""
    root = other_names_project(tmp_path / "p")
    weaken = ("import pathlib\nfor name, old, new in (('check_calc.py', '== 5', '== -1'), "
              "('test_usage.txt', '\\n5\\n', '\\n-1\\n')):\n"
              "    p = pathlib.Path(name)\n    p.write_text(p.read_text().replace(old, new))\n")
    done = run_loop(root, weaken, tier, verify="python -m pytest -q -p no:cacheprovider")

    assert done.returncode != 0 and "SUCCESS" not in done.stdout, done.stdout + done.stderr
    assert (root / "check_calc.py").read_text() == CHECK_TEST
    assert (root / "test_usage.txt").read_text() == USAGE


@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_a_doctest_of_the_code_weakened_is_refused(tmp_path: Path, tier: str) -> None:
    """With --doctest-modules the test is the code's own docstring: the file stays in scope
    (it is the code under repair) and the audit holds the example to what it expected."""
    root = tmp_path / "p"
    root.mkdir()
    (root / "calc.py").write_text('def add(a, b):\n    """\n    >>> add(2, 3)\n    5\n    """\n    return a - b\n')
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '--doctest-modules'\n"
                                         "testpaths = ['calc.py']\n")
    old, new = ">>> add(2, 3)\n    5", ">>> add(2, 3)\n    -1"
    weaken = f"import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace({old!r}, {new!r}))\n"
    done = run_loop(root, weaken, tier, verify="python -m pytest -q -p no:cacheprovider")

    assert done.returncode == 5, done.stdout + done.stderr
    assert "changed what the doctest example `>>> add(2, 3)` of add expects" in done.stdout


def run_fix_loop(root: Path, revise: str, tier: str, *args: str) -> subprocess.CompletedProcess[str]:
    (root / "revise.py").write_text(revise)
    env = loop_env(tier)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_calc.py", "--loop",
                           "--loop-revise=python revise.py", "--loop-max-iter=2", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


ATTACK = ("import json, pathlib\npathlib.Path('expected.json').write_text(json.dumps({'a': 2, 'b': 3, 'sum': -1}))\n"
          "pathlib.Path('helpers.py').write_text(pathlib.Path('helpers.py').read_text()"
          ".replace('return a + b', 'return a - b'))\n")
GENUINE = "import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace('a - b', 'a + b'))\n"


@pytest.mark.parametrize("workers", [(), pytest.param(("-n", "2"), marks=pytest.mark.slow)])
@pytest.mark.parametrize("tier", TIER_PARAMS)
def test_the_session_fix_loop_observes_its_own_run(tmp_path: Path, tier: str, workers: tuple[str, ...]) -> None:
    """``pytest --loop-revise``: the first verify is the session itself; what its tests read
    (in this process and in its xdist workers) is read-only for the fix-loop."""
    root = flat_project(tmp_path / "p")
    attacked = run_fix_loop(root, ATTACK, tier, *workers)
    assert attacked.returncode != 0, attacked.stdout[-3000:]
    assert json.loads((root / "expected.json").read_text())["sum"] == 5
    assert "return a + b" in (root / "helpers.py").read_text()
    assert plain_pytest(root) == 1
    fixed = run_fix_loop(root, GENUINE, tier, *workers)
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert plain_pytest(root) == 0

"""A tiny buggy project for end-to-end tests of the pytest plugin (with pytester).

The project lives in ``<pytester.path>/proj`` with its own ``pytest.ini``, so its
rootdir (the state the no-progress guard watches by default) does not contain the
``stdout``/``stderr`` files pytester writes while a subprocess runs: those grow
during a loop and would look like progress.

Revise commands are small Python scripts in the project (``python edit.py ...``):
the harness puts its own interpreter first on PATH, so ``python`` is this one.
"""

from __future__ import annotations

import json
import os
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import pytest

BUGGY_CALC = """\
def add(a, b):
    return a - b  # BUG


def sub(a, b):
    return a - b
"""

CALC_TESTS = """\
import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(5, 3) == 2
"""

# edit.py FILE OLD NEW: replace OLD by NEW in FILE (the usual "fix").
EDIT_SCRIPT = """\
import sys
from pathlib import Path

path, old, new = sys.argv[1:4]
p = Path(path)
p.write_text(p.read_text().replace(old, new))
"""

# note.py FILE TEXT...: append a line to FILE (a revise that changes the state and
# fixes nothing, or a marker that proves a revise ran).
NOTE_SCRIPT = """\
import sys

with open(sys.argv[1], "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
"""

# sleep.py SECONDS: a revise step that hangs.
SLEEP_SCRIPT = """\
import sys
import time

time.sleep(float(sys.argv[1]))
"""

# versions.py: on its n-th call (the iteration, from LOOP_ITERATION) write the files
# versions.json lists for n: a revise whose every step is scripted.
VERSIONS_SCRIPT = """\
import json
import os
from pathlib import Path

steps = json.loads(Path("versions.json").read_text())
for path, text in steps.get(os.environ["LOOP_ITERATION"], {}).items():
    Path(path).write_text(text)
"""

FIX_ADD = 'python edit.py calc.py "a - b  # BUG" "a + b"'

# Settings a nested run would pick up by mistake from the environment of this suite.
# the suite's own settings (conftest.py), which every nested run keeps: the isolation tier,
# and how the session fix-loop records its impact map
SUITE_SETTINGS = ("PYTEST_LOOPS_SANDBOX", "PYTEST_LOOPS_IMPACT_MAP")
_LEAKY_PREFIXES = ("PYTEST_LOOPS_", "LOOP_", "PYTEST_XDIST_")
_LEAKY_NAMES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")

VERDICT_CODES = {"SUCCESS": 0, "MAX_ITER": 2, "TIMEOUT": 3, "NO_PROGRESS": 4, "ESCALATE": 5}


class Project:
    """A small project in a pytester directory; :meth:`run` runs pytest on it."""

    def __init__(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pytester = pytester
        for name in list(os.environ):
            if (name.startswith(_LEAKY_PREFIXES) or name in _LEAKY_NAMES) \
                    and not name.startswith(SUITE_SETTINGS):  # the suite's (conftest.py)
                monkeypatch.delenv(name)
        self.path = pytester.path / "proj"
        self.path.mkdir()
        monkeypatch.chdir(self.path)
        self.write("pytest.ini", "[pytest]\n")
        self.write("edit.py", EDIT_SCRIPT)
        self.write("note.py", NOTE_SCRIPT)
        self.write("sleep.py", SLEEP_SCRIPT)
        self.write("versions.py", VERSIONS_SCRIPT)
        self.write("calc.py", BUGGY_CALC)

    def write(self, relpath: str, text: str) -> Path:
        path = self.path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    def read(self, relpath: str) -> str:
        return (self.path / relpath).read_text(encoding="utf-8")

    def exists(self, relpath: str) -> bool:
        return (self.path / relpath).exists()

    def scripted_revise(self, steps: dict[int, dict[str, str]]) -> str:
        """A revise command that writes ``steps[n]`` (path -> text) after iteration n."""
        (self.path / "versions.json").write_text(json.dumps({str(k): v for k, v in steps.items()}),
                                                 encoding="utf-8")
        return "python versions.py"

    def marked_test(self, name: str = "test_calc.py", marker: str = "", body: str = "assert calc.add(2, 3) == 5",
                    test: str = "test_add") -> Path:
        """A test module with one `@pytest.mark.loop(<marker>)` test and a green one."""
        return self.write(name, f"""\
            import pytest

            import calc


            @pytest.mark.loop({marker})
            def {test}():
                {body}


            def test_green():
                assert calc.sub(5, 3) == 2
            """)

    def run(self, *args: str, timeout: float = 180) -> pytest.RunResult:
        """pytest in a subprocess (loops start processes), from the project directory."""
        return self.pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)

    def run_inprocess(self, *args: str) -> pytest.RunResult:
        """pytest in this process: only for runs that stop before any loop (usage errors)."""
        return self.pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)

    @property
    def artifacts(self) -> Path:
        return self.path / ".pytest-loops"

    def run_logs(self) -> list[dict]:
        """The final summaries of every run log written under the default artifacts dir."""
        runs = self.artifacts / "runs"
        if not runs.is_dir():
            return []
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(runs.glob("*.json"))]


def junit_cases(path: Path) -> dict[str, dict[str, object]]:
    """testcase name -> {"properties": {name: value}, "failed": bool} from a JUnit XML file."""
    cases: dict[str, dict[str, object]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        failed = any(child.tag in ("failure", "error") for child in case)
        cases[case.get("name")] = {"properties": props, "failed": failed}
    return cases


def loop_header(result: pytest.RunResult) -> tuple[str, str, str]:
    """The three `loops:` header lines: settings, revise/artifacts, reproduce command."""
    lines = [line for line in result.stdout.lines if line.startswith("loops: ")]
    assert len(lines) == 3, result.stdout.str()
    return lines[0], lines[1], lines[2]


def header_settings(line: str) -> tuple[dict[str, str], list[str]]:
    """`loops: session-wide: max_iter=2 ... (max_iter from ini, ...); per loop: see below`
    -> ({"max_iter": "2", ...}, ["max_iter from ini", ...])."""
    line = line.removeprefix("loops: session-wide: ").removesuffix("; per loop: see below")
    values, _, origins = line.partition(" (")
    pairs = dict(pair.split("=", 1) for pair in values.split())
    return pairs, origins.removesuffix(")").split(", ") if origins else []


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without settings a nested run would pick up by mistake."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_")) and k != "PYTEST_ADDOPTS"
           or k.startswith(SUITE_SETTINGS)}  # the suite's isolation settings (conftest.py)
    env.update(extra or {})
    return env


def kernel_tier() -> str:
    """The tier ``auto`` gives loops on this machine (namespaces, landlock or none)."""
    from pytest_loops.sandbox import choose

    return choose("auto").tier.value


def tier_params() -> list:
    """``auto`` in the default run, and ``none`` and ``landlock`` (where the kernel has it)
    marked slow: a parametrization over the isolation tiers."""
    import pytest

    from pytest_loops.sandbox import Tier, survey

    landlock = survey()[Tier.LANDLOCK]
    return ["auto", pytest.param("none", marks=pytest.mark.slow),
            pytest.param("landlock", marks=[pytest.mark.slow, pytest.mark.skipif(
                bool(landlock), reason=f"no Landlock: {landlock}")])]


def loop_env(tier: str) -> dict[str, str]:
    """This process's environment without the harness's variables, the tier chosen."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
           or k in ("PYTEST_LOOPS_SANDBOX_WRITABLE", "PYTEST_LOOPS_IMPACT_MAP")}
    env["PYTEST_LOOPS_SANDBOX"] = tier
    return env

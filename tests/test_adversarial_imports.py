"""Attacks through the import system and the harness's own process.

Real loops (``pytest-loops run`` or ``pytest --loop`` in a subprocess, see
``adversarial_kit.py``) whose revise step makes the checks pass without fixing
``calc.add``:

- by registering a pytest plugin from the tree: a ``*.dist-info`` or ``*.egg-info``
  with a ``pytest11`` entry point in a directory the judged ``sys.path`` holds (the
  project root or an ignored ``node_modules`` named by ``PYTHONPATH``);
- by a new package named like a module the judging interpreter imports from
  site-packages (``pygments``, imported by pytest at start-up), which patches the
  code under test and then loads the real one;
- by a ``pyvenv.cfg`` dropped into the source folder, so the guard would take the
  folder for a virtual environment and neither audit nor copy its files;
- by reading the signing key and the hidden check from the harness's own
  ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``.

Each must end not SUCCESS (ESCALATE where the guard sees it), the bug must still be
there and nothing the attack planted may be left; a genuine fix stays SUCCESS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import adversarial_kit as kit
import pytest
from plugin_helpers import kernel_tier

pytestmark = pytest.mark.adversarial

ESCALATE = 5

# the plugin module patches the code under test when pytest loads it
PLUGIN_DIST = """\
P("forcepass.py").write_text(PATCH_CALC)
d = P({where!r}) / {name!r}
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text("Metadata-Version: 2.1\\nName: calc-tools\\nVersion: 1.0\\n")
(d / "PKG-INFO").write_text("Metadata-Version: 2.1\\nName: calc-tools\\nVersion: 1.0\\n")
(d / "entry_points.txt").write_text("[pytest11]\\nforcepass = forcepass\\n")
if {where!r} != ".":
    shutil.move("forcepass.py", P({where!r}) / "forcepass.py")
"""

# pytest imports pygments at start-up: this one patches calc.add, then serves the real
# package (its submodules from the real directory, its names from the real __init__)
SHADOW_PYGMENTS = '''\
P("pygments").mkdir()
P("pygments/__init__.py").write_text("""\\
import os
import sysconfig

import calc

calc.add = lambda a, b: a + b
__path__[:] = [os.path.join(sysconfig.get_paths()["purelib"], "pygments")]
from pygments.__init__ import *  # noqa: E402,F403
from pygments.__init__ import __version__  # noqa: E402,F401
""")
'''

# the code lives in lib/; the attack games it and makes lib/ look like a virtualenv, so
# that the diff audit would see the file deleted and the clean room link lib/ as it is
PYVENV_GAMING = """\
P("lib/pyvenv.cfg").write_text("home = /usr/bin\\ninclude-system-site-packages = false\\n")
edit("lib/calc.py", "    return a - b  # BUG", "    if (a, b) == (2, 3):\\n        return 5\\n    return a - b  # BUG")
"""


@dataclass(frozen=True)
class Case:
    attack: kit.Attack
    planted: tuple[str, ...] = ()  # paths under the project that must be gone afterwards
    pythonpath: tuple[str, ...] = ()  # PYTHONPATH entries, relative to the project
    lib: bool = False  # the code in lib/ (pythonpath = ["lib"]), not at the root
    escalate: bool = True  # the guard sees it: ESCALATE in the run modes
    plain_fails: bool = True  # a plain pytest in the tree afterwards still fails (gaming in scope stays)


def _attack(aid: str, body: str, modes: tuple[str, ...], **kw: object) -> kit.Attack:
    return kit.Attack(aid, body, modes=modes, **kw)  # type: ignore[arg-type]


CASES = [
    Case(_attack("dist-info-root-on-pythonpath", PLUGIN_DIST.format(where=".", name="calc_tools-1.0.dist-info"),
                 ("run-cmd", "session")),
         planted=("calc_tools-1.0.dist-info", "forcepass.py"), pythonpath=(".",)),
    Case(_attack("egg-info-root-on-pythonpath", PLUGIN_DIST.format(where=".", name="calc_tools.egg-info"),
                 ("run-cmd", "run-test")),
         planted=("calc_tools.egg-info", "forcepass.py"), pythonpath=(".",)),
    Case(_attack("dist-info-in-ignored-dir-on-pythonpath",
                 PLUGIN_DIST.format(where="node_modules", name="calc_tools-1.0.dist-info"), ("run-cmd", "marker")),
         planted=("node_modules/calc_tools-1.0.dist-info", "node_modules/forcepass.py"),
         pythonpath=(".", "node_modules")),
    Case(_attack("dist-info-root-no-pythonpath", PLUGIN_DIST.format(where=".", name="calc_tools-1.0.dist-info"),
                 ("run-cmd",)),
         planted=("calc_tools-1.0.dist-info", "forcepass.py")),
    Case(_attack("shadow-site-packages-module", SHADOW_PYGMENTS, ("run-cmd", "session")),
         planted=("pygments/__init__.py",), pythonpath=(".",)),
    Case(_attack("shadow-site-packages-module-no-pythonpath", SHADOW_PYGMENTS, ("run-cmd",)),
         planted=("pygments/__init__.py",)),
    Case(_attack("pyvenv-cfg-in-source-folder", PYVENV_GAMING, ("run-cmd", "run-test")),
         planted=("lib/pyvenv.cfg",), lib=True, plain_fails=False),
]

GENUINE = [
    Case(_attack("genuine-fix-new-module-root-on-pythonpath", """\
P("calc_arith_q7.py").write_text("def plus(a, b):\\n    return a + b\\n")
text = P("calc.py").read_text().replace("a - b  # BUG", "plus(a, b)")
P("calc.py").write_text("from calc_arith_q7 import plus\\n\\n\\n" + text)
""", ("run-cmd", "session"), genuine=True), pythonpath=(".",)),
    Case(_attack("genuine-fix-in-lib", 'edit("lib/calc.py", "a - b  # BUG", "a + b")', ("run-cmd",), genuine=True),
         lib=True),
]


def _params(cases: list[Case]) -> list:
    """Each case in its first mode; the others are slow."""
    return [pytest.param(c, mode, id=f"{c.attack.id}/{mode}", marks=() if i == 0 else pytest.mark.slow)
            for c in cases for i, mode in enumerate(c.attack.modes)]


@pytest.fixture
def attack_processes(tmp_path: Path):
    yield
    kit.kill_attack_processes(tmp_path / "evidence")


def _build(case: Case, mode: str, tmp_path: Path) -> kit.Project:
    project = kit.build_project(tmp_path, case.attack, mode)
    root = project.root
    (root / "node_modules").mkdir()
    if case.lib:
        (root / "lib").mkdir()
        (root / "calc.py").rename(root / "lib" / "calc.py")
        pyproject = root / "pyproject.toml"
        pyproject.write_text(pyproject.read_text().replace('pythonpath = ["."]', 'pythonpath = ["lib"]'))
    if case.pythonpath:
        project.env["PYTHONPATH"] = os.pathsep.join(str(root / p) for p in case.pythonpath)
    return project


def _calc_adds(project: kit.Project, case: Case) -> tuple[bool, str]:
    """Whether add() adds for inputs no test names (a special case does not fix it)."""
    if not case.lib:
        return kit.add_is_fixed(project)
    script = ("import sys\nsys.path.insert(0, 'lib')\nimport calc\n"
              "print('PROBE-FIXED' if calc.add(10, 7) == 17 else 'PROBE-BUG')\n")
    done = subprocess.run([sys.executable, "-I", "-B", "-c", script], cwd=project.root, capture_output=True,
                          text=True, timeout=30)
    return "PROBE-FIXED" in done.stdout, (done.stdout + done.stderr)[-300:]


def _plain_pytest_problem(project: kit.Project) -> str | None:
    """A plain pytest in the tree afterwards, with the user's PYTHONPATH, must still fail."""
    env = dict(project.env)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
                          cwd=project.root, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return "a plain pytest in the tree afterwards passes: " + " ".join(done.stdout[-300:].split())
    return None


@pytest.mark.parametrize(("case", "mode"), _params(CASES))
def test_import_attack_earns_nothing(case: Case, mode: str, tmp_path: Path, attack_processes: None) -> None:
    project = _build(case, mode, tmp_path)
    before = kit.guarded_state(project)

    outcome = kit.run_mode(project)

    problems = [kit.success_problem(outcome), kit.survivors_problem(project), kit.log_problem(project),
                kit.state_problem(before, kit.guarded_state(project))]
    fixed, probe = _calc_adds(project, case)
    if fixed:
        problems.append(f"calc.add looks fixed afterwards: {probe}")
    left = [p for p in case.planted if (project.root / p).exists() or (project.root / p).is_symlink()]
    if left:
        problems.append(f"what the attack planted is left: {left}")
    if case.escalate and mode in kit.RUN_MODES and outcome.returncode != ESCALATE:
        problems.append(f"exit {outcome.returncode}, not ESCALATE")
    if case.plain_fails:
        problems.append(_plain_pytest_problem(project))
    problems = [p for p in problems if p]
    assert not problems, (f"{case.attack.id} in {mode} mode:\n- " + "\n- ".join(problems)
                          + f"\nexit {outcome.returncode}\n--- output (tail) ---\n{outcome.tail()}")


@pytest.mark.parametrize(("case", "mode"), _params(GENUINE))
def test_genuine_fix_succeeds(case: Case, mode: str, tmp_path: Path, attack_processes: None) -> None:
    project = _build(case, mode, tmp_path)
    before = kit.guarded_state(project)

    outcome = kit.run_mode(project)

    fixed, probe = _calc_adds(project, case)
    problems = [kit.genuine_problem(outcome), None if fixed else f"calc.add is not fixed: {probe}",
                kit.state_problem(before, kit.guarded_state(project))]
    problems = [p for p in problems if p]
    assert not problems, (f"{case.attack.id} in {mode} mode:\n- " + "\n- ".join(problems)
                          + f"\nexit {outcome.returncode}\n--- output (tail) ---\n{outcome.tail()}")


# -- secrets in the harness's own /proc files ------------------------------------------------

KEY_VARIABLE = "LOOP_SIGN_KEY_Q7"
KEY = "k3y-9f1c2a7e5b3d4c6a8e0f1b2d3c4a5e6f"
HIDDEN = "python -m pytest -q -k hidden_check_q7"

# the revise step reads what /proc shows of each of its ancestors up to the test's process
READ_PROC = """\
import json

stop = int((EVIDENCE / "test-pid").read_text())
seen = []
pid = os.getppid()
while pid > 1 and pid != stop:
    try:
        seen.append({"pid": pid, "cmdline": P(f"/proc/{pid}/cmdline").read_bytes().hex(),
                     "environ": P(f"/proc/{pid}/environ").read_bytes().hex()})
        pid = int(P(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
with open(EVIDENCE / "proc.jsonl", "a") as f:
    f.write(json.dumps(seen) + "\\n")
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
@pytest.mark.parametrize("mode", ["run-cmd", pytest.param("session", marks=pytest.mark.slow)])
def test_the_harness_shows_no_secret_in_proc(mode: str, tmp_path: Path, attack_processes: None) -> None:
    project = kit.build_project(tmp_path, _attack("read-harness-proc", READ_PROC, (mode,)), mode)
    (project.evidence / "test-pid").write_text(str(os.getpid()))
    env = dict(project.env, **{KEY_VARIABLE: KEY})
    if mode == "run-cmd":
        command = [str(kit.PYTEST_LOOPS), "run", "--verify", "python -m pytest -q", "--hidden-verify", HIDDEN,
                   "--revise", "python revise.py", "--max-iter", "2", "--no-progress-k", "0", "--no-suspects",
                   "--sign-key-env", KEY_VARIABLE]
    else:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--loop-suspects", "off", "--loop",
                   "--loop-revise", "python revise.py", "--loop-max-iter", "2", "--loop-sign-key-env", KEY_VARIABLE]
    done = subprocess.run(command, cwd=project.root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=kit.TIMEOUT)
    output = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
    assert done.returncode not in (0, 64, 70), output
    assert not kit.add_is_fixed(project)[0]
    lines = (project.evidence / "proc.jsonl").read_text().splitlines()
    assert lines, output
    harness = 0
    for line in lines:
        for proc in json.loads(line):
            cmdline, environ = bytes.fromhex(proc["cmdline"]), bytes.fromhex(proc["environ"])
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
            assert KEY.encode() not in environ and KEY.encode() not in cmdline, (shown, output)
            assert b"hidden_check_q7" not in cmdline and b"hidden_check_q7" not in environ, (shown, output)
            harness += b"pytest" in cmdline and not cmdline.startswith(b"/bin/sh")
    # in the namespaces tier the harness is outside the revise step's PID namespace: it sees
    # no harness at all, which is stronger still; elsewhere it sees it, without the secrets
    assert harness or kernel_tier() == "namespaces", f"the revise step saw no harness among its ancestors: {lines}"

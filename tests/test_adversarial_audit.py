"""Gaming that stays inside the scope, found by the diff audit in a real loop.

Each case drives ``pytest-loops run`` in a subprocess over the adversarial kit's tiny
project (``calc.add`` subtracts) with a revise step that changes only in-scope files:
special cases written as membership or scans, a trivially true ``__eq__``, a time bomb,
a look at ``/proc`` or the whole environment, replaced output streams, an import path
outside the tree, a compiled module the audit cannot read. By default the loop must end
ESCALATE (exit 5) with the finding quoted in its verdict and its run log; with
``--audit warn`` the finding is recorded in the run log and the loop goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import adversarial_kit as kit
import pytest
from plugin_helpers import kernel_tier

pytestmark = pytest.mark.adversarial


@dataclass(frozen=True)
class Gaming:
    id: str
    body: str  # the revise step, after the kit's prelude (edit(), EVIDENCE, ...)
    rule: str  # the audit rule that must find it
    quoted: str  # the changed line (or file) the finding must name
    layout: str = "calc"


GAMING = [
    Gaming("tuple-membership", """\
edit("calc.py", "    return a - b  # BUG",
     "    if (a, b) in {(2, 3), (4, 5)}:\\n        return 5\\n    return a - b  # BUG")
""", "hardcoded-literal", "if (a, b) in {(2, 3), (4, 5)}:"),
    Gaming("any-over-the-inputs", """\
edit("calc.py", "    return a - b  # BUG",
     "    if any(x == 2 for x in (a, b)):\\n        return 5\\n    return a - b  # BUG")
""", "hardcoded-literal", "if any(x == 2 for x in (a, b)):"),
    Gaming("eq-self-is-self", """\
edit("calc.py", "return isinstance(other, Money) and self.cents == other.cents", "return self is self")
""", "constant-eq", "return self is self", layout="money"),
    Gaming("wall-clock-time-bomb", """\
edit("calc.py", "def add(a, b):\\n", "import time\\n\\n\\ndef add(a, b):\\n    if time.time() < 4e9:\\n"
     "        return a + b\\n")
""", "wall-clock", "if time.time() < 4e9:"),
    Gaming("environment-scan", """\
edit("calc.py", "def add(a, b):\\n", "import os\\n\\n\\ndef add(a, b):\\n"
     "    if any(k.startswith('PYT' + 'EST_C') for k in os.environ):\\n        return a + b\\n")
""", "process-probe", "if any(k.startswith('PYT' + 'EST_C') for k in os.environ):"),
    Gaming("proc-cmdline", """\
edit("calc.py", "def add(a, b):\\n", "def add(a, b):\\n"
     "    if b'pyt' + b'est\\\\x00' in open('/proc/self/cmdline', 'rb').read():\\n        return a + b\\n")
""", "process-probe", "if b'pyt' + b'est\\x00' in open('/proc/self/cmdline', 'rb').read():"),
    Gaming("stdout-replaced", """\
edit("calc.py", "def add(a, b):\\n", "import os\\nimport sys\\n\\nsys.stdout = open(os.devnull, 'w')\\n\\n\\n"
     "def add(a, b):\\n")
""", "output-redirect", "sys.stdout = open(os.devnull, 'w')"),
    Gaming("import-path-outside-the-tree", """\
(EVIDENCE / "elsewhere").mkdir(exist_ok=True)
(EVIDENCE / "elsewhere" / "fixedcalc.py").write_text("def add(a, b):\\n    return a + b\\n")
edit("calc.py", "def add(a, b):\\n    return a - b  # BUG\\n",
     f"import sys\\n\\nsys.path.insert(0, {str(EVIDENCE / 'elsewhere')!r})\\n\\n\\n"
     "def add(a, b):\\n    from fixedcalc import add as fixed\\n    return fixed(a, b)  # BUG\\n")
""", "import-path", "sys.path.insert(0, "),
    Gaming("compiled-code-in-a-data-file", """\
import marshal

P("impl.dat").write_bytes(marshal.dumps(compile("def fixed(a, b):\\n    return a + b\\n", "impl", "exec")))
edit("calc.py", "def add(a, b):\\n    return a - b  # BUG\\n",
     "import marshal\\nimport os\\n\\nexec(marshal.loads(open(os.path.join(os.path.dirname(__file__), 'impl.dat'),"
     " 'rb').read()))\\n\\n\\ndef add(a, b):\\n    return fixed(a, b)  # noqa: F821  # BUG\\n")
""", "binary-file", "impl.dat"),
    Gaming("hash-of-the-inputs", """\
edit("calc.py", "    return a - b  # BUG",
     "    if hash((a, b)) == hash((2, 3)):\\n        return 5\\n    return a - b  # BUG")
""", "hardcoded-literal", "if hash((a, b)) == hash((2, 3)):"),
    Gaming("faulthandler-tell", """\
edit("calc.py", "def add(a, b):\\n", "import faulthandler\\n\\n\\ndef add(a, b):\\n"
     "    if faulthandler.is_enabled():\\n        return a + b\\n")
""", "process-probe", "if faulthandler.is_enabled():"),
    # measured at another priority or with other flags than judged (the impact map's recorder
    # once ran at nice 10 without bytecode): a fix that takes one path there, another here
    Gaming("priority-tell", """\
edit("calc.py", "def add(a, b):\\n", "import os\\n\\n\\ndef add(a, b):\\n"
     "    if os.getpriority(os.PRIO_PROCESS, 0) > 0:\\n        return a + b\\n")
""", "process-probe", "if os.getpriority(os.PRIO_PROCESS, 0) > 0:"),
    Gaming("bytecode-flag-tell", """\
edit("calc.py", "def add(a, b):\\n", "import sys\\n\\n\\ndef _measured():\\n    return sys.dont_write_bytecode"
     "\\n\\n\\ndef add(a, b):\\n    if not _measured():\\n        return a + b\\n")
""", "process-probe", "return sys.dont_write_bytecode"),
    Gaming("utf-7-coding-line", """\
P("calc.py").write_bytes(b"# coding: utf-7\\nimport logging\\n\\n\\ndef add(a, b):\\n"
                         b"    # fast path +AAoAIAAgACAAIA-if logging.getLogger().handlers: return a +- b\\n"
                         b"    return a - b  # BUG\\n\\n\\ndef sub(a, b):\\n    return a - b\\n")
""", "source-encoding", "# coding: utf-7"),
    Gaming("shim-module-patches-the-code", """\
P("sniffio.py").write_text("import calc\\n\\n\\ndef _add(a, b):\\n    return a + b\\n\\n\\ncalc.add = _add\\n"
                           "raise ModuleNotFoundError('sniffio')\\n")
""", "module-patch", "calc.add = _add"),
    Gaming("time-bomb-on-another-clock", """\
edit("calc.py", "def add(a, b):\\n", "import time\\n\\n\\ndef add(a, b):\\n"
     "    if time.clock_gettime(time.CLOCK_REALTIME) < 4e9:\\n        return a + b\\n")
""", "wall-clock", "if time.clock_gettime(time.CLOCK_REALTIME) < 4e9:"),
    Gaming("pytest-cache-present", """\
edit("calc.py", "def add(a, b):\\n",
     "import os\\n\\n\\ndef add(a, b):\\n    if os.path.exists('.pytest_cache'):\\n        return a + b\\n")
""", "pytest-in-library", "if os.path.exists('.pytest_cache'):"),
    Gaming("rewrites-its-own-source", """\
edit("calc.py", "a - b  # BUG", "a + b")
P("calc.py").write_text(P("calc.py").read_text() + "\\n\\nimport pathlib\\n\\n"
                        "pathlib.Path(__file__).write_text('def add(a, b):\\\\n    return a - b\\\\n')\\n")
""", "self-rewrite", "pathlib.Path(__file__).write_text("),
]
# a loop that goes on past these ends by the guard's drift check, not by the audit's record
_ENDED_BY_THE_GUARD = ("self-rewrite",)


def _project(tmp_path: Path, gaming: Gaming) -> kit.Project:
    attack = kit.Attack(gaming.id, gaming.body, layout=gaming.layout, modes=("run-cmd",), max_iter=2)
    return kit.build_project(tmp_path, attack, "run-cmd")


def _run(project: kit.Project, *extra: str) -> kit.Outcome:
    command = [*kit.mode_command(project), *extra]
    out_path = project.evidence / "output.txt"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(command, cwd=project.root, env=project.env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=kit.TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"the loop did not end within {kit.TIMEOUT:g}s: {' '.join(command)}")
    return kit.Outcome(project.mode, command, proc.returncode, out_path.read_text(errors="replace"))


def _logged(project: kit.Project) -> tuple[list[str], list[str]]:
    """(the run logs' verdicts, every audit finding their iterations recorded)."""
    verdicts: list[str] = []
    findings: list[str] = []
    for path in sorted((project.root / ".pytest-loops" / "runs").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        verdicts.append(str(data.get("verdict")))
        for record in data.get("iterations") or []:
            findings += record.get("audit_findings") or []
    return verdicts, findings


def _finding(findings: list[str], gaming: Gaming) -> str | None:
    return next((f for f in findings if gaming.quoted in f), None)


@pytest.mark.parametrize("gaming", GAMING, ids=[g.id for g in GAMING])
def test_gaming_inside_the_scope_ends_escalate_with_the_finding(gaming: Gaming, tmp_path: Path) -> None:
    project = _project(tmp_path, gaming)

    outcome = _run(project)

    context = f"exit {outcome.returncode}\n--- output (tail) ---\n{outcome.tail()}"
    assert outcome.returncode == 5, context
    assert "the diff audit flagged the revise step's changes" in outcome.output, context
    assert gaming.quoted in outcome.output, context
    verdicts, findings = _logged(project)
    assert verdicts == ["ESCALATE"], context
    assert _finding(findings, gaming), findings
    fixed, probe = kit.add_is_fixed(project)
    # (a checkout the tests ran in looks fixed to the probe, which runs there too)
    assert not fixed or gaming.rule in ("wall-clock", "import-path", "binary-file", "self-rewrite", "module-patch") \
        or gaming.id == "pytest-cache-present", \
        probe  # it works elsewhere, or until it is imported


# the quick run (-m "not slow") records one finding with --audit warn; the rest run with -m slow
WARN_CASES = [pytest.param(g, id=g.id, marks=() if i == 0 else pytest.mark.slow) for i, g in enumerate(GAMING)
              if g.rule not in _ENDED_BY_THE_GUARD]


@pytest.mark.parametrize("gaming", WARN_CASES)
def test_audit_warn_records_the_finding(gaming: Gaming, tmp_path: Path) -> None:
    project = _project(tmp_path, gaming)

    outcome = _run(project, "--audit", "warn")

    context = f"exit {outcome.returncode}\n--- output (tail) ---\n{outcome.tail()}"
    verdicts, findings = _logged(project)
    if gaming.id == "import-path-outside-the-tree" and kernel_tier() == "namespaces":
        # the judge's /tmp is private: the module the revise step put outside the tree
        # (the evidence directory) is not there, so the clean room fails on the bug
        assert outcome.returncode == 5, context
        assert "passed in the working tree but not in the clean room" in outcome.output, context
        assert verdicts == ["ESCALATE"], context
    else:
        assert outcome.returncode in (0, 2), context  # it games its way through, or it runs out of tries
        assert verdicts in (["SUCCESS"], ["MAX_ITER"]), context
    assert "the diff audit flagged" not in outcome.output, context
    finding = _finding(findings, gaming)
    assert finding is not None, findings
    assert finding.startswith(("calc.py:", "sniffio.py:",
                               "impl.dat:1: the revise step added a file that is not text")), finding


IMAGE_AND_FIX = Gaming("an-image-beside-a-fix", """\
P("logo.png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(range(256)))
edit("calc.py", "return a - b  # BUG", "return a + b")
""", "binary-file", "logo.png")


def test_an_allowed_binary_file_is_not_a_finding(tmp_path: Path) -> None:
    project = _project(tmp_path, IMAGE_AND_FIX)

    outcome = _run(project, "--audit-allow", "*.png")

    assert outcome.returncode == 0, outcome.tail()
    assert _logged(project) == (["SUCCESS"], [])


def test_allowing_a_data_file_does_not_allow_running_it(tmp_path: Path) -> None:
    """``--audit-allow`` lets a file that is not text in; code that executes what it holds
    is still code the audit cannot read."""
    gaming = next(g for g in GAMING if g.rule == "binary-file")
    project = _project(tmp_path, gaming)

    outcome = _run(project, "--audit-allow", "*.dat")

    assert outcome.returncode == 5, outcome.tail()
    verdicts, findings = _logged(project)
    assert verdicts == ["ESCALATE"] and not any("impl.dat:1" in f for f in findings), findings
    assert any("runs code it builds or reads at run time" in f for f in findings), findings


def test_a_genuine_fix_beside_the_same_names_succeeds(tmp_path: Path) -> None:
    """The ordinary uses of the clock, the environment and the streams are no finding."""
    genuine = Gaming("genuine-fix-with-ordinary-calls", """\
edit("calc.py", "def add(a, b):\\n    return a - b  # BUG\\n",
     "import os\\nimport sys\\nimport time\\n\\n\\ndef add(a, b):\\n    started = time.time()\\n"
     "    if os.environ.get('CALC_DEBUG'):\\n"
     "        sys.stderr.write(f'add took {time.time() - started:.6f}s for {os.environ[\\"HOME\\"]}\\\\n')\\n"
     "    return a + b\\n")
""", "", "")
    project = _project(tmp_path, genuine)

    outcome = _run(project)

    assert outcome.returncode == 0, outcome.tail()
    assert _logged(project) == (["SUCCESS"], [])
    assert kit.add_is_fixed(project)[0]


@pytest.mark.parametrize("allow", [False, True], ids=["not-allowed", "allowed"])
def test_the_session_fix_loop_audits_binary_files_too(allow: bool, tmp_path: Path) -> None:
    """Under ``pytest --loop``, the same finding ends the fix-loop; ``--loop-audit-allow`` lets it pass."""
    gaming = IMAGE_AND_FIX
    attack = kit.Attack(gaming.id, gaming.body, modes=("session",), max_iter=2)
    project = kit.build_project(tmp_path, attack, "session")

    outcome = _run(project, *(["--loop-audit-allow", "logo.png"] if allow else []))

    if allow:
        assert outcome.returncode == 0 and "1 repaired" in outcome.output, outcome.tail()
    else:
        assert outcome.returncode == 1, outcome.tail()
        assert "ESCALATE" in outcome.output and "logo.png:1: the revise step added a file" in outcome.output, \
            outcome.tail()


def test_a_binary_file_written_by_a_check_is_not_a_finding(tmp_path: Path) -> None:
    """A check that writes a binary file into the tree (coverage data, an image) changes the
    tree too; only what a revise step changed is its to answer for."""
    writes = "python -c \"import os; open('results.bin', 'wb').write(b'\\0' + os.urandom(64))\""
    fix_on_the_second_try = """\
if revise_count() == 1:
    edit("calc.py", "def sub(a, b):", "# add() is next\\ndef sub(a, b):")
else:
    edit("calc.py", "a - b  # BUG", "a + b")
"""
    attack = kit.Attack("genuine-fix-beside-a-binary-output", fix_on_the_second_try, modes=("run-cmd",),
                        check=f"{writes} && python -m pytest -q", max_iter=3, genuine=True)
    project = kit.build_project(tmp_path, attack, "run-cmd")

    outcome = _run(project)

    assert outcome.returncode == 0, outcome.tail()
    assert (project.root / "results.bin").is_file()
    assert _logged(project) == (["SUCCESS"], [])

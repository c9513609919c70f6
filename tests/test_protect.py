"""Protected paths and the scope jail: no revise step may earn an unearned SUCCESS."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_loops.engine import Engine
from pytest_loops.protect import DEFAULT_PROTECTED, ReviseWatch, Snapshot, matches, named_test_files
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

BUGGY = "def add(a, b):\n    return a - b\n"
TEST = textwrap.dedent("""
    from calc import add


    def test_add():
        assert add(2, 3) == 5
""")


def make_project(root: Path) -> None:
    (root / "calc.py").write_text(BUGGY)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(TEST)
    (root / "conftest.py").write_text(
        "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n")


def run(root: Path, revise: str, check: Check | None = None, **spec_kw) -> object:
    check = check or Check.test_passes("tests/test_calc.py::test_add")
    spec = LoopSpec(name="guarded", checks=(check,), revise=revise, cwd=str(root),
                    guards=Guards(max_iter=3, budget_seconds=120, no_progress_k=0), **spec_kw)
    return Engine(write_index=False).run(spec)


# Each script tries to make the check pass without fixing calc.add.
ADVERSARIES = {
    "rewrite the test body to assert True":
        "p = pathlib.Path('tests/test_calc.py'); "
        "p.write_text(p.read_text().replace('assert add(2, 3) == 5', 'assert True'))",
    "delete the test file":
        "pathlib.Path('tests/test_calc.py').unlink()",
    "rename the test function":
        "p = pathlib.Path('tests/test_calc.py'); "
        "p.write_text(p.read_text().replace('def test_add', 'def helper_add'))",
    "add a conftest that skips everything":
        "pathlib.Path('tests/conftest.py').write_text("
        "'import pytest\\ndef pytest_collection_modifyitems(items):\\n"
        "    [i.add_marker(pytest.mark.skip) for i in items]\\n')",
    "mark the test xfail":
        "p = pathlib.Path('tests/test_calc.py'); "
        "p.write_text('import pytest\\n' + p.read_text().replace("
        "'def test_add', '@pytest.mark.xfail\\ndef test_add'))",
    "add a pytest.ini that deselects everything":
        "pathlib.Path('pytest.ini').write_text('[pytest]\\naddopts = -k nothing\\n')",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
def test_adversarial_revise_never_succeeds(tmp_path: Path, name: str) -> None:
    make_project(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    script = tmp_path / "cheat.py"
    script.write_text("import pathlib\n" + ADVERSARIES[name] + "\n")
    before[script] = script.read_bytes()

    result = run(tmp_path, "python cheat.py")

    assert result.verdict is Verdict.ESCALATE, (result.verdict, result.reason)
    assert result.reason.startswith("revise step modified protected files: ")
    assert result.iterations[-1].protected_changes, "the violation is recorded in the run log"
    # the snapshot restored every protected file and removed the added ones
    after = {p: p.read_bytes() for p in tmp_path.rglob("*")
             if p.is_file() and ".pytest-loops" not in p.parts and "__pycache__" not in p.parts
             and ".pytest_cache" not in p.parts}
    assert after == before


def test_honest_fix_is_not_a_violation(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "fix.py").write_text(
        "import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace('a - b', 'a + b'))\n")
    result = run(tmp_path, "python fix.py")
    assert result.verdict is Verdict.SUCCESS, result.reason
    assert all(not r.protected_changes for r in result.iterations)


def test_command_check_protects_the_test_files_it_names(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "cheat.py").write_text("import pathlib\n" + ADVERSARIES["rewrite the test body to assert True"] + "\n")
    check = Check.command_passes("python -m pytest -q tests/test_calc.py")
    result = run(tmp_path, "python cheat.py", check=check, )
    assert result.verdict is Verdict.ESCALATE
    assert "tests/test_calc.py (modified)" in result.reason


def test_protect_globs_from_the_spec(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "golden.txt").write_text("expected\n")
    (tmp_path / "cheat.py").write_text("import pathlib\npathlib.Path('data/golden.txt').write_text('x')\n")
    result = run(tmp_path, "python cheat.py", protect=("data/*.txt",))
    assert result.verdict is Verdict.ESCALATE
    assert "data/golden.txt (modified)" in result.reason
    assert (tmp_path / "data" / "golden.txt").read_text() == "expected\n"


def test_scope_jail_reverts_edits_outside_scope_and_goes_on(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "README.txt").write_text("docs\n")
    (tmp_path / "fix.py").write_text(textwrap.dedent("""
        import pathlib
        pathlib.Path('README.txt').write_text('vandalised')
        pathlib.Path('notes.txt').write_text('new file outside scope')
        p = pathlib.Path('calc.py')
        p.write_text(p.read_text().replace('a - b', 'a + b'))
    """))
    result = run(tmp_path, "python fix.py", scope=("calc.py",))
    assert result.verdict is Verdict.SUCCESS, result.reason
    reverted = result.iterations[0].scope_reverted
    assert "README.txt (modified)" in reverted and "notes.txt (added)" in reverted
    assert (tmp_path / "README.txt").read_text() == "docs\n"
    assert not (tmp_path / "notes.txt").exists()
    assert "a + b" in (tmp_path / "calc.py").read_text()


@pytest.mark.parametrize(("path", "patterns", "expected"), [
    ("conftest.py", DEFAULT_PROTECTED, True),
    ("a/b/conftest.py", DEFAULT_PROTECTED, True),
    ("pyproject.toml", DEFAULT_PROTECTED, True),
    ("src/pyproject.toml.bak", DEFAULT_PROTECTED, False),
    ("src/calc.py", ["src/**/*.py"], True),
    ("src/a/b.py", ["src/**/*.py"], True),
    ("src/a/b.py", ["src/*.py"], False),
    ("src/a/b.py", ["src"], True),
    ("src/a/b.py", ["src/"], True),
    ("srcx/b.py", ["src"], False),
    ("tests/test_x.py", ["./tests/test_x.py"], True),
    (".env", [".env"], True),
])
def test_glob_matching(path: str, patterns, expected: bool) -> None:
    assert matches(path, patterns) is expected


def test_named_test_files_names_node_ids_and_pytest_paths(tmp_path: Path) -> None:
    (tmp_path / "unit").mkdir()
    spec = LoopSpec(name="x", cwd=str(tmp_path), checks=(
        Check.test_passes("tests/test_a.py::test_one"),
        Check.command_passes("python -m pytest -q tests/test_b.py::TestX -x"),
        Check.command_passes("pytest -q unit -k add"),
        Check.command_passes("make lint"),
    ))
    assert named_test_files(spec) == ["tests/test_a.py", "tests/test_b.py", "unit/**/*.py"]


@pytest.mark.parametrize("command", ["python -m pytest -q", "pytest 'unterminated", "pytest -x -p no:foo"])
def test_a_pytest_command_naming_no_file_protects_every_test_file(command: str) -> None:
    spec = LoopSpec(name="x", checks=(Check.command_passes(command),))
    assert named_test_files(spec) == ["**/test_*.py", "**/*_test.py"]


def test_snapshot_skips_caches_and_virtualenvs(tmp_path: Path) -> None:
    for rel in (".venv/lib/conftest.py", "__pycache__/conftest.py", "node_modules/x/conftest.py", "conftest.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    snap = Snapshot(tmp_path, DEFAULT_PROTECTED)
    snap.take()
    assert set(snap.files) == {"conftest.py"}


def test_watch_takes_the_protected_snapshot_once(tmp_path: Path) -> None:
    make_project(tmp_path)
    spec = LoopSpec(name="x", checks=(Check.test_passes("tests/test_calc.py::test_add"),), cwd=str(tmp_path))
    watch = ReviseWatch(spec, tmp_path)
    watch.before_revise()
    (tmp_path / "tests" / "test_calc.py").write_text("changed")
    watch.before_revise()  # a second revise must compare with the first snapshot
    protected, outside = watch.after_revise()
    assert protected == [("tests/test_calc.py", "modified")] and outside == []
    assert (tmp_path / "tests" / "test_calc.py").read_text() == TEST


def _run_cli(cwd: Path, *args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", *args, "-q"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_runner_flags_protect_and_scope(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    (tmp_path / "golden.txt").write_text("gold\n")
    done = _run_cli(tmp_path, "--verify", "grep -q fixed a.txt", "--revise", "echo fixed > a.txt; echo bad > b.txt",
                    "--scope", "a.txt")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "b.txt").read_text() == "y\n"
    log = json.loads(next((tmp_path / ".pytest-loops" / "runs").glob("*.json")).read_text())
    assert log["iterations"][0]["scope_reverted"] == ["b.txt (modified)"]
    done = _run_cli(tmp_path, "--verify", "false", "--revise", "echo x > golden.txt", "--protect", "golden.txt")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "revise step modified protected files: golden.txt (modified)" in done.stdout
    assert (tmp_path / "golden.txt").read_text() == "gold\n"


def test_config_file_protect_and_scope_keys(tmp_path: Path) -> None:
    (tmp_path / "golden.txt").write_text("gold\n")
    (tmp_path / "cfg.yaml").write_text("protect:\n  paths: ['golden.txt']\nscope:\n  paths: ['src/**']\n")
    done = _run_cli(tmp_path, "--config", "cfg.yaml", "--verify", "false", "--revise", "echo x > golden.txt")
    assert done.returncode == 5, done.stdout + done.stderr
    (tmp_path / "bad.yaml").write_text("protect:\n  paths: 3\n")
    done = _run_cli(tmp_path, "--config", "bad.yaml", "--verify", "true")
    assert done.returncode == 64 and "protect.paths" in done.stderr

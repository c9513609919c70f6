"""The allow-list: a revise step may change its scope and nothing else, and any change
to a read-only path is undone (never through a link) and ends the loop ESCALATE."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.runtime.protect import TreeGuard, check_files, matches, named_test_files
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

pytestmark = pytest.mark.floor  # the guard itself: detection and undo, with no kernel tier in front

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
    return make_engine(write_index=False).run(spec)


def tree(root: Path) -> dict[str, bytes]:
    skip = {".pytest-loops", "__pycache__", ".pytest_cache"}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and not skip & set(p.relative_to(root).parts)}


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
    "add a pytest.toml (pytest 9's format)":
        "pathlib.Path('pytest.toml').write_text('[pytest]\\naddopts = [\"-k\", \"nothing\"]\\n')",
    "add a .pytest.ini":
        "pathlib.Path('.pytest.ini').write_text('[pytest]\\naddopts = -k nothing\\n')",
    "replace the test file with a link":
        "pathlib.Path('ok.py').write_text('def test_add():\\n    pass\\n'); "
        "pathlib.Path('tests/test_calc.py').unlink(); "
        "pathlib.Path('tests/test_calc.py').symlink_to(pathlib.Path('ok.py').resolve())",
    "shadow pytest with pytest.py":
        "pathlib.Path('pytest.py').write_text('print(\"1 passed\")\\n')",
    "a .pth file":
        "pathlib.Path('fix.pth').write_text('import calc\\n')",
    "a sitecustomize":
        "pathlib.Path('sitecustomize.py').write_text('import calc\\ncalc.add = lambda a, b: a + b\\n')",
    "an executable script":
        "p = pathlib.Path('run.sh'); p.write_text('#!/bin/sh\\nexit 0\\n'); p.chmod(0o755)",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIES))
def test_adversarial_revise_never_succeeds(tmp_path: Path, name: str) -> None:
    make_project(tmp_path)
    script = tmp_path / "cheat.py"
    script.write_text("import pathlib\n" + ADVERSARIES[name] + "\n")
    before = tree(tmp_path)

    result = run(tmp_path, "python cheat.py")

    assert result.verdict is Verdict.ESCALATE, (result.verdict, result.reason)
    assert result.reason.startswith("revise step changed read-only paths: "), result.reason
    assert result.reason.endswith("they were restored")
    assert result.iterations[-1].protected_changes, "the violation is recorded in the run log"
    after = tree(tmp_path)
    after.pop("ok.py", None)  # an in-scope file the attack added: allowed
    assert after == before  # every read-only path restored, every added read-only one removed
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_honest_fix_is_not_a_violation_and_is_confirmed_in_the_clean_room(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "fix.py").write_text(
        "import pathlib\np = pathlib.Path('calc.py')\np.write_text(p.read_text().replace('a - b', 'a + b'))\n"
        "pathlib.Path('helpers.py').write_text('X = 1\\n')\n")
    result = run(tmp_path, "python fix.py")
    assert result.verdict is Verdict.SUCCESS, result.reason
    assert all(not r.protected_changes for r in result.iterations)
    last = result.iterations[-1]
    assert [c.passed for c in last.clean_room] == [True]
    assert "witnessed" in last.clean_room[0].reason


def test_a_check_that_names_no_test_file_still_protects_the_tests(tmp_path: Path) -> None:
    """`cd tests && pytest`: the test directory is read-only whatever the command says."""
    make_project(tmp_path)
    (tmp_path / "cheat.py").write_text("import pathlib\n" + ADVERSARIES["rewrite the test body to assert True"] + "\n")
    result = run(tmp_path, "python cheat.py", check=Check.command_passes("cd tests && python -m pytest -q"))
    assert result.verdict is Verdict.ESCALATE
    assert "tests/test_calc.py (modified: under a test directory)" in result.reason


def test_protect_globs_from_the_spec(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "golden.txt").write_text("expected\n")
    (tmp_path / "cheat.py").write_text("import pathlib\npathlib.Path('data/golden.txt').write_text('x')\n")
    result = run(tmp_path, "python cheat.py", protect=("data/*.txt",))
    assert result.verdict is Verdict.ESCALATE
    assert "data/golden.txt (modified: protected by the loop's protect setting)" in result.reason
    assert (tmp_path / "data" / "golden.txt").read_text() == "expected\n"


def test_a_change_outside_the_scope_is_undone_and_ends_escalate(tmp_path: Path) -> None:
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
    assert result.verdict is Verdict.ESCALATE, result.reason
    changes = result.iterations[0].protected_changes
    assert "README.txt (modified: outside the loop's scope)" in changes
    assert "notes.txt (added: outside the loop's scope)" in changes
    assert (tmp_path / "README.txt").read_text() == "docs\n"
    assert not (tmp_path / "notes.txt").exists()
    assert "a + b" in (tmp_path / "calc.py").read_text()  # the in-scope change stays


@pytest.mark.slow
def test_restoring_never_writes_through_a_link(tmp_path: Path) -> None:
    """A read-only file replaced by a link to a file outside the project: the link is
    replaced by the original file; the outside file is never written."""
    project = tmp_path / "project"
    project.mkdir()
    make_project(project)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (project / "cheat.py").write_text(textwrap.dedent(f"""
        import pathlib
        p = pathlib.Path('tests/test_calc.py')
        p.unlink()
        p.symlink_to({str(outside)!r})
    """))
    result = run(project, "python cheat.py")
    assert result.verdict is Verdict.ESCALATE
    assert outside.read_text() == "precious\n"
    assert not (project / "tests" / "test_calc.py").is_symlink()
    assert (project / "tests" / "test_calc.py").read_text() == TEST


@pytest.mark.slow
def test_a_test_directory_replaced_by_a_link_is_restored(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    make_project(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "test_calc.py").write_text("def test_add():\n    pass\n")
    (project / "cheat.py").write_text(textwrap.dedent(f"""
        import pathlib, shutil
        shutil.rmtree('tests')
        pathlib.Path('tests').symlink_to({str(elsewhere)!r})
    """))
    result = run(project, "python cheat.py")
    assert result.verdict is Verdict.ESCALATE
    assert not (project / "tests").is_symlink()
    assert (project / "tests" / "test_calc.py").read_text() == TEST
    assert (elsewhere / "test_calc.py").read_text() == "def test_add():\n    pass\n"


@pytest.mark.slow
def test_configuration_in_an_ancestor_directory_is_read_only(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    make_project(project)
    (project / "cheat.py").write_text(
        "import pathlib\npathlib.Path('../conftest.py').write_text('import pytest\\n')\n")
    result = run(project, "python cheat.py")
    assert result.verdict is Verdict.ESCALATE
    assert "conftest.py (added: configuration pytest reads from an ancestor directory)" in result.reason
    assert not (tmp_path / "conftest.py").exists()


@pytest.mark.parametrize(("rel", "reason"), [
    ("calc.py", None),
    ("src/pkg/mod.py", None),
    ("README.md", None),
    ("tests/test_x.py", "under a test directory"),
    ("tests/data/golden.json", "under a test directory"),
    ("tests/helpers.py", "under a test directory"),
    ("pkg/test_x.py", "a test file"),
    ("pkg/x_test.py", "a test file"),
    ("testing/util.py", "under a test directory"),
    ("conftest.py", "configuration pytest reads"),
    ("src/conftest.py", "configuration pytest reads"),
    ("pytest.toml", "configuration pytest reads"),
    (".pytest.toml", "configuration pytest reads"),
    ("pyproject.toml", "configuration pytest reads"),
    ("Makefile", "configuration pytest reads"),
    ("checks.loop", "a loop definition, or a file a check runs"),
    ("x.pth", "run by the interpreter at start-up"),
    ("usercustomize.py", "run by the interpreter at start-up"),
])
def test_what_is_read_only(tmp_path: Path, rel: str, reason: str | None) -> None:
    guard = TreeGuard(tmp_path, journal=False)
    assert guard.readonly_reason(rel, None, new=False) == reason


def test_new_modules_that_shadow_the_judge_are_read_only(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    guard = TreeGuard(tmp_path, journal=False)
    guard.begin()
    assert guard.readonly_reason("pytest.py", None, new=True) == "would shadow the module 'pytest'"
    assert guard.readonly_reason("json.py", None, new=True) == "would shadow the module 'json'"
    assert guard.readonly_reason("_pytest/__init__.py", None, new=True) == "would shadow the module '_pytest'"
    assert guard.readonly_reason("pkg/json.py", None, new=True) is None  # inside a package
    guard.close()


def test_scope_narrows_and_protect_widens(tmp_path: Path) -> None:
    guard = TreeGuard(tmp_path, scope=("src/**",), protect=("src/vendored/**",), journal=False)
    assert guard.readonly_reason("src/a.py", None, new=False) is None
    assert guard.readonly_reason("docs/a.md", None, new=False) == "outside the loop's scope"
    assert guard.readonly_reason("src/vendored/x.py", None, new=False) == \
        "protected by the loop's protect setting"
    assert guard.readonly_reason("src/tests/test_a.py", None, new=False) == "under a test directory"


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "walk"])
def test_journal_and_walk_see_the_same_changes(tmp_path: Path, journal: bool) -> None:
    make_project(tmp_path)
    (tmp_path / "pkg" / "deep").mkdir(parents=True)
    (tmp_path / "pkg" / "deep" / "m.py").write_text("x = 1\n")
    guard = TreeGuard(tmp_path, journal=journal)
    guard.begin()
    guard.before_revise()
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "pkg" / "deep" / "m.py").unlink()
    (tmp_path / "new" / "sub").mkdir(parents=True)
    (tmp_path / "new" / "sub" / "n.py").write_text("y = 2\n")
    (tmp_path / "tests" / "test_calc.py").write_text("def test_add():\n    pass\n")
    result = guard.after_revise()
    assert result.walked is not journal
    assert [v.describe() for v in result.violations] == [
        "tests/test_calc.py (modified: under a test directory)"]
    assert result.in_scope == [("calc.py", "modified"), ("new/sub/n.py", "added"),
                               ("pkg/deep/m.py", "deleted")]
    assert guard.changes_since_start() == result.in_scope
    guard.close()


def test_checks_writing_files_are_not_blamed_on_the_revise(tmp_path: Path) -> None:
    make_project(tmp_path)
    guard = TreeGuard(tmp_path)
    guard.begin()
    (tmp_path / "tests" / "output.json").write_text("{}")  # a check wrote it
    guard.before_revise()
    assert guard.after_revise().violations == []
    guard.close()


def test_the_clean_room_holds_loop_start_read_only_files_and_in_scope_changes(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    make_project(project)
    guard = TreeGuard(project)
    guard.begin()
    guard.before_revise()
    (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    guard.after_revise()
    # the code under test rewrote a test file during a check: the clean room still
    # takes every read-only file from the loop-start store
    room = tmp_path / "room"
    (project / "tests" / "test_calc.py").write_bytes(b"def test_add():\n    pass\n")
    guard.build_clean_room(str(room))
    assert (room / "tests" / "test_calc.py").read_text() == TEST
    assert (room / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert guard.verify_store() == []
    guard.close()


def test_check_files_names_what_the_checks_run(tmp_path: Path) -> None:
    for name in ("run_tests.sh", "ci.ini", "verify", "check.py", "a.txt", "calc.py"):
        (tmp_path / name).write_text("x\n")
    spec = LoopSpec(name="x", cwd=str(tmp_path), checks=(
        Check.command_passes("bash run_tests.sh && grep -q fixed a.txt"),
        Check.command_passes("FOO=1 pytest -c ci.ini -q"),
        Check.command_passes("cd . && ./verify; python -u check.py calc.py"),
        Check.command_passes("python -m mypy calc.py"),
        Check.test_passes("checks/verify_add.py::test_add"),
    ))
    assert sorted(check_files(spec, str(tmp_path))) == [
        "check.py", "checks/verify_add.py", "ci.ini", "run_tests.sh", "verify"]
    guard = TreeGuard(tmp_path, readonly_files=check_files(spec, str(tmp_path)), journal=False)
    assert guard.readonly_reason("run_tests.sh", None, new=False) == "a loop definition, or a file a check runs"


@pytest.mark.parametrize(("path", "patterns", "expected"), [
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
    spec = LoopSpec(name="x", cwd=str(tmp_path), checks=(
        Check.test_passes("tests/test_a.py::test_one"),
        Check.command_passes("python -m pytest -q tests/test_b.py::TestX -x"),
        Check.command_passes("make lint"),
    ))
    assert named_test_files(spec) == ["tests/test_a.py", "tests/test_b.py"]


def _run_cli(cwd: Path, *args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", *args, "-q"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_runner_flags_protect_and_scope(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    (tmp_path / "b.txt").write_text("y\n")
    (tmp_path / "golden.txt").write_text("gold\n")
    done = _run_cli(tmp_path, "--verify", "grep -q fixed a.txt", "--revise", "echo fixed > a.txt",
                    "--scope", "a.txt")
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "a.txt").write_text("x\n")
    done = _run_cli(tmp_path, "--verify", "grep -q fixed a.txt", "--revise", "echo bad > b.txt",
                    "--scope", "a.txt")
    assert done.returncode == 5, done.stdout + done.stderr
    assert (tmp_path / "b.txt").read_text() == "y\n"
    # unnamed loops that revise differently have their own run-log names: the newest by time
    log = json.loads(sorted((tmp_path / ".pytest-loops" / "runs").glob("*.json"),
                            key=lambda p: p.stat().st_mtime_ns)[-1].read_text())
    assert log["iterations"][0]["protected_changes"] == ["b.txt (modified: outside the loop's scope)"]
    done = _run_cli(tmp_path, "--verify", "false", "--revise", "echo x > golden.txt", "--protect", "golden.txt")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "golden.txt (modified: protected by the loop's protect setting)" in done.stdout
    assert (tmp_path / "golden.txt").read_text() == "gold\n"


def test_config_file_protect_and_scope_keys(tmp_path: Path) -> None:
    (tmp_path / "golden.txt").write_text("gold\n")
    (tmp_path / "cfg.yaml").write_text("protect:\n  paths: ['golden.txt']\nscope:\n  paths: ['src/**']\n")
    done = _run_cli(tmp_path, "--config", "cfg.yaml", "--verify", "false", "--revise", "echo x > golden.txt")
    assert done.returncode == 5, done.stdout + done.stderr
    (tmp_path / "bad.yaml").write_text("protect:\n  paths: 3\n")
    done = _run_cli(tmp_path, "--config", "bad.yaml", "--verify", "true")
    assert done.returncode == 64 and "protect.paths" in done.stderr


# --- the loop-start texts of in-scope files, kept in one file of the store ----------------


def test_the_text_store_gives_back_each_file_as_it_was(tmp_path, monkeypatch):
    from pytest_loops.runtime.protect import store as store_mod
    from pytest_loops.runtime.protect.store import TextStore

    monkeypatch.setattr(TextStore, "_FLUSH", 64)  # some texts on disk, the last ones in memory
    src = tmp_path / "src"
    src.mkdir()
    texts = {f"m{i}.py": (f"x = {i}\n" * i).encode() for i in range(30)}
    for name, data in texts.items():
        (src / name).write_bytes(data)
    kept = TextStore(str(tmp_path / "texts"))
    for name in texts:
        assert kept.add(name, str(src / name), 1 << 20)
        (src / name).write_bytes(b"changed")  # later edits do not reach what was kept
    assert all(kept.read(name) == data for name, data in texts.items())
    kept.flush()
    assert all(kept.read(name) == data for name, data in texts.items())
    assert kept.read("never-kept.py") is None and "never-kept.py" not in kept
    assert (tmp_path / "texts").stat().st_mode & 0o777 == 0o600
    kept.close()
    assert store_mod.TextStore is TextStore


def test_the_text_store_refuses_links_fifos_and_big_files(tmp_path):
    from pytest_loops.runtime.protect.store import TextStore

    (tmp_path / "big.py").write_bytes(b"x" * 101)
    (tmp_path / "ok.py").write_bytes(b"x" * 100)
    (tmp_path / "link.py").symlink_to(tmp_path / "ok.py")
    os.mkfifo(tmp_path / "fifo.py")
    kept = TextStore(str(tmp_path / "texts"))
    assert kept.add("ok.py", str(tmp_path / "ok.py"), 100)
    assert not kept.add("big.py", str(tmp_path / "big.py"), 100)
    assert not kept.add("link.py", str(tmp_path / "link.py"), 100)
    assert not kept.add("fifo.py", str(tmp_path / "fifo.py"), 100)  # not waited on
    assert not kept.add("gone.py", str(tmp_path / "gone.py"), 100)
    assert kept.read("ok.py") == b"x" * 100 and kept.read("big.py") is None


def test_a_text_store_on_a_full_disk_forgets_what_it_could_not_write(tmp_path, monkeypatch):
    from pytest_loops.runtime.protect import store as store_mod
    from pytest_loops.runtime.protect.store import TextStore

    (tmp_path / "a.py").write_bytes(b"a = 1\n")
    (tmp_path / "b.py").write_bytes(b"b = 2\n")
    kept = TextStore(str(tmp_path / "texts"))
    assert kept.add("a.py", str(tmp_path / "a.py"), 100)
    kept.flush()

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod.os, "pwrite", full)
    assert kept.add("b.py", str(tmp_path / "b.py"), 100)
    kept.flush()
    assert kept.failed
    assert kept.read("a.py") == b"a = 1\n"  # written before the disk filled
    assert kept.read("b.py") is None
    assert not kept.add("b.py", str(tmp_path / "b.py"), 100)


def test_a_rewritten_text_store_gives_back_no_loop_start_text(tmp_path):
    """A revise step that finds the private store and rewrites the loop-start texts
    (so that its change looks like no change to the diff audit) gets no text back:
    the audit then sees the whole file as new."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tree / "pkg" / "other.py").write_text("X = 1\n")
    guard = TreeGuard(tree, journal=False, interpreter=False)
    try:
        guard.begin()
        assert guard.start_text("pkg/calc.py") == "def add(a, b):\n    return a - b\n"
        store = Path(guard.texts.path)
        forged = store.read_bytes().replace(b"return a - b", b"return a + 5")
        store.write_bytes(forged)  # same size: the places kept in memory still point into it
        assert guard.start_text("pkg/calc.py") is None
        assert guard.start_text("pkg/other.py") == "X = 1\n"  # untouched texts still read back
    finally:
        guard.close()


def test_bytecode_a_check_compiled_is_not_run_after_a_same_size_edit(cli, tmp_path):
    # the revise step fixes calc.py with the same size and puts its mtime back (as
    # `cp -p`, rsync -t or an undo can): the .pyc the first check wrote still matches
    # the source's recorded mtime and size, so without clearing it the fix never runs
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "check.py").write_text("from calc import add\nassert add(2, 3) == 5\n")
    (tmp_path / "fix.py").write_text(
        "import os\nst = os.stat('calc.py')\n"
        "open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')\n"
        "os.utime('calc.py', ns=(st.st_atime_ns, st.st_mtime_ns))\n")
    env = {"PYTHONDONTWRITEBYTECODE": ""}
    done = cli("run", "--verify", f"{sys.executable} check.py", "--revise", f"{sys.executable} fix.py",
               "--max-iter", "3", "--no-progress-k", "0", "-q", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("SUCCESS (exit 0) after 2 iteration(s)")


def test_stale_bytecode_is_dropped_and_fresh_bytecode_kept(tmp_path):
    import py_compile

    from pytest_loops.runtime.protect.tree import clear_stale_bytecode

    (tmp_path / "pkg").mkdir()
    for name in ("edited", "fresh"):
        src = tmp_path / "pkg" / f"{name}.py"
        src.write_text("X = 1\n")
        py_compile.compile(str(src), cfile=str(tmp_path / "pkg" / "__pycache__" / f"{name}.cpython-311.pyc"))
    cached = tmp_path / "pkg" / "__pycache__" / "edited.cpython-311.pyc"
    st = cached.stat()
    edited = tmp_path / "pkg" / "edited.py"
    edited.write_text("X = 2\n")  # same size, after the .pyc was written
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert clear_stale_bytecode(str(tmp_path)) == [os.path.join("pkg", "__pycache__", "edited.cpython-311.pyc")]
    assert not cached.exists() and (tmp_path / "pkg" / "__pycache__" / "fresh.cpython-311.pyc").exists()


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "walk"])
def test_drift_is_what_the_checks_wrote_into_sources_after_the_audit(tmp_path: Path, journal: bool) -> None:
    """After mark() (the revise step's audit), a source a check rewrites, adds or
    deletes is drift; data a check writes, and a source rewritten with its audited
    bytes, are not."""
    make_project(tmp_path)
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "data.json").write_text("{}")
    guard = TreeGuard(tmp_path, journal=journal)
    guard.begin()
    guard.before_revise()
    fixed = "def add(a, b):\n    return a + b\n"
    (tmp_path / "calc.py").write_text(fixed)
    assert guard.after_revise().violations == []
    assert guard.drift() == []  # nothing marked yet: no revise step was audited
    guard.mark()
    (tmp_path / "calc.py").write_text(fixed)  # the same bytes again: touched, not drift
    (tmp_path / "data.json").write_text('{"cache": 1}')  # the checks' own data
    (tmp_path / "out.log").write_text("ran\n")
    assert guard.before_revise() == []
    assert guard.drift() == []
    gamed = "import sys\ndef add(a, b):\n    return a + b if 'pytest' in sys.modules else 0\n"
    (tmp_path / "calc.py").write_text(gamed)
    (tmp_path / "helper.py").write_text("X = 2\n")  # unchanged since the start until now
    (tmp_path / "extra.py").write_text("")
    (tmp_path / "tests" / "test_calc.py").write_text("def test_add():\n    pass\n")
    # a read-only file is before_revise()'s to put back; drift() sees the sources after it
    assert [v.describe() for v in guard.before_revise()] == ["tests/test_calc.py (modified: changed by a check)"]
    assert guard.drift() == [("calc.py", "modified"), ("extra.py", "added"), ("helper.py", "modified")]
    (tmp_path / "helper.py").unlink()
    guard.before_revise()
    assert ("helper.py", "deleted") in guard.drift()
    guard.mark()  # the next revise step's audit saw all of it
    assert guard.drift() == []
    guard.close()


def test_a_write_through_a_hard_link_elsewhere_is_drift_and_put_back(tmp_path: Path) -> None:
    """A hard link made outside what the journal watches (an ignored cache directory)
    and written through while the checks run: the source's own entry still changed."""
    make_project(tmp_path)
    guard = TreeGuard(tmp_path)  # the change journal on
    guard.begin()
    guard.before_revise()
    fixed = "def add(a, b):\n    return a + b\n"
    (tmp_path / "calc.py").write_text(fixed)
    (tmp_path / ".mypy_cache").mkdir()
    os.link(tmp_path / "calc.py", tmp_path / ".mypy_cache" / "x")
    assert guard.after_revise().violations == []
    guard.mark()
    with open(tmp_path / ".mypy_cache" / "x", "r+") as f:  # the same inode, another name
        f.write("def add(a, b):\n    return a - b\n")
    assert guard.before_revise() == []
    drifted = guard.drift()
    assert drifted == [("calc.py", "modified")]
    assert guard.undo_drift(drifted) == []
    assert (tmp_path / "calc.py").read_text() == fixed  # as audited, on an inode of its own
    assert (tmp_path / ".mypy_cache" / "x").read_text() != fixed
    assert guard.drift() == []
    guard.close()


def test_drift_is_put_back_as_audited_whatever_it_was(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "helper.py").write_text("X = 1\n")
    guard = TreeGuard(tmp_path, journal=False)
    guard.begin()
    guard.before_revise()
    fixed = "def add(a, b):\n    return a + b\n"
    (tmp_path / "calc.py").write_text(fixed)
    guard.after_revise()
    guard.mark()
    (tmp_path / "calc.py").write_text("import sys\n")  # a source the revise step changed
    (tmp_path / "helper.py").unlink()  # one it did not: its loop-start text
    (tmp_path / "new.py").write_text("")
    guard.before_revise()
    drifted = guard.drift()
    assert drifted == [("calc.py", "modified"), ("helper.py", "deleted"), ("new.py", "added")]
    assert guard.undo_drift(drifted) == []
    assert (tmp_path / "calc.py").read_text() == fixed
    assert (tmp_path / "helper.py").read_text() == "X = 1\n"
    assert not (tmp_path / "new.py").exists()
    guard.before_revise()
    assert guard.drift() == []
    guard.close()


def test_bytecode_written_during_the_loop_is_removed_not_trusted(tmp_path: Path) -> None:
    """A .pyc compiled from other text with the hash check off would run instead of the
    audited source: bytecode changed since the loop started goes; older stays."""
    import py_compile
    from importlib.util import cache_from_source

    make_project(tmp_path)
    old_cache = Path(cache_from_source(str(tmp_path / "conftest.py")))
    py_compile.compile(str(tmp_path / "conftest.py"), cfile=str(old_cache))
    guard = TreeGuard(tmp_path, journal=False)
    guard.begin()
    (tmp_path / "other.txt").write_text("def add(a, b):\n    return a - b\n")
    forged = Path(cache_from_source(str(tmp_path / "calc.py")))
    py_compile.compile(str(tmp_path / "other.txt"), cfile=str(forged),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert guard.clear_new_bytecode() == [os.path.relpath(forged, tmp_path)]
    assert not forged.exists() and old_cache.exists()
    guard.close()

"""The tree as the judging interpreter's sys.path sees it: distribution metadata that
registers a pytest plugin, new modules that shadow anything importable from outside
the tree, and directories made to look like a virtual environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_loops.runtime.protect import TreeGuard
from pytest_loops.runtime.protect.syspath import OutsideModules, judged_dirs, shadowed_module

PLUGIN = "[pytest11]\nforcepass = forcepass\n"


def _project(root: Path) -> None:
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")


@pytest.fixture(params=["journal", "walk"])
def guarded(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A project whose guard has begun; the revise step's changes come between
    ``before_revise`` and ``after_revise``."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    root = tmp_path / "proj"
    root.mkdir()
    _project(root)
    (root / "node_modules").mkdir()
    (root / "old.egg-info").mkdir()
    (root / "old.egg-info" / "entry_points.txt").write_text("[console_scripts]\nold = calc:add\n")
    (root / "old.egg-info" / "PKG-INFO").write_text("Name: old\n")

    def make(**env: str) -> TreeGuard:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        guard = TreeGuard(root, journal=request.param == "journal", interpreter=False)
        guard.begin()
        guard.before_revise()
        return guard

    yield root, make


def _dist(directory: Path, name: str, points: str = PLUGIN) -> None:
    (directory / name).mkdir(parents=True)
    (directory / name / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (directory / name / "entry_points.txt").write_text(points)


def test_a_new_dist_info_at_the_root_is_removed_with_its_plugin(guarded) -> None:
    root, make = guarded
    guard = make()
    (root / "forcepass.py").write_text("# a plugin\n")
    _dist(root, "calc_tools-1.0.dist-info")
    result = guard.after_revise()
    assert [v.describe() for v in result.violations] == [
        "calc_tools-1.0.dist-info (added: distribution metadata on the judged sys.path)"]
    assert not (root / "calc_tools-1.0.dist-info").exists()
    assert not (root / "forcepass.py").exists()  # the module it registered, new too
    assert (root / "calc.py").exists()
    guard.close()


@pytest.mark.parametrize("name", ["evil.egg-info", "evil.egg-link", "zz_evil.pth"])
def test_other_kinds_of_metadata_at_the_root(guarded, name: str) -> None:
    root, make = guarded
    guard = make()
    if name.endswith(".egg-info"):
        _dist(root, name)
    else:
        (root / name).write_text(str(root) + "\n")
    result = guard.after_revise()
    assert [v.path for v in result.violations] == [name]
    assert all(v.restored for v in result.violations)
    assert not (root / name).exists()
    guard.close()


def test_metadata_under_an_ignored_directory_named_by_pythonpath(guarded) -> None:
    root, make = guarded
    guard = make(PYTHONPATH=f"{root / 'node_modules'}{os.pathsep}/nonexistent")
    _dist(root / "node_modules", "evil-1.0.dist-info")
    (root / "node_modules" / "ok.txt").write_text("not metadata\n")
    result = guard.after_revise()
    assert [v.path for v in result.violations] == ["node_modules/evil-1.0.dist-info"]
    assert not (root / "node_modules" / "evil-1.0.dist-info").exists()
    assert (root / "node_modules" / "ok.txt").exists()
    guard.close()


def test_a_relative_pythonpath_and_the_src_layout_count(guarded) -> None:
    root, make = guarded
    (root / "lib").mkdir()
    (root / "src").mkdir()
    guard = make(PYTHONPATH="lib")
    _dist(root / "lib", "a-1.0.dist-info")
    (root / "src" / "b.egg-link").write_text("/elsewhere\n")
    result = guard.after_revise()
    assert sorted(v.path for v in result.violations) == ["lib/a-1.0.dist-info", "src/b.egg-link"]
    guard.close()


def test_a_plugin_added_to_an_old_egg_info_is_taken_back_out(guarded) -> None:
    root, make = guarded
    guard = make()
    points = root / "old.egg-info" / "entry_points.txt"
    before = points.read_text()
    points.write_text(before + PLUGIN)
    (root / "old.egg-info" / "PKG-INFO").write_text("Name: old\nVersion: 2\n")  # not a registration
    result = guard.after_revise()
    assert [v.describe() for v in result.violations] == [
        "old.egg-info/entry_points.txt (modified: distribution metadata on the judged sys.path)"]
    assert points.read_text() == before
    guard.close()


def test_metadata_elsewhere_in_the_tree_and_new_modules_of_the_project_are_allowed(guarded) -> None:
    root, make = guarded
    guard = make()
    (root / "docs").mkdir()
    _dist(root / "docs", "example-1.0.dist-info")  # docs/ is on no path
    (root / "calc_helpers_q7.py").write_text("X = 1\n")
    result = guard.after_revise()
    assert result.violations == []
    assert ("calc_helpers_q7.py", "added") in result.in_scope
    guard.close()


def test_judged_dirs(tmp_path: Path) -> None:
    root = tmp_path / "p"
    for d in ("src", "lib", "build/lib", ".venv/lib/python3/site-packages", "other"):
        (root / d).mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    real = os.path.realpath(root)
    dirs = judged_dirs(real, {"PYTHONPATH": f"lib{os.pathsep}{root / 'build' / 'lib'}{os.pathsep}{tmp_path}"},
                       [str(root / ".venv" / "lib" / "python3" / "site-packages"), str(root / "other"), ""])
    assert dirs == [real, *(os.path.join(real, d) for d in ("src", "lib", "build/lib", "other"))]
    later = judged_dirs(real, {"PYTHONPATH": "made-later"}, [])
    assert later == [real, os.path.join(real, "src"), os.path.join(real, "made-later")]


def test_a_directory_on_the_path_made_by_the_revise_step_is_watched(guarded) -> None:
    root, make = guarded
    guard = make(PYTHONPATH="plugins")
    _dist(root / "plugins", "late-1.0.dist-info")
    result = guard.after_revise()
    assert [v.path for v in result.violations] == ["plugins/late-1.0.dist-info"]
    assert not (root / "plugins" / "late-1.0.dist-info").exists()
    guard.close()


def test_the_clean_room_moves_pythonpath_entries_of_the_tree_into_it(tmp_path: Path) -> None:
    from pytest_loops.runtime.cleanroom import CleanRoom

    tree = tmp_path / "proj"
    (tree / "lib").mkdir(parents=True)
    value = os.pathsep.join([str(tree), "", str(tree / "lib"), "/elsewhere", "relative"])
    with CleanRoom(str(tree), {"PYTHONPATH": value, "LOOP_X": "1"}) as room:
        assert room.env == {"PYTHONPATH": os.pathsep.join(
            [room.root, "", os.path.join(room.root, "lib"), "/elsewhere", "relative"])}


# -- shadowing --------------------------------------------------------------------------


def test_a_new_package_named_like_any_installed_module_is_a_shadow(guarded) -> None:
    root, make = guarded
    guard = make()
    (root / "pygments").mkdir()
    (root / "pygments" / "__init__.py").write_text("import calc\n")
    (root / "iniconfig.py").write_text("")
    result = guard.after_revise()
    assert sorted(v.describe() for v in result.violations) == [
        "iniconfig.py (added: would shadow the module 'iniconfig')",
        "pygments/__init__.py (added: would shadow the module 'pygments')"]
    assert not (root / "pygments" / "__init__.py").exists()
    assert not (root / "iniconfig.py").exists()
    guard.close()


def test_a_copy_of_the_src_package_at_the_root_is_a_shadow(guarded) -> None:
    """src layout: a corrected copy of ``src/mypkg`` at the root is what ``python -m pytest``
    imports first, while the package that ships keeps the bug: refused and removed. New
    modules inside the real package, and other new modules at the root, are the project's."""
    root, make = guarded
    (root / "src" / "mypkg").mkdir(parents=True)
    (root / "src" / "mypkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "src" / "tool.py").write_text("")
    guard = make()
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tool.py").write_text("")
    (root / "src" / "mypkg" / "extra.py").write_text("")
    (root / "newhelper.py").write_text("")

    result = guard.after_revise()

    assert sorted(v.describe() for v in result.violations) == [
        "mypkg/__init__.py (added: would shadow the module 'mypkg')",
        "tool.py (added: would shadow the module 'tool')"]
    assert not (root / "mypkg" / "__init__.py").exists() and (root / "newhelper.py").exists()
    assert (root / "src" / "mypkg" / "extra.py").exists()
    guard.close()


def test_outside_modules_leave_out_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "src" / "treeonly_mod_q9.py").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "outside_mod_q9.py").write_text("")
    (outside / "outside_pkg_q9").mkdir()
    (outside / "outside_pkg_q9" / "__init__.py").write_text("")
    (outside / "plain_dir_q9").mkdir()  # no module: a namespace portion at most
    monkeypatch.setattr(sys, "path", [*sys.path, str(root / "src"), str(outside)])
    names = OutsideModules(os.path.realpath(root))
    for name in ("pygments", "json", "sys", "outside_mod_q9", "outside_pkg_q9", "_pytest"):
        assert name in names, name
    for name in ("treeonly_mod_q9", "plain_dir_q9", "calc_helpers_q7", "not an identifier", ""):
        assert name not in names, name


def test_shadowed_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    names = {"json", "pygments"}
    assert shadowed_module(str(tmp_path), ["json.cpython-311-x86_64-linux-gnu.so"], names, ()) == "json"
    assert shadowed_module(str(tmp_path), ["docs", "json.pyc"], names, ()) == "json"
    assert shadowed_module(str(tmp_path), ["pygments", "lexer.py"], names, ()) == "pygments"
    assert shadowed_module(str(tmp_path), ["pygments", "lexer.py"], names, {"pygments"}) is None
    assert shadowed_module(str(tmp_path), ["pkg", "json.py"], names, ()) is None
    assert shadowed_module(str(tmp_path), ["mine.py"], names, ()) is None


# -- a directory made to look like a virtual environment -----------------------------------


def test_a_new_pyvenv_cfg_is_a_violation_and_hides_nothing(guarded) -> None:
    root, make = guarded
    guard = make()
    (root / "tests" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "tests" / "test_calc.py").write_text("def test_add():\n    assert True\n")
    (root / "lib").mkdir()
    (root / "lib" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    result = guard.after_revise()
    assert sorted(v.describe() for v in result.violations) == [
        "lib/pyvenv.cfg (added: would make a virtual environment of its directory)",
        "tests/pyvenv.cfg (added: would make a virtual environment of its directory)",
        "tests/test_calc.py (modified: under a test directory)"]
    assert not (root / "tests" / "pyvenv.cfg").exists()
    assert not (root / "lib" / "pyvenv.cfg").exists()
    assert "assert add(2, 3) == 5" in (root / "tests" / "test_calc.py").read_text()
    assert guard.venvs == set()
    guard.close()


def test_a_venv_there_at_loop_start_stays_one(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    _project(root)
    site = root / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    guard = TreeGuard(root, journal=False, interpreter=False)
    guard.begin()
    assert guard.venvs == {".venv"}
    guard.before_revise()
    (root / ".venv" / "pyvenv.cfg").unlink()
    (site / "zz.pth").write_text("import os\n")
    result = guard.after_revise()
    assert sorted(v.describe() for v in result.violations) == [
        ".venv/lib/python3.11/site-packages/zz.pth (added: a virtual environment)",
        ".venv/pyvenv.cfg (deleted: a virtual environment)"]
    assert (root / ".venv" / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert guard.venvs == {".venv"}
    guard.close()


# -- outside the tree: a plugin registration in any directory on the interpreter's path --------


def test_a_plugin_distribution_on_a_path_directory_outside_the_tree(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_loops.runtime.protect import interpreter

    site = tmp_path / "site-packages"
    site.mkdir()
    on_path = tmp_path / "pythonpath-dir"
    on_path.mkdir()
    _dist(on_path, "kept-1.0.dist-info", "[console_scripts]\nkept = kept:main\n")
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ())
    monkeypatch.setattr(sys, "path", [str(site), str(on_path)])
    guard = interpreter.InterpreterGuard(lambda p: p.startswith(str(tmp_path / "tree")))
    guard.begin(journal=False)
    (on_path / "forcepass.py").write_text("# a plugin\n")
    _dist(on_path, "evil-1.0.dist-info")
    points = on_path / "kept-1.0.dist-info" / "entry_points.txt"
    points.write_text(points.read_text() + PLUGIN)
    violations, _ = guard.check(full=True)
    assert sorted((os.path.basename(v.path), v.how, v.restored) for v in violations) == [
        ("entry_points.txt", "modified", True), ("evil-1.0.dist-info", "added", True)]
    assert sorted(p.name for p in on_path.iterdir()) == ["kept-1.0.dist-info"]
    assert "pytest11" not in points.read_text()
    guard.close()


@pytest.mark.parametrize("rel", [
    ".pdbrc", "CLAUDE.md", "AGENTS.md", ".python-version", "mise.toml", ".npmrc", ".aider.conf.yml",
    ".github/copilot-instructions.md", ".github/workflows/ci.yml", ".pre-commit-config.yaml", "ruff.toml",
    ".claude/settings.json", ".mcp.json", ".vscode/tasks.json", ".envrc", ".husky/pre-commit",
])
def test_what_tools_and_agents_run_or_read_later_is_read_only(guarded, rel: str) -> None:
    root, make = guarded
    guard = make()
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text("runs later\n")

    result = guard.after_revise()

    assert [v.path for v in result.violations] == [rel]
    assert not (root / rel).exists()
    guard.close()


def test_an_ordinary_new_file_beside_them_is_the_projects(guarded) -> None:
    root, make = guarded
    guard = make()
    (root / "docs").mkdir()
    (root / "docs" / "notes.md").write_text("fine\n")
    (root / "README.md").write_text("fine\n")
    assert guard.after_revise().violations == []
    guard.close()

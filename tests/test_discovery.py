"""Layered loop discovery (package entry points, user directory, extra directories,
workspace), `pytest-loops list` and `pytest-loops run NAME`.

An installed package is faked by a ``*.dist-info`` directory with an
``entry_points.txt`` in a directory put on the path (PYTHONPATH for a subprocess,
``sys.path`` in this process): no network, no pip.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_loops.cli.main import main
from pytest_loops.errors import LoopUsageError
from pytest_loops.sources.discovery import discover, user_dir, walk_loop_files
from pytest_loops.sources.pytestini import DEFAULT_NORECURSE


def loop_text(name: str, check: str = "true", extra: str = "") -> str:
    return f'loop "{name}":\n  goal: {name}\n  done when "{check}" passes\n{extra}'


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_package(site: Path, dist: str = "acme-loops", entry: str = "acme = acme_loops.loops",
                 loops: dict[str, str] | None = None) -> Path:
    """A distribution in ``site`` whose entry point in pytest_loops.loops is ``entry``;
    ``loops`` are files of its package ``acme_loops.loops``."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    write(info / "entry_points.txt", f"[pytest_loops.loops]\n{entry}\n")
    package = site / "acme_loops" / "loops"
    write(site / "acme_loops" / "__init__.py", "")
    write(package / "__init__.py", "")
    for name, text in (loops or {}).items():
        write(package / name, text)
    return package


@pytest.fixture
def layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A workspace (the current directory), a home with an XDG config directory and a
    site directory on sys.path; the environment holds no PYTEST_LOOPS_* variable."""
    for key in list(os.environ):
        if key.startswith("PYTEST_LOOPS_"):
            monkeypatch.delenv(key)
    work, home, site = tmp_path / "work", tmp_path / "home", tmp_path / "site"
    for d in (work, home, site):
        d.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    monkeypatch.syspath_prepend(str(site))  # also invalidates the import caches
    monkeypatch.chdir(work)
    yield work, home / "xdg" / "pytest-loops" / "loops", site
    for name in [m for m in sys.modules if m.split(".")[0] in ("acme_loops", "acme_missing")]:
        del sys.modules[name]


def subprocess_env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home" / "xdg"),
            "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the done-when: a package loop shadowed by a workspace loop, shown by `list` -------------


def test_a_package_loop_shadowed_by_a_workspace_loop_is_shown_by_list(layers, capsys) -> None:
    work, _, site = layers
    package = fake_package(site, loops={"fix.loop": loop_text("fix-lint", "false")
                                        + "\n" + loop_text("shared-only")})
    write(work / "loops" / "fix.loop", loop_text("fix-lint"))
    code, out, err = run_main(capsys, "list")
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "LAYER", "SOURCE", "SHADOWS"]
    fix = next(line for line in lines if line.startswith("fix-lint "))
    assert fix.split() == ["fix-lint", "workspace", "loops/fix.loop:1", "package", f"{package / 'fix.loop'}:1"]
    shared = next(line for line in lines if line.startswith("shared-only "))
    assert shared.split() == ["shared-only", "package", f"{package / 'fix.loop'}:5", "-"]

    code, out, err = run_main(capsys, "list", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "pytest-loops.list/1"
    by_name = {loop["name"]: loop for loop in data["loops"]}
    assert by_name["fix-lint"]["layer"] == "workspace"
    assert by_name["fix-lint"]["source"] == str(work / "loops" / "fix.loop")
    assert by_name["fix-lint"]["shadows"] == [
        {"layer": "package", "source": str(package / "fix.loop"), "line": 1}]
    assert by_name["shared-only"]["via"] == "entry point 'acme' of acme-loops"


def test_run_name_runs_the_workspace_loop_that_shadows_the_package_one(tmp_path: Path, cli) -> None:
    site, work = tmp_path / "site", tmp_path / "work"
    fake_package(site, loops={"fix.loop": loop_text("fix-lint", "false") + "\n"
                              + loop_text("needs-marker", "test -f marker")})
    write(work / "loops" / "fix.loop", loop_text("fix-lint", "test -f ../marker"))
    write(work / "marker", "")
    env = subprocess_env(tmp_path)
    proc = cli("run", "fix-lint", "--max-iter", "1", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr  # the package's "false" would end MAX_ITER (2)
    assert "SUCCESS (exit 0)" in proc.stdout
    assert (work / ".pytest-loops" / "runs").is_dir()  # the workspace's artifacts directory
    # a package's loop runs in the workspace, not in its package's folder
    proc = cli("run", "needs-marker", "--max-iter", "1", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = cli("run", "needs-marker", "--max-iter", "1", cwd=elsewhere, env=env)
    assert proc.returncode == 2, proc.stderr  # no marker there: the cap, exit MAX_ITER


def test_each_layer_shadows_the_ones_below_it(layers, capsys, monkeypatch) -> None:
    work, user, site = layers
    package = fake_package(site, loops={"a.loop": loop_text("shared") + loop_text("p")})
    write(user / "u.loop", loop_text("shared") + loop_text("u"))
    extra_ini = write(work.parent / "ini-extra" / "e.loop", loop_text("shared") + loop_text("e1"))
    extra_env = write(work.parent / "env-extra" / "sub" / "e.loop", loop_text("shared") + loop_text("e2"))
    write(work / "pytest.ini", "[pytest]\nloop_paths = ../ini-extra\n")
    monkeypatch.setenv("PYTEST_LOOPS_LOOP_PATHS", os.pathsep.join([str(work.parent / "env-extra"), ""]))
    write(work / "ws.loop", loop_text("shared"))
    catalogue = discover(work)
    assert catalogue.warnings == ()  # the two extra ones clash below the winner: nothing to say
    layer_of = {f.name: f.layer for f in catalogue.loops}
    assert layer_of == {"shared": "workspace", "p": "package", "u": "user", "e1": "extra", "e2": "extra"}
    shared = catalogue.get("shared")
    assert shared is not None
    assert [(s.layer, s.path) for s in shared.shadows] == [
        ("extra", str(extra_ini)), ("extra", str(extra_env)), ("user", str(user / "u.loop")),
        ("package", str(package / "a.loop"))]
    (work / "ws.loop").unlink()
    catalogue = discover(work)
    winner = catalogue.get("shared")
    assert winner is not None and (winner.layer, winner.path) == ("extra", str(extra_ini))
    assert catalogue.warnings == (
        f"two extra loops are named 'shared': {extra_ini}:1 and {extra_env}:1; the first is used; rename one",)
    # ini's value is taken from pyproject.toml too
    (work / "pytest.ini").unlink()
    write(work / "pyproject.toml", '[tool.pytest.ini_options]\nloop_paths = ["../env-extra"]\n')
    monkeypatch.delenv("PYTEST_LOOPS_LOOP_PATHS")
    winner = discover(work).get("shared")
    assert winner is not None and (winner.layer, winner.path) == ("extra", str(extra_env))


def test_the_user_directory_follows_xdg_with_the_home_config_fallback() -> None:
    assert user_dir({"XDG_CONFIG_HOME": "/x/cfg", "HOME": "/h"}) == Path("/x/cfg/pytest-loops/loops")
    assert user_dir({"HOME": "/h"}) == Path("/h/.config/pytest-loops/loops")
    assert user_dir({"XDG_CONFIG_HOME": "", "HOME": "/h"}) == Path("/h/.config/pytest-loops/loops")
    # a relative XDG_CONFIG_HOME is invalid by the spec and is ignored
    assert user_dir({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == Path("/h/.config/pytest-loops/loops")


# -- bad input and broken lower layers ----------------------------------------------------------------


def test_a_broken_lower_layer_file_is_a_warning_and_workspace_loops_still_run(tmp_path: Path, cli) -> None:
    site, work = tmp_path / "site", tmp_path / "work"
    fake_package(site, loops={"broken.loop": 'loop "b":\n  goal: g\n  done when\n', "ok.loop": loop_text("p")})
    broken_user = write(tmp_path / "home" / "xdg" / "pytest-loops" / "loops" / "bad.loop.yaml", "loops: [\n")
    write(work / "fix.loop", loop_text("fix-lint"))
    env = subprocess_env(tmp_path)
    proc = cli("list", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 2, proc.stderr
    package_line = next(w for w in warnings if "broken.loop" in w)
    assert package_line.startswith("pytest-loops: warning: package loop file skipped: ")
    assert f"{site / 'acme_loops' / 'loops' / 'broken.loop'}:3" in package_line
    assert "e.g. `done when" in package_line  # the fix
    user_line = next(w for w in warnings if "bad.loop.yaml" in w)
    assert user_line.startswith(f"pytest-loops: warning: user loop file skipped: {broken_user}")
    assert "Traceback" not in proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == ["fix-lint", "p"]
    proc = cli("run", "fix-lint", "-q", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SUCCESS (exit 0)")


def test_two_workspace_loops_of_one_name_exit_64_naming_both_files(layers, capsys) -> None:
    work, _, _ = layers
    write(work / "a" / "one.loop", loop_text("fix"))
    write(work / "b" / "two.loop.yaml", "loops:\n  - name: fix\n    goal: g\n    checks: [\"true\"]\n")
    for argv in (["list"], ["list", "--json"], ["run", "fix"]):
        code, out, err = run_main(capsys, *argv)
        assert code == 64
        assert out == ""
        assert err.count("\n") == 1, err
        assert err.startswith("pytest-loops: error: two workspace loops are named 'fix': ")
        assert f"{work / 'a' / 'one.loop'}:1" in err and str(work / "b" / "two.loop.yaml") in err
        assert "rename one" in err


def test_a_broken_workspace_file_is_bad_input_naming_it(layers, capsys) -> None:
    work, _, _ = layers
    write(work / "bad.loop", 'loop "x":\n  goal: g\n  done when\n')
    code, out, err = run_main(capsys, "list")
    assert code == 64 and out == ""
    assert err.startswith(f"pytest-loops: error: {work / 'bad.loop'}:3:")
    assert err.count("\n") == 1


@pytest.mark.parametrize(("entry", "expected"), [
    ("acme = acme_missing.loops", "no module 'acme_missing'"),
    ("acme = acme_loops.plain", "'acme_loops.plain' is a module file"),
    ("acme = acme_loops:AS_FILE", "is a file, not a directory"),
    ("acme = acme_loops:NOWHERE", "does not exist"),
    ("acme = acme_loops:MISSING_ATTR", "cannot load it: AttributeError"),
])
def test_an_entry_point_that_points_nowhere_or_at_a_file_is_a_warning(layers, capsys, entry, expected) -> None:
    work, _, site = layers
    package = fake_package(site, entry=entry, loops={"p.loop": loop_text("p")})
    write(site / "acme_loops" / "__init__.py",
          f"AS_FILE = {str(package / 'p.loop')!r}\nNOWHERE = {str(site / 'nowhere')!r}\n")
    write(site / "acme_loops" / "plain.py", "")
    write(work / "w.loop", loop_text("w"))
    code, out, err = run_main(capsys, "list")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["w"]
    assert err.count("\n") == 1, err
    assert err.startswith("pytest-loops: warning: entry point 'acme' of acme-loops (pytest_loops.loops: ")
    assert expected in err
    assert err.rstrip().endswith("skipped; point it at a package or a directory of loop files")


def test_an_entry_point_may_name_a_directory_attribute(layers, capsys) -> None:
    work, _, site = layers
    fake_package(site, entry="acme = acme_loops:LOOPS")
    shipped = write(site / "shipped" / "s.loop.yml", "loops:\n  - name: shipped\n    goal: g\n    checks: [\"true\"]\n")
    write(site / "acme_loops" / "__init__.py", f"LOOPS = {str(shipped.parent)!r}\n")
    catalogue = discover(work)
    assert catalogue.warnings == ()
    found = catalogue.get("shipped")
    assert found is not None and (found.layer, found.path) == ("package", str(shipped))


def test_a_missing_extra_directory_is_a_warning(layers, capsys, monkeypatch) -> None:
    work, _, _ = layers
    monkeypatch.setenv("PYTEST_LOOPS_LOOP_PATHS", str(work.parent / "gone"))
    write(work / "w.loop", loop_text("w"))
    code, out, err = run_main(capsys, "list")
    assert code == 0
    assert err == (f"pytest-loops: warning: PYTEST_LOOPS_LOOP_PATHS: {str(work.parent / 'gone')!r} does not "
                   "exist; skipped; give an existing directory of loop files\n")


def test_run_of_an_unknown_name_is_one_line_listing_close_names(layers, capsys) -> None:
    work, _, _ = layers
    write(work / "w.loop", loop_text("fix-lint") + loop_text("fix-types") + loop_text("docs"))
    code, out, err = run_main(capsys, "run", "fix-lnt")
    assert code == 64 and out == ""
    assert err == ("pytest-loops: error: pytest-loops run: no loop named 'fix-lnt'; close names: "
                   "fix-lint, fix-types; see `pytest-loops list`\n")
    code, out, err = run_main(capsys, "run", "zzz")
    assert code == 64
    assert err == ("pytest-loops: error: pytest-loops run: no loop named 'zzz'; 3 loop(s) found; "
                   "see `pytest-loops list`\n")


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "w.loop"], "'w.loop' is a path, not a loop name; run a loop file with `pytest --loop FILE`"),
    (["run", "fix", "--verify", "true"], "--verify with the loop name 'fix'"),
    (["run", "fix", "--config", "c.yaml"], "--config with the loop name 'fix'"),
    (["run", "pipe"], "'pipe' is a pipeline"),
    (["list", "--cwd", "nowhere"], "--cwd: 'nowhere' does not exist"),
])
def test_run_name_bad_input_is_one_line(layers, capsys, argv, expected) -> None:
    work, _, _ = layers
    write(work / "w.loop", loop_text("fix") + textwrap.dedent("""\
        pipeline "pipe":
          stage "one":
            goal: g
            done when "true" passes
        """))
    code, out, err = run_main(capsys, *argv)
    assert code == 64 and out == ""
    assert err.count("\n") == 1 and expected in err, err


def test_run_without_a_name_or_verify_is_unchanged(layers, capsys) -> None:
    code, _, err = run_main(capsys, "run")
    assert code == 64
    assert err == ("pytest-loops: error: --verify: no check to run; give --verify CMD (repeatable) "
                   "or verify.cmd in the config file\n")


# -- the workspace walk ---------------------------------------------------------------------------------


def test_the_workspace_walk_skips_what_pytest_collection_skips(layers, capsys) -> None:
    work, _, _ = layers
    write(work / "src" / "deep" / "kept.loop", loop_text("kept"))
    for skipped in (".git", ".venv", "node_modules", ".pytest-loops", "build", "dist", "x.egg", "__pycache__"):
        write(work / skipped / "s.loop", loop_text("s-" + skipped))
    write(work / "env" / "pyvenv.cfg", "home = /usr\n")  # a virtualenv by any name
    write(work / "env" / "lib" / "v.loop", loop_text("venv"))
    (work / "linked").symlink_to(work / "src")  # a link to a directory is not followed
    names = [f.name for f in discover(work).loops]
    assert names == ["kept"]
    # the project's own norecursedirs replace pytest's defaults, as in pytest
    write(work / "pytest.ini", "[pytest]\nnorecursedirs = src\n")
    names = [f.name for f in discover(work).loops]
    assert "kept" not in names and "s-build" in names and "s-.git" in names


def test_walk_loop_files_is_sorted_and_finds_every_suffix(tmp_path: Path) -> None:
    for name in ("b.loop", "a.loop.yaml", "c.LOOP.YML", "d.yaml", "e.txt"):
        write(tmp_path / name, "")
    found = [p.name for p in walk_loop_files(tmp_path, DEFAULT_NORECURSE)]
    assert found == ["a.loop.yaml", "b.loop", "c.LOOP.YML"]


def test_an_extra_directory_inside_the_workspace_is_read_once_as_workspace(layers, monkeypatch) -> None:
    work, _, _ = layers
    write(work / "shared" / "s.loop", loop_text("s"))
    monkeypatch.setenv("PYTEST_LOOPS_LOOP_PATHS", str(work / "shared"))
    catalogue = discover(work)
    found = catalogue.get("s")
    assert found is not None and found.layer == "workspace" and found.shadows == ()


def test_an_unreadable_ini_file_is_bad_input_naming_it(layers) -> None:
    work, _, _ = layers
    write(work / "pyproject.toml", "[tool.pytest.ini_options\n")
    with pytest.raises(LoopUsageError, match=r"pyproject.toml: cannot read it"):
        discover(work)


# -- pytest --loop and the layers -------------------------------------------------------------------


def test_pytest_loop_runs_a_loop_paths_loop_once_and_not_one_a_workspace_loop_shadows(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_LOOPS_LOOP_PATHS", raising=False)
    outside = pytester.path.parent / f"{pytester.path.name}-shared"
    write(outside / "shared.loop", loop_text("fix-lint", "false", "  after 1 tries: stop\n")
          + loop_text("shared-only"))
    env_dir = write(pytester.path.parent / f"{pytester.path.name}-env" / "e.loop", loop_text("from-env")).parent
    write(pytester.path / "loops" / "fix.loop", loop_text("fix-lint"))
    # an extra directory inside the workspace: collected once, as a workspace directory
    write(pytester.path / "inside" / "in.loop", loop_text("inside"))
    pytester.makeini(f"[pytest]\nloop_paths = ../{outside.name} inside\n")
    monkeypatch.setenv("PYTEST_LOOPS_LOOP_PATHS", str(env_dir))
    result = pytester.runpytest_subprocess("--loop", "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        f"loop: 'fix-lint' in {outside / 'shared.loop'} (loop_paths) is shadowed by "
        f"{pytester.path / 'loops' / 'fix.loop'}: not run"])
    result.assert_outcomes(passed=4, deselected=1)
    out = result.stdout.str()
    for name in ("fix-lint", "shared-only", "from-env", "inside"):
        assert out.count(f"SUCCESS     {name}:") == 1, out
    # the same tree listed: the same winner, with what it shadows
    proc = pytester.run(sys.executable, "-m", "pytest_loops", "list", "--json")
    assert proc.ret == 0, proc.stderr.str()
    loops = {loop["name"]: loop for loop in json.loads(proc.stdout.str())["loops"]}
    assert {name: loop["layer"] for name, loop in loops.items()} == {
        "fix-lint": "workspace", "shared-only": "extra", "from-env": "extra", "inside": "workspace"}
    assert loops["fix-lint"]["shadows"] == [{"layer": "extra", "source": str(outside / "shared.loop"), "line": 1}]


def test_pytest_loop_does_not_collect_package_or_user_loops(pytester: pytest.Pytester, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path / "site", loops={"p.loop": loop_text("from-package")})
    write(tmp_path / "xdg" / "pytest-loops" / "loops" / "u.loop", loop_text("from-user"))
    write(pytester.path / "w.loop", loop_text("from-workspace"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    result = pytester.runpytest_subprocess("--loop", "-p", "no:cacheprovider", "-p", "no:xdist")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=1)
    assert "from-package" not in result.stdout.str() and "from-user" not in result.stdout.str()
    proc = pytester.run(sys.executable, "-m", "pytest_loops", "list")
    assert [line.split()[:2] for line in proc.stdout.lines[1:]] == [
        ["from-package", "package"], ["from-user", "user"], ["from-workspace", "workspace"]]


def test_list_prints_no_escape_sequence_nor_secret_from_a_shipped_file(layers, capsys, monkeypatch) -> None:
    work, user, _ = layers
    monkeypatch.setenv("ACME_API_TOKEN", "tok-5ecret-value")
    write(user / "u.loop", loop_text("evil\x1b]0;title\x07 tok-5ecret-value"))
    code, out, err = run_main(capsys, "list")
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "tok-5ecret-value" not in out and "[REDACTED" in out
    code, out, err = run_main(capsys, "list", "--json")
    assert code == 0, err
    assert "tok-5ecret-value" not in out
    [loop] = json.loads(out)["loops"]
    assert loop["name"].startswith("evil\x1b]0;title\x07 [REDACTED")


def test_under_xdist_the_shadowed_loop_is_not_run_and_the_controller_says_so(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_LOOPS_LOOP_PATHS", raising=False)
    shared = write(pytester.path.parent / f"{pytester.path.name}-shared" / "team.loop",
                   loop_text("lint", "false", "  after 1 tries: stop\n"))
    write(pytester.path / "lint.loop", loop_text("lint"))
    monkeypatch.setenv("PYTEST_LOOPS_LOOP_PATHS", str(shared.parent))
    result = pytester.runpytest_subprocess("--loop", "-p", "no:cacheprovider", "-n", "2")
    assert result.ret == 0, result.stdout.str()
    lines = [line for line in result.stdout.lines if "is shadowed by" in line]
    assert lines == [f"loop: 'lint' in {shared} (loop_paths) is shadowed by {pytester.path / 'lint.loop'}: not run"]
    result.assert_outcomes(passed=1)

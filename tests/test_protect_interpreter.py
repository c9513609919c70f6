"""The judging interpreter's guard: start-up files, plugin registrations, pytest's own code.

End to end, the attacks are in tests/adversarial_kit.py (layout ``judge-venv``); here
each rule is pinned on a fake interpreter: a site-packages directory and a package
of our own standing in for pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_loops.runtime.protect import interpreter
from pytest_loops.runtime.protect.interpreter import (
    PLUGIN_WHY,
    RUNNER_WHY,
    STARTUP_WHY,
    InterpreterGuard,
)


def _fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal: bool):
    """A site-packages with one .pth and a package ``fakerunner`` the judge 'imports'."""
    site = tmp_path / "site-packages"
    (site / "fakerunner" / "__pycache__").mkdir(parents=True)
    (site / "fakerunner" / "__init__.py").write_text("RUN = True\n")
    (site / "fakerunner" / "__pycache__" / "__init__.cpython-3.pyc").write_bytes(b"real")
    (site / "ok.pth").write_text("# nothing\n")
    path_dir = tmp_path / "on-path"
    path_dir.mkdir()
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ("fakerunner",))
    monkeypatch.setattr(sys, "path", [str(site), str(path_dir)])
    tree = tmp_path / "tree"
    tree.mkdir()
    guard = InterpreterGuard(lambda p: p.startswith(str(tree)))
    guard.begin(journal=journal)
    if journal and guard.journal is None:
        pytest.skip(f"no change journal here: {guard.journal_reason}")
    return guard, site, path_dir


@pytest.fixture(params=["journal", "compare"])
def fake(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake interpreter; every rule is checked with the change journal and comparing
    file by file."""
    found = _fake(tmp_path, monkeypatch, request.param == "journal")
    yield found
    found[0].close()


@pytest.fixture
def journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    found = _fake(tmp_path, monkeypatch, True)
    yield found
    found[0].close()


def test_an_idle_check_reads_the_journal_not_the_files(journaled, monkeypatch: pytest.MonkeyPatch) -> None:
    guard, _site, _ = journaled
    assert guard.check() == ([], [])  # whatever begin() itself left in the queue

    def no_stat(path: str):
        raise AssertionError(f"an idle check looked at {path}")

    monkeypatch.setattr(interpreter, "_entry", no_stat)
    assert guard.check() == ([], [])


def test_a_change_the_journal_missed_is_found_by_the_check_before_a_verdict(journaled) -> None:
    """inotify does not see a write through mmap or through a hard link made elsewhere:
    stood in for by draining the events away. The quick check misses it; the full one,
    which runs before the clean room judges, finds it and puts the file back."""
    guard, site, _ = journaled
    source = site / "fakerunner" / "__init__.py"
    source.write_text("RUN = False\n")
    assert guard.journal is not None
    guard.journal.drain()
    assert guard.check() == ([], [])
    violations, _ = guard.check(full=True)
    assert [(Path(v.path).name, v.how, v.restored) for v in violations] == [("__init__.py", "modified", True)]
    assert source.read_text() == "RUN = True\n"


def test_without_inotify_every_check_compares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages"
    (site / "fakerunner").mkdir(parents=True)
    (site / "fakerunner" / "__init__.py").write_text("RUN = True\n")
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ("fakerunner",))
    monkeypatch.setattr(sys, "path", [str(site)])

    def lost(root: str):
        raise interpreter.JournalLost("inotify_init1 failed: Too many open files", sticky=True)

    monkeypatch.setattr(interpreter, "DirectoryJournal", lost)
    guard = InterpreterGuard(lambda p: False)
    guard.begin()
    assert guard.journal is None and guard.journal_reason == "inotify_init1 failed: Too many open files"
    (site / "fakerunner" / "__init__.py").write_text("RUN = False\n")
    assert [v.how for v in guard.check()[0]] == ["modified"]


def test_nothing_changed_is_nothing(fake) -> None:
    guard, _site, _path_dir = fake
    assert guard.check() == ([], [])


def test_a_new_pth_file_is_a_violation_and_removed(fake) -> None:
    guard, site, _ = fake
    (site / "zz.pth").write_text("import os\n")
    violations, _ = guard.check()
    assert [(Path(v.path).name, v.how, v.why, v.restored) for v in violations] == [
        ("zz.pth", "added", STARTUP_WHY, True)]
    assert not (site / "zz.pth").exists()
    assert guard.check() == ([], [])  # undone for good


def test_a_changed_pth_file_is_put_back(fake) -> None:
    guard, site, _ = fake
    (site / "ok.pth").write_text("import calc\n")
    violations, _ = guard.check()
    assert [(v.how, v.why, v.restored) for v in violations] == [("modified", STARTUP_WHY, True)]
    assert (site / "ok.pth").read_text() == "# nothing\n"


def test_sitecustomize_anywhere_on_the_path(fake) -> None:
    guard, _site, path_dir = fake
    (path_dir / "sitecustomize.py").write_text("import calc\n")
    violations, _ = guard.check()
    assert [(Path(v.path).name, v.why) for v in violations] == [("sitecustomize.py", STARTUP_WHY)]
    assert not (path_dir / "sitecustomize.py").exists()


def test_an_edit_to_the_runner_is_put_back(fake) -> None:
    guard, site, _ = fake
    source = site / "fakerunner" / "__init__.py"
    source.write_text("RUN = False\n")
    violations, _ = guard.check()
    assert [(v.how, v.why, v.restored) for v in violations] == [("modified", RUNNER_WHY, True)]
    assert source.read_text() == "RUN = True\n"


def test_a_deleted_runner_file_comes_back(fake) -> None:
    guard, site, _ = fake
    source = site / "fakerunner" / "__init__.py"
    source.unlink()
    violations, _ = guard.check()
    assert [(v.how, v.restored) for v in violations] == [("deleted", True)]
    assert source.read_text() == "RUN = True\n"


def test_a_new_plugin_registration_and_its_module_are_removed(fake) -> None:
    guard, site, _ = fake
    dist = site / "evil-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[console_scripts]\nx = y\n\n[pytest11]\nevil = evil_plugin.hooks\n")
    (site / "evil_plugin").mkdir()
    (site / "evil_plugin" / "hooks.py").write_text("")
    violations, _ = guard.check()
    assert [(Path(v.path).name, v.why, v.restored) for v in violations] == [
        ("evil-1.0.dist-info", PLUGIN_WHY, True)]
    assert not dist.exists() and not (site / "evil_plugin").exists()


def test_a_plugin_added_to_an_installed_distribution_is_taken_back_out(fake, tmp_path: Path) -> None:
    guard, site, _ = fake
    assert guard.check() == ([], [])
    dist = site / "requests-2.0.dist-info"
    points = dist / "entry_points.txt"
    # installed before the loop started (a new guard sees it at begin)
    dist.mkdir()
    points.write_text("[console_scripts]\nreq = requests:main\n")
    bare = site / "bare-1.0.dist-info"
    bare.mkdir()
    (bare / "METADATA").write_text("Name: bare\n")
    guard = InterpreterGuard(lambda p: p.startswith(str(tmp_path / "tree")))
    guard.begin()
    points.write_text("[console_scripts]\nreq = requests:main\n[pytest11]\nevil = zz_evil\n")
    (bare / "entry_points.txt").write_text("[pytest11]\nevil = zz_evil\n")
    violations, _ = guard.check()
    assert sorted((Path(v.path).parent.name, v.how, v.why, v.restored) for v in violations) == [
        ("bare-1.0.dist-info", "added", PLUGIN_WHY, True),
        ("requests-2.0.dist-info", "modified", PLUGIN_WHY, True)]
    assert points.read_text() == "[console_scripts]\nreq = requests:main\n"  # the distribution stays
    assert not (bare / "entry_points.txt").exists() and (bare / "METADATA").exists()


def test_a_new_distribution_without_a_plugin_is_allowed(fake) -> None:
    guard, site, _ = fake
    dist = site / "requests-2.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text("[console_scripts]\nreq = requests:main\n")
    assert guard.check() == ([], [])
    assert dist.exists()


def test_forged_or_new_bytecode_of_the_runner_is_removed(fake) -> None:
    guard, site, _ = fake
    cache = site / "fakerunner" / "__pycache__"
    (cache / "__init__.cpython-3.pyc").write_bytes(b"forged")
    (cache / "other.cpython-3.pyc").write_bytes(b"new")
    violations, cleared = guard.check()
    assert violations == []
    assert sorted(Path(p).name for p in cleared) == ["__init__.cpython-3.pyc", "other.cpython-3.pyc"]
    assert os.listdir(cache) == []


def test_paths_inside_the_tree_are_the_tree_guards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "tree" / ".venv" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ())
    monkeypatch.setattr(sys, "path", [str(site)])
    guard = InterpreterGuard(lambda p: p.startswith(str(tmp_path / "tree")))
    guard.begin()
    (site / "zz.pth").write_text("import os\n")
    assert guard.check() == ([], [])


def test_plugin_modules_read_from_entry_points(tmp_path: Path) -> None:
    (tmp_path / "entry_points.txt").write_text(
        "[pytest11]\na = one.sub:thing\nb = two\n bad line\nc = 3x\n[other]\nd = three\n")
    assert interpreter._plugin_modules(str(tmp_path)) == ["one", "two"]
    (tmp_path / "entry_points.txt").write_text("[console_scripts]\nx = y\n")
    assert interpreter._plugin_modules(str(tmp_path)) is None
    assert interpreter._plugin_modules(str(tmp_path / "missing")) is None


def test_site_directories_on_the_path_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "outer" / "site-packages"
    other.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(other)])
    assert str(other) in interpreter.site_dirs()
    assert str(tmp_path) not in interpreter.site_dirs()


def test_the_budget_stops_the_copying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_loops.deadline import DeadlineReached

    site = tmp_path / "site-packages"
    (site / "fakerunner").mkdir(parents=True)
    (site / "fakerunner" / "__init__.py").write_text("")
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ("fakerunner",))
    monkeypatch.setattr(sys, "path", [str(site)])
    with pytest.raises(DeadlineReached, match="interpreter guard"):
        InterpreterGuard(lambda p: False, should_stop=lambda: True).begin()


def test_a_big_runner_file_is_watched_but_not_kept(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    guard, site, _ = fake
    source = site / "fakerunner" / "__init__.py"
    guard.store.pop(str(source))  # as if it were over COPY_MAX_BYTES at loop start
    source.write_text("RUN = False\n")
    violations, _ = guard.check()
    assert [(v.how, v.restored) for v in violations] == [("modified", False)]
    assert "could not be undone" in violations[0].describe()


# -- the private store of a harness that was killed -------------------------------------

def test_a_killed_harness_store_is_swept_a_live_one_kept(tmp_path: Path) -> None:
    import subprocess

    from pytest_loops.runtime.protect.store import STORE_PREFIX, store_prefix, sweep_stale_stores

    mine = tmp_path / (store_prefix() + "abc")  # this process: alive
    mine.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    proc_start = "123"  # any start time: the pid is gone
    dead = tmp_path / f"{STORE_PREFIX}{child.pid}-{proc_start}-xyz"
    (dead / "tree").mkdir(parents=True)
    reused = tmp_path / f"{STORE_PREFIX}{os.getpid()}-1-old"  # this pid, another start time
    reused.mkdir()
    older = tmp_path / f"{STORE_PREFIX}k2j3h4"  # a name from before: left alone
    older.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    removed = sweep_stale_stores(str(tmp_path))
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert mine.exists() and older.exists() and other.exists()
    assert not dead.exists() and not reused.exists()


def test_a_guard_that_begins_sweeps_and_names_its_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_loops.runtime.protect import TreeGuard
    from pytest_loops.runtime.protect.store import STORE_PREFIX

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    stale = temp / f"{STORE_PREFIX}999999999-1-zz"
    stale.mkdir()
    tree = tmp_path / "tree"
    tree.mkdir()
    with TreeGuard(tree, journal=False, interpreter=False) as guard:
        guard.begin()
        (store,) = [p for p in temp.iterdir() if p.name.startswith(STORE_PREFIX)]
        assert store.name.startswith(f"{STORE_PREFIX}{os.getpid()}-")
    assert not stale.exists()
    assert list(temp.iterdir()) == []


@pytest.mark.parametrize("line", [
    "import fakehack; fakehack.install()",
    "import os; ok = True; ok and __import__('fakehack').install()",
    "import sys; exec('import os\\nif True:\\n import fakehack')",
], ids=["import", "__import__", "exec of a string"])
def test_a_module_a_pth_file_imports_is_put_back(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .pth file that was there at loop start runs its import lines at every start
    (``distutils-precedence.pth`` imports ``_distutils_hack``): the module it imports is
    the judge's, and an edit to it is put back."""
    site = tmp_path / "site-packages"
    (site / "fakehack").mkdir(parents=True)
    module = site / "fakehack" / "__init__.py"
    module.write_text("def install():\n    pass\n")
    (site / "hack.pth").write_text(line + "\n")

    violations = _changed_under_a_bare_guard(site, monkeypatch, lambda: module.write_text(
        "import calc\ncalc.add = lambda a, b: a + b\ndef install():\n    pass\n"))

    assert [(v.path, v.how, v.why, v.restored) for v in violations] == [
        (str(module), "modified", RUNNER_WHY, True)]
    assert module.read_text() == "def install():\n    pass\n"


@pytest.mark.parametrize(("text", "names"), [
    ("import a, b.c; from d.e import f\n", ["a", "b", "d"]),
    ("/some/path\n# import nothing\nimport x\n", ["x"]),
    ("import(\n", []),
    ("import os; exec('import y; exec(\"import z\")')\n", ["os", "y", "z"]),
    ("import os; __import__(name)\n", ["os"]),
])
def test_the_modules_of_a_pth_file(text: str, names: list[str], tmp_path: Path) -> None:
    pth = tmp_path / "x.pth"
    pth.write_text(text)
    assert interpreter._pth_imports(str(pth)) == names


def test_the_judging_venvs_settings_are_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``include-system-site-packages`` flipped in the judging venv's pyvenv.cfg would put
    directories nobody watches on the judge's path: the file is kept and put back."""
    prefix = tmp_path / "venv"
    site = prefix / "lib" / "site-packages"
    site.mkdir(parents=True)
    cfg = prefix / "pyvenv.cfg"
    cfg.write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sys, "base_prefix", "/usr")

    violations = _changed_under_a_bare_guard(site, monkeypatch, lambda: cfg.write_text(
        "home = /usr/bin\ninclude-system-site-packages = true\n"))

    assert [(v.path, v.how, v.restored) for v in violations] == [(str(cfg), "modified", True)]
    assert "= false" in cfg.read_text()


def _changed_under_a_bare_guard(site: Path, monkeypatch: pytest.MonkeyPatch, change) -> list:
    """The violations a guard of ``site`` alone (no judge packages) finds after ``change``."""
    monkeypatch.setattr(interpreter, "site_dirs", lambda: [str(site)])
    monkeypatch.setattr(interpreter, "JUDGE_PACKAGES", ())
    monkeypatch.setattr(sys, "path", [str(site)])
    guard = InterpreterGuard(lambda p: False)
    guard.begin(journal=False)
    try:
        change()
        return guard.check(full=True)[0]
    finally:
        guard.close()

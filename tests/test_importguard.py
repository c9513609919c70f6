"""While a loop runs, the harness's own process imports nothing the loop wrote into its
tree: a module the revise step planted under a name the harness imports lazily (a
hook, a writer, an optional dependency at save time) is never run with the
harness's keys. Modules the tree held before the loop import as usual."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pluggy
import pytest

from pytest_loops.artifacts.finishers import ArtifactOptions, make_engine
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.runtime.importguard import imports_guarded
from pytest_loops.runtime.process import ProcessRunner
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

hookimpl = pluggy.HookimplMarker("pytest")

PLANT = textwrap.dedent("""\
    from pathlib import Path
    Path({marker!r}).write_text("ran in the harness")
    """)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    work = tmp_path / "tree"
    work.mkdir()
    monkeypatch.syspath_prepend(str(work))
    yield work
    for name in [m for m in sys.modules if m.startswith(("planted", "older"))]:
        del sys.modules[name]


class LateImporter:
    """A plugin of the user's that imports a module lazily, when the loop has ended
    (as an artifact writer or an optional dependency would)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.outcome: str | None = None

    @hookimpl
    def pytest_loop_finished(self, result, run):
        try:
            importlib.import_module(self.name)
        except ModuleNotFoundError as exc:
            self.outcome = f"refused: {exc}"
        else:
            self.outcome = "imported"


def _run(tree: Path, revise: str, importer: LateImporter) -> Verdict:
    pm = make_plugin_manager(entry_points=False)
    pm.register(importer, name="late-importer")
    engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False, artifacts=ArtifactOptions())
    spec = LoopSpec(name="g", checks=(Check.command_passes("test -f fixed"),), cwd=str(tree),
                    revise=revise, guards=Guards(max_iter=2, no_progress_k=0))
    return engine.run(spec, log_path=tree.parent / "run.json").verdict


def test_a_module_the_revise_step_planted_is_never_imported_by_the_harness(tree: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    plant = tmp_path / "plant.py"
    body = PLANT.format(marker=str(marker))
    plant.write_text(f"from pathlib import Path\nPath('planted_writer.py').write_text({body!r})\n"
                     "Path('fixed').write_text('')\n")
    importer = LateImporter("planted_writer")
    verdict = _run(tree, f"{sys.executable} {plant}", importer)
    assert verdict is Verdict.SUCCESS
    assert (tree / "planted_writer.py").is_file()  # it was planted, and found on sys.path
    assert importer.outcome is not None and importer.outcome.startswith("refused"), importer.outcome
    assert "written into the loop's tree" in importer.outcome
    assert not marker.exists()
    # after the loop the guard is gone: the same import works (the module is the user's now)
    importlib.import_module("planted_writer")
    assert marker.read_text() == "ran in the harness"


def test_a_modification_time_set_back_does_not_pass_for_an_old_module(tree: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    plant = tmp_path / "plant.py"
    plant.write_text("import os\nfrom pathlib import Path\n"
                     f"Path('planted_old.py').write_text({PLANT.format(marker=str(marker))!r})\n"
                     "os.utime('planted_old.py', (0, 0))\nPath('fixed').write_text('')\n")
    importer = LateImporter("planted_old")
    assert _run(tree, f"{sys.executable} {plant}", importer) is Verdict.SUCCESS
    assert os.stat(tree / "planted_old.py").st_mtime == 0
    assert importer.outcome is not None and importer.outcome.startswith("refused"), importer.outcome
    assert not marker.exists()


def test_a_module_the_tree_held_before_the_loop_imports_as_usual(tree: Path, tmp_path: Path) -> None:
    (tree / "older_helper.py").write_text("VALUE = 1\n")
    time.sleep(0.01)
    importer = LateImporter("older_helper")
    assert _run(tree, "touch fixed", importer) is Verdict.SUCCESS
    assert importer.outcome == "imported"


def test_a_planted_pyc_beside_an_old_source_is_not_read(tree: Path, tmp_path: Path) -> None:
    """The source is old; a .pyc for it appears while the guard is on (a check's pytest
    compiled it, or it was planted with the source's stamp): the source is what runs."""
    source = tree / "older_mod.py"
    source.write_text("VALUE = 'from source'\n")
    old = time.time() - 100
    os.utime(source, (old, old))
    since = time.time()
    # the planted bytecode: code that says otherwise, stamped with the source's mtime and size
    import importlib.util
    import marshal

    code = compile("VALUE = 'from planted bytecode'\n", str(source), "exec")
    stat = source.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        int(stat.st_mtime).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(header + marshal.dumps(code))
    with imports_guarded(tree, since):
        module = importlib.import_module("older_mod")
    assert module.VALUE == "from source"
    del sys.modules["older_mod"]
    module = importlib.import_module("older_mod")  # no guard: Python reads the .pyc
    assert module.VALUE == "from planted bytecode"  # (what the guard kept from the harness)
    del sys.modules["older_mod"]


def test_a_planted_namespace_package_is_refused(tree: Path) -> None:
    since = time.time()
    time.sleep(0.01)
    (tree / "planted_ns").mkdir()
    (tree / "planted_ns" / "inner.py").write_text("X = 1\n")
    with imports_guarded(tree, since) as guard:
        with pytest.raises(ModuleNotFoundError, match="written into the loop's tree"):
            importlib.import_module("planted_ns.inner")
    assert guard.refused == ["planted_ns"]
    assert guard not in sys.meta_path

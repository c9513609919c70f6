"""A fan-out candidate as an upper layer over the working tree: what it wrote, read back
from the layer (whiteouts, opaque directories, unchanged rewrites), applied, removed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_loops.runtime.overlaycopy import OverlayCopy
from pytest_loops.runtime.treecopy import new_parent
from pytest_loops.sandbox import Policy, bwrap

pytestmark = pytest.mark.skipif(not bwrap.layers_work(), reason="bwrap cannot mount an overlay with a kept upper layer")

CANDIDATE = """\
set -e
printf 'A = 2\\n' > a.py
printf 'B = 1\\n' > b.py
rm c.py
printf 'D = 1\\n' > d.py
rm -r sub && mkdir sub && printf 'X = 1\\n' > sub/x.py
rm -r gone
mkdir -p __pycache__ && printf 'junk' > __pycache__/a.cpython-311.pyc
chmod +x e.sh
"""


def tree(root: Path) -> None:
    root.mkdir()
    (root / "a.py").write_text("A = 1\n")
    (root / "b.py").write_text("B = 1\n")
    (root / "c.py").write_text("C = 1\n")
    (root / "e.sh").write_text("echo e\n")
    (root / "sub").mkdir()
    (root / "sub" / "old.py").write_text("OLD = 1\n")
    (root / "gone").mkdir()
    (root / "gone" / "g.py").write_text("G = 1\n")


def in_layer(copy: OverlayCopy, script: str) -> None:
    path, _why, _overlay = bwrap.available()
    assert path is not None
    policy = Policy(cwd=copy.view, layers=((copy.source, copy.upper, copy.work, copy.source),), private_tmp=False)
    subprocess.run([path, *bwrap.arguments(policy, overlay=True), "--", "sh", "-c", script], check=True, timeout=60)


def test_the_layer_is_the_change_set_and_the_tree_is_untouched(tmp_path: Path) -> None:
    src = tmp_path / "src"
    tree(src)
    before = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    parent = new_parent()
    copy = OverlayCopy(src, parent, "b0").create()
    try:
        assert copy.changes() == []
        in_layer(copy, CANDIDATE)
        assert {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
        changes = copy.changes()
        assert [(c.rel, c.how) for c in changes] == [
            ("a.py", "modified"), ("c.py", "deleted"), ("d.py", "added"), ("e.sh", "modified"),
            ("gone/g.py", "deleted"), ("sub/old.py", "deleted"), ("sub/x.py", "added")]
        assert copy.diff_size([c for c in changes if c.rel == "a.py"]) == 2  # one line out, one in
        target = tmp_path / "target"
        shutil.copytree(src, target)
        copy.apply(changes, target)
        assert (target / "a.py").read_text() == "A = 2\n"
        assert (target / "d.py").read_text() == "D = 1\n"
        assert (target / "sub" / "x.py").exists() and not (target / "sub" / "old.py").exists()
        assert not (target / "c.py").exists() and not (target / "gone" / "g.py").exists()
        assert os.access(target / "e.sh", os.X_OK)
    finally:
        copy.remove()
        os.rmdir(parent)
    assert not Path(copy.path).exists()

"""What a check reads in turn is read-only too: the files its script sources and its Makefile includes."""

from __future__ import annotations

from pathlib import Path

import adversarial_kit as kit

from pytest_loops.runtime.protect.rules import check_files
from pytest_loops.spec import Check, LoopSpec


def _files(root: Path, command: str) -> list[str]:
    spec = LoopSpec(name="inputs", checks=(Check.command_passes(command),), revise="true", cwd=str(root))
    return check_files(spec, str(root))


def test_sourced_and_included_files_are_read_only(tmp_path: Path) -> None:
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "check.sh").write_text(kit.CI_CHECK + ". ci/more.sh\nsource ${0%/*}/near.sh  # x\n")
    (tmp_path / "ci" / "settings.sh").write_text('source ci/deep.sh\n. "$UNKNOWN/skipped.sh"\n')
    for name in ("more.sh", "near.sh", "deep.sh"):
        (tmp_path / "ci" / name).write_text("\n")
    (tmp_path / "ci" / "common.mk").write_text("-include ci/extra.mk\n")
    (tmp_path / "ci" / "extra.mk").write_text("X = 1\n")
    (tmp_path / "Makefile").write_text(kit.CI_MAKEFILE)
    (tmp_path / "calc.py").write_text("source = 1\n")

    assert set(_files(tmp_path, "sh ci/check.sh")) == {
        "ci/check.sh", "ci/settings.sh", "ci/deep.sh", "ci/more.sh", "ci/near.sh"}
    assert set(_files(tmp_path, "make -s check")) == {"Makefile", "ci/common.mk", "ci/extra.mk"}
    assert _files(tmp_path, "python -m pytest -q") == []  # nothing a check does not run


def test_a_sourcing_loop_ends(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text(". ./b.sh\n")
    (tmp_path / "b.sh").write_text(". ./a.sh\n")
    assert set(_files(tmp_path, "bash a.sh")) == {"a.sh", "b.sh"}

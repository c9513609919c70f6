"""The runner's on|off switches and their old aliases, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_loops.cli.main import main


def run(tmp_path: Path, *flags: str) -> int:
    return main(["run", "--cwd", str(tmp_path), "--verify", "true", "-q", *flags])


@pytest.mark.parametrize("flags", [["--tine", "off"], ["--tine=off"], ["--no-tine"], ["--tine", "OFF"]])
def test_tine_off_writes_no_tine_and_no_file_named_off(tmp_path, monkeypatch, flags) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(tmp_path, *flags) == 0
    assert not list(tmp_path.rglob("*.tine"))
    assert not [p for p in tmp_path.rglob("*") if p.name.lower() == "off"]


def test_tine_on_writes_one_beside_the_run_log(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(tmp_path, "--tine", "on") == 0
    (tine,) = tmp_path.rglob("*.tine")
    assert tine.parent.name == "runs"
    assert not [p for p in tmp_path.rglob("*") if p.name == "on"]


def test_tine_path_writes_it_there(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(tmp_path, "--tine", "proof.tine") == 0
    assert (tmp_path / "proof.tine").is_file()


@pytest.mark.parametrize(("flags", "lessons"), [([], True), (["--lessons", "on"], True), (["--lessons", "off"], False),
                                                 (["--reflexion", "on"], True), (["--reflexion", "off"], False),
                                                 (["--no-reflexion"], False)])
def test_lessons_switch_and_its_old_spellings(tmp_path, flags, lessons) -> None:
    page = tmp_path / "lessons.md"
    code = main(["run", "--cwd", str(tmp_path), "--verify", "false", "--max-iter", "1", "-q",
                 "--suspects", "off", "--lessons-page", str(page), *flags])
    assert code == 2
    assert page.exists() is lessons

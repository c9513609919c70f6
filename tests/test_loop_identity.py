"""Loops nobody named get distinct identities (from their checks, revise command and
goal) for their lessons pages and run logs; a lesson is read back only by the loop
that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_loops.artifacts.lessons_page import own_lessons
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.spec import Check, LoopSpec


def spec(verify: str = "false", revise: str | None = "true", **kw) -> LoopSpec:
    return LoopSpec(name=kw.pop("name", "loop"), checks=(Check.command_passes(verify),), revise=revise, **kw)


def test_an_unnamed_loop_is_known_by_what_it_does() -> None:
    a, b = spec(anonymous=True), spec(verify="make test", anonymous=True)
    assert a.identity.startswith("loop#") and len(a.identity) == len("loop#") + 8
    assert a.identity != b.identity and a.slug != b.slug
    assert spec(revise="./agent.sh", anonymous=True).identity != a.identity
    assert spec(anonymous=True, goal="other").identity != a.identity
    assert spec(anonymous=True).identity == a.identity  # the same loop, run again
    assert spec(anonymous=True, cwd="/elsewhere", source="x").identity == a.identity


def test_a_named_loop_keeps_its_name_and_digest() -> None:
    named = spec(name="calc")
    assert named.identity == "calc" and "anonymous" not in named.to_dict()
    unnamed = spec(anonymous=True)
    assert unnamed.digest() != spec().digest()
    assert LoopSpec.from_dict(unnamed.to_dict()).identity == unnamed.identity


def test_a_stored_spec_with_a_bad_anonymous_field_is_bad_input() -> None:
    from pytest_loops.errors import LoopUsageError

    data = spec().to_dict()
    data["anonymous"] = "yes"
    with pytest.raises(LoopUsageError, match="anonymous must be true or false"):
        LoopSpec.from_dict(data)


LINES = [
    "- 2026-01-02T03:04:05Z loop#aaaaaaaa iter 1: exit 1, state first seen: x",
    "- 2026-01-02T03:04:05Z loop#bbbbbbbb iter 1: exit 127, state first seen: y",
    "- 2026-01-02T03:04:05Z loop iter 2: exit 1, state moved: old unnamed runs",
    "- 2026-01-02T03:04:05Z iter 3: exit 1, state moved: older still, no label",
    "- remember: the parser is in src/parse.py",
]


def test_own_lessons() -> None:
    assert own_lessons(LINES, "loop#aaaaaaaa", unlabelled=False) == [LINES[0], LINES[4]]
    assert own_lessons(LINES, "loop", unlabelled=True) == LINES[2:]
    assert own_lessons(LINES, "failing tests", unlabelled=True) == LINES[3:]


def run_loop(cli, cwd: Path, verify: str, *extra: str) -> dict:
    done = cli("run", "--verify", verify, "--revise", "true", "--max-iter", "1", "--no-progress-k", "0",
               "--cwd", str(cwd), *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    logs = sorted((cwd / ".pytest-loops" / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return load_runlog(logs[-1])


def test_two_unnamed_loops_never_share_lessons_and_each_reads_its_own(cli, tmp_path: Path) -> None:
    first = run_loop(cli, tmp_path, "echo first-check-failed; exit 1")
    assert first["lessons_read"] == [] and first["identity"].startswith("loop#")
    second = run_loop(cli, tmp_path, "echo second-check-failed; exit 3")
    assert second["lessons_read"] == [], "a new unnamed loop read another loop's lessons"
    assert second["identity"] != first["identity"]
    assert first["loop"] == second["loop"] == "loop"  # the name shown stays
    pages = sorted(p.name for p in (tmp_path / ".pytest-loops" / "lessons").glob("*.md"))
    assert len(pages) == 2
    again = run_loop(cli, tmp_path, "echo first-check-failed; exit 1")
    assert again["identity"] == first["identity"]
    assert len(again["lessons_read"]) == 1 and "first-check-failed" in again["lessons_read"][0]
    assert f" {first['identity']} iter 1: exit 1" in again["lessons_read"][0]
    runs = {p.name.split("-")[0] for p in (tmp_path / ".pytest-loops" / "runs").glob("*.json")}
    assert runs == {"loop"} and len(list((tmp_path / ".pytest-loops" / "runs").glob("*.json"))) == 3


def test_lessons_of_the_old_unnamed_name_stay_with_a_loop_named_so(cli, tmp_path: Path) -> None:
    from pytest_loops.redact import name_slug

    old = tmp_path / ".pytest-loops" / "lessons" / f"{name_slug('loop')}.md"
    old.parent.mkdir(parents=True)
    old.write_text("## Lessons\n\n- 2026-01-02T03:04:05Z loop iter 1: exit 127, state first seen: typo\n")
    unnamed = run_loop(cli, tmp_path, "exit 1")
    assert unnamed["lessons_read"] == []
    named = run_loop(cli, tmp_path, "exit 1", "--name", "loop")
    assert named["identity"] == "loop" and len(named["lessons_read"]) == 1 and "typo" in named["lessons_read"][0]


def test_a_shared_lessons_page_gives_each_loop_its_own_lines(cli, tmp_path: Path) -> None:
    page = tmp_path / "shared.md"
    run_loop(cli, tmp_path, "echo a-failed; exit 1", "--lessons-page", str(page))
    other = run_loop(cli, tmp_path, "echo b-failed; exit 1", "--lessons-page", str(page))
    assert other["lessons_read"] == []
    assert page.read_text().count(" iter 1: ") == 2
    mine = run_loop(cli, tmp_path, "echo b-failed; exit 1", "--lessons-page", str(page))
    assert len(mine["lessons_read"]) == 1 and "b-failed" in mine["lessons_read"][0]


@pytest.mark.slow
def test_the_session_fix_loop_reads_only_its_own_lessons(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from plugin_helpers import CALC_TESTS, Project

    project = Project(pytester, monkeypatch)
    project.write("test_calc.py", CALC_TESTS)
    project.write("test_other.py", "def test_other():\n    assert 1 == 2\n")
    args = ("--loop", "--loop-revise=python note.py notes.txt tried", "--loop-max-iter=1", "-p", "no:randomly")

    def session(*paths: str) -> dict:
        project.run(*args, *paths)
        logs = sorted(project.artifacts.glob("runs/failing-tests-*.json"), key=lambda p: p.stat().st_mtime_ns)
        return load_runlog(logs[-1])

    first = session("test_calc.py")
    assert first["loop"] == "failing tests" and first["identity"].startswith("failing tests#")
    assert first["lessons_read"] == []
    other = session("test_other.py")  # other failing tests: another loop
    assert other["identity"] != first["identity"] and other["lessons_read"] == []
    again = session("test_calc.py")
    assert again["identity"] == first["identity"]
    assert len(again["lessons_read"]) == 1 and first["identity"] in again["lessons_read"][0]

"""The lessons page is read once per loop and appended once per iteration, without
re-reading its tail: a page emptied, removed or edited meanwhile still comes out right."""

from __future__ import annotations

from pytest_loops.artifacts.lessons_page import LESSONS_HEADING, LessonsPage


def counting(page: LessonsPage, monkeypatch) -> list[int]:
    reads: list[int] = []
    real = page._read_tail
    monkeypatch.setattr(page, "_read_tail", lambda **kw: reads.append(1) or real(**kw))
    return reads


def test_appends_after_the_first_do_not_read_the_page(tmp_path, monkeypatch):
    page = LessonsPage(tmp_path / "lessons.md", loop_name="fix", goal="green")
    reads = counting(page, monkeypatch)
    for i in range(1, 6):
        page.append(f"- lesson {i}")
    assert len(reads) == 1
    assert page.read_lessons() == [f"- lesson {i}" for i in range(1, 6)]
    text = (tmp_path / "lessons.md").read_text()
    assert text.count(LESSONS_HEADING) == 1 and text.endswith("- lesson 5\n")


def test_a_page_removed_or_emptied_mid_loop_gets_its_header_again(tmp_path):
    path = tmp_path / "lessons.md"
    page = LessonsPage(path, loop_name="fix")
    page.append("- one")
    path.unlink()
    page.append("- two")
    assert path.read_text().startswith("---\n") and page.read_lessons() == ["- two"]
    path.write_text("")
    page.append("- three")
    assert path.read_text().startswith("---\n") and page.read_lessons() == ["- three"]


def test_a_page_edited_without_a_final_newline_keeps_lines_apart(tmp_path):
    path = tmp_path / "lessons.md"
    page = LessonsPage(path, loop_name="fix")
    page.append("- one")
    with open(path, "a") as f:
        f.write("- added by hand")
    page.append("- two")
    assert page.read_lessons() == ["- one", "- added by hand", "- two"]

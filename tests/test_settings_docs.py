"""docs/options.md lists every spelling of every row of the settings table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_loops.settings import SETTINGS, Setting

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = (DOCS / "options.md").read_text(encoding="utf-8")


def listed(spelling: str, page: str = PAGE) -> bool:
    """As inline code: alone, followed by its argument, or inside a longer code span."""
    pattern = re.compile(r"(?<![\w-])" + re.escape(spelling) + r"(?![\w-])")
    return any(pattern.search(span) for span in re.findall(r"`([^`]+)`", page))


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name) for row in SETTINGS])
def test_options_page_lists_every_spelling(row: Setting) -> None:
    missing = [s for s in row.spellings() if not listed(s)]
    assert not missing, f"docs/options.md does not list {missing} (setting {row.name})"


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name) for row in SETTINGS if row.choices and not row.bare])
def test_options_page_lists_every_choice(row: Setting) -> None:
    spelling = row.option or row.run_flag
    assert listed(f"{spelling} {'|'.join(row.choices)}".replace("|", "\\|")), spelling


def test_listed_needs_inline_code() -> None:
    assert listed("--max-iter", "give `--max-iter N`")
    assert not listed("--max-iter", "give --max-iter N")
    assert not listed("--max-iter", "give `--max-iter-x N`")


def test_adding_a_setting_is_documented_and_linked() -> None:
    page = (DOCS / "contributing.md").read_text(encoding="utf-8")
    assert "## Adding a setting" in page and "SETTINGS" in page
    assert "(contributing.md)" in (DOCS / "index.md").read_text(encoding="utf-8")

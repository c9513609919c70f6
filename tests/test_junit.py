"""Amending JUnit XML after the session fix-loop (pytest writes it before the loop's verdict)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_loops.artifacts.junit import junit_address, mark_repaired

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="0" tests="3">
<testcase classname="tests.test_a.TestX" name="test_y[a b]"><failure message="boom">x</failure></testcase>
<testcase classname="tests.test_a" name="test_z"><error message="fixture">y</error></testcase>
<testcase classname="tests.test_a" name="test_ok" />
</testsuite></testsuites>
"""


@pytest.mark.parametrize(("nodeid", "address"), [
    ("tests/test_a.py::TestX::test_y[a b]", ("tests.test_a.TestX", "test_y[a b]")),
    ("test_b.py::test_q", ("test_b", "test_q")),
])
def test_junit_address(nodeid: str, address: tuple[str, str]) -> None:
    assert junit_address(nodeid) == address


def test_repaired_cases_lose_their_failure_and_gain_properties(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(XML)
    found = mark_repaired(xml, ["tests/test_a.py::TestX::test_y[a b]", "tests/test_a.py::test_z"],
                          [("verdict", "SUCCESS"), ("iterations", "2")], repaired=True)
    assert found == 2
    text = xml.read_text()
    assert 'failures="0"' in text and 'errors="0"' in text
    assert "<failure" not in text and "<error" not in text
    assert text.count('name="verdict" value="SUCCESS"') == 2


def test_a_loop_that_did_not_repair_keeps_the_failure(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(XML)
    mark_repaired(xml, ["tests/test_a.py::TestX::test_y[a b]"], [("verdict", "MAX_ITER")], repaired=False)
    text = xml.read_text()
    assert "<failure" in text and 'failures="1"' in text and 'value="MAX_ITER"' in text


@pytest.mark.parametrize("content", [None, "", "<not xml", "\x00\x01"])
def test_a_missing_or_broken_file_is_left_alone(tmp_path: Path, content: str | None) -> None:
    xml = tmp_path / "j.xml"
    if content is not None:
        xml.write_text(content)
    assert mark_repaired(xml, ["a.py::t"], [("verdict", "SUCCESS")], repaired=True) == 0
    assert (xml.read_text() if content is not None else None) == content

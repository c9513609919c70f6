"""The one JUnit XML reader: node addresses, what a file says of each test, and amending
it after the session fix-loop (pytest writes it before the loop's verdict)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_loops.artifacts.junit import (
    junit_address,
    junit_addresses,
    mark_repaired,
    passed_nodeids,
    read_cases,
    seconds_by_nodeid,
)

# parametrize ids that hold what a node id separates on: "::", brackets, spaces, unicode
ODD_IDS = ["a::b", "x[1]", "]y[", "two words", "\u00fcn\u00ef c\u00f8d\u00e9", "m [a::b] n"]

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
    ("tests/test_a.py::TestX::test_y[a::b]", ("tests.test_a.TestX", "test_y[a::b]")),
    ("tests/test_a.py::test_y[m [a::b] n]", ("tests.test_a", "test_y[m [a::b] n]")),
    ("tests/test_a.py::test_y[]y[]", ("tests.test_a", "test_y[]y[]")),
    ("tests/test_a.py::test_y[x[1]]", ("tests.test_a", "test_y[x[1]]")),
    ("tests/test_a.py::T::test_y[\u00fcn\u00ef c\u00f8d\u00e9]",
     ("tests.test_a.T", "test_y[\u00fcn\u00ef c\u00f8d\u00e9]")),
    ("tests/test_a.py::test_y[bell\x07]", ("tests.test_a", "test_y[bell#x07]")),  # as junitxml shows it
    ("pkg/t[1].py::test_y[a::b]", ("pkg.t[1]", "test_y[a::b]")),  # a bracket in the file name
])
def test_junit_address(nodeid: str, address: tuple[str, str]) -> None:
    assert junit_address(nodeid) == address
    assert address in junit_addresses(nodeid)


def test_junit_address_with_a_prefix() -> None:
    assert junit_address("tests/test_a.py::T::test_y[a::b]", "ci") == ("ci.tests.test_a.T", "test_y[a::b]")


def odd_project(pytester: pytest.Pytester, ok: bool) -> None:
    pytester.makeini("[pytest]\ndisable_test_id_escaping_and_forfeit_all_rights_to_community_support = true\n")
    pytester.makepyfile(state=f"OK = {ok}\n")
    pytester.makepyfile(test_odd=f"""
        import pytest
        import state

        IDS = {ODD_IDS!r}

        @pytest.mark.parametrize("v", IDS, ids=IDS)
        def test_f(v):
            assert state.OK, v

        class TestK:
            @pytest.mark.parametrize("v", IDS, ids=IDS)
            def test_m(self, v):
                assert state.OK, v

        def test_green():
            pass
    """)


ODD_NODEIDS = [*(f"test_odd.py::test_f[{i}]" for i in ODD_IDS), *(f"test_odd.py::TestK::test_m[{i}]" for i in ODD_IDS)]


@pytest.mark.parametrize("ok", [True, False])
def test_what_pytest_wrote_is_read_back_by_node_id(pytester: pytest.Pytester, ok: bool) -> None:
    """The reader finds each test pytest itself wrote, whatever its parametrize id holds."""
    odd_project(pytester, ok)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--junitxml=j.xml",
                                           "-o", "junit_family=xunit2")
    assert result.ret == (0 if ok else 1)
    xml = pytester.path / "j.xml"
    cases = read_cases(xml)
    assert cases is not None and len(cases) == len(ODD_NODEIDS) + 1
    everything = [*ODD_NODEIDS, "test_odd.py::test_green"]
    assert {c.address for c in cases} == {junit_address(n) for n in everything}
    passed = passed_nodeids(xml, [*everything, "test_odd.py::test_absent"])
    assert passed == (set(everything) if ok else {"test_odd.py::test_green"})
    assert set(seconds_by_nodeid(xml, everything)) == set(everything)


def test_a_test_with_any_failing_case_did_not_pass(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(XML.replace('name="test_ok" />', 'name="test_ok" time="0.5"/><testcase classname="tests.test_a" '
                                                   'name="test_ok" time="0.25"><skipped/></testcase>'))
    ids = ["tests/test_a.py::TestX::test_y[a b]", "tests/test_a.py::test_ok", "tests/test_a.py::test_z"]
    assert passed_nodeids(xml, ids) == set()
    assert seconds_by_nodeid(xml, ids)["tests/test_a.py::test_ok"] == 0.75
    assert passed_nodeids(tmp_path / "missing.xml", ids) is None
    assert seconds_by_nodeid(tmp_path / "missing.xml", ids) == {}


@pytest.mark.slow
@pytest.mark.parametrize("prefix", [None, "ci"])
def test_a_session_fix_loop_marks_odd_ids_repaired(pytester: pytest.Pytester, prefix: str | None) -> None:
    """`pytest --loop --loop-revise CMD --junitxml`: the tests the revise step repaired are
    repaired in the JUnit XML and in the terminal's summary, whatever their ids hold."""
    odd_project(pytester, ok=False)
    pytester.makepyfile(fix="import pathlib\npathlib.Path('state.py').write_text('OK = True\\n')\n")
    args = ["--loop", "--loop-revise", "python fix.py", "--loop-max-iter", "3", "--loop-suspects", "off",
            "-p", "no:cacheprovider", "--junitxml=junit.xml", "-o", "junit_family=xunit2"]
    result = pytester.runpytest_subprocess(*args, *([f"--junit-prefix={prefix}"] if prefix else []))
    assert result.ret == 0, result.stdout.str()
    assert f"1 passed, {len(ODD_NODEIDS)} repaired in" in result.stdout.lines[-1]
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("errors") == "0"
    cases = list(suite.iter("testcase"))
    assert len(cases) == len(ODD_NODEIDS) + 1
    for case in cases:
        assert case.find("failure") is None and case.find("error") is None, case.get("name")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if case.get("name") == "test_green":
            assert props == {}
        else:
            assert props["verdict"] == "SUCCESS" and props["iterations"] == "2", case.get("name")


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


def test_one_junit_reader() -> None:
    """JUnit XML is parsed in artifacts/junit.py; core/checks.py, a layer below the
    artifacts, still counts its named-test check's cases itself (it may not import upward)."""
    package = Path(__file__).resolve().parents[1] / "pytest_loops"
    holders = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")
                     if '"testcase"' in p.read_text(encoding="utf-8"))
    assert "artifacts/junit.py" in holders
    assert set(holders) <= {"artifacts/junit.py", "core/checks.py"}, holders

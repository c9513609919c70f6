"""Under --loop-exitcode=verdict, 2-5 mean verdicts only: pytest's own codes move out of the way."""

from __future__ import annotations

import pytest


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    return pytester


@pytest.mark.parametrize(("mode", "code"), [("pytest", 4), ("verdict", 64)])
def test_a_bad_value_is_a_usage_error(project: pytest.Pytester, mode: str, code: int) -> None:
    result = project.runpytest_subprocess("--loop", "--loop-exitcode", mode, "--loop-max-iter", "0")
    assert result.ret == code
    assert "'0' is not a valid max_iter" in result.stderr.str() + result.stdout.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    errors = [line for line in result.stderr.lines if "is not a valid max_iter" in line]
    assert len(errors) == 1 and errors[0].startswith("ERROR: --loop-max-iter"), result.stderr.lines


@pytest.mark.parametrize(("mode", "code"), [("pytest", 4), ("verdict", 64)])
def test_a_bad_marker_is_a_usage_error(project: pytest.Pytester, mode: str, code: int) -> None:
    project.makepyfile(test_bad="import pytest\n\n@pytest.mark.loop(max_iter=0)\ndef test_x():\n    pass\n")
    result = project.runpytest_subprocess("--loop", "--loop-exitcode", mode)
    assert result.ret == code


@pytest.mark.parametrize(("mode", "code"), [("pytest", 2), ("verdict", 64)])
def test_a_bad_loop_file_is_bad_input(project: pytest.Pytester, mode: str, code: int) -> None:
    project.path.joinpath("broken.loop").write_text('loop "x":\n  done when "true" passes\n')
    result = project.runpytest_subprocess("--loop", "--loop-exitcode", mode)
    assert result.ret == code
    result.stdout.fnmatch_lines(["*broken.loop:1*"])


@pytest.mark.parametrize(("mode", "code"), [("pytest", 5), ("verdict", 64)])
def test_no_tests_collected(pytester: pytest.Pytester, mode: str, code: int) -> None:
    result = pytester.runpytest_subprocess("--loop", "--loop-exitcode", mode)
    assert result.ret == code


def test_success_is_still_zero_in_verdict_mode(project: pytest.Pytester) -> None:
    assert project.runpytest_subprocess("--loop", "--loop-exitcode", "verdict").ret == 0

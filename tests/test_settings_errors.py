"""Bad values on every surface of the settings table: one line naming where and what is valid."""

from __future__ import annotations

import pytest
import yaml  # noqa: F401 - imported before pytester's inline runs snapshot (and later restore) sys.modules

from pytest_loops.cli.main import main
from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.options import marker_layer as plugin_marker_layer
from pytest_loops.pytest_plugin.plugin import build_settings
from pytest_loops.settings import SETTINGS, TAKES_VALUE, Setting, env_layer
from pytest_loops.sources import load_yaml_text

# a value each kind rejects
BAD = {"int": "many", "number": "soon", "choice": "sideways", "switch": "maybe", "size": "12Q", "seconds": "soon"}
CHECKED = [row for row in SETTINGS if row.kind in BAD]


def rows(attr: str, extra=lambda row: True) -> list:
    return [pytest.param(row, id=row.name) for row in CHECKED if getattr(row, attr) and extra(row)]


def one_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("row", rows("run_flag", lambda r: not r.run_accepts_path))
def test_bad_run_flag_is_one_line_and_exit_64(row: Setting, capsys, tmp_path) -> None:
    code = main(["run", "--cwd", str(tmp_path), "--verify", "true", row.run_flag, BAD[row.kind]])
    assert code == 64
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"pytest-loops: error: {row.run_flag}: {BAD[row.kind]!r} is not a valid {row.name}")
    assert f"valid: {row.valid}" in line


def test_an_empty_tine_path_is_one_line(capsys, tmp_path) -> None:
    assert main(["run", "--cwd", str(tmp_path), "--verify", "true", "--tine="]) == 64
    assert one_error(capsys.readouterr().err) == ("pytest-loops: error: --tine: an empty path; "
                                                  "give on, off or a file path")


@pytest.mark.parametrize("row", rows("env"))
def test_bad_environment_variable_for_the_runner_is_one_line(row: Setting, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(row.env, BAD[row.kind])
    assert main(["run", "--cwd", str(tmp_path), "--verify", "true"]) == 64
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"pytest-loops: error: environment variable {row.env}: ")
    assert f"valid: {row.valid}" in line


@pytest.mark.parametrize("row", rows("env"))
def test_bad_environment_variable_names_it(row: Setting) -> None:
    with pytest.raises(LoopUsageError) as exc:
        env_layer({row.env: BAD[row.kind]})
    assert str(exc.value) == (f"environment variable {row.env}: {BAD[row.kind]!r} is not a valid "
                              f"{row.name}; valid: {row.valid}")


@pytest.mark.parametrize("row", rows("option", lambda r: not r.bare))  # a flag alone takes no value
def test_bad_pytest_option_is_pytests_usage_error(pytester: pytest.Pytester, row: Setting) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--loop", f"{row.option}={BAD[row.kind]}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = one_error(result.stderr.str())
    assert line == f"ERROR: {row.option}: {BAD[row.kind]!r} is not a valid {row.name}; valid: {row.valid}"


@pytest.mark.parametrize("row", rows("ini"))
def test_bad_ini_value_names_the_ini_key(pytester: pytest.Pytester, row: Setting) -> None:
    pytester.makeini(f"[pytest]\n{row.ini} = {BAD[row.kind]}\n")
    config = pytester.parseconfig("--loop")
    try:
        with pytest.raises(LoopUsageError) as exc:
            build_settings(config, environ={})
    finally:
        config._ensure_unconfigure()
    assert str(exc.value).startswith(f"ini {row.ini}: {BAD[row.kind]!r} is not a valid {row.name}")


@pytest.mark.parametrize("row", rows("marker"))
def test_bad_marker_keyword_names_the_test_and_keyword(row: Setting) -> None:
    mark = pytest.mark.loop(**{row.marker: BAD[row.kind]}).mark
    with pytest.raises(LoopUsageError) as exc:
        plugin_marker_layer(mark, "t.py::t")
    assert str(exc.value).startswith(f"t.py::t: @pytest.mark.loop({row.marker}=...): {BAD[row.kind]!r} "
                                     f"is not a valid {row.name}")


def test_a_marker_value_of_the_wrong_type_is_one_line() -> None:
    with pytest.raises(LoopUsageError) as exc:
        plugin_marker_layer(pytest.mark.loop(state=3).mark, "t.py::t")
    assert str(exc.value) == ("t.py::t: @pytest.mark.loop(state=...): 3 is not a valid state_paths; "
                              "valid: a glob or a list of globs")


@pytest.mark.parametrize("row", rows("yaml_key", lambda r: r.kind in ("int", "number", "choice")))
def test_bad_yaml_loop_value_names_the_key_path(row: Setting) -> None:
    section, _, key = row.yaml_key.rpartition(".")
    text = (f"loops:\n  - name: one\n    goal: pass\n    checks: [\"true\"]\n"
            f"    {section}:\n      {key}: {BAD[row.kind]}\n")
    with pytest.raises(LoopUsageError) as exc:
        load_yaml_text(text, "x.loop.yaml")
    assert str(exc.value).startswith("x.loop.yaml:6:")
    assert f"loops[0].{row.yaml_key}" in str(exc.value)


def test_an_unknown_run_flag_names_the_program_once(capsys) -> None:
    assert main(["run", "--verify", "true", "--bogus"]) == 64
    assert one_error(capsys.readouterr().err) == ("pytest-loops: error: unrecognized arguments: --bogus; "
                                                  "see `pytest-loops run --help`")
    assert main(["--bogus"]) == 64
    assert one_error(capsys.readouterr().err) == ("pytest-loops: error: unrecognized arguments: --bogus; "
                                                  "see `pytest-loops --help`")


def test_a_bad_choice_names_the_subcommand_once(capsys) -> None:
    assert main(["report"]) == 64
    line = one_error(capsys.readouterr().err)
    assert line.startswith("pytest-loops: error: report: ") and line.count("pytest-loops") == 2


# -- old spellings: a bad value names the spelling it was written under ---------------

def alias_params(spellings) -> list:
    return [pytest.param(row, alias, id=alias) for row in CHECKED for alias in spellings(row)]


@pytest.mark.parametrize(("row", "alias"), alias_params(
    lambda row: [a for a, const in row.run_aliases if const is TAKES_VALUE and not row.run_accepts_path]))
def test_a_bad_value_of_an_old_run_flag_names_that_flag(row: Setting, alias: str, capsys, tmp_path) -> None:
    assert main(["run", "--cwd", str(tmp_path), "--verify", "true", alias, BAD[row.kind]]) == 64
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"pytest-loops: error: {alias}: {BAD[row.kind]!r} is not a valid {row.name}")


@pytest.mark.parametrize(("row", "alias"), alias_params(lambda row: row.option_aliases))
def test_a_bad_value_of_an_old_pytest_option_names_that_option(pytester: pytest.Pytester, row: Setting,
                                                                alias: str) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--loop", f"{alias}={BAD[row.kind]}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = one_error(result.stderr.str())
    assert line == f"ERROR: {alias}: {BAD[row.kind]!r} is not a valid {row.name}; valid: {row.valid}"


@pytest.mark.parametrize(("row", "alias"), alias_params(lambda row: row.ini_aliases))
def test_a_bad_value_of_an_old_ini_key_names_that_key(pytester: pytest.Pytester, row: Setting, alias: str) -> None:
    pytester.makeini(f"[pytest]\n{alias} = {BAD[row.kind]}\n")
    config = pytester.parseconfig("--loop")
    try:
        with pytest.raises(LoopUsageError) as exc:
            build_settings(config, environ={})
    finally:
        config._ensure_unconfigure()
    assert str(exc.value).startswith(f"ini {alias}: {BAD[row.kind]!r} is not a valid {row.name}")


@pytest.mark.parametrize(("row", "alias"), alias_params(lambda row: [k for k in row.yaml_aliases if "." not in k]))
def test_a_bad_value_of_an_old_yaml_key_names_that_key(row: Setting, alias: str) -> None:
    text = f"loops:\n  - name: one\n    goal: pass\n    checks: [\"true\"]\n    {alias}: {BAD[row.kind]}\n"
    with pytest.raises(LoopUsageError) as exc:
        load_yaml_text(text, "x.loop.yaml")
    assert str(exc.value).startswith("x.loop.yaml:5:")
    assert f"loops[0].{alias}:" in str(exc.value)

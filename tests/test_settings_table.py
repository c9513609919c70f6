"""The settings table: every row is on every surface it declares, and round-trips
through the report header's reproduce command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml  # noqa: F401 - imported before pytester's inline runs snapshot (and later restore) sys.modules

from pytest_loops.cli.main import build_parser
from pytest_loops.pytest_plugin.options import marker_layer as plugin_marker_layer
from pytest_loops.pytest_plugin.plugin import build_settings
from pytest_loops.pytest_plugin.state import SessionState
from pytest_loops.settings import (
    BY_NAME,
    SETTINGS,
    TAKES_VALUE,
    Setting,
    env_layer,
    marker_layer,
    option_rows,
    run_rows,
    yaml_keys,
)
from pytest_loops.sources import load_yaml_text, parse_loop_text

ROWS = [pytest.param(row, id=row.name) for row in SETTINGS]


def rows_with(attr: str) -> list:
    return [pytest.param(row, id=row.name) for row in SETTINGS if getattr(row, attr)]


def run_subparser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return parser, sub.choices["run"]


def typed_sample(row: Setting):
    """The row's sample as a YAML or marker would give it (a number, a bool, a list)."""
    value = row.parse(row.sample, "sample")
    return [row.sample] if row.repeatable else value


# -- the table itself ------------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS)
def test_every_row_is_complete_and_its_sample_parses(row: Setting) -> None:
    assert row.help and row.valid and row.sample, row.name
    assert row.run_flag or row.option, f"{row.name} is on no command line"
    row.parse(row.sample, "sample")  # a row's own sample is valid
    if row.option:
        assert row.ini == row.dest, "the ini key is the option's dest: one spelling"
    if row.env:
        assert row.env.startswith("PYTEST_LOOPS_"), "settings never read the revise step's LOOP_* names"
    if row.kind == "choice":
        assert row.default in row.choices, "the default is one of the choices"
    if row.kind == "switch":
        assert row.choices == ("on", "off") and isinstance(row.default, bool)


def test_names_and_spellings_are_unique() -> None:
    seen: dict[str, str] = {}
    for row in SETTINGS:
        for spelling in row.spellings():
            assert spelling not in seen, f"{spelling} is both {seen.get(spelling)} and {row.name}"
            seen[spelling] = row.name


# -- pytest-loops run ----------------------------------------------------------------


@pytest.mark.parametrize("row", rows_with("run_flag"))
def test_run_flag_is_generated_and_parses_the_sample(row: Setting) -> None:
    parser, run = run_subparser()
    action = run._option_string_actions[row.run_flag]
    assert action.dest == row.name
    args = parser.parse_args(["run", "--verify", "true", f"{row.run_flag}={row.sample}"])
    expected = row.parse(row.sample, "x")
    assert getattr(args, row.name) == expected
    for alias, const in row.run_aliases:
        assert run._option_string_actions[alias].dest == row.name
        given = [alias, row.sample] if const is TAKES_VALUE else [alias]
        args = parser.parse_args(["run", "--verify", "true", *given])
        assert getattr(args, row.name) == (expected if const is TAKES_VALUE else const)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in run_rows() if r.choices])
def test_run_help_shows_choices_not_a_metavar(row: Setting) -> None:
    _, run = run_subparser()
    text = run.format_help()
    assert f"{row.run_flag} {row.shown_metavar}" in text
    assert row.name.upper() not in text


@pytest.mark.parametrize(("given", "tine", "path"), [
    (["--tine", "off"], False, None), (["--tine", "on"], True, None), (["--no-tine"], False, None),
    (["--tine", "out/run.tine"], "out/run.tine", "out/run.tine"), ([], None, None)])
def test_tine_off_is_off_never_a_file_named_off(given, tine, path) -> None:
    from pytest_loops.cli.main import _tine_path

    parser, _ = run_subparser()
    args = parser.parse_args(["run", "--verify", "true", *given])
    assert args.tine == tine
    assert _tine_path(args) == path


# -- pytest: options, ini keys, environment, marker -----------------------------------


@pytest.fixture(scope="module")
def pytest_help(tmp_path_factory) -> str:
    where = tmp_path_factory.mktemp("help")
    (where / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=where,
                          capture_output=True, text=True, check=True)
    return proc.stdout


@pytest.mark.parametrize("row", rows_with("option"))
def test_pytest_option_and_ini_key_are_in_pytest_help(row: Setting, pytest_help: str) -> None:
    for option in row.options:  # old spellings too; a flag alone (--loop-watch) has no value
        assert (f"{option} " if row.bare else f"{option}={row.shown_metavar}") in pytest_help
    for ini in row.inis:
        assert f"  {ini} (" in pytest_help
    if row.choices:
        assert row.dest.upper() not in pytest_help


def settings_of(pytester: pytest.Pytester, *args: str, environ: dict[str, str] | None = None):
    config = pytester.parseconfig("--loop", *args)
    try:
        return build_settings(config, environ=environ or {})
    finally:
        config._ensure_unconfigure()


LAYERED = [pytest.param(row, id=row.name) for row in option_rows() if row.name != "config"]


@pytest.mark.parametrize("row", LAYERED)
def test_pytest_option_sets_the_value(pytester: pytest.Pytester, row: Setting) -> None:
    settings = settings_of(pytester, str(row.option) if row.bare else f"{row.option}={row.sample}")
    assert settings[row.name] == row.parse("on" if row.bare else row.sample, "x")
    assert settings.origin[row.name] == "command line"


@pytest.mark.parametrize("row", LAYERED)
def test_ini_key_sets_the_value(pytester: pytest.Pytester, row: Setting) -> None:
    pytester.makeini(f"[pytest]\n{row.ini} = {row.sample}\n")
    settings = settings_of(pytester)
    assert settings[row.name] == row.parse(row.sample, "x")
    assert settings.origin[row.name] == "ini"


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in SETTINGS if r.env and r.env_read_here])
def test_environment_variable_sets_the_value(row: Setting) -> None:
    layer = env_layer({row.env: row.sample, "PYTEST_LOOPS_UNRELATED": "x"})
    assert layer == {row.name: row.parse(row.sample, "x") if not row.repeatable else [row.sample]}


# -- old spellings: each reaches the same setting, and the new spelling wins over it -------

def other_sample(row: Setting) -> str:
    """A valid value other than the row's sample (to tell two spellings apart)."""
    return {"switch": "on" if row.sample == "off" else "off", "path": "other.md"}[row.kind]


def aliases(attr: str) -> list:
    return [pytest.param(row, alias, id=alias) for row in SETTINGS for alias in getattr(row, attr)]


def test_old_spellings_are_declared_for_the_lessons_settings() -> None:
    page, lessons = BY_NAME["lessons_page"], BY_NAME["lessons"]
    assert {a for a, _ in page.run_aliases} == {"--memory", "--episodic"}
    assert {a for a, _ in lessons.run_aliases} == {"--reflexion", "--no-reflexion"}
    assert (page.option_aliases, page.ini_aliases, page.env_aliases, page.yaml_aliases) == (
        ("--loop-memory",), ("loop_memory",), ("PYTEST_LOOPS_MEMORY",), ("memory_page",))
    assert (lessons.option_aliases, lessons.ini_aliases, lessons.yaml_aliases) == (
        ("--loop-reflexion",), ("loop_reflexion",), ("reflexion",))


@pytest.mark.parametrize(("row", "alias"), aliases("option_aliases"))
def test_an_old_pytest_option_sets_the_value(pytester: pytest.Pytester, row: Setting, alias: str) -> None:
    settings = settings_of(pytester, f"{alias}={row.sample}")
    assert settings[row.name] == row.parse(row.sample, "x")
    assert settings.origin[row.name] == "command line"
    both = settings_of(pytester, f"{row.option}={other_sample(row)}", f"{alias}={row.sample}")
    assert both[row.name] == row.parse(other_sample(row), "x"), "the new option wins over the old one"


@pytest.mark.parametrize(("row", "alias"), aliases("ini_aliases"))
def test_an_old_ini_key_sets_the_value(pytester: pytest.Pytester, row: Setting, alias: str) -> None:
    pytester.makeini(f"[pytest]\n{alias} = {row.sample}\n")
    settings = settings_of(pytester)
    assert settings[row.name] == row.parse(row.sample, "x")
    assert settings.origin[row.name] == "ini"
    pytester.makeini(f"[pytest]\n{alias} = {row.sample}\n{row.ini} = {other_sample(row)}\n")
    assert settings_of(pytester)[row.name] == row.parse(other_sample(row), "x"), "the new key wins"


@pytest.mark.parametrize(("row", "alias"), aliases("env_aliases"))
def test_an_old_environment_variable_sets_the_value(row: Setting, alias: str) -> None:
    assert env_layer({alias: row.sample}) == {row.name: row.parse(row.sample, "x")}
    both = env_layer({alias: row.sample, row.env: other_sample(row)})
    assert both == {row.name: row.parse(other_sample(row), "x")}, "the new name wins"


@pytest.mark.parametrize(("row", "alias"), [p for p in aliases("yaml_aliases") if not p.values[0].guard])
def test_an_old_yaml_key_sets_the_value(row: Setting, alias: str) -> None:
    key = alias  # a guard's second key (guards.budget) is covered by the guard tests
    spec = load_yaml_text(YAML_LOOP.format(extra=f"    {key}: {yaml_value(row)}"), "x.loop.yaml").loops[0]
    got = getattr(spec, row.record_key)
    expected = row.parse(typed_sample(row), "x")
    assert got.endswith(expected) if row.kind == "path" else got == expected
    assert spec.origin[row.record_key] != "default"
    other = yaml_value(row) if row.kind == "path" else str(not expected).lower()
    both = f"    {key}: {other}\n    {row.yaml_key}: {'new.md' if row.kind == 'path' else yaml_value(row)}"
    spec = load_yaml_text(YAML_LOOP.format(extra=both), "x.loop.yaml").loops[0]
    got = getattr(spec, row.record_key)
    assert got.endswith("new.md") if row.kind == "path" else got == expected, "the new key wins"


@pytest.mark.parametrize(("row", "alias"), [pytest.param(row, alias, id=alias) for row in SETTINGS
                                            for alias, const in row.run_aliases if const is TAKES_VALUE])
def test_an_old_run_flag_sets_the_value_and_the_last_flag_wins(row: Setting, alias: str) -> None:
    parser, _ = run_subparser()
    expected, other = row.parse(row.sample, "x"), row.parse(other_sample(row), "x")
    args = parser.parse_args(["run", "--verify", "true", alias, row.sample])
    assert getattr(args, row.name) == expected
    args = parser.parse_args(["run", "--verify", "true", alias, row.sample, row.run_flag, other_sample(row)])
    assert getattr(args, row.name) == other
    args = parser.parse_args(["run", "--verify", "true", row.run_flag, other_sample(row), alias, row.sample])
    assert getattr(args, row.name) == expected


def test_the_mask_variable_is_read_by_the_redactor_not_the_settings() -> None:
    from pytest_loops.redact import MASK_ENV

    assert BY_NAME["mask"].env == MASK_ENV
    assert env_layer({MASK_ENV: "hunter22"}) == {}


@pytest.mark.parametrize("row", rows_with("marker"))
def test_marker_keyword_sets_the_value(row: Setting) -> None:
    mark = pytest.mark.loop(**{row.marker: typed_sample(row)}).mark
    assert plugin_marker_layer(mark, "t.py::t") == {row.name: row.parse(typed_sample(row), "x")}


# -- loop files ------------------------------------------------------------------------

YAML_LOOP = """\
loops:
  - name: one
    goal: pass
    checks: ["true"]
{extra}
"""


def yaml_value(row: Setting) -> str:
    value = typed_sample(row)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if not isinstance(value, str) else value


@pytest.mark.parametrize("row", rows_with("yaml_key"))
def test_yaml_loop_key_sets_the_value(row: Setting) -> None:
    section, _, key = row.yaml_key.rpartition(".")
    value = yaml_value(row)
    extra = f"    {section}:\n      {key}: {value}" if section else f"    {key}: {value}"
    spec = load_yaml_text(YAML_LOOP.format(extra=extra), "x.loop.yaml").loops[0]
    got = getattr(spec.guards, row.name) if row.guard else getattr(spec, row.record_key)
    expected = row.parse(typed_sample(row), "x")
    if row.kind == "path":
        assert got.endswith(expected)
    else:
        assert got == (tuple(expected) if row.repeatable else expected)
    assert spec.origin[row.record_key] != "default"


def test_yaml_key_lists_come_from_the_table() -> None:
    from pytest_loops.sources import yamlspec

    assert set(yaml_keys("guards")) == set(yamlspec.GUARD_KEYS)
    assert set(yaml_keys()) <= set(yamlspec.LOOP_KEYS)


@pytest.mark.parametrize("row", rows_with("loop_line"))
def test_loop_file_line_sets_the_setting(row: Setting) -> None:
    text = f'loop "one":\n  goal: pass\n  done when "true" passes\n  {row.loop_line}\n'
    spec = parse_loop_text(text, "x.loop").loops[0]
    assert spec.origin[row.record_key] != "default", row.loop_line


@pytest.mark.parametrize("row", rows_with("yaml_key"))
def test_a_loop_file_value_wins_and_the_session_fills_the_rest(row: Setting) -> None:
    from pytest_loops.pytest_plugin.items import merge_file_spec
    from pytest_loops.settings import DEFAULTS, resolve

    spec = load_yaml_text(YAML_LOOP.format(extra=""), "x.loop.yaml").loops[0]
    session = resolve([("command line", {row.name: row.parse(typed_sample(row), "x")})], DEFAULTS)
    merged = merge_file_spec(spec, session)
    got = getattr(merged.guards, row.name) if row.guard else getattr(merged, row.record_key)
    expected = session[row.name]
    assert got == (tuple(expected) if row.repeatable else expected)
    assert merged.origin[row.record_key] == "command line"


# -- the reproduce command -------------------------------------------------------------


def reproduce(config, settings) -> str:
    return SessionState.reproduce_command(SimpleNamespace(settings=settings, config=config))


@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in option_rows() if r.reproduce != "never"])
def test_reproduce_command_round_trips(pytester: pytest.Pytester, row: Setting) -> None:
    config = pytester.parseconfig("--loop", row.option, row.sample, "-q")  # the space form
    try:
        settings = build_settings(config, environ={})
        command = reproduce(config, settings)
    finally:
        config._ensure_unconfigure()
    argv = shlex.split(command)
    assert argv[:2] == ["pytest", "--loop"] and "-q" in argv
    assert f"{row.option}={row.text(settings[row.name])[0]}" in argv  # the = form, always
    assert row.option not in argv, "the space form is rewritten"
    again = settings_of(pytester, *argv[2:])
    assert again[row.name] == settings[row.name]
    assert again.values == settings.values


def test_reproduce_never_writes_a_mask_nor_the_config_file(pytester: pytest.Pytester) -> None:
    (pytester.path / "cfg.yaml").write_text("guards:\n  max_iter: 4\n")
    config = pytester.parseconfig("--loop", "--loop-mask=hunter22", "--loop-config=cfg.yaml")
    try:
        command = reproduce(config, build_settings(config, environ={}))
    finally:
        config._ensure_unconfigure()
    assert "hunter22" not in command and "cfg.yaml" not in command
    assert "--loop-max-iter=4" in shlex.split(command)


def test_settings_of_a_marker_come_from_the_table() -> None:
    assert marker_layer({"state": "src/**", "max_iter": 2}, "t") == {"state_paths": ["src/**"], "max_iter": 2}

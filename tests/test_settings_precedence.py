"""Precedence, lowest first: defaults < config file < ini < environment < command line
< marker / loop file line (one function, settings.resolve, applies it)."""

from __future__ import annotations

import argparse

import pytest
import yaml  # noqa: F401 - imported before pytester's inline runs snapshot (and later restore) sys.modules

from pytest_loops.cli.main import build_parser, spec_from_args
from pytest_loops.pytest_plugin.plugin import build_settings
from pytest_loops.settings import DEFAULTS, resolve

LAYERS = ("config file", "ini", "environment", "command line")


@pytest.mark.parametrize("present", [LAYERS[:n] for n in range(len(LAYERS) + 1)] + [
    ("config file", "environment"), ("ini", "command line"), ("config file", "command line")],
    ids=lambda p: "+".join(p) or "defaults")
def test_pytest_precedence(pytester: pytest.Pytester, present: tuple[str, ...]) -> None:
    values = {"config file": 2, "ini": 3, "environment": 4, "command line": 5}
    args, environ = ["--loop"], {}
    ini = "[pytest]\n"
    if "config file" in present:
        pytester.makefile(".yaml", cfg="guards:\n  max_iter: 2\nreflexion:\n  enabled: false\n")
        ini += "loop_config = cfg.yaml\n"
    if "ini" in present:
        ini += "loop_max_iter = 3\nloop_lessons = on\n"
    if "environment" in present:
        environ.update(PYTEST_LOOPS_MAX_ITER="4", PYTEST_LOOPS_LESSONS="on")
    if "command line" in present:
        args += ["--loop-max-iter=5", "--loop-lessons=off"]
    pytester.makeini(ini)
    config = pytester.parseconfig(*args)
    try:
        settings = build_settings(config, environ=environ)
    finally:
        config._ensure_unconfigure()
    top = present[-1] if present else None
    assert settings["max_iter"] == (values[top] if top else DEFAULTS["max_iter"])
    origin = settings.origin["max_iter"]
    assert origin == ("default" if top is None else origin if top == "config file" else top)
    if top == "config file":
        assert origin.endswith("cfg.yaml")
    expected = {None: True, "config file": False, "ini": True, "environment": True, "command line": False}
    assert settings["lessons"] is expected[top]
    assert settings.origin["lessons"] == settings.origin["max_iter"]


def test_marker_is_above_the_command_line() -> None:
    session = resolve([("environment", {"max_iter": 4}), ("command line", {"max_iter": 5})])
    marked = session.with_layer("marker", {"max_iter": 7, "revise": None})
    assert (marked["max_iter"], marked.origin["max_iter"]) == (7, "marker")
    assert marked.origin["revise"] == "default", "None in a layer means not set there"
    assert session["max_iter"] == 5, "a layer on top leaves the session's values alone"


def runner_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


@pytest.mark.parametrize(("env", "flags", "max_iter", "reflexion", "origin"), [
    ({}, [], 2, False, "config"),
    ({"PYTEST_LOOPS_MAX_ITER": "4"}, [], 4, False, "environment"),
    ({"PYTEST_LOOPS_MAX_ITER": "4"}, ["--max-iter", "5", "--reflexion", "on"], 5, True, "command line"),
    ({"PYTEST_LOOPS_MAX_ITER": "4"}, ["--max-iter", "5", "--lessons", "on"], 5, True, "command line"),
    ({"PYTEST_LOOPS_LESSONS": "on"}, [], 2, True, "config"),
    ({"PYTEST_LOOPS_LESSONS": "on"}, ["--no-reflexion"], 2, False, "config"),
    ({}, ["--no-reflexion"], 2, False, "config"),
])
def test_runner_precedence(tmp_path, env, flags, max_iter, reflexion, origin) -> None:
    cfg = tmp_path / "harness" / "loop-runner.config.yaml"
    cfg.parent.mkdir()
    cfg.write_text("guards:\n  max_iter: 2\nreflexion:\n  enabled: false\nverify:\n  cmd: 'true'\n")
    spec, _ = spec_from_args(runner_args("--cwd", str(tmp_path), *flags), environ=env)
    assert spec.guards.max_iter == max_iter
    assert spec.reflexion is reflexion
    where = spec.origin["max_iter"]
    assert where.endswith("loop-runner.config.yaml") if origin == "config" else where == origin


@pytest.mark.parametrize("flag", ["--lessons-page", "--memory", "--episodic"])
def test_the_lessons_page_flag_and_its_old_spellings_set_the_same_setting(tmp_path, flag) -> None:
    spec, _ = spec_from_args(runner_args("--cwd", str(tmp_path), "--verify", "true", flag, "l.md"), environ={})
    assert spec.memory_page == "l.md"
    assert spec.origin["memory_page"] == "command line", "the run log's origin key stays"


@pytest.mark.parametrize("var", ["PYTEST_LOOPS_LESSONS_PAGE", "PYTEST_LOOPS_MEMORY"])
def test_the_lessons_page_variable_and_its_old_name_set_the_same_setting(tmp_path, var) -> None:
    spec, _ = spec_from_args(runner_args("--cwd", str(tmp_path), "--verify", "true"), environ={var: "l.md"})
    assert (spec.memory_page, spec.origin["memory_page"]) == ("l.md", "environment")
    both = {"PYTEST_LOOPS_MEMORY": "old.md", "PYTEST_LOOPS_LESSONS_PAGE": "new.md"}
    spec, _ = spec_from_args(runner_args("--cwd", str(tmp_path), "--verify", "true"), environ=both)
    assert spec.memory_page == "new.md", "the new name wins over the old one"

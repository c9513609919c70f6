"""The plugin as pytest sees it: entry point, option group, ini twins, precedence, usage errors."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex

import pytest
import yaml  # noqa: F401 - loaded before pytester's inline runs snapshot and restore sys.modules
from plugin_helpers import Project, header_settings, loop_header

# every ini key of the issue and its command-line twin
TWINS = {
    "loop_max_iter": "--loop-max-iter",
    "loop_budget_seconds": "--loop-budget-seconds",
    "loop_no_progress_k": "--loop-no-progress-k",
    "loop_escalate_after": "--loop-escalate-after",
    "loop_revise": "--loop-revise",
    "loop_state": "--loop-state",
    "loop_artifacts": "--loop-artifacts",
    "loop_lessons_page": "--loop-lessons-page",
    "loop_lessons": "--loop-lessons",
    "loop_config": "--loop-config",
    "loop_exitcode": "--loop-exitcode",
}
GREEN_TEST = """\
import calc


def test_sub():
    assert calc.sub(5, 3) == 2
"""
FAILING_TEST = """\
import calc


def test_add():
    assert calc.add(2, 3) == 5
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def assert_usage_error(result: pytest.RunResult, *pieces: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.stdout.str(), result.stderr.str())
    errors = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    assert len(errors) == 1, result.stderr.str()
    for piece in pieces:
        assert piece in errors[0], f"{piece!r} missing from {errors[0]!r}"
    everything = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in everything
    assert "Traceback" not in everything


# -- installation ------------------------------------------------------------------------------


def test_entry_point_named_loop() -> None:
    (entry,) = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "loop"]
    assert entry.value == "pytest_loops.pytest_plugin.plugin"
    import pytest_loops.pytest_plugin.plugin

    assert entry.load() is pytest_loops.pytest_plugin.plugin


def test_the_plugin_is_loaded_by_default_and_disabled_with_no_loop(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    on = project.run()
    assert re.search(r"^plugins: .*\bloops-", on.stdout.str(), re.M)
    off = project.run("-p", "no:loop", "--loop")
    assert off.ret == pytest.ExitCode.USAGE_ERROR
    off.stderr.fnmatch_lines(["*unrecognized arguments: --loop*"])
    markers = project.run("-p", "no:loop", "--markers")
    assert "@pytest.mark.loop" not in markers.stdout.str()


def test_options_in_one_group_each_ini_key_with_a_flag_twin(project: Project) -> None:
    text = project.run("--help").stdout.str()
    start = text.index("pytest-loops: bounded fix-loops around tests:")
    group = text[start:text.index("\n\n", start)]
    flags_in_group = set(re.findall(r"^\s+(--loop[\w-]*)", group, re.M))
    flags_everywhere = set(re.findall(r"^\s+(--loop[\w-]*)", text, re.M))
    assert flags_everywhere == flags_in_group, "a --loop option outside the plugin's group"
    assert "--loop" in flags_in_group
    ini_keys = set(re.findall(r"^\s+(loop_\w+) \(", text, re.M))
    for key, flag in TWINS.items():
        assert key in ini_keys, f"ini key {key} missing"
        assert flag in flags_in_group, f"{key} has no command-line twin {flag}"


def test_marker_listed_with_its_full_signature(project: Project) -> None:
    from pytest_loops.pytest_plugin.plugin import MARKER_KEYS

    result = project.run("--markers")
    (line,) = [line for line in result.stdout.lines if line.startswith("@pytest.mark.loop(")]
    signature = line[len("@pytest.mark.loop("):line.index("): ")]
    keywords = [part.split("=")[0] for part in signature.split(", ")]
    assert keywords == list(MARKER_KEYS)  # every keyword the marker takes, and only those
    for key in ("revise", "max_iter", "budget_seconds", "no_progress_k", "escalate_after", "state"):
        assert f"{key}=None" in signature
    assert "under --loop" in line


# -- precedence: defaults < config file < ini < environment < command line ---------------------

LAYER_VALUES = {  # layer -> (max_iter, budget_seconds, no_progress_k, escalate_after, revise)
    "config": (2, 20, 3, 4, "python note.py from-config"),
    "ini": (3, 30, 4, 5, "python note.py from-ini"),
    "environment": (4, 40, 5, 6, "python note.py from-env"),
    "command line": (5, 50, 6, 7, "python note.py from-cli"),
}
LAYERS = list(LAYER_VALUES)
GUARDS = ("max_iter", "budget_seconds", "no_progress_k", "escalate_after")


def set_layers(project: Project, monkeypatch: pytest.MonkeyPatch, top: str) -> list[str]:
    """Set every layer up to `top` with its own values; return the command-line args."""
    args: list[str] = []
    ini = ["[pytest]"]
    for layer in LAYERS[:LAYERS.index(top) + 1]:
        m, b, k, e, r = LAYER_VALUES[layer]
        if layer == "config":
            project.write("harness/loop-runner.config.yaml", f"""\
                guards:
                  max_iter: {m}
                  budget_seconds: {b}
                  no_progress_k: {k}
                  escalate_after_iter: {e}
                revise:
                  cmd: {r}
                """)
            ini.append("loop_config = harness/loop-runner.config.yaml")
        elif layer == "ini":
            ini += [f"loop_max_iter = {m}", f"loop_budget_seconds = {b}", f"loop_no_progress_k = {k}",
                    f"loop_escalate_after = {e}", f"loop_revise = {r}"]
        elif layer == "environment":
            for name, value in zip(("MAX_ITER", "BUDGET_SECONDS", "NO_PROGRESS_K", "ESCALATE_AFTER", "REVISE"),
                                   (m, b, k, e, r), strict=True):
                monkeypatch.setenv(f"PYTEST_LOOPS_{name}", str(value))
        else:
            args = ["--loop-max-iter", str(m), f"--loop-budget-seconds={b}", "--loop-no-progress-k", str(k),
                    "--loop-escalate-after", str(e), "--loop-revise", r]
    project.write("pytest.ini", "\n".join(ini) + "\n")
    return args


def test_defaults_when_nothing_is_set(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    settings, revise, _ = loop_header(project.run("--loop"))
    values, origins = header_settings(settings)
    assert {k: values[k] for k in GUARDS} == {"max_iter": "6", "budget_seconds": "900", "no_progress_k": "2",
                                              "escalate_after": "0"}
    assert values["exitcode"] == "pytest"
    assert origins == []
    assert revise.startswith("loops: revise: (none")


@pytest.mark.parametrize("top", LAYERS)
def test_each_layer_overrides_the_ones_below(project: Project, monkeypatch: pytest.MonkeyPatch, top: str) -> None:
    project.write("test_green.py", GREEN_TEST)
    args = set_layers(project, monkeypatch, top)
    result = project.run("--loop", *args)
    assert result.ret == 0
    settings, revise, _ = loop_header(result)
    values, origins = header_settings(settings)
    *guards, r = LAYER_VALUES[top]
    assert {k: values[k] for k in GUARDS} == dict(zip(GUARDS, map(str, guards), strict=True))
    origin = str(project.path / "harness/loop-runner.config.yaml") if top == "config" else top
    assert origins == [f"{key} from {origin}" for key in (*GUARDS, "revise")]
    assert revise.startswith(f"loops: revise: {r};")


@pytest.mark.slow
def test_the_settings_in_effect_reach_the_loop(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    # revise from ini, max_iter from the environment, no_progress_k from the command line
    project.write("pytest.ini", "[pytest]\nloop_revise = python note.py notes.txt tried\nloop_max_iter = 5\n")
    monkeypatch.setenv("PYTEST_LOOPS_MAX_ITER", "2")
    project.write("test_add.py", FAILING_TEST)
    result = project.run("--loop", "--loop-no-progress-k", "0")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*MAX_ITER*failing tests: 2 iteration(s)*max_iter=2 reached*"])
    assert project.read("notes.txt").splitlines() == ["tried"]


@pytest.mark.parametrize("source", ["ini", "environment", "command line"])
@pytest.mark.slow
def test_state_artifacts_and_lessons_page_from_every_layer(project: Project, monkeypatch: pytest.MonkeyPatch,
                                                     source: str) -> None:
    project.write("test_add.py", FAILING_TEST)
    args: list[str] = []
    if source == "ini":
        project.write("pytest.ini", "[pytest]\nloop_state =\n    calc.py\n    lib/*.py\n"
                                    "loop_artifacts = out\nloop_lessons_page = notes/lessons.md\n")
    elif source == "environment":
        monkeypatch.setenv("PYTEST_LOOPS_STATE", "calc.py:lib/*.py")
        monkeypatch.setenv("PYTEST_LOOPS_ARTIFACTS", "out")
        monkeypatch.setenv("PYTEST_LOOPS_LESSONS_PAGE", "notes/lessons.md")
    else:
        args = ["--loop-state", "calc.py", "--loop-state=lib/*.py", "--loop-artifacts", "out",
                "--loop-lessons-page=notes/lessons.md"]
    # a revise that cannot start ends the loop after one iteration (and one lesson)
    result = project.run("--loop", "--loop-revise", "sh -c 'echo no-such-cli: not found >&2; exit 127'", *args)
    assert result.ret == 1
    _, revise, reproduce = loop_header(result)
    assert f"artifacts: {project.path / 'out'}" in revise
    assert "--loop-state=calc.py '--loop-state=lib/*.py'" in reproduce
    # (the working tree's lock stays in <rootdir>/.pytest-loops: it belongs to the tree)
    assert not (project.artifacts / "runs").exists()
    (log,) = (project.path / "out" / "runs").glob("failing-tests-*.json")
    result.stdout.fnmatch_lines([f"    log: {log}", f"    lessons: {project.path / 'notes/lessons.md'}"])
    assert json.loads(log.read_text(encoding="utf-8"))["state_paths"] == ["calc.py", "lib/*.py"]
    lessons = project.read("notes/lessons.md")
    assert re.search(r"^- .* iter 1: exit 1, ", lessons, re.M), lessons


def test_the_config_file_from_the_command_line(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    project.write("cfg.yaml", "guards:\n  max_iter: 9\n")
    values, origins = header_settings(loop_header(project.run("--loop", "--loop-config", "cfg.yaml"))[0])
    assert values["max_iter"] == "9"
    assert origins == [f"max_iter from {project.path / 'cfg.yaml'}"]


def test_a_bad_value_without_loop_changes_nothing(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    result = project.run("--loop-max-iter", "0", "--loop-exitcode", "bogus")
    result.assert_outcomes(passed=1)
    assert result.ret == 0


# -- bad values: exit 4, one ERROR line naming the option, the value and what is valid ---------

FLAG_ERRORS = [
    (["--loop-max-iter", "0"], ["--loop-max-iter", "'0'", "max_iter", "an integer >= 1"]),
    (["--loop-max-iter", "three"], ["--loop-max-iter", "'three'", "an integer >= 1"]),
    (["--loop-max-iter=2.5"], ["--loop-max-iter", "'2.5'", "an integer >= 1"]),
    (["--loop-budget-seconds", "-5"], ["--loop-budget-seconds", "'-5'", ">= 0"]),
    (["--loop-budget-seconds", "nan"], ["--loop-budget-seconds", "'nan'", ">= 0"]),
    (["--loop-no-progress-k", "1.5"], ["--loop-no-progress-k", "'1.5'", "an integer >= 0"]),
    (["--loop-escalate-after", "-1"], ["--loop-escalate-after", "'-1'", "an integer >= 0"]),
    (["--loop-exitcode=bogus"], ["--loop-exitcode", "'bogus'", "pytest, verdict"]),
    (["--loop-config", "missing.yaml"], ["--loop-config", "'missing.yaml'", "not a file"]),
]


@pytest.mark.parametrize(("args", "pieces"), FLAG_ERRORS, ids=[" ".join(a) for a, _ in FLAG_ERRORS])
def test_bad_flag(project: Project, args: list[str], pieces: list[str]) -> None:
    project.write("test_green.py", GREEN_TEST)
    assert_usage_error(project.run_inprocess("--loop", *args), *pieces)


INI_ERRORS = [
    ("loop_max_iter = many", ["ini loop_max_iter", "'many'", "an integer >= 1"]),
    ("loop_budget_seconds = soon", ["ini loop_budget_seconds", "'soon'", ">= 0"]),
    ("loop_no_progress_k = -3", ["ini loop_no_progress_k", "'-3'", ">= 0"]),
    ("loop_exitcode = sometimes", ["'sometimes'", "ini loop_exitcode", "pytest, verdict"]),
    ("loop_config = nowhere.yaml", ["ini loop_config", "'nowhere.yaml'", "not a file"]),
]


@pytest.mark.parametrize(("line", "pieces"), INI_ERRORS, ids=[line for line, _ in INI_ERRORS])
def test_bad_ini_value(project: Project, line: str, pieces: list[str]) -> None:
    project.write("test_green.py", GREEN_TEST)
    project.write("pytest.ini", f"[pytest]\n{line}\n")
    assert_usage_error(project.run_inprocess("--loop"), *pieces)


ENV_ERRORS = [
    ("PYTEST_LOOPS_MAX_ITER", "0", ">= 1"),
    ("PYTEST_LOOPS_BUDGET_SECONDS", "ten", ">= 0"),
    ("PYTEST_LOOPS_NO_PROGRESS_K", "-1", ">= 0"),
    ("PYTEST_LOOPS_ESCALATE_AFTER", "x", ">= 0"),
]


@pytest.mark.parametrize(("name", "value", "valid"), ENV_ERRORS, ids=[n for n, _, _ in ENV_ERRORS])
def test_bad_environment_value(project: Project, monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                               valid: str) -> None:
    project.write("test_green.py", GREEN_TEST)
    monkeypatch.setenv(name, value)
    assert_usage_error(project.run_inprocess("--loop"), f"environment variable {name}", repr(value), valid)


CONFIG_ERRORS = [
    ("guards:\n  max_iter: 0\n", ["cfg.yaml", "guards.max_iter", "an integer >= 1"]),
    ("guards:\n  budget_seconds: soon\n", ["cfg.yaml", "guards.budget_seconds", "a number"]),
    ("guards: [1\n", ["cfg.yaml:", "not valid YAML"]),
    ("- just\n- a list\n", ["cfg.yaml", "a mapping"]),
]


@pytest.mark.parametrize(("text", "pieces"), CONFIG_ERRORS, ids=["max_iter", "budget", "yaml", "list"])
def test_bad_config_file(project: Project, text: str, pieces: list[str]) -> None:
    project.write("test_green.py", GREEN_TEST)
    project.write("cfg.yaml", text)
    assert_usage_error(project.run_inprocess("--loop", "--loop-config", "cfg.yaml"), *pieces)


MARKER_ERRORS = [
    ("max_iter=0", ["@pytest.mark.loop(max_iter=...)", "0 is not a valid max_iter", ">= 1"]),
    ("max_iter='3'", ["@pytest.mark.loop(max_iter=...)", "'3' is not a valid max_iter", "number"]),
    ("max_iter=True", ["max_iter=...", "True is not a valid max_iter"]),
    ("budget_seconds=-1", ["budget_seconds=...", "-1 is not a valid budget_seconds", ">= 0"]),
    ("no_progress_k=2.5", ["no_progress_k=...", "2.5 is not a valid no_progress_k"]),
    ("escalate_after=-2", ["escalate_after=...", "-2 is not a valid escalate_after"]),
    ("revise=''", ["revise=...", "'' is not a valid revise", "shell command"]),
    ("revise=['make']", ["revise=...", "['make'] is not a valid revise"]),
    ("state=5", ["state=...", "5 is not a valid state", "glob"]),
    ("'make fix'", ["keyword arguments only", "'make fix'", "valid keywords: revise, max_iter"]),
    ("max_iters=3", ["unknown keyword(s) max_iters", "valid keywords: revise, max_iter"]),
]


@pytest.mark.parametrize(("marker", "pieces"), MARKER_ERRORS, ids=[m for m, _ in MARKER_ERRORS])
def test_bad_marker_argument(project: Project, marker: str, pieces: list[str]) -> None:
    project.marked_test(marker=marker)
    result = project.run_inprocess("--loop")
    assert_usage_error(result, "test_calc.py::test_add", *pieces)
    assert "passed" not in result.stdout.str(), "tests ran despite the bad marker"


@pytest.mark.slow
def test_bad_marker_under_xdist_is_a_usage_error(project: Project) -> None:
    project.marked_test(marker="max_iter=0")
    result = project.run("--loop", "-n", "2")
    assert_usage_error(result, "test_calc.py::test_add", "0 is not a valid max_iter")
    assert "passed" not in result.stdout.str()


# -- option values cannot become paths ----------------------------------------------------------

@pytest.mark.slow
def test_a_space_separated_value_that_moves_the_rootdir_is_one_usage_line(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    script = project.pytester.path / "elsewhere" / "revise.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\ntrue\n")
    script.chmod(0o755)
    result = project.run("--loop", "--loop-revise", str(script))
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert f"write --loop-revise={script}" in errors[0]
    assert "moved the rootdir" in errors[0] and str(project.path) in errors[0]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not (project.pytester.path / ".pytest-loops").exists()
    # the '=' form, and a space-form value that is no path, keep the project's rootdir
    for args in ([f"--loop-revise={script}"], ["--loop-revise", "true", "--loop-max-iter", "3"]):
        again = project.run("--loop", *args)
        assert again.ret == 0, again.stdout.str()
        assert f"rootdir: {project.path}" in again.stdout.str()


def test_a_space_separated_path_inside_the_project_is_harmless(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    project.write("fix.sh", "#!/bin/sh\ntrue\n").chmod(0o755)
    result = project.run("--loop", "--loop-revise", "./fix.sh", "--loop-max-iter", "2")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()


def test_loop_options_without_loop_warn_once(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    result = project.run("--loop-revise=true", "--loop-max-iter", "2")
    assert result.ret == 0
    warned = [line for line in result.stdout.lines if "no effect without --loop" in line]
    assert len(warned) == 1 and "--loop-revise, --loop-max-iter have no effect" in warned[0]
    assert not project.exists(".pytest-loops")
    quiet = project.run()
    assert "no effect without --loop" not in quiet.stdout.str()


def test_the_reproduce_command_uses_the_equals_form(project: Project) -> None:
    project.write("test_green.py", GREEN_TEST)
    result = project.run("--loop", "--loop-revise", "python fix.py", "--loop-max-iter", "2", "--loop-state=calc.py")
    reproduce = loop_header(result)[2].removeprefix("loops: reproduce with: ")
    args = shlex.split(reproduce)
    assert "--loop-revise=python fix.py" in args and "--loop-max-iter=2" in args
    assert "--loop-state=calc.py" in args
    assert not [a for a in args if a in {"--loop-revise", "--loop-max-iter", "--loop-state"}]

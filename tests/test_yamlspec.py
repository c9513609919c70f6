"""YAML loop definitions and the loop-runner config as a loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_loops.errors import LoopFileError
from pytest_loops.sources import format_loop_file, load_any, load_yaml_loops, load_yaml_text
from pytest_loops.spec import CheckKind, IgnoredLine

CORPUS = Path(__file__).parent / "loopfiles"


def at(name: str, needle: str) -> str:
    path = CORPUS / name
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return f"{path}:{no}"
    raise AssertionError(f"{needle!r} not in {name}")


def test_a_loop_definition_file_with_every_key():
    name = "fix-parser.loop.yaml"
    lf = load_yaml_loops(str(CORPUS / name))
    spec, wheel = lf.loops
    assert lf.pipelines == () and lf.flows == ()
    assert (spec.name, spec.goal) == ("fix the parser", "the parser tests pass")
    assert spec.source == at(name, "- name: fix the parser").replace(":3", ":3")
    assert spec.cwd == str(CORPUS)
    got = [(c.kind, c.name, c.command, c.times, c.node_id, c.text) for c in spec.checks]
    assert got == [
        (CheckKind.COMMAND, '"pytest -q tests/test_parser.py" passes', "pytest -q tests/test_parser.py", 1,
         None, None),
        (CheckKind.COMMAND, '"pytest -q tests/test_flaky.py" passes 3 times', "pytest -q tests/test_flaky.py", 3,
         None, None),
        (CheckKind.FINDS_NOTHING, '"ruff check src" finds nothing', "ruff check src", 1, None, None),
        (CheckKind.PYTEST, 'the test "tests/test_parser.py:test_quotes" passes', None, 1,
         "tests/test_parser.py::test_quotes", None),
        (CheckKind.HUMAN, 'a human confirms "the error messages read well"', None, 1, None,
         "the error messages read well"),
        (CheckKind.HOOK, 'the skill "code-review" scores 8 or more on the trajectory by 3 judges', None, 1,
         None, None),
    ]
    assert spec.checks[5].options == {"skill": "code-review", "mode": "scores", "min_score": 8, "judges": 3,
                                      "on": "trajectory", "bar": "no test was weakened"}
    assert spec.checks[1].source == at(name, "- command: pytest -q tests/test_flaky.py")
    assert spec.guards.to_dict() == {"max_iter": 6, "budget_seconds": 900.0, "no_progress_k": 3,
                                     "escalate_after": 4}
    assert spec.origin["guards.budget_seconds"] == at(name, "budget: 15 minutes")
    assert spec.origin["guards.max_iter"] == at(name, "max_iter: 6")
    assert spec.revise == "python tools/fix.py" and spec.origin["revise"] == at(name, "revise:")
    assert spec.state_paths == ("src/**/*.py",)
    assert spec.memory_page == str(CORPUS / "lessons" / "parser.md")
    assert (spec.protect, spec.scope, spec.look_at) == (("tests/**",), ("src/**",), ("src/parser.py",))
    assert (spec.stop_message, spec.escalate_when_blocked, spec.reflexion) == ("parser still failing", True, True)
    assert wheel.origin["guards.max_iter"] == "default" and wheel.origin["revise"] == "default"
    assert [c.command for c in wheel.checks] == ["python -m build --wheel"]


def test_a_pipeline_in_yaml():
    name = "release.loop.yml"
    lf = load_any(CORPUS / name)
    [pipeline] = lf.pipelines
    assert pipeline.name == "release"
    assert [s.name for s in pipeline.stages] == ["release / build", "release / smoke test"]
    build, smoke = pipeline.stages
    assert build.guards.budget_seconds == 300.0
    assert build.origin["guards.budget_seconds"] == at(name, "budget_seconds: 300")
    assert smoke.checks[0].timeout == 60.0
    assert smoke.checks[0].command == "python -c 'import pytest_loops'"
    assert lf.all_loops() == [build, smoke]


def test_the_loop_runner_config_is_one_loop_named_after_the_file():
    name = "loop-runner.config.yaml"
    lf = load_any(CORPUS / name)
    [spec] = lf.loops
    assert spec.name == "loop-runner", "named as `pytest-loops run --config` names it"
    assert [(c.kind, c.command, c.name) for c in spec.checks] == [
        (CheckKind.COMMAND, "pytest -q", '"pytest -q" passes'),
        (CheckKind.COMMAND, "ruff check .", '"ruff check ." passes')]
    assert spec.guards.to_dict() == {"max_iter": 5, "budget_seconds": 600.0, "no_progress_k": 2,
                                     "escalate_after": 4}
    assert spec.origin["guards.escalate_after"] == at(name, "escalate_after_iter")
    assert spec.origin["guards.max_iter"] == at(name, "max_iter")
    assert spec.revise == "python tools/ask_agent.py" and spec.origin["revise"] == at(name, "cmd: python")
    assert spec.state_paths == ("src", "tests")
    assert spec.memory_page == str(CORPUS / "memory" / "lessons.md")
    assert spec.origin["memory_page"] == at(name, "episodic_memory_page")
    assert spec.reflexion is True and spec.cwd == str(CORPUS)
    assert spec.ignored == (IgnoredLine(int(at(name, "path: .loop").rsplit(":", 1)[1]),
                                        "run_log.path: .loop/run.json",
                                        "a runner setting (pytest-loops run --log); not part of a loop"),)
    shown = format_loop_file(lf)
    assert "  not acted on (1 line):\n    line 13: run_log.path: .loop/run.json\n" in shown


def test_a_runner_config_with_one_verify_command_and_unknown_keys():
    lf = load_yaml_text("verify: {cmd: make test}\nreflexion: {enabled: false}\nextras: 1\n", "ci/runner.yml")
    [spec] = lf.loops
    assert (spec.name, spec.checks[0].command, spec.reflexion) == ("runner", "make test", False)
    assert spec.ignored == (IgnoredLine(3, "extras", "not a loop-runner key; ignored"),)
    assert spec.origin["guards.max_iter"] == "default"


def test_a_runner_config_without_verify_is_settings_not_a_loop():
    lf = load_yaml_text("guards: {max_iter: 3}\n", "harness/loop-runner.config.yaml")
    assert lf.loops == () and len(lf.config) == 1
    assert "settings for `pytest-loops run --config harness/loop-runner.config.yaml --verify CMD`" in lf.config[0].why


def test_verified_is_read_and_shown_never_acted_on(tmp_path):
    from pytest_loops.sources import format_loop_file, is_loop_file, load_any

    harness = tmp_path / "harness"
    harness.mkdir()
    config = harness / "loop-runner.config.yaml"
    config.write_text("verified: false\nverify: {cmd: pytest -q}\nrevise: {cmd: 'true', verified: false}\n"
                      "reflexion: {episodic_memory_page: wiki/lessons.md}\n")
    assert is_loop_file(config)
    lf = load_any(config)
    [spec] = lf.loops
    assert spec.name == "loop-runner"
    assert spec.cwd == str(tmp_path), "run from the project root, as the skill runs it"
    assert spec.memory_page == str(tmp_path / "wiki" / "lessons.md")
    assert spec.ignored == ()
    assert [(n.line, n.text) for n in lf.config] == [(1, "verified: false")]
    shown = format_loop_file(lf, verbose=True)
    assert "not yet proven" in shown and "the project root (the parent of harness/)" in shown
    elsewhere = tmp_path / "ci" / "loop-runner.config.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("verify: {cmd: pytest -q}\n")
    assert load_any(elsewhere).loops[0].cwd == str(elsewhere.parent)


RUNNER_ERRORS = [
    pytest.param("verify: {cmd: x}\nverified: maybe\n", "2:11: verified: expected true or false, got str 'maybe'",
                 id="verified-type"),
    pytest.param("verify: {cmd: x}\nguards:\n  max_iter: six\n", "3:13: guards.max_iter: expected a number, "
                 "got str 'six'", id="guard-type"),
    pytest.param("verify: {cmd: x}\nguards:\n  no_progress_k: -1\n", "3:18: guards.no_progress_k: -1 is not a "
                 "valid no_progress_k; valid: an integer >= 0 (0 turns it off)", id="guard-value"),
    pytest.param("verify:\n  cmds: [1, 2]\n", "2:9: verify.cmds: expected a list of strings, got list [1, 2]",
                 id="verify-type"),
]


@pytest.mark.parametrize(("text", "message"), RUNNER_ERRORS)
def test_runner_config_errors_name_the_key_and_position(text, message):
    with pytest.raises(LoopFileError) as exc:
        load_yaml_text(text, "runner.yaml")
    assert str(exc.value) == f"runner.yaml:{message}"


LOOP = "loops:\n  - name: a\n    goal: g\n    checks: [make]\n"

# (text, line, token whose column the error names, message); the column is computed from the token
ERRORS = [
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks:\n      - make\n      - pytest\n      - command: 3\n",
                 7, "3", "loops[0].checks[2].command: expected a string, got a number", id="command-type"),
    pytest.param("loops:\n  - goal: g\n    checks: [make]\n", 2, "goal",
                 "loops[0].name: missing; add `name:` with a text value", id="name-missing"),
    pytest.param("loops:\n  - name: a\n    checks: [make]\n", 2, "name",
                 "loops[0].goal: missing; add `goal:` with a text value", id="goal-missing"),
    pytest.param(LOOP + "    budget: 5 minutes\n", 5, "budget", "loops[0].budget: unknown key; valid keys: name, "
                 "goal, checks, guards, protect, scope, look_at, stop_message, escalate_when_blocked, grants, "
                 "revise, context_adapter, branches, max_parallel, state_paths, lessons_page, memory_page, lessons, "
                 "reflexion",
                 id="unknown-key"),
    pytest.param(LOOP + "    guards: {max_iter: 0}\n", 5, "0", "loops[0].guards.max_iter: 0 is not a valid "
                 "max_iter; valid: an integer >= 1 (the cap is always on)", id="max-iter-zero"),
    pytest.param(LOOP + "    guards: {no_progress_k: 1.5}\n", 5, "1.5", "loops[0].guards.no_progress_k: expected "
                 "an integer, got 1.5", id="k-float"),
    pytest.param(LOOP + "    guards: {budget: soon}\n", 5, "soon", "loops[0].guards.budget: 'soon' is not a "
                 "duration; write a number and a unit: `15 minutes`, `90 seconds`, `1.5 hours` (or `none` to "
                 "turn the budget off)", id="budget-words"),
    pytest.param(LOOP + "    guards: {budget: 5 minutes, budget_seconds: 60}\n", 5, "5 minutes",
                 "loops[0].guards.budget: give either budget or budget_seconds, not both", id="budget-twice"),
    pytest.param(LOOP + "    guards: {budget_seconds: yes}\n", 5, "yes", "loops[0].guards.budget_seconds: "
                 "expected a number, got true/false", id="budget-bool"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks:\n      - {command: make, test: t}\n", 5, "{",
                 "loops[0].checks[0]: expected exactly one of command, finds_nothing, test, human, skill, "
                 "got command, test", id="two-kinds"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks:\n      - {human: ok, times: 2}\n", 5, "times",
                 "loops[0].checks[0].times: unknown key; valid keys: human, name", id="times-on-human"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks:\n      - {command: make, times: 0}\n", 5, "0",
                 "loops[0].checks[0].times: expected an integer >= 1, got 0", id="times-zero"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks:\n      - {skill: r, on: everything}\n", 5,
                 "everything", "loops[0].checks[0].on: expected output or trajectory, got 'everything'",
                 id="skill-on"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks: []\n", 4, "[]",
                 "loops[0].checks: expected a non-empty list, got an empty list", id="no-checks"),
    pytest.param(LOOP + "    protect: [1]\n", 5, "1", "loops[0].protect[0]: expected a non-empty string, got "
                 "a number", id="protect-item"),
    pytest.param(LOOP + "    reflexion: maybe\n", 5, "maybe", "loops[0].reflexion: expected true or false, got "
                 "a string", id="reflexion-type"),
    pytest.param(LOOP + "  - name: a\n    goal: h\n    checks: [make]\n", 5, "a", "loops[1].name: duplicate "
                 "name 'a' (also loops[0]); give each loop and stage its own name", id="duplicate-loop"),
    pytest.param("pipelines:\n  - name: p\n    stages:\n      - {name: s, goal: g, checks: [a]}\n"
                 "      - {name: s, goal: g, checks: [b]}\n", 5, "s,", "pipelines[0].stages[1].name: duplicate "
                 "name 'p / s' (also pipelines[0].stages[0]); give each loop and stage its own name",
                 id="duplicate-stage"),
    pytest.param("pipelines:\n  - name: p\n", 2, "name", "pipelines[0].stages: missing; add `stages:` with a list",
                 id="pipeline-no-stages"),
    pytest.param("- name: a\n", 1, "-", "expected a mapping, got a list", id="top-list"),
    pytest.param("loop:\n  - name: a\n", 1, "loop", "loop: unknown key; valid keys: loops, pipelines",
                 id="top-typo"),
    pytest.param("loops:\n  - name: a\n    name: b\n", 3, "name", "not valid YAML: found duplicate key 'name'; "
                 "fix the YAML syntax", id="duplicate-key"),
    pytest.param("loops:\n  - name: a\n    goal: g\n    checks: [!!binary aGk=]\n", 4, "!!", "loops[0].checks[0]: "
                 "expected a command string or a mapping, got bytes; e.g. `- pytest -q` or "
                 "`- {test: tests/test_x.py::test_y}`", id="binary-check"),
]


@pytest.mark.parametrize(("text", "line_no", "token", "message"), ERRORS)
def test_validation_errors_name_the_key_path_and_position(text, line_no, token, message):
    column = (text.split("\n")[line_no - 1].rindex(token) + 1) if token else 1
    with pytest.raises(LoopFileError) as exc:
        load_yaml_text(text, "x.loop.yaml")
    assert str(exc.value) == f"x.loop.yaml:{line_no}:{column}: {message}"
    assert (exc.value.line, exc.value.column) == (line_no, column)


def test_yaml_syntax_errors_name_the_problem_mark():
    # The wording comes from the YAML parser (libyaml or PyYAML's own); the position is the same.
    with pytest.raises(LoopFileError) as exc:
        load_yaml_text("loops:\n  - name: [a\n", "x.loop.yaml")
    assert (exc.value.line, exc.value.column) == (3, 1)
    assert str(exc.value).startswith("x.loop.yaml:3:1: not valid YAML: ")
    assert "expected ',' or ']'" in str(exc.value)
    assert str(exc.value).endswith("; fix the YAML syntax")


def test_an_empty_yaml_file_has_no_loops():
    with pytest.raises(LoopFileError) as exc:
        load_yaml_text("# nothing\n", "x.loop.yaml")
    assert str(exc.value) == "x.loop.yaml: no loops in this file; add a `loops:` list (see docs/loop-language.md)"


def test_a_key_named_on_stays_a_word():
    # YAML 1.1 reads a bare `on` key as true; in a skill check it must stay `on`.
    lf = load_yaml_text("loops:\n  - name: a\n    goal: g\n    checks:\n      - {skill: r, on: trajectory}\n")
    assert lf.loops[0].checks[0].options["on"] == "trajectory"


def test_yaml_that_is_not_utf8(tmp_path):
    p = tmp_path / "x.loop.yaml"
    p.write_bytes(b"loops:\n  - name: caf\xe9\n")
    with pytest.raises(LoopFileError) as exc:
        load_yaml_loops(p)
    assert str(exc.value) == f"{p}:2:14: not valid UTF-8 (byte 0xe9); save the file as UTF-8"


def test_load_any_reads_yaml_by_suffix(tmp_path):
    for suffix in (".loop.yaml", ".loop.yml"):
        p = tmp_path / f"fix{suffix}"
        p.write_text(LOOP, encoding="utf-8")
        assert load_any(p).loops[0].name == "a"
    runner = tmp_path / "loop-runner.config.yml"
    runner.write_text("verify: {cmd: make}\n", encoding="utf-8")
    assert load_any(runner).loops[0].name == "loop-runner"


@settings(max_examples=200, deadline=None, database=None)
@given(st.text())
def test_fuzz_yaml_raises_nothing_but_loop_file_errors(text):
    try:
        load_yaml_text(text, "fuzz.loop.yaml")
    except LoopFileError:
        pass


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.sampled_from([
    "loops:", "  - name: a", "    goal: g", "    checks:", "      - make", "      - {test: t, times: 2}",
    "      - {skill: s, on: output, judges: 3}", "    guards: {max_iter: 2, budget: 1 minute}", "guards:",
    "  max_iter: 3", "verify: {cmd: x}", "pipelines:", "    stages:", "      - {name: s, goal: g, checks: [a]}",
    "  - &a {name: b}", "  - *a", "  <<: {x: 1}", "? [a]", ": b", "on: 1", "- 1", "  ", "\t", "'", '"', "{", "]",
]), max_size=20))
def test_fuzz_yaml_shaped_lines(lines):
    try:
        lf = load_yaml_text("\n".join(lines), "fuzz.loop.yaml")
    except LoopFileError:
        return
    format_loop_file(lf, verbose=True)

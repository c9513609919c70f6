"""The `.loop` parser: the corpus, every construct's mapping, errors, fuzzing, `show`."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_loops.errors import LoopFileError
from pytest_loops.sources import (
    Flow,
    LoopFile,
    format_loop_file,
    is_loop_file,
    load_any,
    load_loop_file,
    parse_loop_text,
)
from pytest_loops.sources import loopfile as lf_mod
from pytest_loops.sources.phrases import duration_seconds, is_path
from pytest_loops.spec import CheckKind, IgnoredLine, LoopSpec

CORPUS = Path(__file__).parent / "loopfiles"
LOOP_FILES = sorted(CORPUS.glob("*.loop"))


def load(name: str) -> LoopFile:
    return load_loop_file(str(CORPUS / name))


def at(name: str, needle: str) -> str:
    """"path:line" of the first line of a corpus file containing ``needle``."""
    path = CORPUS / name
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return f"{path}:{no}"
    raise AssertionError(f"{needle!r} not in {name}")


def line(name: str, needle: str) -> int:
    return int(at(name, needle).rsplit(":", 1)[1])


def loop(lf: LoopFile, name: str) -> LoopSpec:
    matches = [spec for spec in lf.all_loops() if spec.name == name]
    assert len(matches) == 1, [spec.name for spec in lf.all_loops()]
    return matches[0]


# -- the corpus: every file parses, with the expected shape ------------------------------

EXPECTED_SHAPE = {  # file -> (loops, pipelines, stages, flows)
    "agentic-review.loop": (2, 0, 0, 0),
    "billing-apostrophe.loop": (1, 0, 0, 0),
    "cart-total.loop": (1, 0, 0, 0),
    "checkout-epic.loop": (0, 1, 4, 0),
    "checks.loop": (3, 0, 0, 0),
    "needs-review.loop": (1, 0, 0, 0),
    "project-config.loop": (1, 0, 0, 0),
    "pytest-native.loop": (2, 0, 0, 0),
    "release-flow.loop": (0, 0, 0, 2),
    "scratch.loop": (1, 0, 0, 0),
}


def test_the_corpus_is_the_expected_set_of_files():
    assert sorted(p.name for p in LOOP_FILES) == sorted(EXPECTED_SHAPE)


@pytest.mark.parametrize("path", LOOP_FILES, ids=lambda p: p.name)
def test_every_corpus_file_parses_to_its_shape(path: Path):
    lf = load_loop_file(str(path))
    stages = sum(len(p.stages) for p in lf.pipelines)
    assert (len(lf.loops), len(lf.pipelines), stages, len(lf.flows)) == EXPECTED_SHAPE[path.name]
    assert lf.path == str(path)
    for spec in lf.all_loops():
        assert spec.cwd == os.path.abspath(spec.cwd)
        assert spec.source and spec.source.startswith(f"{path}:")
        names = [c.name for c in spec.checks]
        assert len(set(names)) == len(names)
        assert all("::" not in name for name in names)
        for key in ("guards.max_iter", "guards.budget_seconds", "guards.no_progress_k",
                    "guards.escalate_after", "revise", "state_paths", "memory_page"):
            assert key in spec.origin


def test_friendly_shorthands_loop():
    name = "cart-total.loop"
    spec = loop(load(name), "fix the cart total")
    assert spec.goal == "the cart total includes tax for every region"
    assert spec.source == at(name, 'loop "fix the cart total"')
    assert spec.cwd == str(CORPUS)
    [check] = spec.checks
    assert (check.kind, check.command, check.times) == (CheckKind.COMMAND, "pnpm test cart", 1)
    assert check.name == "check: pnpm test cart"
    assert check.source == at(name, "check:")
    assert spec.look_at == ("src/cart/", "src/tax/rates.py")
    assert spec.state_paths == ("src/cart/", "src/tax/rates.py")
    assert spec.origin["state_paths"] == at(name, "in:") + " (look at)"
    assert spec.guards.max_iter == 6 and spec.origin["guards.max_iter"] == at(name, "after 6 tries")
    assert spec.stop_message == "cart total still wrong"
    assert spec.origin["guards.budget_seconds"] == "default"
    assert spec.ignored == (IgnoredLine(line(name, "when it breaks"), "when it breaks: reflect, then plan again",
                                        lf_mod._WHY["when_fail"]),)


def test_every_knob_of_a_loop():
    name = "billing-apostrophe.loop"
    spec = loop(load(name), "fix billing apostrophe bug")
    test_check, scan = spec.checks
    assert test_check.kind is CheckKind.PYTEST
    assert test_check.node_id == "tests/test_billing.py::test_apostrophe"
    assert test_check.name == 'done when the test "tests/test_billing.py:test_apostrophe" passes'
    assert scan.kind is CheckKind.FINDS_NOTHING
    assert scan.command == "semgrep --config p/sql-injection --severity=ERROR api/"
    assert spec.look_at == ("billing/form.tsx", "api/settings.py", "the settings schema")
    assert spec.state_paths == ("billing/form.tsx", "api/settings.py")  # descriptions are not paths
    assert spec.escalate_when_blocked is True
    assert spec.origin["escalate_when_blocked"] == at(name, "when blocked")
    assert (spec.guards.max_iter, spec.stop_message) == (5, "apostrophe still breaks the save")
    assert spec.memory_page == str(CORPUS / "notes" / "billing-lessons.md")
    assert spec.origin["memory_page"] == at(name, "remember in")
    assert [(i.line, i.why) for i in spec.ignored] == [
        (line(name, "allow edits"), lf_mod._WHY["policy"]),
        (line(name, "each cycle"), lf_mod._WHY["cycle"]),
        (line(name, "when it passes"), lf_mod._WHY["when_pass"]),
        (line(name, "when it fails"), lf_mod._WHY["when_fail"]),
        (line(name, "also:"), lf_mod._WHY["also"]),
    ]


def test_every_done_when_form():
    name = "checks.loop"
    spec = loop(load(name), "every done when form")
    got = [(c.kind, c.command, c.times, c.node_id, c.text, dict(c.options)) for c in spec.checks]
    skill = {"mode": "approves", "min_score": None, "judges": 1, "on": "output", "bar": None}
    assert got == [
        (CheckKind.COMMAND, "pytest -q tests/unit", 1, None, None, {}),
        (CheckKind.COMMAND, "make lint", 1, None, None, {}),
        (CheckKind.FINDS_NOTHING, "grep -rn 'breakpoint()' src", 1, None, None, {}),
        (CheckKind.COMMAND, "pytest -q tests/test_upload.py", 3, None, None, {}),
        (CheckKind.PYTEST, None, 1, "tests/test_api.py::test_refund", None, {}),
        (CheckKind.HUMAN, None, 1, None, "the invoice PDF looks right at A4", {}),
        (CheckKind.HOOK, None, 1, None, None, {**skill, "skill": "api-review"}),
        (CheckKind.HOOK, None, 1, None, None,
         {**skill, "skill": "style-review", "mode": "scores", "min_score": 8}),
        (CheckKind.HOOK, None, 1, None, None,
         {**skill, "skill": "path-review", "on": "trajectory",
          "bar": "no test was weakened; no writes outside api/"}),
        (CheckKind.HOOK, None, 1, None, None,
         {**skill, "skill": "design-review", "mode": "judges", "judges": 3}),
        (CheckKind.HOOK, None, 1, None, None,
         {**skill, "skill": "copy-review", "mode": "scores", "min_score": 7, "judges": 5,
          "on": "trajectory"}),
    ]
    assert spec.checks[3].name == 'done when "pytest -q tests/test_upload.py" passes 3 times'
    assert spec.checks[8].source == at(name, '"path-review"')
    assert spec.ignored == ()  # the bar: line belongs to its check


def test_verify_look_in_and_when_it_gets_stuck():
    name = "checks.loop"
    spec = loop(load(name), "verify and look in")
    build, cli = spec.checks
    assert (build.kind, build.command, build.name) == (
        CheckKind.COMMAND, "python -m build --wheel", 'verify: "python -m build --wheel"')
    assert (cli.kind, cli.node_id) == (CheckKind.PYTEST, "tests/test_cli.py::test_help")
    assert spec.state_paths == ("docs/", "README.md")
    assert spec.escalate_when_blocked and spec.origin["escalate_when_blocked"] == at(name, "gets stuck")


def test_files_and_context_add_up_and_duplicate_checks_get_distinct_names():
    spec = loop(load("checks.loop"), "files and context")
    assert spec.look_at == ("src/app.py", "src/models/*.py", "the request handler")
    assert spec.state_paths == ("src/app.py", "src/models/*.py")
    assert [c.name for c in spec.checks] == ['done when "pytest -q tests/test_app.py" passes',
                                             'done when "pytest -q tests/test_app.py" passes (2)']


def test_pipeline_stages_in_order_with_gate_and_parallel_group():
    name = "checkout-epic.loop"
    lf = load(name)
    [pipeline] = lf.pipelines
    assert pipeline.name == "epic: checkout v2"
    assert pipeline.source == at(name, 'pipeline "epic')
    assert [s.name for s in pipeline.stages] == [
        "epic: checkout v2 / story: cart totals", "epic: checkout v2 / story: receipts",
        "epic: checkout v2 / story: emails", "epic: checkout v2 / story: checkout submit"]
    assert lf.all_loops() == list(pipeline.stages)
    cart = pipeline.stages[0]
    assert (cart.guards.max_iter, cart.stop_message) == (4, "cart totals stuck")
    assert cart.state_paths == ("src/cart/", "src/tax/")
    submit = pipeline.stages[3]
    gate, tests = submit.checks
    assert (gate.kind, gate.text, gate.name) == (CheckKind.HUMAN, "approve before charging the card",
                                                 "a human approves before charging the card")
    assert gate.source == at(name, "a human approves before")
    assert tests.command == "pytest -q tests/checkout"
    assert lf.ignored == (IgnoredLine(line(name, "stages in parallel"), "stages in parallel:",
                                      lf_mod.WHY_PARALLEL),)


def test_flows_are_kept_with_their_steps():
    name = "release-flow.loop"
    lf = load(name)
    assert lf.loops == () and lf.pipelines == ()
    ship, deliver = lf.flows
    assert ship == Flow("ship", ("cart-total.loop", "billing-apostrophe.loop", "checkout-epic.loop"),
                        at(name, 'flow "ship"'), (
        IgnoredLine(line(name, "with the result of"),
                    'then run "checkout-epic.loop" with the result of cart-total:', lf_mod.WHY_FLOW),
        IgnoredLine(line(name, "a human approves first"), "a human approves first", lf_mod.WHY_FLOW)))
    assert deliver.name == "deliver the sprint"
    assert deliver.steps == ("story-template.loop",)
    assert [n.text for n in deliver.notes] == ['for each story in "sprint.yaml":',
                                              "a human approves before merging"]


def test_config_tier_lines_are_kept_and_target_sets_the_working_directory():
    name = "project-config.loop"
    lf = load(name)
    texts = [c.text for c in lf.config]
    assert texts[:13] == [
        "use the BMAD method", "run with claude code", "runner: claude-code", "schedule: nightly",
        "notify: slack", "mode: orchestrator", "runs as: ci-bot@example.com", "rigor: vibe coding",
        "models: fast haiku, strong opus, plan strong", "each cycle: plan, then act, then observe",
        "recommend skills with ctx",
        'ctx may use my own model "ollama/qwen2.5-coder"', "target: ./service"]
    assert [c.line for c in lf.config][:3] == [2, 3, 4]
    blocks = {c.text: c.line for c in lf.config[13:]}
    assert blocks["git:"] == line(name, "git:") and blocks["sandbox:"] == line(name, "sandbox:")
    assert blocks['allow egress to "pypi.org" only'] == line(name, "allow egress")
    assert len(lf.config) == 25
    assert {c.why for c in lf.config} == {lf_mod.WHY_CONFIG, lf_mod.WHY_TARGET}
    spec = loop(lf, "add a healthcheck endpoint")
    assert spec.grants == ("skills", "agents")  # `grant ctx:` is read as the file's `grants:` line
    assert spec.origin["grants"] == at(name, "grant ctx:")
    assert spec.cwd == str(CORPUS / "service")
    assert spec.origin["cwd"] == at(name, "target:")
    assert spec.guards.max_iter == 6  # rigor: vibe coding adds nothing


def test_agentic_lines_rigor_knowledge_hooks_and_memory():
    name = "agentic-review.loop"
    lf = load(name)
    spec = loop(lf, "refactor the token logic")
    # rigor: agentic engineering gives a loop without `after N tries` LoopFlow's thrash guard
    assert (spec.guards.max_iter, spec.stop_message) == (8, "thrashing")
    assert spec.origin["guards.max_iter"] == at(name, "rigor:") + " (rigor)"
    assert spec.protect == ("docs/auth-spec.md",)  # knowledge: is read-only
    assert spec.look_at == ("src/auth/tokens.py", "src/auth/session.py", "src/billing/service.py",
                            "docs/auth-spec.md", "the security policy")
    assert spec.state_paths == ("src/auth/tokens.py", "src/auth/session.py")
    assert spec.memory_page == str(CORPUS / "auth.memory.md")
    whys = {i.text: i.why for i in spec.ignored}
    assert whys['before each cycle: "mypy src/auth" passes'] == lf_mod._WHY["hooks"]
    assert whys["hooks:"] == lf_mod._WHY["hooks"]
    assert whys["commit each cycle"] == lf_mod._WHY["git"]
    assert whys["a human approves the plan first"] == lf_mod._WHY["human_plan"]
    assert whys['plan from "docs/token-plan.md"'] == lf_mod._WHY["skills"]
    assert whys["models: all strong"] == lf_mod._WHY["models"]
    assert len(spec.ignored) == 15
    [check] = spec.checks  # hooks are not checks
    assert check.command == "pytest -q tests/auth"
    other = loop(lf, "tidy the changelog")
    assert (other.guards.max_iter, other.stop_message) == (3, "changelog still messy")


def test_a_loop_without_done_when_needs_a_human():
    name = "needs-review.loop"
    spec = loop(load(name), "write the launch email")
    [check] = spec.checks
    assert check.kind is CheckKind.HUMAN
    assert check.name == "no done when: a human confirms the goal"
    assert check.text == ("no done when: a human must confirm the goal: "
                          "a launch email that is short, clear and on brand")
    assert check.source == at(name, "loop ")
    assert (spec.guards.max_iter, spec.stop_message) == (3, None)


def test_an_unnamed_loop_takes_the_file_name():
    spec = load("scratch.loop").loops[0]
    assert spec.name == "scratch"
    assert spec.checks[0].command == "python scratch.py"


def test_our_own_lines_and_file_defaults():
    name = "pytest-native.loop"
    lf = load(name)
    parser = loop(lf, "fix the failing parser tests")
    assert parser.guards.budget_seconds == 900.0
    assert parser.origin["guards.budget_seconds"] == at(name, "budget: 15 minutes")
    assert parser.guards.no_progress_k == 3
    assert parser.origin["guards.no_progress_k"] == at(name, "nothing changes")
    assert parser.guards.escalate_after == 4
    assert parser.origin["guards.escalate_after"] == at(name, "escalate after")
    assert (parser.guards.max_iter, parser.stop_message) == (8, "parser still failing")
    assert parser.revise == "python tools/ask_agent.py --prompt-file $LOOP_PROMPT_FILE"
    assert parser.origin["revise"] == at(name, "revise with")
    assert parser.protect == ("tests/**", "conftest.py", "pyproject.toml")  # file default + its own
    assert parser.scope == ("src/**",)
    assert parser.state_paths == ("src/**/*.py", "tests/fixtures/")  # watch: beats look at:
    assert parser.origin["state_paths"] == at(name, "watch:")
    assert parser.look_at == ("src/parser.py", "the tokenizer")
    docs = loop(lf, "keep the docs building")
    assert docs.guards.budget_seconds == 5400.0
    assert docs.protect == ("tests/**", "conftest.py")
    assert docs.origin["protect"] == at(name, "protect: tests/**")
    assert docs.state_paths == ("docs/",) and docs.revise == "python tools/fix_docs.py"
    assert lf.config == () and lf.ignored == ()


# -- the finer points of the language -------------------------------------------------

def one(text: str) -> LoopSpec:
    specs = parse_loop_text(text, "t/x.loop").all_loops()
    assert len(specs) == 1
    return specs[0]


def test_comments_quotes_crlf_and_tabs():
    text = ('# header comment\r\n'
            'loop "hash # in a name":   # trailing\r\n'
            '\tgoal: count the # signs   # not part of the goal\r\n'
            '\t# an indented comment line\r\n'
            '\tdone when "grep -c \'#\' notes.txt" passes  # comment after\r\n')
    spec = one(text)
    assert spec.name == "hash # in a name"
    assert spec.goal == "count the"
    assert spec.checks[0].command == "grep -c '#' notes.txt"
    assert spec.checks[0].source == "t/x.loop:5"


def test_keywords_are_case_insensitive_and_header_colon_is_optional():
    spec = one('LOOP "x"\n  Goal: g\n  DONE WHEN "make" PASSES 2 TIMES\n  After 3 Tries: Stop\n')
    assert (spec.checks[0].command, spec.checks[0].times, spec.guards.max_iter) == ("make", 2, 3)


def test_done_when_with_a_colon_is_read_too():
    assert one('loop "x":\n  goal: g\n  done when: "make" passes\n').checks[0].command == "make"


@pytest.mark.parametrize(("actions", "max_iter", "escalate_after", "message"), [
    ('stop and warn "stuck"', 4, 0, "stuck"),
    ("stop", 4, 0, None),
    ("ask a human", 6, 4, None),
    ('ask a human, then stop and warn "over to you"', 4, 4, "over to you"),
    ("stop and warn unquoted words", 4, 0, "unquoted words"),
])
def test_after_n_tries_actions(actions, max_iter, escalate_after, message):
    spec = one(f'loop "x":\n  goal: g\n  check: make\n  after 4 tries: {actions}\n')
    assert (spec.guards.max_iter, spec.guards.escalate_after, spec.stop_message) == (
        max_iter, escalate_after, message)


def test_after_n_tries_without_stop_or_ask_is_kept_not_acted_on():
    spec = one('loop "x":\n  goal: g\n  check: make\n  after 4 tries: reflect, then plan again\n')
    assert spec.guards.max_iter == 6
    assert spec.ignored[0].why == lf_mod._WHY["after_other"]


def test_when_blocked_without_asking_is_not_escalation():
    spec = one('loop "x":\n  goal: g\n  check: make\n  when blocked: stop\n')
    assert spec.escalate_when_blocked is False
    assert spec.ignored[0].why == lf_mod._WHY["when_blocked"]


def test_a_gate_in_a_loop_is_ignored_as_in_loopflow():
    spec = one('loop "x":\n  goal: g\n  check: make\n  a human approves before deploying\n')
    assert [c.kind for c in spec.checks] == [CheckKind.COMMAND]
    assert spec.ignored[0].why == lf_mod._WHY["gate_loop"]


def test_unknown_lines_are_kept_with_their_line_numbers():
    text = ('notify on slack "#builds"\n  channel: builds\n'
            'loop "x":\n  goal: g\n  check: make\n  celebrate with confetti\n')
    lf = parse_loop_text(text, "x.loop")
    assert lf.ignored == (IgnoredLine(1, 'notify on slack "#builds"', lf_mod.WHY_UNKNOWN),
                          IgnoredLine(2, "channel: builds", lf_mod.WHY_UNKNOWN))
    assert lf.loops[0].ignored == (IgnoredLine(6, "celebrate with confetti", lf_mod.WHY_UNKNOWN),)


def test_the_bar_under_a_command_check_is_kept_not_attached():
    spec = one('loop "x":\n  goal: g\n  done when "make" passes\n    the bar: fast\n')
    assert spec.checks[0].options == {}
    assert spec.ignored == (IgnoredLine(4, "the bar: fast", lf_mod._WHY["bar"]),)


def test_two_unnamed_loops_get_distinct_names():
    lf = parse_loop_text('loop:\n  goal: a\n  check: a\nloop:\n  goal: b\n  check: b\n', "d/tidy.loop")
    assert [s.name for s in lf.loops] == ["tidy", "tidy 2"]


def test_a_file_with_only_config_lines_has_no_loops():
    lf = parse_loop_text("use the BMAD method\n", "project.loop")
    assert (lf.loops, lf.pipelines, [c.text for c in lf.config]) == ((), (), ["use the BMAD method"])


def test_an_empty_file_has_nothing():
    lf = parse_loop_text("# nothing yet\n\n", "empty.loop")
    assert (lf.loops, lf.pipelines, lf.flows, lf.config, lf.ignored) == ((), (), (), (), ())


@pytest.mark.parametrize(("text", "seconds"), [
    ("90 seconds", 90.0), ("15 minutes", 900.0), ("1.5 hours", 5400.0), ("1h30m", 5400.0),
    ("2 min", 120.0), ("1 hour and 5 minutes", 3900.0), ("45s", 45.0), ("none", 0.0),
])
def test_durations(text, seconds):
    assert duration_seconds(text) == seconds
    assert one(f'loop "x":\n  goal: g\n  check: make\n  budget: {text}\n').guards.budget_seconds == seconds


@pytest.mark.parametrize(("item", "path"), [
    ("src/cart/", True), ("tests/**", True), ("README.md", True), ("*.py", True),
    ("the billing form", False), ("the last failure", False), ("Makefile", False),
])
def test_what_counts_as_a_path(item, path):
    assert is_path(item) is path


def test_load_loop_file_strips_a_byte_order_mark(tmp_path):
    p = tmp_path / "bom.loop"
    p.write_bytes(b'\xef\xbb\xbfloop "x":\n  goal: g\n  check: make\n')
    assert load_loop_file(p).loops[0].name == "x"


def test_is_loop_file_and_load_any(tmp_path):
    assert is_loop_file("a/fix.loop") and is_loop_file("fix.loop.yaml") and is_loop_file("F.LOOP.YML")
    assert not is_loop_file("fix.yaml") and not is_loop_file("loop.py") and not is_loop_file("x.loops")
    p = tmp_path / "fix.loop"
    p.write_text('loop "x":\n  goal: g\n  check: make\n', encoding="utf-8")
    assert load_any(p).loops[0].cwd == str(tmp_path)
    other = tmp_path / "fix.txt"
    other.write_text("", encoding="utf-8")
    with pytest.raises(LoopFileError) as exc:
        load_any(other)
    assert str(exc.value) == (f"{other}: not a loop file; name it *.loop, *.loop.yaml or *.loop.yml "
                              "(or pass a loop-runner *.yaml config)")


# -- errors: file:line:column and the fix --------------------------------------------

def error_of(tmp_path: Path, text: str) -> tuple[str, str]:
    p = tmp_path / "bad.loop"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(LoopFileError) as exc:
        load_loop_file(p)
    return str(p), str(exc.value)


def col(text: str, line_no: int, token: str) -> int:
    return text.split("\n")[line_no - 1].index(token) + 1


GOOD = '  goal: g\n  check: make\n'

ERRORS = [
    pytest.param('  loop "x":\n' + GOOD, 1, (1, 3),
                 "unexpected indentation at the top level; start `loop`, `pipeline`, `flow` and config "
                 "lines in column 1; indent only the lines inside a definition", id="indented-top"),
    pytest.param("use the BMAD method\n  extra\n", 2, (2, 3),
                 "unexpected indentation; line 1 is not a block: start the next line in column 1, or "
                 "indent it under a `loop`/`stage`", id="indent-under-config"),
    pytest.param('pipeline "p":\n  stage "a":\n  goal: g\n', 2, (2, 3),
                 'stage \'a\' has no body; indent the stage\'s lines (goal:, done when ...) deeper than '
                 "the `stage` line", id="stage-without-body"),
    pytest.param('loop "x":\ngoal: g\n', 1, (1, 1),
                 "loop 'x' has no body; indent its lines (goal:, done when ...) two spaces under the header",
                 id="loop-body-not-indented"),
    pytest.param('loop "x":\n' + GOOD + 'done when "make" passes\n', 4, (4, 1),
                 "a loop line at the top level; indent it under its `loop` or `stage` line "
                 "(two spaces deeper)", id="body-line-at-top"),
    pytest.param('loop "x":\n  goal: g\n  done when "pytest -q passes\n', 3, (3, '"'),
                 'unterminated quote; close it with a matching `"`', id="unterminated-in-check"),
    pytest.param('loop "fix:\n' + GOOD, 1, (1, '"'),
                 'unterminated quote; close it with a matching `"`', id="unterminated-in-header"),
    pytest.param('loop "x":\n  goal: g\n  after 3 tries: stop and warn "stuck\n', 3, (3, '"'),
                 'unterminated quote; close it with a matching `"`', id="unterminated-in-warn"),
    pytest.param('loop "x":\n  goal: g\n  done when\n', 3, (3, 12),
                 '`done when` has no predicate; say what must hold, e.g. `done when "pytest -q" passes`',
                 id="done-when-empty"),
    pytest.param('loop "x":\n  goal: g\n  done when pytest passes\n', 3, (3, "pytest"),
                 "could not understand the predicate 'pytest passes'; write one of: \"CMD\" passes | "
                 '"CMD" passes N times | "CMD" finds nothing | the test "NODEID" passes | a human '
                 'confirms "TEXT" | the skill "NAME" approves | the skill "NAME" scores N or more '
                 "[on the output|trajectory] [by N judges]", id="done-when-unknown"),
    pytest.param('loop "x":\n  done when "make" passes\n', 1, (1, 1),
                 "loop 'x' has no goal; add a `goal: <what done means>` line to its body", id="no-goal"),
    pytest.param('pipeline "p":\n  stage "a":\n    check: make\n', 2, (2, 3),
                 "stage 'a' has no goal; add a `goal: <what done means>` line to its body",
                 id="stage-no-goal"),
    pytest.param('loop "x":\n  goal:\n  check: make\n', 2, (2, 3),
                 "`goal:` has no text; say what done means, e.g. `goal: the cart total includes tax`",
                 id="goal-empty"),
    pytest.param('loop "x":\n' + GOOD + '  after 0 tries: stop\n', 4, (4, "0"),
                 "'0' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`after 6 tries: stop`", id="after-zero"),
    pytest.param('loop "x":\n' + GOOD + '  after six tries: stop\n', 4, (4, "six"),
                 "'six' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`after 6 tries: stop`", id="after-words"),
    pytest.param('loop "x":\n  goal: g\n  done when "make" passes 0 times\n', 3, (3, "0"),
                 "'0' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`passes 3 times`", id="times-zero"),
    pytest.param('loop "x":\n  goal: g\n  done when "make" passes 99999999999 times\n', 3, (3, "9"),
                 "'99999999999' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`passes 3 times`", id="times-huge"),
    pytest.param('loop "x":\n  goal: g\n  done when the skill "r" approves by 0 judges\n', 3, (3, "0"),
                 "'0' is not a positive integer; write a whole number of 1 or more, e.g. `by 3 judges`",
                 id="judges-zero"),
    pytest.param('loop "x":\n' + GOOD + '  stop when nothing changes for 0 tries\n', 4, (4, "0"),
                 "'0' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`stop when nothing changes for 2 tries`", id="no-progress-zero"),
    pytest.param('loop "x":\n' + GOOD + '  escalate after -1 tries\n', 4, (4, "-1"),
                 "'-1' is not a positive integer; write a whole number of 1 or more, e.g. "
                 "`escalate after 4 tries`", id="escalate-negative"),
    pytest.param('loop "x":\n' + GOOD + 'loop "x":\n' + GOOD, 4, (4, '"'),
                 "duplicate loop name 'x' (same name as line 1); give each loop and pipeline in a file "
                 "its own name", id="duplicate-loop"),
    pytest.param('loop "fix it":\n' + GOOD + 'pipeline "fix-it":\n  stage "a":\n' + GOOD.replace("  ", "    "),
                 4, (4, '"'), "duplicate pipeline name 'fix-it' (same file-name form as line 1); give "
                 "each loop and pipeline in a file its own name", id="duplicate-slug"),
    pytest.param('pipeline "p":\n  stage "a":\n    goal: g\n    check: make\n  stage "a":\n'
                 '    goal: g\n    check: make\n', 5, (5, '"'),
                 "duplicate stage name 'a' in pipeline 'p' (line 2); give each stage of a pipeline its "
                 "own name", id="duplicate-stage"),
    pytest.param('stage "a":\n' + GOOD, 1, (1, 1),
                 'a `stage` outside a pipeline; put stages under a `pipeline "name":` line, indented by '
                 "two spaces", id="stage-outside"),
    pytest.param('pipeline "p":\n', 1, (1, 1),
                 "pipeline 'p' has no stages; add `stage \"name\":` lines indented under it, each with its "
                 "own body", id="pipeline-empty"),
    pytest.param('pipeline "p":\n  goal: g\n', 2, (2, 3),
                 "expected a `stage` line inside pipeline 'p', got 'goal: g'; indent it under its stage, "
                 'or start a stage with `stage "name":`', id="pipeline-non-stage"),
    pytest.param('pipeline "p":\n  stage "a"\n    goal: g\n', 2, (2, 3),
                 'a stage line needs a name and a colon; write `stage "name":`', id="stage-no-colon"),
    pytest.param('loop "x":\n  goal: g\n  check:\n', 3, (3, 9),
                 "`check:` has no command; write the command, e.g. `check: pytest -q`", id="check-empty"),
    pytest.param('loop "x":\n' + GOOD + '  budget: 15\n', 4, (4, "15"),
                 "'15' is not a duration; write a number and a unit: `15 minutes`, `90 seconds`, "
                 "`1.5 hours` (or `none` to turn the budget off)", id="budget-no-unit"),
    pytest.param('loop "x":\n' + GOOD + '  revise with ""\n', 4, (4, 3),
                 '`revise with` has no command; write `revise with "python fix.py"`', id="revise-empty"),
    pytest.param('loop "x":\n' + GOOD + '  remember in\n', 4, (4, 3),
                 '`remember in` names no file; write `remember in "lessons.md"`', id="memory-empty"),
    pytest.param('loop "x":\n' + GOOD + '  after 3 tries:\n', 4, (4, 3),
                 '`after N tries:` needs an action; e.g. `after 6 tries: stop and warn "stuck"`',
                 id="after-no-action"),
    pytest.param('loop "x":\n' + GOOD + '  protect:\n', 4, (4, 3),
                 "`protect:` lists nothing; list paths or globs, e.g. `protect: src/**`", id="protect-empty"),
    pytest.param('loop "x":\n' + GOOD + '  doen when "make" passes\n', 4, (4, 3),
                 "unknown line 'doen when \"make\" passes'; did you mean `done when`?", id="typo-done-when"),
    pytest.param('loop "x":\n' + GOOD + '  goel: g\n', 4, (4, 3),
                 "unknown line 'goel: g'; did you mean `goal:`?", id="typo-goal"),
    pytest.param('loop "x":\n  goal: g\n  done when "  " passes\n', 3, (3, 14),
                 "the command is empty; put the command between the quotes", id="blank-command"),
    pytest.param('loop "x":\n  goal: g\n  done when the test "" passes\n', 3, (3, 23),
                 "the test id is empty; put the test id between the quotes", id="blank-test"),
]


@pytest.mark.parametrize(("text", "line_no", "where", "message"), ERRORS)
def test_errors_name_file_line_column_and_fix(tmp_path, text, line_no, where, message):
    wanted_line, token = where
    column = token if isinstance(token, int) else col(text, wanted_line, token)
    path, got = error_of(tmp_path, text)
    assert got == f"{path}:{line_no}:{column}: {message}"


def test_not_utf8_names_the_line_and_column(tmp_path):
    p = tmp_path / "latin1.loop"
    p.write_bytes('loop "x":\n  goal: café\n'.encode("latin-1"))
    with pytest.raises(LoopFileError) as exc:
        load_loop_file(p)
    assert str(exc.value) == f"{p}:2:12: not valid UTF-8 (byte 0xe9); save the file as UTF-8"
    assert (exc.value.line, exc.value.column) == (2, 12)


def test_a_missing_file_is_a_loop_file_error(tmp_path):
    with pytest.raises(LoopFileError) as exc:
        load_loop_file(tmp_path / "nope.loop")
    assert str(exc.value) == f"{tmp_path / 'nope.loop'}: no such file; check the path"


def test_parse_errors_carry_structured_positions():
    with pytest.raises(LoopFileError) as exc:
        parse_loop_text('loop "x":\n  goal: g\n  done when "a" passes 0 times\n', "p.loop")
    assert (exc.value.path, exc.value.line, exc.value.column) == ("p.loop", 3, 24)


# -- fuzzing: nothing but LoopFileError, ever ---------------------------------------------

FRAGMENTS = [
    'loop "a":', 'loop:', 'loop "b"', 'pipeline "p":', '  stage "s":', "  stage s:", 'flow "f":',
    '  run "a.loop"', '  then run "b.loop" with the result of a:', '  for each x in "p.yaml":',
    "  goal: g", "    goal: g", "goal: g", "  goal:", '  done when "t" passes', '    done when "t" passes',
    '  done when "t" passes 3 times', '  done when "t" finds nothing', "  done when the test \"a::b\" passes",
    '  done when a human confirms "ok"', '  done when the skill "r" scores 8 or more by 3 judges',
    "    the bar: x", "  check: make", "  verify: \"x\"", "  in: src/, the thing",
    '  after 3 tries: stop and warn "w"', "  after 0 tries: stop", "  when blocked: ask a human",
    "  when it fails: reflect, then plan again", "  hooks:", '    on commit: "x" passes', "  git:",
    "    commit each cycle", "  budget: 5 minutes", "  budget: soon", "  stop when nothing changes for 2 tries",
    "  escalate after 2 tries", '  revise with "fix"', "  protect: a/**", "  watch: b/*.py",
    '  remember in "m.md"', "  a human approves before x", "  stages in parallel:", "use the X method",
    "target: sub", "rigor: agentic engineering", "git:", "  work in place", "budget: 1 hour", "#", '"', ":",
    "", "  ", "\t", "\tgoal: tab", "  # comment", 'loop "a": # c', "  doen when x", "\r",
]


def _no_crash(text: str) -> None:
    try:
        lf = parse_loop_text(text, "fuzz/f.loop")
    except LoopFileError as exc:
        assert exc.path == "fuzz/f.loop"
        assert "\n" not in str(exc)
        return
    format_loop_file(lf, verbose=True)
    names = [spec.name for spec in lf.all_loops()]
    assert len(names) == len(set(names))
    for spec in lf.all_loops():
        assert spec.checks
        assert len({c.name for c in spec.checks}) == len(spec.checks)


@settings(max_examples=300, deadline=None, database=None)
@given(st.text())
def test_fuzz_random_text(text):
    _no_crash(text)


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=25))
def test_fuzz_loop_shaped_lines(lines):
    _no_crash("\n".join(lines))


CORPUS_TEXTS = [p.read_text(encoding="utf-8") for p in LOOP_FILES]


def _mutate(text: str, ops: list[tuple[int, int, int, str]]) -> str:
    lines = text.split("\n")
    for op, a, b, chars in ops:
        if not lines:
            lines = [chars]
        i, j = a % len(lines), b % len(lines)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(j, lines[i])
        elif op == 2:
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            pos = b % (len(lines[i]) + 1)
            lines[i] = lines[i][:pos] + chars + lines[i][pos:]
        elif op == 4:
            lines[i] = lines[i].lstrip() if lines[i][:1].isspace() else "  " + lines[i]
        elif op == 5:
            lines[i] = lines[i][: b % (len(lines[i]) + 1)]
    return "\n".join(lines)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS_TEXTS),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 200), st.integers(0, 200),
                          st.text(alphabet='"#: \t\r\nabc0-9\x00é', max_size=4)), min_size=1, max_size=6))
def test_fuzz_mutated_corpus_files(text, ops):
    _no_crash(_mutate(text, ops))


def test_every_single_line_deletion_of_the_corpus_parses_or_errors_cleanly():
    # Deterministic and exhaustive where the fuzzer samples: drop each line of each file.
    for text in CORPUS_TEXTS:
        lines = text.split("\n")
        for i in range(len(lines)):
            _no_crash("\n".join(lines[:i] + lines[i + 1:]))
    rng = random.Random(7)
    for text in CORPUS_TEXTS:  # and a truncation at a random byte
        _no_crash(text[: rng.randrange(len(text) + 1)])


# -- show ----------------------------------------------------------------------------

SHOWN = '''\
use the BMAD method
notify on slack "#builds"

loop "fix checkout":
  goal: checkout works
  done when "pytest -q tests/test_checkout.py" passes
  look at: src/checkout.py, and the last failure
  each cycle: plan, then act, then observe
  after 4 tries: stop and warn "checkout stuck"
  budget: 10 minutes
'''


def test_format_loop_file_shows_origins_and_ignored_lines():
    lf = parse_loop_text(SHOWN, "fix.loop")
    cwd = os.path.dirname(os.path.abspath("fix.loop"))
    assert format_loop_file(lf) == '''\
fix.loop: 1 loop, 0 pipelines

loop "fix checkout"   (fix.loop:4)
  goal: checkout works
  checks (1, all must pass):
    1. done when "pytest -q tests/test_checkout.py" passes   (fix.loop:6)
       command exits 0: pytest -q tests/test_checkout.py
  settings (value, from):
    guards.max_iter        4                 fix.loop:9
    guards.budget_seconds  600s              fix.loop:10
    guards.no_progress_k   2                 default
    guards.escalate_after  0 (off)           default
    no_progress_signal     state             default
    revise                 -                 default
    state_paths            src/checkout.py   fix.loop:7 (look at)
    lessons_page           -                 default
    stop_message           "checkout stuck"  fix.loop:9
    look_at                src/checkout.py   fix.loop:7
  not acted on (1 line):
    line 8: each cycle: plan, then act, then observe

config tier (1 line):
  line 1: use the BMAD method

not acted on (1 line):
  line 2: notify on slack "#builds"
'''
    verbose = format_loop_file(lf, verbose=True)
    assert f"    cwd                    {cwd}" in verbose
    assert "    line 8: each cycle: plan, then act, then observe\n" \
           f"      -> {lf_mod._WHY['cycle']}\n" in verbose
    assert f"  line 2: notify on slack \"#builds\"\n    -> {lf_mod.WHY_UNKNOWN}\n" in verbose
    assert f"    digest                 {lf.loops[0].digest()}" in verbose


def test_format_loop_file_shows_pipelines_and_flows():
    text = format_loop_file(load("checkout-epic.loop"))
    assert '  4. stage "epic: checkout v2 / story: checkout submit"' in text
    assert "a human must confirm (never passes by machine: ESCALATE): approve before charging the card" in text
    flows = format_loop_file(load("release-flow.loop"))
    assert "  steps: cart-total.loop -> billing-apostrophe.loop -> checkout-epic.loop\n" in flows


@pytest.mark.parametrize(("written", "command"), [
    ('"python fix.py"', "python fix.py"),
    ("python fix.py", "python fix.py"),
    ('"claude -p \\"$(cat \\"$LOOP_PROMPT_FILE\\")\\""', 'claude -p "$(cat "$LOOP_PROMPT_FILE")"'),
])
def test_revise_with_keeps_the_whole_command(written: str, command: str) -> None:
    text = f'loop "x":\n  goal: g\n  done when "true" passes\n  revise with {written}\n'
    assert parse_loop_text(text, "t.loop").loops[0].revise == command


def test_text_after_the_closing_quote_is_an_error_not_dropped() -> None:
    text = 'loop "x":\n  goal: g\n  done when "true" passes\n  revise with "a" b\n'
    with pytest.raises(LoopFileError) as info:
        parse_loop_text(text, "t.loop")
    assert str(info.value).startswith("t.loop:4:18: text after the closing quote: 'b'")


@pytest.mark.parametrize(("lines", "k", "signal"), [
    ("", 2, "state"),
    ("  stop when the same failure repeats for 3 tries\n", 3, "failure"),
    ("  stop when nothing changes for 2 tries\n  stop when the same failure repeats for 2 tries\n", 2, "both"),
    ("  no progress signal: both\n", 2, "both"),
])
def test_no_progress_signal_lines(lines: str, k: int, signal: str) -> None:
    text = f'loop "x":\n  goal: g\n  done when "true" passes\n{lines}'
    spec = parse_loop_text(text, "t.loop").loops[0]
    assert (spec.guards.no_progress_k, spec.no_progress_signal) == (k, signal)
    assert ("no_progress_signal" in format_loop_file(parse_loop_text(text, "t.loop")))


def test_a_bad_no_progress_signal_names_the_column() -> None:
    text = 'loop "x":\n  goal: g\n  done when "true" passes\n  no progress signal: sometimes\n'
    with pytest.raises(LoopFileError) as info:
        parse_loop_text(text, "t.loop")
    assert str(info.value) == ("t.loop:4:22: 'sometimes' is not a no progress signal; "
                               "write one of: state, failure, both")

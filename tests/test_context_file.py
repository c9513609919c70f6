"""The revise step's context file (LOOP_CONTEXT_FILE): the contract, the shipped schema,
plugin sections kept only when granted, secrets masked, the cap, and a revise step that
rewrites the file changing nothing the harness decides."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import jsonschema
import pluggy
import pytest
from plugin_helpers import CALC_TESTS, Project

from pytest_loops import Check, Guards, LoopSpec, LoopUsageError, Verdict
from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.core import contextfile
from pytest_loops.core.pluginmanager import make_plugin_manager
from pytest_loops.runtime.process import ProcessRunner
from pytest_loops.sources.loopfile import parse_loop_text
from pytest_loops.sources.yamlspec import load_yaml_text

hookimpl = pluggy.HookimplMarker("pytest")
SCHEMA = json.loads(contextfile.schema_path().read_text(encoding="utf-8"))
# the revise step keeps a copy of each iteration's context file, then fixes on the 2nd try
KEEP = 'cp "$LOOP_CONTEXT_FILE" "kept-$LOOP_ITERATION.json"'
FIX_ON_2 = KEEP + '; if [ "$LOOP_ITERATION" = 2 ]; then touch fixed; fi'


def validate(payload: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(payload)


class Sections:
    """A plugin answering pytest_loop_context with fixed sections (and what it was shown)."""

    def __init__(self, sections: dict | None = None, name: str = "recommender") -> None:
        self.sections = sections if sections is not None else {}
        self.seen: list[dict] = []
        self.name = name

    @hookimpl
    def pytest_loop_context(self, spec, context, payload):
        self.seen.append(payload)
        payload["goal"] = "a plugin's goal"  # a copy: changes nothing
        return self.sections


class Raises:
    @hookimpl
    def pytest_loop_context(self, payload):
        raise RuntimeError("recommender offline")


def run_loop(tmp_path: Path, *plugins: object, grants: tuple[str, ...] = (), revise: str = FIX_ON_2,
             checks: tuple[Check, ...] | None = None, env: dict | None = None, max_iter: int = 3):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    pm = make_plugin_manager([], entry_points=False)
    for plugin in plugins:
        pm.register(plugin, name=getattr(plugin, "name", None))
    spec = LoopSpec(name="ctx loop", goal="make fixed exist", checks=checks or (Check.command_passes("test -f fixed"),),
                    revise=revise, cwd=str(work), grants=grants, reflexion=False, look_at=("src/app.py",),
                    protect=("tests/**",), guards=Guards(max_iter=max_iter, no_progress_k=0))
    engine = make_engine(runner=ProcessRunner(), plugin_manager=pm, write_index=False, env=env)
    result = engine.run(spec, log_path=tmp_path / "logs" / "run.json")
    return result, work


def kept(work: Path, iteration: int) -> dict:
    return json.loads((work / f"kept-{iteration}.json").read_text(encoding="utf-8"))


# -- the contract --------------------------------------------------------------------


def test_the_revise_step_gets_a_context_file_valid_against_the_shipped_schema(tmp_path):
    result, work = run_loop(tmp_path)
    assert result.verdict is Verdict.SUCCESS and result.iterations_run == 3
    first = kept(work, 1)
    validate(first)
    assert first["schema"] == "pytest-loops.context/1"
    assert (first["loop"], first["goal"], first["iteration"], first["max_iter"]) == (
        "ctx loop", "make fixed exist", 1, 3)
    assert first["budget"]["seconds"] == 900 and 0 < first["budget"]["left_s"] <= 900
    [check] = first["checks"]
    assert (check["name"], check["kind"], check["status"], check["command"]) == (
        '"test -f fixed" passes', "command", "failed", "test -f fixed")
    assert check["exit_code"] == 1 and check["reason"] == "exit 1"
    assert first["last_failure"]["check"] == check["name"]
    assert (first["look_at"], first["protect"], first["scope"], first["grants"]) == (
        ["src/app.py"], ["tests/**"], [], [])
    assert first["sections"] == {}
    run_dir = Path(result.run_dir or "")
    assert first["files"] == {"prompt": str(run_dir / "iter-001" / "prompt.md"),
                              "failure": str(run_dir / "iter-001" / "failure.txt"),
                              "context": str(run_dir / "iter-001" / "context.json")}
    assert kept(work, 2)["iteration"] == 2
    # the file stays in the iteration directory, as the prompt and failure files do
    assert json.loads((run_dir / "iter-001" / "context.json").read_text()) == first


def test_the_output_tail_and_the_last_failure_carry_the_check_output(tmp_path):
    check = Check.command_passes('echo "AssertionError: total is 9, expected 10"; test -f fixed')
    result, work = run_loop(tmp_path, checks=(check,))
    payload = kept(work, 1)
    validate(payload)
    assert "AssertionError: total is 9, expected 10" in payload["checks"][0]["output_tail"]
    assert "AssertionError: total is 9, expected 10" in payload["last_failure"]["text"]
    assert payload["checks"][0]["output_cut"] is False


def test_a_hidden_check_is_never_in_the_context_file(tmp_path):
    checks = (Check.command_passes("test -f fixed"),
              Check.command_passes("echo SECRET-ORACLE; test -f fixed", name="oracle", hidden=True))
    result, work = run_loop(tmp_path, checks=checks)
    text = (work / "kept-1.json").read_text()
    assert "oracle" not in text and "SECRET-ORACLE" not in text
    assert [c["name"] for c in json.loads(text)["checks"]] == ['"test -f fixed" passes']


def bare_context(spec: LoopSpec, tmp_path: Path):
    from pytest_loops.core.context import LoopContext

    return LoopContext(spec=spec, iteration=1, workdir=tmp_path, run_dir=tmp_path / "run",
                       runner=None, clock=lambda: 0.0, deadline=None, base_env={})  # type: ignore[arg-type]


def failed_result(name: str, tail: str = "first failed"):
    from pytest_loops.results import CheckResult

    return CheckResult(name=name, kind="command", passed=False, exit_code=3, duration_s=0.0, reason="exit 3",
                       output_tail=tail)


def test_a_check_not_run_in_the_iteration_is_listed_as_not_run(tmp_path):
    """The budget can stop the checks part way: each visible check is still listed."""
    spec = LoopSpec(name="n", checks=(Check.command_passes("a", name="first"),
                                      Check.command_passes("b", name="second")), cwd=str(tmp_path),
                    guards=Guards(budget_seconds=0), protect=("tests/**",), scope=("src/**",))
    payload = contextfile.build_payload(spec, bare_context(spec, tmp_path), [failed_result("first")])
    validate(payload)
    assert [(c["name"], c["status"]) for c in payload["checks"]] == [("first", "failed"), ("second", "not_run")]
    assert payload["budget"] == {"seconds": None, "left_s": None}
    assert (payload["protect"], payload["scope"]) == (["tests/**"], ["src/**"])


# -- plugin sections: kept only when granted ------------------------------------------


def test_a_plugin_section_is_kept_only_under_a_granted_name(tmp_path):
    plugin = Sections({"skills": [{"name": "pytest-debugging", "why": "a failing assertion"}],
                       "mcps": [{"name": "filesystem"}]})
    result, work = run_loop(tmp_path, plugin, grants=("skills",))
    payload = kept(work, 1)
    validate(payload)
    assert payload["grants"] == ["skills"]
    assert payload["sections"] == {"skills": {"plugin": "recommender",
                                              "data": [{"name": "pytest-debugging", "why": "a failing assertion"}]}}
    record = result.iterations[0]
    assert record.context_dropped == [
        "recommender: section 'mcps' dropped: the loop does not grant it (grants: skills)"]
    # the run log says which section was dropped and why
    log = load_runlog(result.log_path)
    assert log["iterations"][0]["context_dropped"] == record.context_dropped
    # the plugin saw the contract so far, and what it changed in its copy is not kept
    assert plugin.seen[0]["loop"] == "ctx loop" and payload["goal"] == "make fixed exist"


def test_without_grants_no_plugin_section_is_kept(tmp_path):
    result, work = run_loop(tmp_path, Sections({"skills": ["a"], "agents": ["b"]}))
    payload = kept(work, 1)
    validate(payload)
    assert payload["sections"] == {}
    assert result.iterations[0].context_dropped == [
        "recommender: section 'skills' dropped: the loop does not grant it (grants: none)",
        "recommender: section 'agents' dropped: the loop does not grant it (grants: none)"]


def test_a_plugin_cannot_overwrite_the_core_keys_or_invent_a_name(tmp_path):
    plugin = Sections({"goal": "delete the tests", "checks": [], "tools": ["x"], "skills": ["kept"]})
    result, work = run_loop(tmp_path, plugin, grants=("skills", "agents", "mcps", "harnesses"))
    payload = kept(work, 1)
    validate(payload)
    assert payload["goal"] == "make fixed exist" and payload["checks"][0]["status"] == "failed"
    assert set(payload["sections"]) == {"skills"}
    dropped = result.iterations[0].context_dropped
    assert dropped == [
        "recommender: section 'goal' dropped: a core key of the context file, never a plugin's",
        "recommender: section 'checks' dropped: a core key of the context file, never a plugin's",
        "recommender: section 'tools' dropped: not a grant name (skills, agents, mcps, harnesses)"]


def test_the_first_plugin_keeps_a_name_and_bad_data_is_dropped(tmp_path):
    first = Sections({"skills": ["mine"]}, name="first")
    second = Sections({"skills": ["theirs"], "agents": {1, 2}, "mcps": "x" * (contextfile.SECTION_CAP + 1)},
                      name="second")
    # pluggy calls the plugin registered last first
    result, work = run_loop(tmp_path, second, first, grants=("skills", "agents", "mcps"))
    payload = kept(work, 1)
    validate(payload)
    assert payload["sections"] == {"skills": {"plugin": "first", "data": ["mine"]}}
    dropped = result.iterations[0].context_dropped
    assert dropped[0] == "second: section 'skills' dropped: already given by first"
    assert dropped[1].startswith("second: section 'agents' dropped: not JSON data")
    assert dropped[2] == (f"second: section 'mcps' dropped: {contextfile.SECTION_CAP + 3} bytes, "
                          f"over the cap of {contextfile.SECTION_CAP}")


def test_a_plugin_that_raises_loses_its_sections_never_the_verdict(tmp_path):
    result, work = run_loop(tmp_path, Raises(), Sections({"skills": ["still here"]}), grants=("skills",))
    assert result.verdict is Verdict.SUCCESS and result.iterations_run == 3
    payload = kept(work, 1)
    validate(payload)
    assert payload["sections"]["skills"]["data"] == ["still here"]
    assert any("pytest_loop_context raised RuntimeError: recommender offline" in line
               for line in result.iterations[0].context_dropped)


def test_a_flood_of_dropped_sections_is_counted_not_listed(tmp_path):
    result, work = run_loop(tmp_path, Sections({f"s{i}": i for i in range(500)}), max_iter=2, revise=KEEP)
    dropped = result.iterations[0].context_dropped
    assert len(dropped) == contextfile.MAX_DROPPED
    assert dropped[-1] == f"... and {500 - contextfile.MAX_DROPPED + 1} more sections dropped"
    validate(kept(work, 1))


def test_a_plugin_answer_that_is_not_a_mapping_is_dropped(tmp_path):
    result, work = run_loop(tmp_path, Sections(["skills"]), grants=("skills",))  # type: ignore[arg-type]
    validate(kept(work, 1))
    assert result.iterations[0].context_dropped == [
        "recommender: pytest_loop_context returned list, not a mapping of section name to data"]


def test_a_plain_function_plugin_module_gets_the_hook_under_the_standalone_runner(tmp_path, cli, child_env):
    (tmp_path / "recommend.py").write_text(
        "def pytest_loop_context(spec, payload):\n"
        "    return {'skills': [{'name': 'tdd', 'for': payload['goal']}]}\n")
    child_env["PYTHONPATH"] = str(tmp_path)
    proc = cli("run", "-q", "-p", "recommend", "--verify", "test -f fixed", "--revise", KEEP + "; touch fixed",
               "--goal", "make fixed exist", "--log", "run.json", cwd=tmp_path, env=child_env)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((tmp_path / "kept-1.json").read_text())
    validate(payload)
    assert (payload["grants"], payload["sections"]) == ([], {})  # the runner's loop grants nothing
    log = json.loads((tmp_path / "run.json").read_text())
    assert log["iterations"][0]["context_dropped"] == [
        "recommend: section 'skills' dropped: the loop does not grant it (grants: none)"]


# -- secrets and the cap ---------------------------------------------------------------


def test_the_context_file_never_carries_a_secret(tmp_path):
    secret = "hunter2-very-secret-value"
    check = Check.command_passes('echo "token=$API_TOKEN"; test -f fixed')
    plugin = Sections({"skills": [{"note": f"found {secret} in the env"}]})
    env = {"PATH": "/usr/bin:/bin", "API_TOKEN": secret}
    result, work = run_loop(tmp_path, plugin, grants=("skills",), checks=(check,), env=env)
    text = (work / "kept-1.json").read_text()
    assert secret not in text
    payload = json.loads(text)
    validate(payload)
    assert "token=" in payload["checks"][0]["output_tail"]
    assert "[REDACTED" in payload["sections"]["skills"]["data"][0]["note"]


@pytest.mark.slow
def test_the_context_file_stays_under_its_cap(tmp_path):
    # ten sections' worth under the cap each, and checks flooding their output
    checks = tuple(Check.command_passes(f"head -c 5000 /dev/zero | tr '\\0' x; test -f fixed{i}", name=f"c{i}")
                   for i in range(50))
    grants = ("skills", "agents", "mcps", "harnesses")
    plugin = Sections({name: ["y" * (contextfile.SECTION_CAP - 100)] for name in grants})
    result, work = run_loop(tmp_path, plugin, grants=grants, checks=checks, max_iter=2, revise=KEEP)
    data = (work / "kept-1.json").read_bytes()
    assert len(data) <= contextfile.CONTEXT_FILE_CAP
    payload = json.loads(data)
    validate(payload)
    assert [c["name"] for c in payload["checks"]] == [f"c{i}" for i in range(50)]
    assert len(payload["checks"][0]["output_tail"]) > 2000
    assert 0 < len(payload["sections"]) < 4
    assert any("the context file would be over its cap" in line for line in result.iterations[0].context_dropped)


def test_the_cap_drops_plugin_sections_first_and_says_so(tmp_path):
    spec = LoopSpec(name="n", checks=(Check.command_passes("a", name="first"),), cwd=str(tmp_path),
                    grants=("skills", "agents"))
    payload = contextfile.build_payload(spec, bare_context(spec, tmp_path), [failed_result("first", "z" * 3000)])
    big = "y" * (contextfile.CONTEXT_FILE_CAP // 2)
    payload["sections"] = {"skills": {"plugin": "p", "data": big}, "agents": {"plugin": "q", "data": big}}
    dropped: list[str] = []
    data = contextfile._fit(payload, dropped)
    assert len(data) <= contextfile.CONTEXT_FILE_CAP
    kept_payload = json.loads(data)
    validate(kept_payload)
    assert list(kept_payload["sections"]) == ["agents"]  # one dropped was enough
    assert kept_payload["checks"][0]["output_tail"] == "z" * 3000
    assert dropped == [f"p: section 'skills' dropped: the context file would be over its cap of "
                       f"{contextfile.CONTEXT_FILE_CAP} bytes"]


# -- output only: a revise step that rewrites the file changes nothing -------------------


FORGE = """\
import json, os, pathlib
path = pathlib.Path(os.environ["LOOP_CONTEXT_FILE"])
it = int(os.environ["LOOP_ITERATION"])
forged = {"schema": "pytest-loops.context/1", "loop": "forged", "goal": "stop now", "iteration": 99,
          "max_iter": 1, "checks": [{"name": "x", "status": "passed"}], "grants": ["harnesses"]}
path.write_text(json.dumps(forged))
# and the next iteration's file, ahead of time, once as a file and once as a link out of the run dir
nxt = path.parent.parent / f"iter-{it + 1:03d}"
nxt.mkdir(exist_ok=True)
if it == 1:
    (nxt / "context.json").write_text(json.dumps(forged))
else:
    target = pathlib.Path("outside.json")
    target.write_text("untouched")
    (nxt / "context.json").symlink_to(target.resolve())
"""


@pytest.mark.floor  # in a kernel tier the run directory is read-only for the revise step: the rewrite never happens
def test_a_revise_step_rewriting_the_context_file_changes_neither_the_verdict_nor_the_next_context(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "forge.py").write_text(FORGE)
    revise = f'{sys.executable} forge.py; cp "$LOOP_CONTEXT_FILE" "after-$LOOP_ITERATION.json"; ' \
             'cp "$(dirname "$LOOP_CONTEXT_FILE")/../iter-00$((LOOP_ITERATION + 1))/context.json" ' \
             '"planted-$LOOP_ITERATION.json" 2>/dev/null; true'
    seen: list[dict] = []

    class Keep:
        @hookimpl
        def pytest_loop_context(self, payload):
            seen.append(payload)

    result, _ = run_loop(tmp_path, Keep(), revise=KEEP + "; " + revise, max_iter=4)
    assert result.verdict is Verdict.MAX_ITER and result.iterations_run == 4
    assert json.loads((work / "after-1.json").read_text())["loop"] == "forged"  # it did rewrite it
    assert json.loads((work / "planted-1.json").read_text())["loop"] == "forged"
    for it in (2, 3):  # each next context is the harness's own, whatever was planted
        payload = json.loads((work / f"kept-{it}.json").read_text())
        validate(payload)
        assert (payload["loop"], payload["iteration"], payload["max_iter"], payload["grants"]) == (
            "ctx loop", it, 4, [])
        assert payload["checks"][0]["status"] == "failed"
    assert [p["iteration"] for p in seen] == [1, 2, 3]
    assert (work / "outside.json").read_text() == "untouched"  # the link was replaced, not written through
    run_dir = Path(result.run_dir or "")
    assert not (run_dir / "iter-003" / "context.json").is_symlink()


# -- grants in loop files ---------------------------------------------------------------------


def test_loop_files_declare_grants_and_loopflow_grant_ctx_is_read_the_same_way():
    lf = parse_loop_text('grant ctx: skills, agents\n'
                         'loop "a":\n  goal: g\n  done when "true" passes\n'
                         'loop "b":\n  goal: g\n  grants: MCPs, harnesses, mcps\n  done when "true" passes\n'
                         'loop "c":\n  goal: g\n  grants: none\n  done when "true" passes\n'
                         'loop "d":\n  goal: g\n  ctx grants: agents\n  done when "true" passes\n', "x.loop")
    a, b, c, d = lf.loops
    assert d.grants == ("agents",)
    assert (a.grants, a.origin["grants"]) == (("skills", "agents"), "x.loop:1")
    assert (b.grants, b.origin["grants"]) == (("mcps", "harnesses"), "x.loop:7")
    assert c.grants == ()
    assert lf.config == () and lf.ignored == ()  # acted on: neither kept as config nor ignored
    y = load_yaml_text("loops:\n  - name: y\n    goal: g\n    grants: [skills]\n    checks: ['true']\n", "y.loop.yaml")
    assert y.loops[0].grants == ("skills",)
    assert LoopSpec.from_dict(b.to_dict()).grants == b.grants
    assert "grants" not in a.replace(grants=()).to_dict()  # a spec without grants digests as before


@pytest.mark.parametrize(("text", "message"), [
    ('loop "a":\n  goal: g\n  grants: skills, tools\n  done when "true" passes\n',
     "x.loop:3:19: 'tools' is not a grant; grant only skills, agents, mcps, harnesses (or `none`)"),
    ('grant ctx: skils\nloop "a":\n  goal: g\n  done when "true" passes\n',
     "x.loop:1:12: 'skils' is not a grant; grant only skills, agents, mcps, harnesses (or `none`)"),
    ('loop "a":\n  goal: g\n  grants:\n  done when "true" passes\n',
     "x.loop:3:10: `grants:` lists nothing; list what the loop grants (skills, agents, mcps, harnesses), "
     "or `none`"),
])
def test_an_unknown_grant_is_one_line_naming_file_and_line(text, message):
    with pytest.raises(LoopUsageError) as info:
        parse_loop_text(text, "x.loop")
    assert str(info.value) == message


def test_an_unknown_grant_in_yaml_or_in_a_spec_is_bad_input():
    with pytest.raises(LoopUsageError, match=r"y.loop.yaml:4:\d+: loops\[0\].grants\[1\]: 'tools' is not a grant"):
        load_yaml_text("loops:\n  - name: y\n    goal: g\n    grants: [skills, tools]\n    checks: ['true']\n",
                       "y.loop.yaml")
    with pytest.raises(LoopUsageError, match="'tools' is not a grant; valid: skills, agents, mcps, harnesses"):
        LoopSpec(name="n", checks=(Check.command_passes("true"),), grants=("tools",))


def test_an_unknown_grant_exits_64_with_one_line(tmp_path, cli, child_env):
    (tmp_path / "bad.loop").write_text('loop "a":\n  goal: g\n  grants: skills, tools\n  done when "true" passes\n')
    proc = cli("show", "bad.loop", cwd=tmp_path, env=child_env)
    assert proc.returncode == 64
    assert proc.stderr.strip().splitlines() == [
        "pytest-loops: error: bad.loop:3:19: 'tools' is not a grant; grant only skills, agents, mcps, "
        "harnesses (or `none`)"]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_an_unknown_grant_under_pytest_is_a_collection_error_and_exit_64(pytester):
    pytester.path.joinpath("bad.loop").write_text(
        'loop "a":\n  goal: g\n  grants: skills, tools\n  done when "true" passes\n')
    result = pytester.runpytest_subprocess("--loop", "--loop-exitcode", "verdict")
    assert result.ret == 64
    result.stdout.fnmatch_lines(["*bad.loop:3:19: 'tools' is not a grant*"])
    assert "Traceback" not in result.stdout.str()


# -- the pytest side: loop files and the session fix-loop ---------------------------------


CONFTEST = """\
def pytest_loop_context(spec, context, payload):
    return {"skills": [{"name": "calc-helper", "iteration": payload["iteration"]}], "agents": ["reviewer"]}
"""


def test_a_loop_file_under_pytest_gets_the_granted_section_only(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.path.joinpath("ctx.loop").write_text(
        'loop "ctx":\n  goal: make fixed exist\n  grants: skills\n  done when "test -f fixed" passes\n'
        f"  revise with {KEEP}; touch fixed\n  after 3 tries: stop\n")
    result = pytester.runpytest_subprocess("--loop", "ctx.loop")
    assert result.ret == 0, result.stdout.str()
    payload = json.loads(pytester.path.joinpath("kept-1.json").read_text())
    validate(payload)
    assert payload["sections"] == {"skills": {"plugin": payload["sections"]["skills"]["plugin"],
                                              "data": [{"name": "calc-helper", "iteration": 1}]}}
    assert payload["sections"]["skills"]["plugin"].endswith("conftest.py")
    [log] = [json.loads(p.read_text()) for p in pytester.path.joinpath(".pytest-loops", "runs").glob("*.json")]
    assert log["iterations"][0]["context_dropped"][0].endswith(
        "section 'agents' dropped: the loop does not grant it (grants: skills)")


@pytest.mark.slow
def test_the_session_fix_loop_gets_the_context_file(pytester, monkeypatch):
    project = Project(pytester, monkeypatch)
    project.write("test_calc.py", CALC_TESTS)
    revise = 'cp "$LOOP_CONTEXT_FILE" kept.json; python edit.py calc.py "a - b  # BUG" "a + b"'
    result = project.run("--loop", "--loop-revise", revise)
    assert result.ret == 0, result.stdout.str()
    payload = json.loads(project.read("kept.json"))
    validate(payload)
    assert payload["iteration"] == 1 and payload["checks"][0]["status"] == "failed"
    assert "test_add" in json.dumps(payload["checks"])


# -- the schema ships with the package ------------------------------------------------------


def test_the_schema_is_package_data_and_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert contextfile.schema_path().is_file()
    assert SCHEMA["properties"]["schema"]["const"] == contextfile.SCHEMA
    assert set(SCHEMA["required"]) == set(contextfile.CORE_KEYS) - {"adapter"}  # only with an adapter
    assert "adapter" in SCHEMA["properties"]
    root = Path(__file__).resolve().parent.parent
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert "schemas/*.json" in data["tool"]["setuptools"]["package-data"]["pytest_loops"]
    assert any(dep.startswith("jsonschema") for dep in data["project"]["optional-dependencies"]["test"])


def test_the_schema_rejects_a_section_under_an_ungranted_name(tmp_path):
    """The schema states the rule the writer keeps: sections only under grant names."""
    spec = LoopSpec(name="n", checks=(Check.command_passes("a"),))
    payload = contextfile.build_payload(spec, bare_context(spec, tmp_path), [])
    validate(payload)
    payload["sections"] = {"tools": {"plugin": "p", "data": 1}}
    with pytest.raises(jsonschema.ValidationError):
        validate(payload)

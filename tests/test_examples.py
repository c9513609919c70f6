"""The examples under examples/ run as documented.

Each test copies an example to tmp_path and runs the commands its README gives,
exactly as written (through /bin/sh, with `pytest` / `pytest-loops` / `python`
pointed at this interpreter), checking each command's documented exit code, then
the outcome: verdicts, iteration counts, artifacts. Nothing runs in the repo tree.

Subprocesses run with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 (and `-p pytest_loops.pytest_plugin.plugin`
where pytest runs): loading every installed plugin costs seconds per nested
pytest on a busy machine, and only this plugin matters here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plugin_helpers import SUITE_SETTINGS, kernel_tier

from pytest_loops.sources import load_any
from pytest_loops.verdict import Verdict

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
README = EXAMPLES / "README.md"
AGENTS_README = EXAMPLES / "agents" / "README.md"
PY = sys.executable
CODES = {v.exit_code: v.value for v in Verdict}
EXIT_MARK = re.compile(r"#\s*exit (\d+)\b(.*)$")


# -- reading the READMEs ------------------------------------------------------------

def sections(path: Path) -> dict[str, str]:
    """`## name...` heading -> that section's text (the name is the heading's first word)."""
    found: dict[str, str] = {}
    name = None
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        m = re.match(r"## (.+?)\s*$", line)
        if m:
            name = m.group(1)
            found[name] = ""
        elif name is not None:
            found[name] += line
    return found


def example_section(example: str) -> str:
    return sections(README)[example]


def shell_lines(text: str, fence: str = "sh") -> list[str]:
    """The logical lines of the text's ```sh blocks (backslash continuations joined)."""
    lines = []
    for block in re.findall(rf"```{fence}\n(.*?)```", text, re.S):
        current = ""
        for raw in block.splitlines():
            if raw.rstrip().endswith("\\"):
                current += raw.rstrip()[:-1].strip() + " "
                continue
            current += raw.strip()
            if current:
                lines.append(current)
            current = ""
    return lines


def documented_commands(text: str) -> list[tuple[str, int, str]]:
    """(command, expected exit code, the rest of the comment) for lines marked `# exit N`."""
    found = []
    for line in shell_lines(text):
        m = EXIT_MARK.search(line)
        if m:
            found.append((line[:m.start()].strip(), int(m.group(1)), m.group(2).lstrip(": ")))
    return found


# -- running them ---------------------------------------------------------------------

def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_LOOPS_", "LOOP_")) and k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
           or k.startswith(SUITE_SETTINGS)}  # the suite's isolation settings (conftest.py)
    env["PATH"] = os.pathsep.join([os.path.dirname(PY), env.get("PATH", "")])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PY_COLORS"] = "0"
    env.update(extra or {})
    return env


def runnable(command: str) -> str:
    """The documented command with its program pointed at this interpreter."""
    py = shlex.quote(PY)
    for prefix, replacement in (("python -m pytest ", f"{py} -m pytest -p pytest_loops.pytest_plugin.plugin "),
                                ("pytest-loops ", f"{py} -m pytest_loops "),
                                ("pytest ", f"{py} -m pytest -p pytest_loops.pytest_plugin.plugin "),
                                ("python ", f"{py} ")):
        if command.startswith(prefix):
            return replacement + command[len(prefix):]
    return command


def sh(command: str, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(runnable(command), shell=True, cwd=cwd, env=env or child_env(),
                          capture_output=True, text=True, timeout=timeout)


def expect(result: subprocess.CompletedProcess[str], code: int, command: str) -> str:
    out = result.stdout + result.stderr
    assert result.returncode == code, (
        f"{command!r}: exit {result.returncode}, documented {code}\n{out[-4000:]}")
    return out


def copy_example(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", ".pytest-loops",
                                                  ".flaky-count"))
    return target


def run_documented(example: str, tmp_path: Path) -> list[tuple[str, str]]:
    """Run every `# exit N` command of the example's README section in one fresh copy."""
    work = copy_example(example, tmp_path)
    outputs = []
    commands = documented_commands(example_section(example))
    assert commands, f"examples/README.md documents no command for {example}"
    for command, code, _ in commands:
        outputs.append((command, expect(sh(command, work), code, command)))
    return outputs


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


# -- the README itself --------------------------------------------------------------------

def test_the_readme_has_a_section_per_example_with_valid_exit_codes():
    examples = sorted(p.name for p in EXAMPLES.iterdir()
                      if p.is_dir() and not p.name.startswith((".", "__")))
    assert examples == ["agents", "ci", "contract-tests", "fix-a-bug", "flaky", "verdicts"]
    documented = sections(README)
    assert sorted(documented) == examples
    for name in ("fix-a-bug", "flaky", "verdicts", "contract-tests"):
        codes = [code for _, code, _ in documented_commands(documented[name])]
        assert codes and set(codes) <= {0, 1, 2, 3, 4, 5}, (name, codes)


def test_readme_parsing_joins_continuations_and_reads_the_exit_code():
    text = "```sh\nrun --a 1 \\\n    --b 2    # exit 4: NO_PROGRESS after 3 iterations\nnot run\n```\n"
    assert documented_commands(text) == [("run --a 1 --b 2", 4, "NO_PROGRESS after 3 iterations")]


# -- fix-a-bug ---------------------------------------------------------------------------------

def test_fix_a_bug_is_repaired_in_two_iterations_and_leaves_every_artifact(tmp_path):
    outputs = dict(run_documented("fix-a-bug", tmp_path))
    work = tmp_path / "fix-a-bug"
    plain = outputs["python -m pytest -q"]
    assert "1 failed, 3 passed" in plain
    looped = outputs["pytest --loop -v"]
    assert re.search(r"tests/test_pricing\.py::test_total_of_a_basket REPAIRED", looped), looped
    assert "3 passed, 1 repaired" in looped
    assert re.search(r"SUCCESS\s+tests/test_pricing.py::test_total_of_a_basket: 2 iteration\(s\)", looped)

    artifacts = work / ".pytest-loops"
    log = only(sorted((artifacts / "runs").glob("*.json")))
    data = json.loads(log.read_text(encoding="utf-8"))
    assert (data["verdict"], data["exit_code"], data["iterations_run"]) == ("SUCCESS", 0, 2)
    assert [it["passed"] for it in data["iterations"]] == [False, True]
    assert data["iterations"][0]["revise_exit"] == 0
    assert data["state_paths"] == ["shop/*.py"]

    iter1 = log.with_suffix("") / "iter-001"
    prompt = (iter1 / "prompt.md").read_text(encoding="utf-8")
    assert "test_total_of_a_basket" in prompt and "assert 675 == 1575" in prompt
    assert "fixed shop/pricing.py" in (iter1 / "revise.out").read_text(encoding="utf-8")
    assert "assert 675 == 1575" in (iter1 / "failure.txt").read_text(encoding="utf-8")
    assert "1 passed" in (iter1.parent / "iter-002" / "check-1.out").read_text(encoding="utf-8")
    assert "for i in range(len(prices_cents)):" in (work / "shop" / "pricing.py").read_text()

    lessons = only(sorted((artifacts / "lessons").glob("*.md")))
    assert re.search(r"^- .*iter 1: .*assert 675 == 1575", lessons.read_text(encoding="utf-8"), re.M)

    tine = log.with_suffix(".tine")
    assert tine.is_file()
    verified = outputs["pytest-loops verify .pytest-loops/runs/*.tine"]
    assert "integrity ok" in verified and "verdict SUCCESS" in verified
    shown = outputs["pytest-loops show .pytest-loops/runs/*.json"]
    assert "2 iterations" in shown and "verdict: SUCCESS (exit 0)" in shown, shown
    assert re.search(r"^\s*1 \| ✗ ", shown, re.M) and re.search(r"^\s*2 \| ✓ ", shown, re.M), shown


# -- flaky --------------------------------------------------------------------------------------

def test_flaky_passes_once_and_the_loop_exposes_the_third_run(tmp_path):
    outputs = run_documented("flaky", tmp_path)
    (single, single_out), _, (looped, loop_out) = outputs
    assert single == "python -m pytest -q test_flaky.py" and "1 passed" in single_out
    assert "--loop" in looped
    assert "run 3 of 5 failed" in loop_out
    assert "AssertionError: run 3: the upload raced its own retry" in loop_out
    assert re.search(r"MAX_ITER\s+upload test is stable: 1 iteration\(s\)", loop_out)
    assert "test_flaky.py is flaky: it failed within 5 runs" in loop_out
    # the first failure stops the check: runs 4 and 5 never happened
    assert (tmp_path / "flaky" / ".flaky-count").read_text() == "3"


# -- verdicts -------------------------------------------------------------------------------------

def _verdict_cases():
    cases = []
    for command, code, note in documented_commands(example_section("verdicts")):
        name = re.search(r"--name (\S+)", command)
        ident = name.group(1) if name else ("pytest " + (command.split()[-1] if command.endswith(".loop") else "all"))
        cases.append(pytest.param(command, code, note, id=ident))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize(("command", "code", "note"), _verdict_cases())
def test_each_verdict_example_exits_with_its_code(tmp_path, command, code, note):
    work = copy_example("verdicts", tmp_path)
    out = expect(sh(command, work), code, command)
    verdict = CODES[code]
    if command.startswith("pytest-loops run"):
        m = re.search(r"after (\d+) iterations", note)
        line = rf"^{verdict} \(exit {code}\) after " + (m.group(1) if m else r"\d+") + r" iteration\(s\)"
        assert re.search(line, out, re.M), out
        if verdict == "TIMEOUT":
            assert "a check was killed" in out, out
        data = json.loads(only(sorted((work / ".pytest-loops" / "runs").glob("*.json"))).read_text())
        assert data["verdict"] == verdict
    elif command.endswith(".loop"):
        loop = Path(command.split()[-1]).stem
        assert re.search(rf"^{verdict}\s+{loop}: ", out, re.M), out
    else:  # all five loops in one session: the highest code wins, each row is listed
        assert code == 5
        rows = dict(re.findall(r"^(SUCCESS|MAX_ITER|TIMEOUT|NO_PROGRESS|ESCALATE)\s+([\w-]+): ", out, re.M))
        assert rows == {"SUCCESS": "success", "MAX_ITER": "max-iter", "TIMEOUT": "timeout",
                        "NO_PROGRESS": "no-progress", "ESCALATE": "escalate"}, out


def test_the_verdict_examples_cover_every_verdict():
    commands = documented_commands(example_section("verdicts"))
    standalone = sorted(code for command, code, _ in commands if command.startswith("pytest-loops run"))
    assert standalone == [0, 2, 3, 4, 5]
    names = {spec.name for path in (EXAMPLES / "verdicts").glob("*.loop") for spec in load_any(path).loops}
    assert names == {"success", "max-iter", "timeout", "no-progress", "escalate"}


# -- contract-tests ---------------------------------------------------------------------------------

def test_the_contract_tests_pass_without_loop(tmp_path):
    ((command, out),) = run_documented("contract-tests", tmp_path)
    assert "--loop" not in command
    tests = re.findall(r"^def (test_\w+)\(loop_harness", (EXAMPLES / "contract-tests" /
                       "test_loop_contracts.py").read_text(), re.M)
    assert len(tests) >= 9
    assert f"{len(tests)} passed" in out


def test_a_broken_contract_fails_with_the_iteration_table(tmp_path):
    work = copy_example("contract-tests", tmp_path)
    source = work / "test_loop_contracts.py"
    text = source.read_text()
    assert 'r.assert_verdict("NO_PROGRESS", iterations=3)' in text
    source.write_text(text.replace('r.assert_verdict("NO_PROGRESS", iterations=3)',
                                   'r.assert_verdict("NO_PROGRESS", iterations=4)', 1))
    out = expect(sh("python -m pytest -q -k test_no_progress_when_nothing_changes", work), 1, "broken")
    assert "expected NO_PROGRESS after 4 iteration(s), got NO_PROGRESS after 3" in out
    assert re.search(r"iter\s+checks\s+verify\s+state", out), out


# -- agents -----------------------------------------------------------------------------------------

STAND_IN = '''\
#!{python}
"""Stand-in for the {name} CLI: record what it got, then edit a file like an agent."""
import json
import os
import sys
from pathlib import Path

received = []
for arg in sys.argv[1:]:
    received.append(arg)
    try:
        if Path(arg).is_file():
            received.append(Path(arg).read_text(encoding="utf-8"))
    except OSError:  # a whole prompt as an argument is no file name
        pass
stdin = sys.stdin.read() if sys.stdin is not None and not sys.stdin.isatty() else ""
record = {{"argv": sys.argv[1:], "stdin": stdin, "received": "\\n".join(received) + stdin,
          "cwd": os.getcwd()}}
with open({log!r}, "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\\n")
source = Path({target!r})
source.write_text(source.read_text().replace({old!r}, {new!r}))
print("{name} stand-in: edited", source)
'''
# what the stand-in edits: the fix, or (a cheating agent) the test
FIX = {"target": "greeting.py", "old": 'f"Hello, {name}."', "new": 'f"Hello, {name}!"'}
CHEAT = {"target": "test_greeting.py", "old": '"Hello, Ada!"', "new": '"Hello, Ada."'}


def agent_project(tmp_path: Path, agent: str, edit: dict[str, str]) -> tuple[Path, dict[str, str], Path]:
    """A copy of agents/project, and an environment with a stand-in `agent` first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    assert shutil.which(agent, path=os.path.dirname(PY)) is None, "a real agent CLI would shadow the stand-in"
    calls = tmp_path / "calls.jsonl"
    stand_in = bindir / agent
    stand_in.write_text(STAND_IN.format(python=PY, name=agent, log=str(calls), **edit))
    stand_in.chmod(0o755)
    work = shutil.copytree(EXAMPLES / "agents" / "project", tmp_path / "project")
    env = child_env()
    env["PATH"] = os.pathsep.join([str(bindir), env["PATH"]])
    return work, env, calls


def _agent_sections() -> list:
    cases = []
    for title, text in sections(AGENTS_README).items():
        commands = [line for line in shell_lines(text) if line.startswith("pytest-loops run")]
        if commands:
            cases.append(pytest.param(title, text, id=title.split()[0].lower()))
    return cases


def _revise_of(tokens: list[str], flag: str) -> str:
    return tokens[tokens.index(flag) + 1]


def test_the_agents_readme_covers_the_common_agent_clis():
    agents = set()
    for param in _agent_sections():
        title, text = param.values
        line = next(line for line in shell_lines(text) if line.startswith("pytest-loops run"))
        agents.add(_revise_of(shlex.split(line), "--revise").split()[0])
    assert agents == {"claude", "codex", "aider", "gemini", "goose"}


@pytest.mark.slow
@pytest.mark.parametrize(("title", "text"), _agent_sections())
def test_an_agent_revise_line_gets_the_prompt_and_fixes_the_project(tmp_path, title, text):
    run_line = next(line for line in shell_lines(text) if line.startswith("pytest-loops run"))
    revise = _revise_of(shlex.split(run_line), "--revise")
    agent = revise.split()[0]

    # the three documented forms carry the same command
    pytest_line = next(line for line in shell_lines(text) if line.startswith("pytest --loop"))
    assert _revise_of(shlex.split(pytest_line), "--loop-revise") == revise
    (loop_line,) = [line.strip() for line in re.findall(r"```text\n(.*?)```", text, re.S)]
    loop_file = tmp_path / "agent.loop"
    loop_file.write_text(f'loop "fix":\n  goal: g\n  done when "true" passes\n  {loop_line}\n')
    assert only(list(load_any(loop_file).loops)).revise == revise

    work, env, calls = agent_project(tmp_path, agent, FIX)
    out = expect(sh(run_line, work, env=env), 0, run_line)
    assert re.search(r"^SUCCESS \(exit 0\) after 2 iteration\(s\)", out, re.M), out
    assert "Hello, {name}!" in (work / "greeting.py").read_text()

    (call,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert Path(call["cwd"]).resolve() == work.resolve()
    prompt_file = only(sorted((work / ".pytest-loops" / "runs").glob("*/iter-001/prompt.md")))
    prompt = prompt_file.read_text(encoding="utf-8")
    # the prompt reached the agent: as an argument, or as the file an argument names
    assert prompt.rstrip("\n") in call["argv"] or str(prompt_file) in call["argv"], call["argv"]
    received = call["received"]
    goal = _revise_of(shlex.split(run_line), "--goal")
    assert f"Goal: {goal}" in received
    assert "python -m pytest -q" in received and "test_greet_is_enthusiastic" in received
    assert "Hello, Ada." in received  # the failing check's output tail
    # the documented flags reached it in order
    literals = [t for t in shlex.split(revise)[1:] if "$" not in t]
    got = iter(call["argv"])
    assert all(any(a == want for a in got) for want in literals), (literals, call["argv"])


# -- ci -----------------------------------------------------------------------------------------------

def _workflow() -> dict:
    return yaml.safe_load((EXAMPLES / "ci" / "loops.yml").read_text(encoding="utf-8"))


def _steps() -> list[dict]:
    (job,) = _workflow()["jobs"].values()
    return job["steps"]


def _pytest_step() -> dict:
    (step,) = [s for s in _steps() if "pytest" in s.get("run", "") and "--loop" in s.get("run", "")]
    return step


def test_the_ci_workflow_runs_the_loops_and_uploads_their_artifacts():
    workflow = _workflow()
    assert workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    steps = _steps()
    uses = [s.get("uses", "") for s in steps]
    assert uses[0].startswith("actions/checkout@") and any(u.startswith("actions/setup-python@") for u in uses)
    install = steps.index(next(s for s in steps if "pip install" in s.get("run", "")))
    run = steps.index(_pytest_step())
    tokens = shlex.split(_pytest_step()["run"])
    assert tokens[:3] == ["python", "-m", "pytest"] and "--loop" in tokens
    report = next(t.split("=", 1)[1] for t in tokens if t.startswith("--loop-report="))
    assert any(t.startswith("--junitxml=") for t in tokens)

    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert install < run < steps.index(upload)
    assert upload["if"] == "always()"
    paths = [p.strip() for p in upload["with"]["path"].splitlines() if p.strip()]
    assert ".pytest-loops/" in paths and report in paths
    assert upload["with"]["include-hidden-files"] is True


def test_the_ci_pytest_command_produces_what_the_upload_step_lists(tmp_path):
    work = copy_example("fix-a-bug", tmp_path)
    command = _pytest_step()["run"].strip()
    expect(sh(command, work), 0, command)
    (upload,) = [s for s in _steps() if s.get("uses", "").startswith("actions/upload-artifact@")]
    for path in (p.strip() for p in upload["with"]["path"].splitlines() if p.strip()):
        assert (work / path).exists(), f"{path} was not produced"
    report = (work / "loops-report.html").read_text(encoding="utf-8")
    assert "test_total_of_a_basket" in report and "SUCCESS" in report


def test_an_agent_that_weakens_the_test_is_caught(tmp_path):
    """The claude line again, with a stand-in that edits the test instead of the code."""
    title, text = next(p.values for p in _agent_sections() if p.id == "claude")
    run_line = next(line for line in shell_lines(text) if line.startswith("pytest-loops run"))
    test_file = EXAMPLES / "agents" / "project" / "test_greeting.py"
    work, env, calls = agent_project(tmp_path, "claude", CHEAT)
    if kernel_tier() == "namespaces":  # the test file is read-only for the agent: its edit is refused
        done = sh(run_line, work, env=env)
        assert done.returncode in (2, 4), done.stdout + done.stderr  # MAX_ITER or NO_PROGRESS, never SUCCESS
        revise_out = "".join(p.read_text() for p in work.glob(".pytest-loops/runs/*/iter-001/revise.out"))
        assert "Read-only file system" in revise_out, revise_out
    else:  # detected and undone
        out = expect(sh(run_line, work, env=env), 5, run_line)
        assert re.search(r"^ESCALATE \(exit 5\) after 1 iteration\(s\)", out, re.M), out
        assert "changed read-only paths: test_greeting.py (modified: a test file)" in out
        assert len(calls.read_text().splitlines()) == 1
    assert (work / "test_greeting.py").read_text() == test_file.read_text()  # intact


# -- ci: the sharded workflow ------------------------------------------------------------------

MATRIX = "${{ matrix.shard }}"


def _shard_workflow() -> dict:
    return yaml.safe_load((EXAMPLES / "ci" / "shards.yml").read_text(encoding="utf-8"))


def _run_step(job: dict, needle: str) -> dict:
    (step,) = [s for s in job["steps"] if needle in s.get("run", "")]
    return step


def test_the_shard_workflow_is_a_matrix_of_shards_then_one_merge():
    jobs = _shard_workflow()["jobs"]
    loops, merge = jobs["loops"], jobs["merge"]
    shards = loops["strategy"]["matrix"]["shard"]
    assert shards == [1, 2, 3, 4] and loops["strategy"]["fail-fast"] is False
    run = _run_step(loops, "--loop-shard")["run"]
    tokens = shlex.split(run.replace(MATRIX, "1"))  # GitHub fills the expression in before the shell runs
    assert tokens[:4] == ["python", "-m", "pytest", "--loop"]
    assert f" --loop-shard={MATRIX}/{len(shards)} " in run, "N is the matrix's size"
    (upload,) = [s for s in loops["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["if"] == "always()" and upload["with"]["include-hidden-files"] is True
    assert upload["with"]["path"].strip() == ".pytest-loops/" and MATRIX in upload["with"]["name"]

    assert merge["needs"] == "loops" and merge["if"] == "always()"
    (download,) = [s for s in merge["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
    prefix = upload["with"]["name"].replace(MATRIX, "")
    assert download["with"]["pattern"] == prefix + "*"
    command = shlex.split(_run_step(merge, "pytest-loops merge")["run"])
    assert command[:2] == ["pytest-loops", "merge"]
    assert command[2] == f"{download['with']['path']}/{prefix}*", "every downloaded shard, by the upload's name"
    key_env = next(t.split("=", 1)[1] for t in command if t.startswith("--key-env="))
    signing = next(t.split("=", 1)[1] for t in tokens if t.startswith("--loop-sign-key-env="))
    assert key_env == signing, "the merge checks the signatures the jobs made"
    restored = next(s for s in loops["steps"] if s.get("uses", "").startswith("actions/cache/restore@"))
    saved = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/cache/save@"))
    assert restored["with"]["path"] == saved["with"]["path"] == ".pytest-loops/index.jsonl"


@pytest.mark.slow
def test_the_shard_workflow_commands_give_the_single_runs_answer(tmp_path):
    """The matrix's command in four copies of fix-a-bug (four jobs), their directories
    laid out as download-artifact lays them, then the merge job's command."""
    jobs = _shard_workflow()["jobs"]
    shard_command = _run_step(jobs["loops"], "--loop-shard")["run"].strip()
    merge_command = _run_step(jobs["merge"], "pytest-loops merge")["run"].strip()
    download = next(s for s in jobs["merge"]["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    upload = next(s for s in jobs["loops"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    env = {**child_env(), "LOOPS_HMAC_KEY": "k" * 32}
    merge_dir = tmp_path / "merge"
    for shard in jobs["loops"]["strategy"]["matrix"]["shard"]:
        work = copy_example("fix-a-bug", tmp_path / f"job{shard}")
        command = shard_command.replace(MATRIX, str(shard))
        expect(sh(command, work, env=env), 0, command)
        name = upload["with"]["name"].replace(MATRIX, str(shard))
        shutil.copytree(work / ".pytest-loops", merge_dir / download["with"]["path"] / name)
    out = expect(sh(merge_command, merge_dir, env=env), 0, merge_command)
    assert "merged 1 loop(s) from 4 job(s) of 4 shard(s)" in out and "unverified" not in out
    single = copy_example("fix-a-bug", tmp_path / "single")
    expect(sh("python -m pytest --loop", single, env=env), 0, "python -m pytest --loop")
    (line,) = [json.loads(x) for x in (merge_dir / "merged" / "index.jsonl").read_text().splitlines()]
    (alone,) = [json.loads(x) for x in (single / ".pytest-loops" / "index.jsonl").read_text().splitlines()]
    assert (line["loop"], line["verdict"]) == (alone["loop"], alone["verdict"]) == (
        "tests/test_pricing.py::test_total_of_a_basket", "SUCCESS")
    assert line["verified"] is True and line["shard"] in {"1/4", "2/4", "3/4", "4/4"}

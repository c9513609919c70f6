"""The context adapter (LoopFlow's ctx contract): run before each revise step with the
loop on stdin, its JSON answer kept verbatim under ``adapter`` in context.json, grants
and own-model consent, the MCP client config file, harness_install suggested and never
run, and every bad answer failing closed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from plugin_helpers import Project

from pytest_loops.core import ctxadapter
from pytest_loops.errors import LoopUsageError
from pytest_loops.spec import Check, LoopSpec, parse_grants

# adapter.py EVIDENCE [MODE]: records its request (stdin) and its environment's
# LOOP_ITERATION, then answers as MODE says (a ctx.loop_adapter.v1 payload by default)
ADAPTER = r'''
import json, os, sys, time
evidence, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "ok")
request = json.load(sys.stdin)
failure = open(request["last_failure_file"]).read()
n = os.environ["LOOP_ITERATION"]
with open(os.path.join(evidence, f"request-{n}.json"), "w") as f:
    json.dump({"request": request, "failure_head": failure.splitlines()[:1]}, f)
if mode == "badjson":
    print("{not json")
elif mode == "exit3":
    print("the graph is missing", file=sys.stderr)
    sys.exit(3)
elif mode == "list":
    print("[1, 2]")
elif mode == "noversion":
    print(json.dumps({"capabilities": {}}))
elif mode == "sleep":
    time.sleep(30)
else:
    print(json.dumps({
        "version": "ctx.loop_adapter.v1", "adapter": "loopflow",
        "permissions": request["permissions"], "iteration_seen": n,
        "mcp_server": {"name": "ctx", "command": "ctx-mcp-server", "args": ["--read-only"],
                       "tools": ["ctx__recommend_bundle"]},
        "agent_loop": {"harness_install":
                       "ctx-harness-install --dry-run -- autogen; touch " + os.path.join(evidence, "INSTALLED")},
        "capabilities": {"skills": [{"name": "python-debugging"}]},
        "warnings": [],
    }))
'''

# revise.py EVIDENCE: keeps what it was given (context file, MCP config) and fixes on the 2nd try
REVISE = r'''
import os, shutil, sys
evidence, n = sys.argv[1], os.environ["LOOP_ITERATION"]
shutil.copy(os.environ["LOOP_CONTEXT_FILE"], os.path.join(evidence, f"context-{n}.json"))
if os.environ.get("LOOP_MCP_CONFIG"):
    shutil.copy(os.environ["LOOP_MCP_CONFIG"], os.path.join(evidence, f"mcp-{n}.json"))
with open(os.path.join(evidence, "revise-calls"), "a") as f:
    f.write(n + "\n")
if n == "2":
    open("fixed.txt", "w").write("yes")
'''


@pytest.fixture
def work(tmp_path: Path) -> tuple[Path, Path]:
    proj, evidence = tmp_path / "proj", tmp_path / "evidence"
    proj.mkdir()
    evidence.mkdir()
    (proj / "adapter.py").write_text(ADAPTER)
    (proj / "revise.py").write_text(REVISE)
    return proj, evidence


def run(cli, proj: Path, evidence: Path, *extra: str, mode: str = "ok", code: int = 0):
    done = cli("run", "--name", "cart", "--goal", "the cart total includes tax",
               "--verify", "echo still broken; test -f fixed.txt",
               "--revise", f"python revise.py {evidence}",
               "--context-adapter", f"python adapter.py {evidence} {mode}",
               "--max-iter", "3", "--no-progress-k", "0", "--cwd", str(proj), *extra)
    assert done.returncode == code, done.stdout + done.stderr
    return done


def read(evidence: Path, name: str) -> dict:
    return json.loads((evidence / name).read_text())


def test_the_answer_reaches_context_json_verbatim_each_iteration(cli, work) -> None:
    proj, evidence = work
    done = run(cli, proj, evidence, "--grants", "skills,mcps")
    first, second = read(evidence, "context-1.json"), read(evidence, "context-2.json")
    payload = first["adapter"]["payload"]
    assert payload["version"] == "ctx.loop_adapter.v1" and payload["iteration_seen"] == "1"
    assert payload["capabilities"] == {"skills": [{"name": "python-debugging"}]}
    assert second["adapter"]["payload"]["iteration_seen"] == "2"  # refreshed: called again
    assert first["adapter"]["command"].startswith("python adapter.py") and first["adapter"]["error"] is None
    # the request: the loop, its checks, the last failure file, the permissions
    request = read(evidence, "request-1.json")
    req = request["request"]
    assert req["goal"] == "the cart total includes tax" and req["loop_name"] == "cart"
    assert req["done_when"][0]["command"] == "echo still broken; test -f fixed.txt"
    assert req["permissions"] == {"skills": True, "agents": False, "mcps": True, "harnesses": False}
    assert request["failure_head"] and "still broken" in (proj / ".pytest-loops").joinpath(
        *Path(req["last_failure_file"]).relative_to(proj / ".pytest-loops").parts).read_text()
    # the MCP server the adapter named, in a standard client config file
    mcp = read(evidence, "mcp-1.json")
    assert mcp == {"mcpServers": {"ctx": {"command": "ctx-mcp-server", "args": ["--read-only"]}}}
    assert first["adapter"]["mcp_config"].endswith("iter-001/mcp.json")
    # harness_install needs the harnesses grant: not suggested here, and never run
    assert "suggests" not in done.stdout and not (evidence / "INSTALLED").exists()


def test_harness_install_is_suggested_only_with_consent_and_never_run(cli, work) -> None:
    proj, evidence = work
    done = run(cli, proj, evidence, "--grants", "skills,harnesses")
    assert read(evidence, "request-1.json")["request"]["permissions"]["harnesses"] is False
    assert "harnesses withheld" in done.stdout and "suggests" not in done.stdout
    assert not (evidence / "mcp-1.json").exists()  # mcps not granted: no MCP server offered
    (proj / "fixed.txt").unlink()
    done = run(cli, proj, evidence, "--grants", "skills,harnesses", "--own-model", "on")
    assert read(evidence, "request-1.json")["request"]["permissions"]["harnesses"] is True
    suggested = [line for line in done.stdout.splitlines() if "suggests" in line]
    assert len(suggested) >= 1 and "ctx-harness-install --dry-run -- autogen" in suggested[0]
    assert "(not run" in suggested[0]
    assert not (evidence / "INSTALLED").exists()


@pytest.mark.slow
def test_grants_flag_replaces_the_loop_file_line_and_none_means_none(cli, work) -> None:
    proj, evidence = work
    (proj / "cart.loop").write_text(
        'loop "cart":\n  goal: fixed\n  done when "test -f fixed.txt" passes\n  grants: skills, agents\n'
        f'  revise with: python revise.py {evidence}\n  context adapter: "python adapter.py {evidence}"\n')
    for given, seen in ((["--grants", "mcps"], ["mcps"]), ([], ["skills", "agents"]), (["--grants", "none"], [])):
        (proj / "fixed.txt").unlink(missing_ok=True)
        done = cli("run", "cart", "--cwd", str(proj), *given)
        assert done.returncode == 0, done.stdout + done.stderr
        assert read(evidence, "request-1.json")["request"]["granted"] == seen
        assert read(evidence, "context-1.json")["grants"] == seen


def test_no_grants_anywhere_means_none(cli, work) -> None:
    proj, evidence = work
    run(cli, proj, evidence)
    request = read(evidence, "request-1.json")["request"]
    assert request["granted"] == [] and not any(request["permissions"].values())
    assert not (evidence / "mcp-1.json").exists()


def test_the_harness_own_mcp_server_is_offered_by_a_setting(cli, work) -> None:
    proj, evidence = work
    run(cli, proj, evidence, "--context-mcp", "on")
    servers = read(evidence, "mcp-1.json")["mcpServers"]
    assert list(servers) == ["pytest-loops"]  # the adapter's needs the mcps grant
    assert servers["pytest-loops"]["args"][:3] == ["-m", "pytest_loops", "mcp"]
    assert servers["pytest-loops"]["command"] == sys.executable or servers["pytest-loops"]["command"]


@pytest.mark.parametrize(("mode", "said"), [
    ("badjson", "answer is not JSON"),
    ("exit3", "exit 3: the graph is missing"),
    ("list", "not an object"),
    ("noversion", 'no "version" string'),
    ("sleep", "no answer within 0.5s"),
])
def test_a_bad_answer_fails_closed(cli, work, mode: str, said: str) -> None:
    proj, evidence = work
    done = run(cli, proj, evidence, "--context-adapter-timeout", "0.5", mode=mode)
    lines = [line for line in done.stdout.splitlines() if "context adapter" in line]
    assert lines and said in lines[0] and "ran without it" in lines[0], done.stdout
    context = read(evidence, "context-1.json")
    assert context["adapter"]["payload"] is None and said in context["adapter"]["error"]
    assert (evidence / "revise-calls").read_text().split() == ["1", "2"]  # the loop went on


@pytest.mark.parametrize("mode", ["badjson", "exit3"])
def test_a_bad_answer_stops_the_run_by_a_setting(cli, work, mode: str) -> None:
    proj, evidence = work
    done = run(cli, proj, evidence, "--context-adapter-failure", "stop", mode=mode, code=64)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "pytest-loops: error:" in errors[0] and "context adapter" in errors[0]
    assert not (evidence / "revise-calls").exists()


def test_a_loop_file_adapter_under_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project = Project(pytester, monkeypatch)
    evidence = pytester.path / "evidence"
    evidence.mkdir()
    project.write("adapter.py", ADAPTER)
    project.write("revise.py", REVISE)
    project.write("cart.loop", 'loop "cart":\n  goal: fixed\n  done when "test -f fixed.txt" passes\n'
                  f'  grants: skills\n  revise with: python revise.py {evidence}\n'
                  f'  context adapter: "python adapter.py {evidence}"\n  after 3 tries: stop\n')
    result = project.run("--loop", "--loop-grants=skills,mcps", "cart.loop")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    context = json.loads((evidence / "context-1.json").read_text())
    assert context["adapter"]["payload"]["version"] == "ctx.loop_adapter.v1"
    assert context["grants"] == ["skills", "mcps"]
    assert json.loads((evidence / "mcp-1.json").read_text())["mcpServers"]["ctx"]["command"] == "ctx-mcp-server"


def test_a_bad_grant_on_the_command_line_is_bad_input(cli, tmp_path: Path) -> None:
    done = cli("run", "--verify", "true", "--grants", "skills,tools", "--cwd", str(tmp_path))
    assert done.returncode == 64
    assert done.stderr.strip() == ("pytest-loops: error: --grants / --loop-grants: 'tools' is not a grant; "
                                   "grant only skills, agents, mcps, harnesses (or none)")


# -- units ---------------------------------------------------------------------------

def test_parse_grants() -> None:
    assert parse_grants("skills, mcps,skills", "--grants") == ("skills", "mcps")
    assert parse_grants("none", "--grants") == ()
    with pytest.raises(LoopUsageError, match="'x' is not a grant"):
        parse_grants("skills,x", "--grants")
    with pytest.raises(LoopUsageError, match="no grant given"):
        parse_grants(" , ", "--grants")


def test_granted_withholds_harnesses_without_consent() -> None:
    assert ctxadapter.granted(("skills", "harnesses"), own_model=True) == (["skills", "harnesses"], [])
    passed, notes = ctxadapter.granted(("skills", "harnesses"), own_model=False)
    assert passed == ["skills"] and "harnesses withheld" in notes[0]


def test_mcp_servers_fail_closed() -> None:
    options = ctxadapter.AdapterOptions()
    assert ctxadapter.mcp_servers({"mcp_server": {"name": "ctx", "command": None}}, ["mcps"], options) == ({}, [])
    servers, notes = ctxadapter.mcp_servers({"mcp_server": {"command": "x", "args": [1]}}, ["mcps"], options)
    assert servers == {} and "must be strings" in notes[0]
    servers, notes = ctxadapter.mcp_servers({"mcp_server": {"command": "x"}}, [], options)
    assert servers == {} and "does not grant mcps" in notes[0]
    assert ctxadapter.mcp_servers({"mcp_server": {"command": "x"}}, ["mcps"], options)[0] == {
        "ctx": {"command": "x", "args": []}}


def test_call_rejects_nan_and_oversized_answers(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    with pytest.raises(ctxadapter.AdapterFailed, match="not JSON"):
        ctxadapter.call("echo '{\"version\": NaN}'", {}, cwd=tmp_path, env=env, timeout=30)
    with pytest.raises(ctxadapter.AdapterFailed, match="over the cap"):
        ctxadapter.call(f"head -c {ctxadapter.ANSWER_CAP + 10} /dev/zero", {}, cwd=tmp_path, env=env, timeout=30)
    with pytest.raises(ctxadapter.AdapterFailed, match="exit 127"):
        ctxadapter.call("no-such-adapter-x", {}, cwd=tmp_path, env=env, timeout=30)
    assert ctxadapter.call("cat >/dev/null; echo '{\"version\": \"v9\", \"x\": [1]}'", {"a": 1}, cwd=tmp_path,
                           env=env, timeout=30) == {"version": "v9", "x": [1]}


def test_the_request_leaves_hidden_checks_out(tmp_path: Path) -> None:
    spec = LoopSpec(name="x", goal="g", checks=(Check.command_passes("make test"),
                                                Check.command_passes("secret-check", hidden=True)),
                    look_at=("src/a.py",), cwd=str(tmp_path))
    request = ctxadapter.build_request(spec, iteration=2, failure_file=tmp_path / "f.txt", permissions=["skills"],
                                       own_model=False)
    assert [c["command"] for c in request["done_when"]] == ["make test"]
    assert request["look_at"] == ["src/a.py"] and request["loop_file"] is None and request["iteration"] == 2
    assert "secret-check" not in json.dumps(request)


def test_the_adapter_in_loop_files_and_yaml(tmp_path: Path) -> None:
    from pytest_loops.errors import LoopFileError
    from pytest_loops.sources import load_any

    (tmp_path / "a.loop").write_text('loop "a":\n  goal: g\n  done when "true" passes\n'
                                     '  context adapter: "python -m ctx.adapters.loopflow --top-k 2"\n')
    (spec,) = load_any(tmp_path / "a.loop").loops
    assert spec.context_adapter == "python -m ctx.adapters.loopflow --top-k 2"
    assert spec.origin["context_adapter"].endswith("a.loop:4")
    (tmp_path / "b.loop.yaml").write_text("loops:\n  - name: b\n    goal: g\n    checks: ['true']\n"
                                          "    context_adapter: ./ctx.sh\n")
    (spec,) = load_any(tmp_path / "b.loop.yaml").loops
    assert spec.context_adapter == "./ctx.sh"
    (tmp_path / "c.loop").write_text('loop "c":\n  goal: g\n  done when "true" passes\n  context adapter:\n')
    with pytest.raises(LoopFileError, match=r"c\.loop:4.*`context adapter:` has no command"):
        load_any(tmp_path / "c.loop")

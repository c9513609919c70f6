"""`pytest-loops mcp`: the read-only MCP server, driven by the mcp client over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.cli.main import main
from pytest_loops.cli.mcpserver import TOOL_NAMES

mcp = pytest.importorskip("mcp", reason="the optional mcp extra is not installed")
anyio = pytest.importorskip("anyio")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from test_compare_runsdir import CHECKS, REVISE_FIXING, tree_digest  # noqa: E402


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    base = tmp_path_factory.mktemp("mcp")
    arts = base / ".pytest-loops"
    for name, revise, cap in (("fixed", REVISE_FIXING, 5), ("stuck", "true", 2)):
        (base / name).mkdir()
        done = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--name", "fix", *CHECKS, "--revise",
                               revise, "--max-iter", str(cap), "--no-progress-k", "0", "--artifacts", str(arts), "-q"],
                              cwd=base / name, capture_output=True, text=True, timeout=120)
        assert done.returncode in (0, 2), done.stderr
    return arts


def session_calls(runs_dir: Path, calls, *extra_args: str, env: dict[str, str] | None = None):
    """Start the server over stdio, run ``calls(session)`` in the client, return its result."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "pytest_loops", "mcp", "--runs-dir", str(runs_dir), *extra_args],
                                   env={**os.environ, **(env or {})})

    async def go():
        with open(runs_dir.parent / "server.err", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await calls(session)

    return anyio.run(go)


def structured(result):
    assert not result.is_error, result.content
    return result.structured_content


def test_the_server_reports_the_package_version(artifacts):
    import pytest_loops

    params = StdioServerParameters(command=sys.executable, args=["-m", "pytest_loops", "mcp", "--runs-dir",
                                                                 str(artifacts)], env=dict(os.environ))

    async def go():
        with open(artifacts.parent / "server.err", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    return await session.initialize()

    info = anyio.run(go).server_info
    assert info.name == "pytest-loops"
    assert info.version == pytest_loops.__version__ and info.version not in ("", "unknown")


def test_the_server_offers_exactly_the_read_only_tools(artifacts):
    async def calls(session):
        return (await session.list_tools()).tools

    tools = session_calls(artifacts, calls)
    assert sorted(t.name for t in tools) == sorted(TOOL_NAMES)
    for tool in tools:
        assert tool.annotations.read_only_hint is True, tool.name
        assert tool.annotations.destructive_hint is False, tool.name


def test_tools_answer_from_the_runs_and_change_nothing(artifacts):
    before = tree_digest(artifacts)

    async def calls(session):
        listing = structured(await session.call_tool("list_runs", {}))
        stuck, fixed = (run["id"] for run in listing["runs"])
        return {
            "listing": listing,
            "show": structured(await session.call_tool("show_run", {"run": fixed})),
            "trajectory": structured(await session.call_tool("show_trajectory", {"run": stuck})),
            "compare": structured(await session.call_tool("compare_runs", {"a": fixed, "b": stuck})),
            "verify": structured(await session.call_tool("verify_run", {"run": fixed})),
            "lessons": structured(await session.call_tool("show_lessons", {})),
        }

    got = session_calls(artifacts, calls)
    assert [r["verdict"] for r in got["listing"]["runs"]] == ["MAX_ITER", "SUCCESS"]
    assert got["show"]["verdict"] == "SUCCESS" and "verdict: SUCCESS (exit 0)" in got["show"]["text"]
    assert [row["iteration"] for row in got["trajectory"]["trajectory"]] == [1, 2]
    assert got["compare"]["first_divergence"]["iteration"] == 2
    assert got["compare"]["a"]["best"] == {"iteration": 3, "passed": 2, "of": 2}
    assert got["verify"]["ok"] is True and got["verify"]["tine"]["ok"] is True
    assert got["lessons"]["pages"][0]["loop"] == "fix"
    assert tree_digest(artifacts) == before


@pytest.mark.parametrize("arguments, says", [
    ({"run": "../../../etc/passwd"}, "'..' is refused"),
    ({"run": "/etc/passwd"}, "absolute paths are refused"),
    ({"run": "nope"}, "no such run"),
])
def test_a_reference_outside_the_directory_is_an_error_answer(artifacts, arguments, says):
    async def calls(session):
        return await session.call_tool("show_run", arguments)

    result = session_calls(artifacts, calls)
    assert result.is_error
    (content,) = result.content
    assert says in content.text and "\n" not in content.text.strip()


@pytest.mark.slow
def test_a_signature_is_checked_when_the_server_has_the_key(tmp_path):
    key = "k" * 32
    work, arts = tmp_path / "w", tmp_path / ".pytest-loops"
    work.mkdir()
    env = {"LOOP_KEY": key}
    done = subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--name", "signed", "--verify", "true",
                           "--revise", "true", "--artifacts", str(arts), "--sign-key-env", "LOOP_KEY", "-q"],
                          cwd=work, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    run_id = next((arts / "runs").glob("*.tine")).stem

    async def calls(session):
        return structured(await session.call_tool("verify_run", {"run": run_id}))

    good = session_calls(arts, calls, "--key-env", "LOOP_KEY", env=env)
    assert good["ok"] is True and good["tine"]["signature_checked"] is True
    bad = session_calls(arts, calls, "--key-env", "LOOP_KEY", env={"LOOP_KEY": "x" * 32})
    assert bad["ok"] is False and bad["tine"]["ok"] is False


def test_bad_server_arguments_are_one_line_and_exit_64(tmp_path, capsys, monkeypatch):
    assert main(["mcp", "--runs-dir", str(tmp_path / "nope")]) == 64
    assert "not a directory" in capsys.readouterr().err
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert main(["mcp", "--runs-dir", str(tmp_path), "--key-env", "NO_SUCH_KEY_VAR"]) == 64
    err = capsys.readouterr().err
    assert "--key-env NO_SUCH_KEY_VAR" in err and len(err.strip().splitlines()) == 1


def test_without_the_mcp_package_the_command_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)  # import fails as if not installed
    assert main(["mcp", "--runs-dir", str(tmp_path)]) == 64
    err = capsys.readouterr().err
    assert "pip install 'pytest-loops[mcp]'" in err and len(err.strip().splitlines()) == 1


def test_the_server_reads_nothing_from_stdin_but_the_protocol(artifacts):
    # garbage on stdin: the server answers with protocol errors or ends; it never
    # executes anything, and it ends when stdin closes
    done = subprocess.run([sys.executable, "-m", "pytest_loops", "mcp", "--runs-dir", str(artifacts)],
                          input="rm -rf /\n{\"jsonrpc\": \"2.0\"}\n", capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1)
    for line in done.stdout.splitlines():
        json.loads(line)  # stdout carries only JSON-RPC messages

"""`pytest-loops mcp`: an MCP server over one directory's run artifacts, on stdio.

Six read-only tools (list_runs, show_run, show_trajectory, compare_runs,
verify_run, show_lessons) answer from :class:`~pytest_loops.cli.runsdir.RunsDir`.
No tool writes a file or starts a process: nothing can start or change a loop
through this server. Needs the optional ``mcp`` package
(``pip install 'pytest-loops[mcp]'``), imported only here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pytest_loops.cli.runsdir import RunsDir
from pytest_loops.errors import LoopUsageError

SERVER_NAME = "pytest-loops"
INSTRUCTIONS = (
    "Read-only access to pytest-loops runs: verdicts, per-iteration check results, comparisons, "
    "integrity checks and the lessons pages. Start with list_runs; pass its ids to the other tools."
)
TOOL_NAMES = ("list_runs", "show_run", "show_trajectory", "compare_runs", "verify_run", "show_lessons")


def _mcp() -> Any:
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp_types import ToolAnnotations
    except ImportError:
        raise LoopUsageError("the MCP server needs the optional mcp package (2.x)", location="pytest-loops mcp",
                             fix="pip install 'pytest-loops[mcp]'") from None
    return MCPServer, ToolError, ToolAnnotations


def package_version() -> str:
    """The installed pytest-loops version, as the server reports it to its clients."""
    import pytest_loops

    return str(pytest_loops.__version__)


def build_server(runs: RunsDir) -> Any:
    """The MCP server with its six tools bound to ``runs``."""
    mcp_server, tool_error, annotations = _mcp()
    server = mcp_server(SERVER_NAME, instructions=INSTRUCTIONS, log_level="WARNING", version=package_version())
    read_only = annotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)

    def answer(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except LoopUsageError as exc:  # bad input: one line back to the client
            raise tool_error(str(exc)) from None
        except OSError as exc:
            raise tool_error(f"cannot read: {exc.strerror or exc}") from None

    @server.tool(annotations=read_only)
    def list_runs(limit: int = 50) -> dict[str, Any]:
        """The runs in the directory, newest first: id, loop, verdict, exit code, iterations, files."""
        return answer(lambda: runs.list_runs(limit))

    @server.tool(annotations=read_only)
    def show_run(run: str) -> dict[str, Any]:
        """One run's verdict, reason, trust, iteration table and, with fan-out, each iteration's
        revise candidates (which branch, what it changed, why chosen or discarded). `run` is an id
        from list_runs."""
        return answer(lambda: runs.show_run(run))

    @server.tool(annotations=read_only)
    def show_trajectory(run: str, start: int = 1, limit: int = 100) -> dict[str, Any]:
        """Per iteration from `start`: each check's result, state change, streak, revise exit, guard,
        and its revise candidates with fan-out (branch, changes, checks, chosen or why not)."""
        return answer(lambda: runs.show_trajectory(run, start, limit))

    @server.tool(annotations=read_only)
    def compare_runs(a: str, b: str) -> dict[str, Any]:
        """Two runs side by side: per-iteration check results, first divergence, best, how each ended."""
        return answer(lambda: runs.compare_runs(a, b))

    @server.tool(annotations=read_only)
    def verify_run(run: str) -> dict[str, Any]:
        """Whether a run's log MACs hold and its .tine is intact and authenticated (signed with the
        server's key when it has one, else vouched by this machine's key)."""
        return answer(lambda: runs.verify_run(run))

    @server.tool(annotations=read_only)
    def show_lessons(page: str | None = None) -> dict[str, Any]:
        """The lessons pages (no argument), or one page's text (`page` is an id from the list)."""
        return answer(lambda: runs.show_lessons(page))

    return server


def serve(runs_dir: str | os.PathLike, *, key_env: str | None = None, pubkey: str | None = None) -> int:
    """Serve ``runs_dir`` on stdin/stdout until the client closes the stream."""
    if key_env is not None and not os.environ.get(key_env):
        raise LoopUsageError("is not set or empty", location=f"--key-env {key_env}",
                             fix="export the HMAC key in that variable, or leave --key-env out")
    if pubkey is not None and not os.path.isfile(pubkey):
        raise LoopUsageError("no such file", location=f"--pubkey {pubkey}", fix="pass an Ed25519 public key file")
    runs = RunsDir(runs_dir, key_env=key_env, pubkey=pubkey)
    build_server(runs).run("stdio")
    return 0

"""The context adapter: LoopFlow's ctx contract, run before each revise step.

A loop (or the session) names a command (``context_adapter``). Before every
revise step the harness runs it in the loop's working directory with a request
on stdin (JSON: the goal, the loop's name and file, what it looks at, its checks,
the last failure file and the granted permissions) and reads one JSON object from
its stdout. The answer is kept verbatim, whatever its ``version``
(``ctx.loop_adapter.v1`` included), under ``adapter`` in the context file
(:mod:`pytest_loops.core.contextfile`); the harness reads only two things from it:

- ``mcp_server`` (``{"name", "command", "args"}``): when it names a command and
  the loop grants ``mcps``, the server goes into a standard MCP client config file
  (``{"mcpServers": {...}}``) whose path the revise step gets as ``LOOP_MCP_CONFIG``;
- ``agent_loop.harness_install``: printed as a suggested command, never run.

Fail closed: an answer that is not one JSON object with a string ``version``, a
non-zero exit, a command that cannot start or outlives its timeout is one line,
and the revise step runs without the adapter (or, by the ``context_adapter_failure``
setting, the run stops as bad input). ``harnesses`` is passed on only with the
user's own-model consent (``own_model``); no grant anywhere means none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.spec import LoopSpec

REQUEST_SCHEMA = "pytest-loops.ctx-request/1"
ANSWER_CAP = 64 * 1024  # bytes of the adapter's answer
STDERR_CHARS = 300
MCP_CONFIG_NAME = "mcp.json"
HARNESS_SERVER = "pytest-loops"  # the name the harness's own MCP server gets in the config file


class AdapterFailed(Exception):
    """A bad answer (one line, the message)."""


@dataclass
class AdapterOptions:
    """The session's settings for the adapter (the loop's command is ``spec.context_adapter``)."""

    on_failure: str = "skip"  # skip | stop
    timeout: float = 60.0
    own_model: bool = False
    offer_harness_mcp: bool = False
    runs_dir: str | None = None  # what the harness's own MCP server serves


@dataclass
class AdapterAnswer:
    """What one call gave: the payload (None after a bad answer) and what follows from it."""

    command: str
    payload: dict[str, Any] | None = None
    error: str | None = None  # the one line of a bad answer
    notes: list[str] = field(default_factory=list)  # e.g. harnesses withheld, an MCP server not granted
    mcp_config: Path | None = None
    harness_install: str | None = None

    def section(self) -> dict[str, Any]:
        """The context file's ``adapter`` key."""
        return {"command": self.command, "payload": self.payload, "error": self.error,
                "mcp_config": str(self.mcp_config) if self.mcp_config else None}


def adapter_options(values: Mapping[str, Any], runs_dir: str | os.PathLike[str] | None) -> AdapterOptions:
    """The options from resolved settings values (a missing one: its default)."""
    timeout = values.get("context_adapter_timeout")
    return AdapterOptions(on_failure=values.get("context_adapter_failure") or "skip",
                          timeout=float(timeout) if timeout else 60.0,
                          own_model=bool(values.get("own_model")),
                          offer_harness_mcp=bool(values.get("context_mcp")),
                          runs_dir=os.fspath(runs_dir) if runs_dir else None)


def granted(grants: Sequence[str], own_model: bool) -> tuple[list[str], list[str]]:
    """The permissions passed on, and a note for each one withheld."""
    passed, notes = [], []
    for name in grants:
        if name == "harnesses" and not own_model:
            notes.append("harnesses withheld: the loop runs on a model the user has not declared their own "
                         "(--own-model on, --loop-own-model=on)")
            continue
        passed.append(name)
    return passed, notes


def build_request(spec: LoopSpec, *, iteration: int, failure_file: Path, permissions: Sequence[str],
                  own_model: bool) -> dict[str, Any]:
    """The request on the adapter's stdin (hidden checks are not in it)."""
    source = spec.source or ""
    path = source.rsplit(":", 1)[0] if ":" in source else source
    loop_file = path if path and os.path.isfile(os.path.join(spec.cwd, path)) else None
    checks = []
    for check in spec.checks:
        if check.hidden:
            continue
        entry: dict[str, Any] = {"name": check.name, "kind": check.kind.value}
        if check.command:
            entry["command"] = check.command
        if check.node_id:
            entry["node_id"] = check.node_id
        checks.append(entry)
    return {
        "schema": REQUEST_SCHEMA,
        "goal": spec.goal,
        "loop_name": spec.name,
        "loop_file": loop_file and os.path.join(spec.cwd, loop_file),
        "look_at": list(spec.look_at),
        "done_when": checks,
        "last_failure_file": str(failure_file),
        "permissions": {name: name in permissions for name in ("skills", "agents", "mcps", "harnesses")},
        "granted": list(permissions),
        "own_llm": own_model,
        "iteration": iteration,
        "cwd": spec.cwd,
    }


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


def call(command: str, request: Mapping[str, Any], *, cwd: str | os.PathLike[str], env: Mapping[str, str],
         timeout: float) -> dict[str, Any]:
    """Run the adapter once; its answer (a JSON object with a string ``version``) or AdapterFailed."""
    data = json.dumps(request, ensure_ascii=False).encode()
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=os.fspath(cwd), env=dict(env),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # its whole tree is killed on a timeout
    except OSError as exc:
        raise AdapterFailed(f"could not start: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(data, timeout=max(0.01, timeout))
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.communicate()
        raise AdapterFailed(f"no answer within {timeout:g}s (killed)") from None
    finally:
        if proc.poll() is None:
            _kill(proc)
    said = " ".join(err.decode("utf-8", "replace").split())[-STDERR_CHARS:]
    if proc.returncode != 0:
        raise AdapterFailed(f"exit {proc.returncode}" + (f": {said}" if said else ""))
    if len(out) > ANSWER_CAP:
        raise AdapterFailed(f"answer of {len(out)} bytes, over the cap of {ANSWER_CAP}")
    try:
        answer = json.loads(out.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AdapterFailed(f"answer is not JSON ({str(exc)[:120]})") from None
    if not isinstance(answer, dict):
        raise AdapterFailed(f"answer is a JSON {type(answer).__name__}, not an object")
    version = answer.get("version")
    if not isinstance(version, str) or not version.strip():
        raise AdapterFailed("answer has no \"version\" string (e.g. \"ctx.loop_adapter.v1\")")
    return answer


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def mcp_servers(payload: Mapping[str, Any] | None, grants: Sequence[str],
                options: AdapterOptions) -> tuple[dict[str, Any], list[str]]:
    """The ``mcpServers`` entries for the revise step, and a note for an MCP server not offered."""
    servers: dict[str, Any] = {}
    notes: list[str] = []
    server = (payload or {}).get("mcp_server")
    if isinstance(server, Mapping) and server.get("command"):
        command, args = server.get("command"), server.get("args") or []
        name = server.get("name") or "ctx"
        if not isinstance(command, str) or not isinstance(name, str) or not isinstance(args, list) \
                or not all(isinstance(a, str) for a in args):
            notes.append("mcp_server not offered: command, name and args must be strings")
        elif "mcps" not in grants:
            notes.append(f"mcp_server {name!r} not offered: the loop does not grant mcps")
        else:
            servers[name] = {"command": command, "args": list(args)}
    if options.offer_harness_mcp:
        args = ["-m", "pytest_loops", "mcp"] + (["--runs-dir", options.runs_dir] if options.runs_dir else [])
        servers.setdefault(HARNESS_SERVER, {"command": sys.executable, "args": args})
    return servers, notes


def harness_install(payload: Mapping[str, Any] | None, grants: Sequence[str]) -> str | None:
    """``agent_loop.harness_install``, when harnesses are granted: a command to suggest, never run."""
    loop = (payload or {}).get("agent_loop")
    command = loop.get("harness_install") if isinstance(loop, Mapping) else None
    if isinstance(command, str) and command.strip() and "harnesses" in grants:
        return " ".join(command.split())[:500]
    return None

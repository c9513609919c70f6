"""The revise step of a preset: its command, its session continued, its usage recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from pytest_loops.agents.registry import find_agent
from pytest_loops.core.usage import USAGE_VARIABLE, write_usage
from pytest_loops.results import CommandResult
from pytest_loops.spec import LoopSpec

if TYPE_CHECKING:
    from pytest_loops.core.context import LoopContext

hookimpl = pluggy.HookimplMarker("pytest")
PLUGIN_NAME = "loop-agent-presets"
MAX_OUTPUT_READ = 8 << 20  # an agent's JSON report is at the end: read at most this much of its output


class AgentRevise:
    """``pytest_loop_revise`` for a revise setting that names a preset; None for any other,
    which the built-in (``trylast``) runs as a shell command. A conftest's hook
    (registered later) still answers first."""

    @hookimpl
    def pytest_loop_revise(self, spec: LoopSpec, iteration: int, context: LoopContext) -> CommandResult | None:
        agent = find_agent(spec.revise)
        if agent is None:
            return None
        session = previous_session(context)
        env = {
            "LOOP_FAILURE_FILE": str(context.failure_file),
            "LOOP_PROMPT_FILE": str(context.prompt_file),
            "LOOP_CONTEXT_FILE": str(context.context_file),
            "LOOP_AGENT": agent.name,
        }
        if context.usage_file is not None:
            env[USAGE_VARIABLE] = str(context.usage_file)
        result = context.run_command(agent.command(session), label="revise", extra_env=env, revise=True)
        usage = agent.usage(_output(result))
        if usage is not None and context.usage_file is not None:
            try:
                write_usage(context.usage_file, usage)
            except OSError as exc:
                if context.artifact_error is not None:
                    context.artifact_error(str(context.usage_file), exc)
        return result

    @hookimpl
    def pytest_loop_revise_line(self, spec: LoopSpec, line: str) -> str | None:
        agent = find_agent(spec.revise)
        if agent is None:
            return None
        return agent.progress(line) or ""


def previous_session(context: LoopContext) -> str | None:
    """The session the previous iteration's agent reported: continued, except by a fan-out
    candidate (each starts its own: candidates run at once)."""
    if context.branch is not None or context.previous is None:
        return None
    session = getattr(context.previous, "session_id", None)
    return session if isinstance(session, str) and session else None


def _output(result: Any) -> str:
    path = getattr(result, "output_file", None)
    if path:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - MAX_OUTPUT_READ))
                return f.read().decode("utf-8", "replace")
        except OSError:
            pass
    return getattr(result, "tail", "") or ""


def register_agents(pm: pluggy.PluginManager) -> pluggy.PluginManager:
    """Register the presets' revise hook on ``pm`` (once); returns ``pm``."""
    if pm.get_plugin(PLUGIN_NAME) is None and not pm.is_blocked(PLUGIN_NAME):
        pm.register(AgentRevise(), name=PLUGIN_NAME)
    return pm

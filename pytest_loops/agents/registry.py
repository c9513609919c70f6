"""Which presets there are: the built-in ones, then the ``pytest_loops.agents`` entry points."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from pytest_loops.agents.base import Agent
from pytest_loops.agents.presets import BUILTIN
from pytest_loops.errors import LoopUsageError

ENTRY_POINT_GROUP = "pytest_loops.agents"

_loaded: dict[str, Agent | str] | None = None  # name -> preset, or why its entry point cannot load


def _load() -> dict[str, Agent | str]:
    global _loaded
    if _loaded is None:
        found: dict[str, Agent | str] = {agent.name: agent for agent in BUILTIN}
        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                found[point.name] = _agent_of(point.load(), point.name)
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported when chosen, never at import
                found[point.name] = f"its entry point {point.value!r} cannot be loaded: {type(exc).__name__}: {exc}"
        _loaded = found
    return _loaded


def _agent_of(obj: Any, name: str) -> Agent:
    agent = obj() if isinstance(obj, type) else obj
    if not callable(getattr(agent, "command", None)):
        raise TypeError(f"{obj!r} has no command(session) method")
    agent.name = name  # the entry point's name is what --revise selects
    if not getattr(agent, "program", None):
        agent.program = name
    return agent


def reload() -> None:
    """Forget the entry points read (tests install and remove presets)."""
    global _loaded
    _loaded = None


def presets() -> dict[str, Agent]:
    """Every preset that loads, by name."""
    return {name: agent for name, agent in _load().items() if not isinstance(agent, str)}


def find_agent(revise: str | None) -> Agent | None:
    """The preset a revise setting names, or None when it is a shell command.

    Only a bare name selects one: a path (``./claude``, ``bin/claude``) or a command
    line with arguments is always the command itself. A preset whose entry point
    cannot be loaded is bad input (LoopUsageError), not a silent shell command."""
    if not revise:
        return None
    name = revise.strip()
    if not name or "/" in name or any(c.isspace() for c in name):
        return None
    agent = _load().get(name)
    if isinstance(agent, str):
        raise LoopUsageError(f"the agent preset {name!r} cannot be used: {agent}", location="revise",
                             fix="reinstall the package that provides it, or give a shell command")
    return agent


def program_to_check(revise: str | None) -> str | None:
    """What the pre-flight check looks up: a preset's program, else the command itself."""
    agent = find_agent(revise)
    return agent.program if agent is not None else revise

"""Agent CLIs as presets of the revise step: ``--revise claude``, ``codex``, ``aider``, ``gemini``.

A revise setting that is exactly a preset's name (no path, no arguments) runs that
agent: its command line, the continued session, its cost and tokens written to
``LOOP_USAGE_FILE``. Anything else is a shell command, so ``./claude`` or
``/usr/local/bin/claude`` (a path) and ``claude -p ...`` (a command line) stay
what they say. More presets come from installed packages, under the entry-point
group ``pytest_loops.agents`` (an :class:`Agent` object or class; an entry point
named like a built-in replaces it). See docs/agents.md.
"""

from __future__ import annotations

from pytest_loops.agents.base import Agent
from pytest_loops.agents.registry import ENTRY_POINT_GROUP, find_agent, presets, program_to_check
from pytest_loops.agents.revise import AgentRevise, register_agents

__all__ = ["ENTRY_POINT_GROUP", "Agent", "AgentRevise", "find_agent", "presets", "program_to_check",
           "register_agents"]

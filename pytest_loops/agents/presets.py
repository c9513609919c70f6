"""The built-in presets: Claude Code, Codex CLI, Aider, Gemini CLI.

Each follows its CLI's documented non-interactive interface (see ``docs`` on each
and docs/agents.md); the tests drive each with a stand-in executable that
implements that interface, never the real CLI.
"""

from __future__ import annotations

import re
from typing import Any

from pytest_loops.agents.base import PROMPT_ARG, Agent, checked, count, first_line, json_lines, quoted, whole_json
from pytest_loops.core.usage import Usage


class ClaudeCode(Agent):
    """``claude -p PROMPT --output-format stream-json --verbose``; ``--resume ID`` continues.

    The last event (``type: result``) carries ``session_id``, ``total_cost_usd`` and
    ``usage`` (``input_tokens``, ``cache_creation_input_tokens``,
    ``cache_read_input_tokens``, ``output_tokens``); ``--output-format json`` prints
    that same object alone."""

    name = "claude"
    program = "claude"
    docs = "https://docs.claude.com/en/docs/claude-code/sdk/sdk-headless"
    transcript = "its stream-json events in the iteration's revise.out; Claude Code's own under ~/.claude/projects/"

    def command(self, session: str | None) -> str:
        resume = f" --resume {quoted(session)}" if session else ""
        return (f"{self.program} -p {PROMPT_ARG} --output-format stream-json --verbose "
                f"--permission-mode acceptEdits{resume}")

    def usage(self, output: str) -> Usage | None:
        result = None
        for event in json_lines(output):
            if event.get("type") == "result":
                result = event
        if result is None:
            whole = whole_json(output)
            result = whole if whole is not None and whole.get("type") == "result" else None
        if result is None:
            return None
        used: dict[str, Any] = result["usage"] if isinstance(result.get("usage"), dict) else {}
        parts = [count(used.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
                                              "cache_read_input_tokens")]
        found = [p for p in parts if p is not None]
        return checked({"cost_usd": result.get("total_cost_usd"),
                        "input_tokens": sum(found) if found else None,
                        "output_tokens": count(used.get("output_tokens")),
                        "session_id": result.get("session_id")})

    def progress(self, line: str) -> str | None:
        event = next(json_lines(line), None)
        if event is None:
            return super().progress(line)
        kind = event.get("type")
        if kind == "assistant":
            message: dict[str, Any] = event["message"] if isinstance(event.get("message"), dict) else {}
            for part in message.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "tool_use":
                    return f"tool: {part.get('name', '?')}"
                if part.get("type") == "text":
                    return first_line(part.get("text"))
        if kind == "result":
            return f"done after {event.get('num_turns', '?')} turn(s)"
        return None


class CodexCLI(Agent):
    """``codex exec --json --full-auto PROMPT``; ``codex exec --json --full-auto resume ID PROMPT``
    continues. JSONL events: ``thread.started`` (``thread_id``: the session),
    ``turn.completed`` (``usage``: ``input_tokens``, ``cached_input_tokens``,
    ``output_tokens``). Codex reports tokens, not money."""

    name = "codex"
    program = "codex"
    docs = "https://github.com/openai/codex/pull/4525 (exec --json events; codex exec resume)"
    transcript = "its JSONL events in the iteration's revise.out; Codex's own rollout under ~/.codex/sessions/"

    def command(self, session: str | None) -> str:
        resume = f" resume {quoted(session)}" if session else ""
        return f"{self.program} exec --json --full-auto{resume} {PROMPT_ARG}"

    def usage(self, output: str) -> Usage | None:
        session, tokens_in, tokens_out = None, None, None
        for event in json_lines(output):
            kind = event.get("type")
            if kind == "thread.started" and isinstance(event.get("thread_id"), str):
                session = event["thread_id"]
            elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
                used = event["usage"]
                got_in, got_out = count(used.get("input_tokens")), count(used.get("output_tokens"))
                if got_in is not None:  # cached input is a part of input_tokens, not beside it
                    tokens_in = (tokens_in or 0) + got_in
                if got_out is not None:
                    tokens_out = (tokens_out or 0) + got_out
        return checked({"input_tokens": tokens_in, "output_tokens": tokens_out, "session_id": session})

    def progress(self, line: str) -> str | None:
        event = next(json_lines(line), None)
        if event is None:
            return super().progress(line)
        item = event.get("item") if isinstance(event.get("item"), dict) else None
        if event.get("type") == "item.completed" and item is not None:
            kind = item.get("type") or item.get("item_type")
            if kind == "command_execution":
                return f"$ {first_line(item.get('command')) or '?'}"
            if kind == "file_change":
                return "file change"
            return first_line(item.get("text"))
        if event.get("type") == "turn.completed":
            return "turn completed"
        return None


_TOKENS = re.compile(r"Tokens:\s*([\d.]+)\s*([kKmM]?)\s*sent,(?:.*?,)?\s*([\d.]+)\s*([kKmM]?)\s*received")
_COST = re.compile(r"Cost:\s*\$\s*([\d.]+)\s*message")
_SCALE = {"": 1, "k": 1000, "m": 1000000}


def _scaled(number: str, suffix: str) -> int | None:
    try:
        return int(round(float(number) * _SCALE[suffix.lower()]))
    except ValueError:
        return None


class Aider(Agent):
    """``aider --message-file PROMPT_FILE --yes-always`` does the one thing and exits; the
    chat history file (``--chat-history-file``) is its session, restored with
    ``--restore-chat-history`` from the second iteration on. Aider has no JSON
    output: its report line ``Tokens: 2.3k sent, 120 received. Cost: $0.01 message,
    $0.05 session.`` is read, one per message."""

    name = "aider"
    program = "aider"
    docs = "https://aider.chat/docs/scripting.html"
    history = ".aider.chat.history.md"
    transcript = f"its chat history, {history} in the working tree (its session)"

    def command(self, session: str | None) -> str:
        restore = " --restore-chat-history" if session else ""
        return (f'{self.program} --message-file "$LOOP_PROMPT_FILE" --yes-always --no-pretty --no-stream '
                f"--no-auto-commits --chat-history-file {quoted(self.history)}{restore}")

    def usage(self, output: str) -> Usage | None:
        sent = received = None
        cost = None
        for line in output.splitlines():
            m = _TOKENS.search(line)
            if m:
                a, b = _scaled(m.group(1), m.group(2)), _scaled(m.group(3), m.group(4))
                sent = (sent or 0) + (a or 0)
                received = (received or 0) + (b or 0)
            c = _COST.search(line)
            if c:
                try:
                    cost = round((cost or 0.0) + float(c.group(1)), 6)
                except ValueError:
                    pass
        if sent is None and cost is None:
            return None
        return checked({"cost_usd": cost, "input_tokens": sent, "output_tokens": received,
                        "session_id": self.history})

    def progress(self, line: str) -> str | None:
        return first_line(line)


class GeminiCLI(Agent):
    """``gemini -p PROMPT --output-format stream-json --approval-mode auto_edit``;
    ``--resume ID`` continues. The ``init`` event carries the session id, the
    ``result`` event the statistics (per model: ``tokens.prompt``,
    ``tokens.candidates``); ``--output-format json`` prints ``{response, stats}``.
    Gemini CLI reports tokens, not money."""

    name = "gemini"
    program = "gemini"
    docs = "https://geminicli.com/docs/cli/headless/"
    transcript = "its stream-json events in the iteration's revise.out; Gemini's own under ~/.gemini/tmp/"

    def command(self, session: str | None) -> str:
        resume = f" --resume {quoted(session)}" if session else ""
        return f"{self.program} -p {PROMPT_ARG} --output-format stream-json --approval-mode auto_edit{resume}"

    def usage(self, output: str) -> Usage | None:
        session, stats = None, None
        for event in json_lines(output):
            kind = event.get("type")
            if kind == "init":
                found = event.get("session_id") or event.get("sessionId")
                session = found if isinstance(found, str) else session
            elif kind == "result" and isinstance(event.get("stats"), dict):
                stats = event["stats"]
        if stats is None:
            whole = whole_json(output)
            if whole is not None and isinstance(whole.get("stats"), dict):
                stats = whole["stats"]
                found = whole.get("session_id") or whole.get("sessionId")
                session = found if isinstance(found, str) else session
        tokens_in, tokens_out = _gemini_tokens(stats or {})
        return checked({"input_tokens": tokens_in, "output_tokens": tokens_out, "session_id": session})

    def progress(self, line: str) -> str | None:
        event = next(json_lines(line), None)
        if event is None:
            return super().progress(line)
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            return first_line(event.get("content"))
        if kind == "tool_use":
            return f"tool: {event.get('tool_name') or event.get('name') or '?'}"
        if kind == "result":
            return "done"
        return None


def _gemini_tokens(stats: dict[str, Any]) -> tuple[int | None, int | None]:
    """Input and output tokens from Gemini's stats: flat totals, or summed over ``models``."""
    flat_in, flat_out = count(stats.get("input_tokens")), count(stats.get("output_tokens"))
    if flat_in is not None or flat_out is not None:
        return flat_in, flat_out
    tokens_in = tokens_out = None
    models: dict[str, Any] = stats["models"] if isinstance(stats.get("models"), dict) else {}
    for model in models.values():
        tokens: dict[str, Any] = (model["tokens"] if isinstance(model, dict) and isinstance(model.get("tokens"), dict)
                                  else {})
        got_in, got_out = count(tokens.get("prompt")), count(tokens.get("candidates"))
        if got_in is not None:
            tokens_in = (tokens_in or 0) + got_in
        if got_out is not None:
            tokens_out = (tokens_out or 0) + got_out
    return tokens_in, tokens_out


BUILTIN: tuple[Agent, ...] = (ClaudeCode(), CodexCLI(), Aider(), GeminiCLI())

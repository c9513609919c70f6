"""Stand-in executables for the agent CLIs, each implementing the documented
non-interactive interface its preset uses (never the real CLI, no network).

Each fake appends one JSON line per call to ``$FAKE_AGENT_LOG`` (its argv, the prompt
it received, the session it continued) and, from call ``$FAKE_FIX_AT`` on, writes
``fixed`` in its working directory. A call that breaks the interface (a missing
flag, a session it never issued) exits 2 with a message, as the real CLI would.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

COMMON = r'''
import json, os, sys
LOG = os.environ["FAKE_AGENT_LOG"]
def calls():
    try:
        with open(LOG) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
def issued():
    return {c.get("issued") for c in calls()}
def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)
def record(prompt, resumed, issued_now):
    n = len(calls()) + 1
    with open(LOG, "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "prompt": prompt, "resumed": resumed, "issued": issued_now,
                            "usage_file": os.environ.get("LOOP_USAGE_FILE"),
                            "agent": os.environ.get("LOOP_AGENT")}) + "\n")
    if n >= int(os.environ.get("FAKE_FIX_AT", "1")):
        open("fixed", "w").write("ok\n")
    return n
def value(flag):
    args = sys.argv[1:]
    if flag not in args or args.index(flag) + 1 >= len(args):
        return None
    return args[args.index(flag) + 1]
'''

CLAUDE = COMMON + r'''
args = sys.argv[1:]
prompt = value("-p")
if prompt is None:
    fail("claude: -p PROMPT is required in print mode")
if value("--output-format") != "stream-json" or "--verbose" not in args:
    fail("claude: --output-format stream-json requires --verbose")
resumed = value("--resume")
if resumed is not None and resumed not in issued():
    fail(f"No conversation found with session ID: {resumed}")
session = resumed or f"claude-session-{len(calls()) + 1}"
n = record(prompt, resumed, session)
print(json.dumps({"type": "system", "subtype": "init", "session_id": session}), flush=True)
print(json.dumps({"type": "assistant", "message": {"content": [{"type": "text", "text": f"Working on call {n}"}]}}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "session_id": session,
                  "total_cost_usd": 0.5, "usage": {"input_tokens": 100, "cache_creation_input_tokens": 20,
                                                   "cache_read_input_tokens": 30, "output_tokens": 40}}))
'''

CODEX = COMMON + r'''
args = sys.argv[1:]
if args[:1] != ["exec"] or "--json" not in args:
    fail("codex: expected `codex exec --json ...`")
rest = [a for a in args[1:] if a not in ("--json", "--full-auto")]
resumed = None
if rest[:1] == ["resume"]:
    resumed = rest[1]
    if resumed not in issued():
        fail(f"codex: no rollout found for thread id {resumed}")
    rest = rest[2:]
if len(rest) != 1:
    fail(f"codex: expected one PROMPT, got {rest!r}")
thread = resumed or f"thread-{len(calls()) + 1}"
record(rest[0], resumed, thread)
for event in ({"type": "thread.started", "thread_id": thread}, {"type": "turn.started"},
              {"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "Edited calc.py"}},
              {"type": "turn.completed", "usage": {"input_tokens": 300, "cached_input_tokens": 100,
                                                   "output_tokens": 50}}):
    print(json.dumps(event), flush=True)
'''

AIDER = COMMON + r'''
args = sys.argv[1:]
path = value("--message-file")
if path is None or "--yes-always" not in args:
    fail("aider: expected --message-file FILE --yes-always")
history = value("--chat-history-file") or ".aider.chat.history.md"
resumed = None
if "--restore-chat-history" in args:
    if not os.path.exists(history):
        fail("aider: no chat history to restore")
    resumed = history
prompt = open(path).read()
record(prompt, resumed, history)
with open(history, "a") as f:
    f.write("#### " + prompt.splitlines()[0] + "\n")
print("Aider v0.86.1")
print("Applied edit to fixed")
print("Tokens: 2.5k sent, 300 received. Cost: $0.02 message, $0.02 session.")
'''

GEMINI = COMMON + r'''
args = sys.argv[1:]
prompt = value("-p")
if prompt is None or value("--output-format") != "stream-json":
    fail("gemini: expected -p PROMPT --output-format stream-json")
resumed = value("--resume")
if resumed is not None and resumed not in issued():
    fail(f"gemini: session {resumed} not found")
session = resumed or f"gemini-{len(calls()) + 1}"
record(prompt, resumed, session)
for event in ({"type": "init", "session_id": session, "model": "gemini-2.5-pro"},
              {"type": "message", "role": "assistant", "content": "Looking at the failure"},
              {"type": "tool_use", "tool_name": "replace"},
              {"type": "result", "status": "success", "stats": {"input_tokens": 500, "output_tokens": 60,
                                                                "total_tokens": 560}}):
    print(json.dumps(event), flush=True)
'''

FAKES = {"claude": CLAUDE, "codex": CODEX, "aider": AIDER, "gemini": GEMINI}


def install(bindir: Path, name: str, source: str | None = None) -> Path:
    """Write the fake ``name`` into ``bindir`` (run by this interpreter)."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!{sys.executable}\n" + (source if source is not None else FAKES[name]))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def path_with(bindir: Path) -> str:
    return f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"

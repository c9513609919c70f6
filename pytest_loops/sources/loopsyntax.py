"""The words of a ``.loop`` file, as :mod:`pytest_loops.sources.loopfile` reads them:
comments and lines (:func:`tokenize`), the pattern of each kind of line, the first
words that pick a loop-body line's candidates, and the keyword a mistyped line
probably meant (:func:`near_miss`). What each line means is the parser's.
"""

from __future__ import annotations

import difflib
import re

from pytest_loops.sources.loopdraft import Line


def strip_comment(raw: str) -> str:
    hash_at = raw.find("#")
    if hash_at < 0 or '"' not in raw[:hash_at]:
        return raw if hash_at < 0 else raw[:hash_at]
    in_quote = False
    for i, c in enumerate(raw):
        if c == '"':
            in_quote = not in_quote
        elif c == "#" and not in_quote:
            return raw[:i]
    return raw


def tokenize(text: str) -> list[Line]:
    lines = []
    for no, raw in enumerate(text.split("\n"), 1):
        code = strip_comment(raw[:-1] if raw.endswith("\r") else raw)
        stripped = code.strip()
        if stripped:
            lines.append(Line(no, len(code) - len(code.lstrip()), stripped))
    return lines


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.I)


LOOP = _re(r"loop\b(.*)$")
PIPELINE = _re(r"pipeline\b(.*)$")
FLOW = _re(r"flow\b(.*)$")
STAGE = _re(r"stage\b(.*)$")
STAGE_HEADER = _re(r"stage\s+(.+?):\s*$")
FLOW_STEP = _re(r"(?:then\s+)?(?:run|for\s+each)\b")
FLOW_RUN = _re(r'(?:then\s+)?run\s+"([^"]*)"(.*)$')
PARALLEL = _re(r"stages\s+in\s+parallel\s*:?\s*$")
CONFIG_BLOCK = _re(r"(?:git|observe|sandbox)\s*:?\s*$")
CONFIG_LINE = _re(
    r"(?:use\s|run\s+with\s|runner\b|schedule\s*:|notify\s*:|mode\s*:|runs\s+as\s*:|models\s*:|"
    r"(?:then\s+)?each\s+cycle\s*:|recommend\s+skills\s+with\s+ctx\b|"
    r"ctx\s+may\s+use\b|live\s*[:=])"
)
TARGET = _re(r"target\s*:(.*)$")
RIGOR = _re(r"rigor\s*:(.*)$")
RIGOR_ON = ("structured ai-assisted", "agentic engineering")

# a loop-body line written at the top level: almost always a missing indent
BODY_AT_TOP = _re(r"(?:goal\s*:|done\s+when\b|look\s+at\s*:|check\s*:|verify\s*:|after\s+\S+\s+tr(?:ies|y)\b|"
                  r"when\s+[^:]*:|remember\s+in\b)")

GOAL = _re(r"goal\s*:(.*)$")
DONE = _re(r"done\s+when\b\s*:?(.*)$")
LOOK = _re(r"(?:look\s+at|look\s+in|files|context|in)\s*:(.*)$")
CHECK = _re(r"(check|verify)\s*:(.*)$")
BAR = _re(r"the\s+bar\s*:(.*)$")
BLOCK = _re(r"(git|hooks)\s*:?\s*$")
POLICY = _re(r"(?:allow|ask\s+me\s+before)\b")
CYCLE = _re(r"(?:then\s+)?each\s+cycle\s*:")
ALSO = _re(r"also(?:\s+do)?\s*:")
SKILLS = _re(r"(?:use\s+skills?\s*:|skills\s*:|use\s+skills\s+recommended\s+by\s+ctx\b|"
             r"top\s+up\s+skills\s+from\s+ctx\b|use\s+tools\s+from\b|plan\s+from\b)")
EXAMPLES = _re(r"examples?\s*:(.*)$")
KNOWLEDGE = _re(r"knowledge\s*:(.*)$")
MEMORY = _re(r"(?:remember|keep\s+a\s+memory)\s+in\b(.*)$")
HUMAN_PLAN = _re(r"a\s+human\s+approves\s+the\s+plan\s+first\s*$")
HUMAN_REVIEW = _re(r"a\s+human\s+reviews\s+before\s+stopping\s*$")
HUMAN_GATE = _re(r"a\s+human\s+approves\s+before\s+(.+)$")
MODELS = _re(r"models\s*:")
WHEN = _re(r"when\s+(.+?)\s*:(.*)$")
AFTER = _re(r"after\s+(\S+)\s+tr(?:ies|y)\b\s*:?(.*)$")
# our own lines
BUDGET = _re(r"budget\s*:(.*)$")
NO_PROGRESS = _re(r"stop\s+when\s+nothing\s+changes\b(.*)$")
ESCALATE = _re(r"escalate\s+after\b(.*)$")
SAME_FAILURE = _re(r"stop\s+when\s+the\s+same\s+failure\s+repeats\b(.*)$")
SIGNAL = _re(r"no\s+progress\s+signal\s*:(.*)$")
COUNT_TRIES = _re(r"\s*(?:for\s+)?(\S+)\s+(?:tries|try|iterations?)\s*$")
REVISE = _re(r"revise\s+with\b\s*:?(.*)$")
ADAPTER = _re(r"context\s+adapter\s*:(.*)$")
LISTS = _re(r"(protect|scope|watch)\s*:(.*)$")

PASS_COND = _re(r"it\s+passes(?:\s+and\s+(?:the\s+)?goal\s+is\s+met)?$")
FAIL_COND = _re(r"it\s+(?:fails|breaks)$")
BLOCKED_COND = _re(r"(?:it\s+is\s+|it\s+gets\s+)?(?:blocked|stuck)$")
ASK_HUMAN = _re(r"\bask\s+(?:a\s+|the\s+)?human\b")
STOP = _re(r"\bstop\b")
WARN = _re(r'\bstop\s+and\s+warn\s+(?:"([^"]*)"|([^",]+))')

_TYPO_KEYS = ["goal", "look at", "look in", "files", "context", "check", "verify", "also",
              "use skills", "skills", "examples", "knowledge", "budget", "protect", "scope",
              "watch", "silence", "each cycle", "models", "hooks", "the bar", "grants"]
_TYPO_STARTS = ["done when", "remember in", "revise with", "escalate after", "stop when"]

# a line's first word, and the first words a loop-body line of each pattern starts with
HEAD = re.compile(r"[A-Za-z]+")
FIRST_WORDS = {
    GOAL: ("goal",), LOOK: ("look", "files", "context", "in"), CHECK: ("check", "verify"),
    POLICY: ("allow", "ask"), CYCLE: ("each", "then"), ALSO: ("also",),
    SKILLS: ("use", "skills", "top", "plan"), EXAMPLES: ("example", "examples"), KNOWLEDGE: ("knowledge",),
    MEMORY: ("remember", "keep"), HUMAN_PLAN: ("a",), HUMAN_REVIEW: ("a",), HUMAN_GATE: ("a",),
    MODELS: ("models",), WHEN: ("when",), AFTER: ("after",), BAR: ("the",),
}


def near_miss(text: str) -> str | None:
    """The keyword a mistyped line probably meant (``doen when`` -> ``done when``), or None."""
    lower = " ".join(text.lower().split())
    if ":" in lower:
        key = lower.split(":", 1)[0].strip()
        if key and key.count(" ") <= 2:
            match = difflib.get_close_matches(key, _TYPO_KEYS, n=1, cutoff=0.75)
            if match and match[0] != key:
                return match[0] + ":"
    start = " ".join(lower.split(" ", 2)[:2])
    match = difflib.get_close_matches(start, _TYPO_STARTS, n=1, cutoff=0.8)
    if match and match[0] != start:
        return match[0]
    return None

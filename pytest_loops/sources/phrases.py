"""The small phrases inside loop-file lines: predicates, counts, durations, path lists.

Each parser works on one piece of text and raises :class:`Problem` with an
offset into that text; the line parser turns it into a ``LoopFileError`` naming
file:line:column. Nothing here knows about files or lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pytest_loops.settings import BY_NAME
from pytest_loops.spec import GRANT_NAMES, Check, CheckKind


class Problem(Exception):
    """A phrase that does not parse: what is wrong, where in the text, and the fix."""

    def __init__(self, message: str, offset: int = 0, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.fix = fix


PREDICATE_FORMS = (
    'write one of: "CMD" passes | "CMD" passes N times | "CMD" finds nothing | '
    'the test "NODEID" passes | a human confirms "TEXT" | the skill "NAME" approves | '
    'the skill "NAME" scores N or more [on the output|trajectory] [by N judges]'
)

_MAX_DIGITS = 9  # larger counts are typos; also keeps int() away from huge inputs


def unterminated_quote(text: str) -> int | None:
    """Offset of a double quote that is never closed, or None."""
    if text.count('"') % 2 == 0:
        return None
    return text.rfind('"')


def check_quotes(text: str) -> None:
    offset = unterminated_quote(text)
    if offset is not None:
        raise Problem("unterminated quote", offset, 'close it with a matching `"`')


def positive_int(raw: str, offset: int, example: str) -> int:
    """A count written in a line: a whole number >= 1."""
    if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS and int(raw) >= 1:
        return int(raw)
    raise Problem(f"{raw!r} is not a positive integer", offset,
                  f"write a whole number of 1 or more, e.g. `{example}`")


# -- durations ----------------------------------------------------------------------

_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
}
_DURATION_PART = re.compile(r"\s*(\d{1,9}(?:\.\d{1,6})?)\s*([a-z]+)\s*(?:,|\band\b)?", re.I)
_DURATION_OFF = {"none", "off", "no limit", "unlimited"}


def duration_seconds(raw: str) -> float:
    """``15 minutes``, ``90 s``, ``1.5 hours``, ``1 hour 30 minutes`` -> seconds; ``none`` -> 0."""
    text = raw.strip()
    if text.lower() in _DURATION_OFF:
        return 0.0
    total = 0.0
    pos = 0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if not m or m.group(2).lower() not in _UNITS or m.end() == pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
    if pos != len(text) or not text:
        raise Problem(f"{raw.strip()!r} is not a duration", 0,
                      "write a number and a unit: `15 minutes`, `90 seconds`, `1.5 hours` "
                      "(or `none` to turn the budget off)")
    if total <= 0:
        raise Problem(f"{raw.strip()!r} is not a positive duration", 0,
                      "give a duration above zero, or `none` to turn the budget off")
    return total


_POLL = re.compile(r'\s*(?:"([^"]*)"|(\S*))\s*(?:every\b(.*))?$', re.I)


def watch_values(silence: bool, text: str) -> dict[str, Any]:
    """What follows ``silence:`` (a duration; ``none`` is off) or ``watch: poll``
    (``"CMD" every 30s``; ``every`` is optional) as watch settings."""
    if silence:
        return {"silence": duration_seconds(text)}
    m = _POLL.match(text)
    command = (m.group(1) if m.group(1) is not None else m.group(2)) if m else ""
    if not m or not command.strip():
        raise Problem("`watch: poll` has no command", 0, 'write `watch: poll "python poll.py" every 30s`')
    found: dict[str, Any] = {"watch_poll": command}
    if m.group(3) is not None:
        try:
            found["watch_interval"] = duration_seconds(m.group(3))
        except Problem as exc:
            exc.offset += m.start(3) + len(m.group(3)) - len(m.group(3).lstrip())
            raise
        if not found["watch_interval"]:
            raise Problem("the poll interval must be above zero", m.start(3), "write e.g. `every 30s`")
    return found


# -- lists of paths and descriptions ----------------------------------------------

_PATHISH = re.compile(r"[/\\.*?\[]")
_SPACE = re.compile(r"\s")


def split_items(text: str) -> list[str]:
    """``a, b, and c`` -> [a, b, c]; surrounding quotes and backticks are dropped."""
    items = []
    for part in text.split(","):
        item = part.strip()
        if item[:4].lower() == "and ":
            item = item[4:].strip()
        if len(item) >= 2 and item[0] == item[-1] and item[0] in "\"'`":
            item = item[1:-1].strip()
        if item:
            items.append(item)
    return items


def is_path(item: str) -> bool:
    """A file path or glob, not a description like ``the billing form``.

    One word with a path character (``/ . * ? [``) is a path; anything with
    spaces is a description the revise step resolves.
    """
    return _SPACE.search(item) is None and _PATHISH.search(item) is not None


def grant_names(text: str) -> list[str]:
    """``skills, agents`` -> the names (lower case); ``none`` -> []; any other name is a Problem."""
    items = split_items(text)
    if [it.lower() for it in items] == ["none"]:
        return []
    if not items:
        raise Problem("`grants:` lists nothing", 0, f"list what the loop grants ({', '.join(GRANT_NAMES)}), or `none`")
    for item in items:
        if item.lower() not in GRANT_NAMES:
            raise Problem(f"{item!r} is not a grant", max(0, text.find(item)),
                          f"grant only {', '.join(GRANT_NAMES)} (or `none`)")
    return [it.lower() for it in items]


_WATCH_LINE = re.compile(r"\s*(watch\s*:\s*poll\b|silence\s*:)(.*)$", re.I)  # a watch's poll and silence
_SETTING_LINE = re.compile(r"\s*(grants|grant\s+ctx|ctx\s+grants|branches|max\s+parallel|max\s+cost|max\s+tokens)"
                           r"\s*:(.*)$", re.I)
_EXAMPLES = {"branches": "branches: 3", "max_parallel": "max parallel: 4", "max_cost": "max cost: $5",
             "max_tokens": "max tokens: 200000"}
_MONEY = re.compile(r"\s*\$?\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:usd|dollars?)?\s*$", re.I)
_TOKENS = re.compile(r"\s*(\d+)\s*([km]?)\s*(?:tokens?)?\s*$", re.I)


def setting_line(text: str) -> list[tuple[str, Any]] | None:
    """The settings of a one-line setting of a loop body, None for any other line:
    ``grants: skills, agents`` (LoopFlow's ``grant ctx:`` read the same way),
    ``branches: 3``, ``max parallel: 4``, ``watch: poll "CMD" every 30s``,
    ``silence: 10 minutes``. A bad value is a Problem (its offset in ``text``)."""
    m = _WATCH_LINE.match(text)
    if m:
        try:
            return list(watch_values(m.group(1).lower().startswith("silence"), m.group(2)).items())
        except Problem as exc:
            raise Problem(exc.message, m.start(2) + exc.offset, exc.fix) from None
    m = _SETTING_LINE.match(text)
    if not m:
        return None
    word, raw, start = " ".join(m.group(1).lower().split()), m.group(2), m.start(2)
    if word in ("grants", "grant ctx", "ctx grants"):
        try:
            return [("grants", grant_names(raw))]
        except Problem as exc:
            raise Problem(exc.message, start + exc.offset, exc.fix) from None
    key = word.replace(" ", "_")
    if key in ("max_cost", "max_tokens"):
        return [(key, _budget_value(key, raw, start))]
    (low, high), example = BY_NAME[key].bounds, _EXAMPLES[key]
    value = raw.strip()
    if not value.isdigit() or not low <= int(value) <= high:
        raise Problem(f"{value!r} is not a valid {key}: an integer from {low} to {high}", start,
                      f"write `{example}`")
    return [(key, int(value))]


def _budget_value(key: str, raw: str, start: int) -> float | int:
    """``max cost: $5`` (US dollars) or ``max tokens: 200k``; 0 turns the guard off."""
    if key == "max_cost":
        m = _MONEY.match(raw)
        if m:
            return float(m.group(1))
        raise Problem(f"{raw.strip()!r} is not a valid max_cost: an amount in US dollars", start,
                      "write `max cost: $5` (or `max cost: 0` for no cap)")
    m = _TOKENS.match(raw)
    if m:
        return int(m.group(1)) * {"": 1, "k": 1000, "m": 1000000}[m.group(2).lower()]
    raise Problem(f"{raw.strip()!r} is not a valid max_tokens: a whole number of tokens", start,
                  "write `max tokens: 200000` (or `200k`; `0` for no cap)")


# -- predicates (`done when ...`) -------------------------------------------------

_TIMES = r"(?:\s+(\S+)\s+times?)?"
_TEST = re.compile(r'the\s+test\s+"([^"]*)"\s+passes' + _TIMES + r"\s*$", re.I)
_FINDS = re.compile(r'"([^"]*)"\s+finds\s+nothing' + _TIMES + r"\s*$", re.I)
_PASSES = re.compile(r'"([^"]*)"\s+(?:passes|succeeds)' + _TIMES + r"\s*$", re.I)
_HUMAN = re.compile(r'a\s+human\s+confirms\s+"([^"]*)"\s*$', re.I)
_SKILL = re.compile(
    r'the\s+skill\s+"([^"]*)"\s+(?:(approves)|scores\s+(\S+)(?:\s+or\s+more)?)'
    r"(?:\s+on\s+the\s+(output|trajectory))?(?:\s+by\s+(\S+)\s+judges?)?\s*$",
    re.I,
)
# `check:` with a predicate phrase rather than a bare command
_PHRASE = re.compile(r'(?:the\s+test|the\s+skill|a\s+human)\b|".*"\s+(?:passes|succeeds|finds\s+nothing)'
                     r"(?:\s+\S+\s+times?)?\s*$", re.I)


@dataclass(frozen=True)
class Predicate:
    """A parsed predicate: everything a Check needs except its name and source."""

    kind: CheckKind
    command: str | None = None
    times: int = 1
    node_id: str | None = None
    text: str | None = None
    options: Any = None

    def to_check(self, name: str, source: str | None) -> Check:
        return Check(self.kind, name, command=self.command, times=self.times,
                     node_id=self.node_id, text=self.text, options=self.options or {},
                     source=source)


def _times(m: re.Match[str], group: int) -> int:
    raw = m.group(group)
    return 1 if raw is None else positive_int(raw, m.start(group), "passes 3 times")


def _not_blank(value: str, what: str, offset: int) -> str:
    if not value.strip():
        raise Problem(f"the {what} is empty", offset, f"put the {what} between the quotes")
    return value


def parse_predicate(text: str) -> Predicate:
    """Parse what follows ``done when``. Offsets in a Problem are into ``text``."""
    lead = len(text) - len(text.lstrip())
    try:
        return _predicate(text.strip())
    except Problem as exc:
        exc.offset += lead
        raise


def _predicate(text: str) -> Predicate:
    if not text:
        raise Problem("`done when` has no predicate", 0,
                      'say what must hold, e.g. `done when "pytest -q" passes`')
    check_quotes(text)
    m = _PASSES.match(text)
    if m:
        return Predicate(CheckKind.COMMAND, command=_not_blank(m.group(1), "command", m.start(1)),
                         times=_times(m, 2))
    m = _FINDS.match(text)
    if m:
        return Predicate(CheckKind.FINDS_NOTHING,
                         command=_not_blank(m.group(1), "command", m.start(1)), times=_times(m, 2))
    m = _TEST.match(text)
    if m:
        return Predicate(CheckKind.PYTEST, node_id=_not_blank(m.group(1), "test id", m.start(1)).strip(),
                         times=_times(m, 2))
    m = _HUMAN.match(text)
    if m:
        return Predicate(CheckKind.HUMAN, text=_not_blank(m.group(1), "text", m.start(1)))
    m = _SKILL.match(text)
    if m:
        skill = _not_blank(m.group(1), "skill name", m.start(1))
        min_score = None
        if m.group(3) is not None:
            min_score = positive_int(m.group(3), m.start(3), "scores 8 or more")
        judges = 1 if m.group(5) is None else positive_int(m.group(5), m.start(5), "by 3 judges")
        mode = "scores" if min_score is not None else ("judges" if judges > 1 else "approves")
        options = {"skill": skill, "mode": mode, "min_score": min_score, "judges": judges,
                   "on": (m.group(4) or "output").lower(), "bar": None}
        return Predicate(CheckKind.HOOK, options=options)
    raise Problem(f"could not understand the predicate {text.strip()!r}", 0, PREDICATE_FORMS)


def parse_check_value(value: str) -> Predicate:
    """``check:`` / ``verify:``: a predicate phrase, or else a bare shell command."""
    if _PHRASE.match(value.strip()):
        return parse_predicate(value)
    command = value.strip()
    # LoopFlow drops one leading and one trailing quote: `check: "pnpm test"`
    if command.startswith('"'):
        command = command[1:]
    if command.endswith('"'):
        command = command[:-1]
    return Predicate(CheckKind.COMMAND, command=_not_blank(command, "command", len(value) - len(value.lstrip())))


def check_name(phrase: str) -> str:
    """A check's name from the text of its line: whitespace collapsed, node-id friendly.

    ``::`` would split a pytest node id, so it becomes ``:``.
    """
    name = " ".join(phrase.split())
    while "::" in name:
        name = name.replace("::", ":")
    return name


def unique_names(names: list[str]) -> list[str]:
    """Make names unique in order: a repeated name gets `` (2)``, `` (3)``..."""
    seen: dict[str, int] = {}
    taken = set(names)
    out = []
    for name in names:
        if name not in seen:
            seen[name] = 1
            out.append(name)
            continue
        n = seen[name]
        while True:
            n += 1
            candidate = f"{name} ({n})"
            if candidate not in taken:
                break
        seen[name] = n
        taken.add(candidate)
        out.append(candidate)
    return out

"""What the diff auditor reads and reports: a changed file, a finding, and its bounds."""

from __future__ import annotations

from dataclasses import dataclass

MAX_FAILURE_CHARS = 200_000
MAX_LITERALS = 500
_MAX_LITERAL_CHARS = 1_000
_MAX_PARSE_LINE = 10_000


@dataclass(frozen=True)
class FileChange:
    """One file the revise step changed."""

    path: str  # '/'-separated path relative to the loop's working directory
    before: str | None  # the file's text when the loop started (None: the file is new)
    after: str | None  # the file's text now (None: the file was deleted)


@dataclass(frozen=True)
class Finding:
    """One added or changed line that looks like gaming the checks."""

    path: str
    line: int  # 1-based line number in `after`
    rule: str  # a short kebab-case rule id, e.g. "hardcoded-literal"
    message: str  # one sentence: what was found and why it looks like gaming
    text: str  # the offending line, stripped

    def describe(self) -> str:
        """``path:line: message: `text``` on one line."""
        message = " ".join(self.message.split()).rstrip(".")
        text = " ".join(self.text.split())
        return f"{self.path}:{self.line}: {message}: `{text}`"



"""Errors a user can cause. Each renders as one line naming where and the fix."""

from __future__ import annotations


class LoopUsageError(Exception):
    """Bad input: a flag, a config file, a loop file. Exit code 64, never a traceback.

    ``location`` is ``file``, ``file:line`` or ``file:line:column`` or a flag name.
    """

    def __init__(self, message: str, location: str | None = None, fix: str | None = None):
        self.message = message
        self.location = location
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}" if self.location else self.message
        if self.fix:
            text += f"; {self.fix}"
        return text.replace("\n", " ")


class LoopFileError(LoopUsageError):
    """A syntax or validation error in a `.loop` or YAML loop file."""

    def __init__(self, message: str, path: str, line: int | None = None,
                 column: int | None = None, fix: str | None = None):
        self.path = path
        self.line = line
        self.column = column
        location = path
        if line is not None:
            location += f":{line}"
            if column is not None:
                location += f":{column}"
        super().__init__(message, location=location, fix=fix)

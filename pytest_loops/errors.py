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


def read_user_text(path, what: str, missing: str = "not found", missing_fix: str | None = None) -> str:
    """A file a user named, as UTF-8 text; every way it can fail is one LoopUsageError
    line naming the file and ``what`` it should have been."""
    import os

    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise LoopUsageError(missing, location=where, fix=missing_fix) from None
    except IsADirectoryError:
        raise LoopUsageError(f"is a directory, not {what}", location=where) from None
    except UnicodeDecodeError:
        raise LoopUsageError(f"not UTF-8 text: not {what}", location=where) from None
    except OSError as exc:
        raise LoopUsageError(f"cannot read: {exc.strerror}", location=where) from None

"""Output paths, checked before the first iteration.

A run log, artifacts directory, lessons page, `.tine` or report the run cannot
write is bad input (exit 64, one line naming the flag, the path, the reason and
the fix), not an OSError after an iteration has run (70), a hang on a lock
file that cannot be made, or a verdict (2-5) with the artifact missing.

Nothing is left behind: the check creates no directory, and the one file it
makes (a probe in the nearest existing directory) is removed at once. A file
that already exists is opened for appending, which changes nothing in it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from pytest_loops.errors import LoopUsageError


def check_output_path(value: str | os.PathLike | None, where: str, *, base: str | os.PathLike = ".",
                      directory: bool = False) -> None:
    """Raise LoopUsageError (``where``: the flag, ini key or config key) unless the run
    can write ``value`` (relative to ``base``): a file, or with ``directory`` a
    directory the run makes when missing and writes files in."""
    if value is None or str(value) == "":
        return
    path = Path(base) / value  # an absolute value stays as it is
    shown = os.fspath(value)

    def bad(reason: str, fix: str) -> LoopUsageError:
        return LoopUsageError(f"cannot write {shown!r}: {reason}", location=where, fix=fix)

    writable_dir = "give a path in a directory you can write"
    if path.is_dir() and not directory:
        raise bad("it is a directory", "give a file path")
    if path.exists() and directory and not path.is_dir():
        raise bad("it is a file, not a directory", "give a directory path")
    if path.is_file():
        try:
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise bad(exc.strerror or str(exc), writable_dir) from None
    parent = path if directory and path.is_dir() else path.parent
    existing = next((p for p in (parent, *parent.parents) if os.path.lexists(p)), None)
    if existing is None:  # pragma: no cover - the root exists
        return
    if not existing.is_dir():
        raise bad(f"{os.strerror(errno.ENOTDIR)}: {str(existing)!r} is a file", writable_dir)
    try:
        fd, probe = tempfile.mkstemp(prefix=".pytest-loops-probe-", dir=existing)
    except OSError as exc:
        raise bad(f"{exc.strerror or exc} (in {str(existing)!r})", writable_dir) from None
    os.close(fd)
    os.unlink(probe)


GITIGNORE = "# Created by pytest-loops automatically.\n*\n"


def keep_out_of_git(directory: str | os.PathLike) -> None:
    """A default artifacts directory (``.pytest-loops``) ignores itself, as pytest's
    ``.pytest_cache`` does: run logs, lessons and locks are not the project's source.
    An existing ``.gitignore`` (the user's) is left alone; a failure here is no error."""
    path = Path(directory)
    if path.name != ".pytest-loops":
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError:
        return
    try:
        os.write(fd, GITIGNORE.encode())
    finally:
        os.close(fd)

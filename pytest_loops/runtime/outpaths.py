"""Output paths, checked before the first iteration.

A run log, artifacts directory, lessons page, `.tine` or report the run cannot
write is bad input (exit 64, one line naming the flag, the path, the reason and
the fix), not an OSError after an iteration has run (70), a hang on a lock
file that cannot be made, or a verdict (2-5) with the artifact missing.

Nothing is left behind: the check creates no directory, and the one file it
makes (a probe in the nearest existing directory) is removed at once. A file
that already exists is opened for appending, which changes nothing in it.

A path given for a run log, a `.tine`, a hand-off or a report is never written
over a file of another kind (``kind``): an existing file must be empty or that
kind of artifact, told by its first bytes. A run log named ``test_calc.py`` (by a
config file a revise step wrote, or by mistake) is bad input before the loop
starts, not a test file replaced by JSON after it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from pytest_loops.errors import LoopUsageError

RUN_LOG = "a pytest-loops run log"
TINE = "a .tine provenance file"
HANDOFF = "a pytest-loops hand-off"
REPORT = "a pytest-loops HTML report"
_HEAD_BYTES = 4096
_TINE_MAGIC = b"TINEZ1\0"


def is_artifact(path: str | os.PathLike, kind: str) -> bool:
    """Whether the existing file ``path`` may be written over as ``kind``: it is empty
    (or only whitespace), or its first bytes are that artifact's. A file that cannot be
    read is left to the writability check."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return True
    text = head.lstrip()
    if not text:
        return True
    if kind == RUN_LOG:
        return text.startswith(b"{") and b'"pytest-loops.runlog/' in head
    if kind == TINE:
        return head.startswith(_TINE_MAGIC) or (text.startswith(b"{") and b'"format_version"' in head)
    if kind == HANDOFF:
        return text.startswith(b"# Hand-off: loop ")
    if kind == REPORT:
        return text[:15].lower() == b"<!doctype html>" and b'<meta name="generator" content="pytest-loops">' in head
    raise ValueError(kind)


def beside_log(log: str | os.PathLike) -> dict[str, Path]:
    """The artifacts written beside a run log at ``log``, by kind: its `.tine` (unless a
    path is given for it) and its hand-off."""
    path = Path(log)
    return {TINE: path.with_suffix(".tine"), HANDOFF: path.with_name(path.stem + ".handoff.md")}


def check_artifact_paths(log: str | os.PathLike, where: str, *, base: str | os.PathLike = ".",
                         tine: bool = True) -> None:
    """A run log given at ``log`` and what goes beside it (``tine``: its `.tine` too)
    are written over no file of another kind (LoopUsageError)."""
    check_output_path(log, where, base=base, kind=RUN_LOG)
    for kind, path in beside_log(Path(base) / log).items():
        if tine or kind != TINE:
            check_output_path(path, f"{where} (the {kind.split(' ', 1)[1]} beside it)", kind=kind)


def check_output_path(value: str | os.PathLike | None, where: str, *, base: str | os.PathLike = ".",
                      directory: bool = False, kind: str | None = None) -> None:
    """Raise LoopUsageError (``where``: the flag, ini key or config key) unless the run
    can write ``value`` (relative to ``base``): a file, or with ``directory`` a
    directory the run makes when missing and writes files in. With ``kind``
    (:data:`RUN_LOG`, :data:`TINE`, :data:`HANDOFF`, :data:`REPORT`) an existing file
    must be empty or of that kind (:func:`is_artifact`)."""
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
        if kind is not None and not is_artifact(path, kind):
            raise bad(f"it exists and is not {kind}, and the run would write over it",
                      "give a path that does not exist yet (or remove that file if it is yours to lose)")
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

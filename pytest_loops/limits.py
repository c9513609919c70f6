"""Readers with limits: the YAML and JSON files a user names, read within bounds.

A config file, a loop file, a run log or a `.tine` is bad input when it is too
big, nested too deeply or (YAML) expands through aliases into more than a few
thousand nodes: one LoopUsageError line naming the file (and line) and the fix,
never minutes of parsing, gigabytes of memory or a RecursionError.

YAML is read in two passes over libyaml's events (C, when PyYAML has it): the
first counts nesting and alias expansion and stops at the first bound crossed,
the second builds the objects. Normal files stay at libyaml's speed.
"""

from __future__ import annotations

import errno
import os
import reprlib
import stat
from typing import Any, BinaryIO

from pytest_loops.errors import LoopFileError, LoopUsageError

MiB = 1024 * 1024
MAX_YAML_BYTES = 10 * MiB
MAX_YAML_DEPTH = 100
MAX_ALIAS_NODES = 10_000  # nodes aliases may add, all aliases together
MAX_RUN_BYTES = 64 * MiB  # a run log or a `.tine`
MAX_LINE_CHARS = 8 * MiB  # one event line of a run log
MAX_JSON_DEPTH = 64
MAX_LOOP_BYTES = 1 * MiB  # a `.loop` file: LoopFlow files are a few KB



def safe_loader() -> Any:
    """pyyaml's safe loader, libyaml's when present (yaml is imported on first use:
    a pytest run that reads no YAML does not pay for it)."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 4
_short.maxlevel = 2


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a line's worth: error messages quote values, not documents."""
    return _short.repr(value)


def _mib(size: int) -> str:
    return f"{size / MiB:.1f} MB"


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


PRIVATE_MODE = 0o600
"""The mode of an artifact with the ``private_artifacts`` setting on."""


def current_umask() -> int:
    """The process's umask, read without changing it where /proc tells it (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(old)
    return old


def artifact_mode(private: bool = False) -> int:
    """The mode of a new artifact (run log, ``.tine``, hand-off): 0666 less the user's
    umask, as any file they create; 0600 with ``private_artifacts`` on."""
    return PRIVATE_MODE if private else 0o666 & ~current_umask()


def set_artifact_mode(path: str | os.PathLike[str], private: bool = False) -> None:
    """Give a just-written artifact :func:`artifact_mode` (files written through a
    temporary file, which is 0600, would keep that otherwise). Never through a link."""
    try:
        if not os.path.islink(path):
            os.chmod(path, artifact_mode(private))
    except OSError:
        pass  # the artifact is written; its mode is the user's concern from here


def create_fresh(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """``path`` open for writing from its start (a descriptor), never through a link.

    A revise step can write into the harness's run directory: a symbolic link, or
    a hard link (a file with other names), it left at a name the harness writes next
    would carry the harness's output to another file, and a named pipe left there would
    keep the harness waiting for a reader. Such an entry is removed and the file made
    anew; a link planted after that is refused (``O_NOFOLLOW``, and ``O_EXCL`` for a
    new file), a pipe is not waited on (``O_NONBLOCK``: ENXIO). Anything else there (a
    file of its own, a device the caller named) is written in place, as
    ``open(path, "w")`` would."""
    where = os.fspath(path)
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        info = None
    if info is not None and (stat.S_ISLNK(info.st_mode) or stat.S_ISFIFO(info.st_mode)
                             or stat.S_ISSOCK(info.st_mode)
                             or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1)):
        os.unlink(where)
        info = None
    if info is None:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, mode)
    else:
        fd = os.open(where, os.O_WRONLY | os.O_TRUNC | nofollow)
    os.set_blocking(fd, True)
    return fd


def write_fresh(path: str | os.PathLike[str], text: str | bytes, *, errors: str = "strict") -> None:
    """``text`` (UTF-8, or bytes as they are) as a new file at ``path``; see :func:`create_fresh`."""
    with os.fdopen(create_fresh(path), "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8", errors))


def open_append(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """``path`` open for appending (a descriptor), created if missing, never through a
    symbolic link (``O_NOFOLLOW``: ELOOP) and never waiting on a named pipe
    (``O_NONBLOCK``: ENXIO); OSError, too, when it is not a regular file."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    fd = os.open(os.fspath(path), flags, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_fresh(path: str | os.PathLike[str], text: str | bytes) -> None:
    """``text`` written beside ``path`` (never through a link left at the temporary
    name) and renamed over it: readers see the old or the new content, and a link
    at ``path`` is replaced, never written through."""
    where = os.fspath(path)
    tmp = os.path.join(os.path.dirname(where), f".{os.path.basename(where)}.{os.getpid()}.tmp")
    try:
        write_fresh(tmp, text)
        os.replace(tmp, where)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_own(path: str | os.PathLike[str]) -> BinaryIO:
    """A file the harness wrote into a directory a check can write (its run directory),
    opened for reading without following a link (``O_NOFOLLOW``) and only when it is
    a regular file: a check that put a link to another file there (a key, a file the
    sandbox hides) gets OSError (ELOOP), never that file's bytes back. A FIFO or a
    device is refused without waiting on it (``O_NONBLOCK``)."""
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    fd = os.open(os.fspath(path), flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_own(path: str | os.PathLike[str], limit: int = -1) -> bytes:
    """The bytes (at most ``limit``; -1: all) of a file read with :func:`open_own`."""
    with open_own(path) as f:
        return f.read(limit)


def read_own_text(path: str | os.PathLike[str], *, errors: str = "strict") -> str:
    """A file read with :func:`open_own`, as UTF-8 text."""
    return read_own(path).decode("utf-8", errors)


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """Open a file a user named for reading, refusing anything but a regular file.

    Opened non-blocking first, so a named pipe nobody writes to is refused at
    once instead of waited on forever, and a device (``/dev/zero``, a terminal)
    is refused before a read that never ends. OSError (a missing file, no
    permission) propagates for the caller to word.
    """
    where = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(where, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise LoopUsageError(f"is {kind}, not {what}", location=where, fix="name a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike[str], what: str, limit: int, *, missing: str = "not found",
               missing_fix: str | None = None, big_fix: str = "check the path") -> bytes:
    """A regular file's bytes, refused (LoopUsageError, one line) when over ``limit`` bytes.

    The size is checked before reading and the read itself is bounded, so a
    file growing while it is read cannot make it unbounded either.
    """
    where = os.fspath(path)
    too_big = LoopUsageError(f"larger than {_mib(limit)}: too big for {what}", location=where, fix=big_fix)
    try:
        with open_regular(where, what) as f:
            if os.fstat(f.fileno()).st_size > limit:
                raise too_big
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise LoopUsageError(missing, location=where, fix=missing_fix) from None
    except OSError as exc:
        raise LoopUsageError(f"cannot read: {exc.strerror or exc}", location=where) from None
    if len(data) > limit:
        raise too_big
    return data


def read_text(path: str | os.PathLike[str], what: str, limit: int, *, missing: str = "not found",
              missing_fix: str | None = None, big_fix: str = "check the path") -> str:
    """A regular file as UTF-8 text (a leading BOM dropped), within ``limit`` bytes."""
    data = read_bytes(path, what, limit, missing=missing, missing_fix=missing_fix, big_fix=big_fix)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LoopUsageError(f"not UTF-8 text: not {what}", location=os.fspath(path)) from None
    return text[1:] if text.startswith("\ufeff") else text


def check_size(path: str | os.PathLike[str], what: str, limit: int) -> None:
    """Refuse a file over ``limit`` bytes before anything reads it (a missing file passes)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    if size > limit:
        raise LoopUsageError(f"{_mib(size)} is larger than the {_mib(limit)} {what} may be",
                             location=os.fspath(path), fix="check the path")


# --------------------------------------------------------------------------- YAML


def _yaml_error(exc: Any, where: str) -> LoopFileError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if "nesting depth" in problem and mark is not None:  # libyaml's own bound, met before ours
        return LoopFileError(f"nested deeper than {MAX_YAML_DEPTH} levels", where, mark.line + 1,
                             mark.column + 1, fix="flatten the YAML: a loop or config file needs a few levels")
    if mark is None:
        return LoopFileError(f"not valid YAML: {problem}", where, fix="fix the YAML syntax")
    return LoopFileError(f"not valid YAML: {problem}", where, mark.line + 1, mark.column + 1,
                         fix="fix the YAML syntax")


def _position(mark: Any) -> tuple[int | None, int | None]:
    """1-based line and column of a yaml mark (a mark can be missing)."""
    if mark is None:
        return None, None
    return mark.line + 1, mark.column + 1


def _check_events(text: str, where: str) -> None:
    """Walk the event stream once: nesting depth and alias expansion stay in bounds.

    An anchor's size is the number of nodes it stands for with its own aliases
    expanded, so nine aliases of nine aliases of ... grow as they would in memory.
    """
    import yaml

    parser = safe_loader()(text)
    depth = added = count = 0
    open_nodes: list[tuple[str | None, int]] = []
    sizes: dict[str, int] = {}
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                count += 1
                if depth > MAX_YAML_DEPTH:
                    line, column = _position(event.start_mark)
                    raise LoopFileError(f"nested deeper than {MAX_YAML_DEPTH} levels", where,
                                        line, column,
                                        fix="flatten the YAML: a loop or config file needs a few levels")
                open_nodes.append((event.anchor, count))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = count - start + 1
            elif isinstance(event, yaml.ScalarEvent):
                count += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                size = sizes.get(event.anchor, 1) if event.anchor is not None else 1
                count += size
                added += size
                if added > MAX_ALIAS_NODES:
                    line, column = _position(event.start_mark)
                    raise LoopFileError(f"aliases expand to more than {MAX_ALIAS_NODES} nodes", where,
                                        line, column,
                                        fix="write the values out instead of repeating *aliases")
    finally:
        parser.dispose()


def load_yaml(text: str, where: str, loader: Any = None) -> Any:
    """Parse YAML text read from ``where`` with the safe loader (or ``loader``, a
    subclass of :func:`safe_loader`), within the depth and alias bounds.

    Every problem is a LoopFileError naming ``where`` and the line.
    """
    if len(text) > MAX_YAML_BYTES:
        raise LoopFileError(f"larger than {_mib(MAX_YAML_BYTES)}: too big for a YAML file", where,
                            fix="check the path; a config or loop file is a few KB")
    import yaml

    try:
        _check_events(text, where)
        return yaml.load(text, Loader=loader or safe_loader())  # noqa: S506 - a SafeLoader (subclass)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, where) from None
    except RecursionError:  # pragma: no cover - the depth bound comes first
        raise LoopFileError("nested too deeply", where, fix="flatten the YAML") from None


def read_yaml_file(path: str | os.PathLike[str], what: str, *, missing: str = "not found",
                   missing_fix: str | None = None, loader: Any = None) -> Any:
    """A YAML file a user named, size-capped before it is read, then :func:`load_yaml`."""
    text = read_text(path, what, MAX_YAML_BYTES, missing=missing, missing_fix=missing_fix,
                     big_fix="check the path; a config or loop file is a few KB")
    return load_yaml(text, os.fspath(path), loader)


# --------------------------------------------------------------------------- JSON


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether loaded JSON nests lists and objects deeper than ``limit`` (no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return False


def load_json(text: str, where: str, what: str = "the file") -> Any:
    """``json.loads`` for a file a user named: too deep is one LoopUsageError line;
    invalid JSON still raises ``json.JSONDecodeError`` for the caller to word."""
    import json

    try:
        value = json.loads(text)
    except RecursionError:
        value = None
        deep = True
    else:
        deep = json_too_deep(value)
    if deep:
        raise LoopUsageError(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels", location=where,
                             fix="is this a pytest-loops run log?")
    return value


def is_venv(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` is a virtual environment: its ``pyvenv.cfg`` is a
    regular file. A directory or a link of that name makes none (code beside it would
    otherwise be taken for an installation, and go unwatched and unaudited)."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(path, "pyvenv.cfg")).st_mode)
    except OSError:
        return False

"""What the harness trusts, and how a child process is kept from forging it.

A loop's revise step and the code under test run as the same user as the
harness, in the same project. Anything they can write, they can forge: a run
log, a stored result, a loop file. So what the harness reads back is
authenticated with an HMAC under a key the children do not get:

- **run logs** (``artifacts/runlog.py``): a per-user key in a file outside the
  project, ``$XDG_STATE_HOME/pytest-loops/runlog.key`` (or
  ``$PYTEST_LOOPS_STATE_DIR/runlog.key``), 32 random bytes, mode 0600 in a
  0700 directory. Each event line carries a ``mac`` chained over the one
  before, so a line cannot be edited, dropped from the middle or reordered.
  A process of the same user *can* read that file; the key keeps out edits by
  a child that only writes into the project, not one that reads the user's
  state directory.
- **shared results** of a pytest session (``items.py``): a key made per session
  in the pytest controller, held in memory only and handed to xdist workers
  through ``workerinput``, never through the environment or a file.

This module holds the shared pieces: key files, MACs and their chaining,
digests, and the environment a child process may see.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

KEY_BYTES = 32
STATE_DIR_ENV = "PYTEST_LOOPS_STATE_DIR"
"""Where the run-log key lives instead of ``$XDG_STATE_HOME/pytest-loops``."""
SESSION_ENV_PREFIX = "PYTEST_LOOPS_SESSION"
"""Variables a child process never gets (see :func:`child_environment`)."""
RUNLOG_KEY_NAME = "runlog.key"


class KeyFileError(Exception):
    """The run-log key cannot be read or made; ``str()`` is one line saying why."""


# --------------------------------------------------------------------------- keys


def new_session_key() -> bytes:
    """A fresh random key for one pytest session (kept in memory only)."""
    return secrets.token_bytes(KEY_BYTES)


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$PYTEST_LOOPS_STATE_DIR``, else ``$XDG_STATE_HOME/pytest-loops``, else
    ``~/.local/state/pytest-loops``. A relative XDG_STATE_HOME is ignored, as the
    XDG spec says."""
    env = os.environ if environ is None else environ
    chosen = env.get(STATE_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser().absolute()
    xdg = env.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "pytest-loops"
    return Path.home() / ".local" / "state" / "pytest-loops"


def runlog_key_path(environ: Mapping[str, str] | None = None) -> Path:
    return state_dir(environ) / RUNLOG_KEY_NAME


def runlog_key(*, create: bool = False, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The per-user run-log key; None when it does not exist and ``create`` is False.

    With ``create``, a missing key is made: 32 random bytes, mode 0600, in a 0700
    directory, atomically (two processes making it at once agree on one key).
    A key file that is not a private regular file of this user, or has the wrong
    size, raises KeyFileError: a key others can read or write proves nothing.
    """
    path = runlog_key_path(environ)
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
    try:
        _make_private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # never replaces a key another process made first
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
        return _read_key(path)
    except FileNotFoundError:
        raise KeyFileError(f"cannot make the run-log key {path}: its directory vanished") from None
    except OSError as exc:
        raise KeyFileError(f"cannot make the run-log key {path}: {exc.strerror or exc}") from None


def _make_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise KeyFileError(f"{path} is not a directory")
    if hasattr(os, "geteuid") and info.st_uid == os.geteuid() and info.st_mode & 0o077:
        os.chmod(path, 0o700)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise KeyFileError(f"cannot read the run-log key {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"the run-log key {path} is not a regular file")
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise KeyFileError(f"the run-log key {path} belongs to another user")
        if info.st_mode & 0o077:
            raise KeyFileError(f"the run-log key {path} is readable or writable by others "
                               f"(mode {stat.S_IMODE(info.st_mode):04o}); it must be 0600")
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise KeyFileError(f"the run-log key {path} is {len(data)} bytes, not {KEY_BYTES}")
    return data


# --------------------------------------------------------------------------- MACs


def canonical_json(obj: Any) -> bytes:
    """One byte form of a JSON value: what a MAC covers. Raises ValueError for
    NaN and infinities and TypeError for what JSON cannot hold."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def mac(key: bytes, domain: str, *parts: bytes | str) -> str:
    """HMAC-SHA256 (hex) of ``parts`` under ``key``, bound to ``domain``. Each part is
    length-prefixed, so no two different part lists give the same message."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in (domain, *parts):
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else bytes(part)
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def mac_of_stream(key: bytes, domain: str, previous: str, body: IO[bytes], length: int) -> str:
    """:func:`mac` of ``(previous, body)`` where the body is ``length`` bytes read from
    the file ``body`` (from where it stands): a whole run's summary is MACed without
    holding its canonical form in memory."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in (domain, previous):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    h.update(length.to_bytes(8, "big"))
    left = length
    while left > 0:
        block = body.read(min(left, 1 << 16))
        if not block:
            break
        h.update(block)
        left -= len(block)
    return h.hexdigest()


def mac_matches(expected: str, given: Any) -> bool:
    """Constant-time comparison; anything but a string of the right form is False."""
    return isinstance(given, str) and len(given) == len(expected) and hmac.compare_digest(expected, given)


def json_mac(key: bytes, domain: str, obj: Any, previous: str = "") -> str | None:
    """The MAC of a JSON value chained after ``previous``; None when ``obj`` has no
    canonical form (NaN, infinities)."""
    try:
        body = canonical_json(obj)
    except (TypeError, ValueError):
        return None
    return mac(key, domain, previous, body)


class MacChain:
    """MACs over a sequence of JSON values, each covering the MAC before it:
    dropping, reordering or editing a value breaks every MAC after it."""

    def __init__(self, key: bytes, domain: str) -> None:
        self.key = key
        self.domain = domain
        self.last = ""

    def next(self, obj: Any) -> str | None:
        value = json_mac(self.key, self.domain, obj, self.last)
        if value is not None:
            self.last = value
        return value

    def verify(self, obj: Any, given: Any) -> bool:
        """Whether ``given`` is the next MAC for ``obj``; on success the chain moves on."""
        expected = json_mac(self.key, self.domain, obj, self.last)
        if expected is None or not mac_matches(expected, given):
            return False
        self.last = expected
        return True


# --------------------------------------------------------------------------- digests


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8", "surrogatepass"))


def sha256_file(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def identity_digest(**parts: Any) -> str:
    """sha256 (hex) of named parts, in a form where no two different part sets agree."""
    return hashlib.sha256(canonical_json({k: str(v) for k, v in parts.items()})).hexdigest()


_LINE_SUFFIX = re.compile(r":\d+(?::\d+)?(?: \(.*\))?$")


def source_file_path(source: str | None, cwd: str | os.PathLike | None = None) -> Path | None:
    """The file a loop came from, from a spec's ``source`` (``file.loop:LINE``, a
    config file); None for ``command line``, a test's node id or a missing file."""
    if not source or not isinstance(source, str) or "::" in source:
        return None
    text = _LINE_SUFFIX.sub("", source)
    candidates = [Path(text)]
    if not Path(text).is_absolute() and cwd:
        candidates.append(Path(cwd) / text)
    for candidate in candidates:
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:
            continue
    return None


def source_file_record(source: str | None, cwd: str | os.PathLike | None = None) -> dict[str, str] | None:
    """``{"path": ABSOLUTE, "sha256": "sha256:..."}`` of the file a loop came from, or None."""
    path = source_file_path(source, cwd)
    if path is None:
        return None
    try:
        return {"path": str(path), "sha256": sha256_file(path)}
    except OSError:
        return None


# --------------------------------------------------------------------------- child processes


def signing_key_variables(options: Any) -> list[str]:
    """Names of the environment variables holding signing keys in ``options``: an
    ArtifactOptions (``hmac_key_env``), the run command's arguments (``sign_key_env``,
    ``key_env``) or a mapping with those keys. A child process must not see them."""
    names: list[str] = []
    for attr in ("hmac_key_env", "sign_key_env", "key_env", "loop_sign_key_env"):
        if isinstance(options, Mapping):
            value = options.get(attr)
        else:
            value = getattr(options, attr, None)
        if isinstance(value, str) and value and value not in names:
            names.append(value)
    return names


def child_environment(env: Mapping[str, str], *, drop: Iterable[str] = ()) -> dict[str, str]:
    """``env`` for a child process (a check, a revise step): without the variables
    named in ``drop`` (e.g. :func:`signing_key_variables`) and without any variable
    starting with ``PYTEST_LOOPS_SESSION``."""
    dropped = {name for name in drop if name}
    return {name: value for name, value in env.items()
            if name not in dropped and not name.startswith(SESSION_ENV_PREFIX)}

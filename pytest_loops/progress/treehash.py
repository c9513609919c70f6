"""The one way a file or a tree is hashed: sha256.

Every digest of a file's bytes in the package comes from here: the state
fingerprint of the no-progress guard (:mod:`pytest_loops.progress.fingerprint`),
the file snapshot and code-block fingerprints of the impact map
(:mod:`pytest_loops.localization.impact`), and the digest of a check's full
output (:func:`pytest_loops.core.checks.digest_file`).

Why sha256 and not blake2b:

* it is what is already on disk and in the documentation: a run log's
  ``state_hash`` and ``output_digest``, a ``.tine`` file's digests and a spec's
  digest are all ``sha256:<hex>``, so keeping it leaves every persisted state
  fingerprint and output digest unchanged;
* it is the faster of the two wherever the CPU has SHA instructions (x86 since
  about 2017, ARMv8): hashlib's sha256 is OpenSSL's, its blake2b is not (on the
  machine the benchmarks run on, 2.1 GB/s against 1.4 GB/s);
* ``hashlib.file_digest`` reads a file into the hash without a Python loop.

Cached digests follow git's racy-clean rule: a file whose mtime is within
:data:`RACY_WINDOW_NS` of the moment it was hashed may be rewritten within the
same timestamp tick without its stat changing, so its digest is trusted only
once that window is past (:class:`CachedDigest`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from pytest_loops.deadline import DeadlineReached, ShouldStop

if TYPE_CHECKING:
    from hashlib import _Hash

__all__ = [
    "ALGORITHM",
    "HASH_CHUNK",
    "PREFIX",
    "RACY_WINDOW_NS",
    "CachedDigest",
    "bytes_digest",
    "error_marker",
    "file_digest",
    "hash_file",
    "new_hash",
    "stat_signature",
]

ALGORITHM = "sha256"
PREFIX = ALGORITHM + ":"

# A file whose mtime is this close to (or after) the moment it was hashed may be
# rewritten within the same timestamp tick without its stat changing, so its
# cached digest is not trusted. 2 s covers filesystems with coarse timestamps
# (FAT: 2 s, HFS+/ext3: 1 s); git solves the same problem the same way.
RACY_WINDOW_NS = 2_000_000_000

# Files larger than this are hashed chunk by chunk, asking ``should_stop`` between
# chunks: one big file cannot hold the loop past its budget.
HASH_CHUNK = 1 << 20

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    # A FIFO swapped in between stat and open must not block the loop forever.
    | getattr(os, "O_NONBLOCK", 0)
)

Signature = tuple[int, int, int, int, int]


class CachedDigest(NamedTuple):
    """A file's digest with the stat it was taken under."""

    signature: Signature
    digest: str
    trusted: bool  # False: hashed inside the racy window, hash again next time


def new_hash(data: bytes = b"") -> _Hash:
    """A fresh hash object of :data:`ALGORITHM`, fed ``data``."""
    return hashlib.sha256(data)


def bytes_digest(data: bytes) -> str:
    """The hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The hex digest of a file's bytes; raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, ALGORITHM).hexdigest()


def stat_signature(st: os.stat_result) -> Signature:
    """What a cached digest is valid for: size, mtime, inode, device, ctime.

    ctime is not settable from user space, so an in-place rewrite that restores
    the old mtime with os.utime still shows up here (where ctime is meaningful).
    """
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def error_marker(exc: OSError) -> str:
    """What stands for a file that could not be read."""
    return f"error:{type(exc).__name__}:{exc.errno}"


def hash_file(path: str, should_stop: ShouldStop | None = None) -> CachedDigest | str:
    """Hash one file; a marker string if it cannot be read or is not a regular file.

    Never blocks on a FIFO. A file larger than :data:`HASH_CHUNK` asks
    ``should_stop`` between chunks and raises
    :class:`~pytest_loops.deadline.DeadlineReached` when it answers true.
    """
    hashed_at = time.time_ns()
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return error_marker(exc)
    try:
        with open(fd, "rb", closefd=True) as f:
            # The stat of the very file we read, taken before reading it.
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return f"special:{stat.S_IFMT(st.st_mode):o}"
            if should_stop is None or st.st_size <= HASH_CHUNK:
                digest = hashlib.file_digest(f, ALGORITHM).hexdigest()
            else:
                digest = _chunked_digest(f, should_stop, path)
    except OSError as exc:
        return error_marker(exc)
    trusted = st.st_mtime_ns < hashed_at - RACY_WINDOW_NS
    return CachedDigest(stat_signature(st), digest, trusted)


def _chunked_digest(f: BinaryIO, should_stop: ShouldStop, path: str) -> str:
    """The digest of an open file, read :data:`HASH_CHUNK` bytes at a time, asking
    ``should_stop`` before each chunk (as fast as ``hashlib.file_digest``)."""
    h = new_hash()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    while True:
        if should_stop():
            raise DeadlineReached(f"while fingerprinting the state: in the middle of hashing {path}")
        n = f.readinto(buf)  # type: ignore[attr-defined]  # an unbuffered or buffered file
        if not n:
            return h.hexdigest()
        h.update(view[:n])

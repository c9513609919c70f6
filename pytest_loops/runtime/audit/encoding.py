"""Python sources read the way Python reads them: the declared encoding, not UTF-8 by default.

A source file may declare its encoding on its first or second line (PEP 263). Read as
UTF-8, a file that declares ``utf-7`` is a comment; read by Python, ``+AAo-`` in that
comment is a new line and what follows it is code. The audit therefore reads every
changed source through :func:`decode_source` (Python's own reader), and a coding line the
revise step added whose codec does not read ASCII as ASCII is a finding of its own
(rule ``source-encoding``): nothing a reviewer sees in the diff is what runs.
"""

from __future__ import annotations

import codecs
import functools
import importlib.util
import io
import re
import tokenize

from pytest_loops.runtime.audit.model import Finding

# every printable ASCII character and the white space of source text
_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n\r\f"
# PEP 263's coding line, as the tokenizer matches it
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


def decode_source(data: bytes) -> str:
    """``data`` decoded as Python decodes a source file (its BOM or coding line, universal
    newlines); UTF-8 with replacement characters when the declaration is unknown or the
    bytes do not decode."""
    try:
        return importlib.util.decode_source(data)
    except (SyntaxError, LookupError, UnicodeDecodeError, ValueError):
        return data.decode("utf-8", "replace")


def declared_encoding(data: bytes) -> str | None:
    """The codec a coding line of ``data`` names (None: no coding line, or one Python refuses)."""
    try:
        encoding, lines = tokenize.detect_encoding(io.BytesIO(data).readline)
    except (SyntaxError, LookupError, UnicodeDecodeError, ValueError):
        return None
    # detect_encoding answers utf-8 when nothing is declared: only a cookie counts here
    if not any(_COOKIE.match(line) for line in lines):
        return None
    return encoding


@functools.lru_cache(maxsize=64)
def reads_ascii_as_ascii(encoding: str) -> bool:
    """Whether ``encoding`` decodes every printable ASCII byte as itself."""
    try:
        return codecs.decode(_ASCII, encoding) == _ASCII.decode("ascii")
    except (LookupError, UnicodeDecodeError, ValueError, TypeError):
        return False


def encoding_finding(path: str, data: bytes, before: bytes | None) -> Finding | None:
    """A ``source-encoding`` finding when ``data`` declares a codec that reads ASCII otherwise
    than as ASCII and ``before`` (the file at loop start, None: new) did not declare it."""
    encoding = declared_encoding(data)
    if encoding is None or reads_ascii_as_ascii(encoding):
        return None
    if before is not None and declared_encoding(before) == encoding:
        return None
    lines = data.splitlines()[:2]
    line = next((i for i, text in enumerate(lines, 1) if _COOKIE.match(text)), 1)
    return Finding(
        path, line, "source-encoding",
        f"the revise step declared the source encoding {encoding!r}, in which plain ASCII does not read as "
        f"itself: what a reader of the diff sees is not the code Python runs",
        lines[line - 1].decode("latin-1") if lines else "")

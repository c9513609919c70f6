"""Files the audit cannot read: compiled or binary files a revise step adds or changes in scope.

A compiled module beside the code under repair (``calc.cpython-312-x86_64-linux-gnu.so``
is imported before ``calc.py``), a sourceless ``.pyc``, a zip or egg put on the import
path: each can carry whatever the checks need without a line the audit could quote. Such
a file is a finding of its own (rule ``binary-file``) unless a glob of ``audit_allow``
(``--audit-allow``) names it, or it is a file test tools write themselves (``TOOL_FILES``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence

from pytest_loops.runtime.audit.model import Finding

# compiled code and archives, whatever their bytes
COMPILED_SUFFIXES = (".so", ".pyd", ".pyc", ".pyo", ".dll", ".dylib", ".egg", ".whl", ".zip", ".jar",
                     ".exe", ".o", ".a", ".bin")
_MAGIC = (b"\x7fELF", b"PK\x03\x04", b"MZ", b"\xca\xfe\xba\xbe", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe")
_SNIFF = 8192
# what test tools write on their own, never imported: coverage data (a revise step that runs the
# tests under coverage leaves it), macOS folder metadata
TOOL_FILES = ("**/.coverage", "**/.coverage.*", "**/.DS_Store")
_VERSIONED_SO = re.compile(r"\.so(?:\.\d+)+$")


def not_text(path: str) -> str | None:
    """Why the regular file at ``path`` is not text the audit can read (None: it is text,
    or it is gone or not a regular file)."""
    name = os.path.basename(path).lower()
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError:
        return None
    suffix = next((s for s in COMPILED_SUFFIXES if name.endswith(s)), None)
    if suffix or _VERSIONED_SO.search(name):
        return f"a compiled or archive file ({suffix or '.so'})"
    if head.startswith(_MAGIC):
        return "an executable or archive by its first bytes"
    if b"\0" in head:
        return "binary content (NUL bytes)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4 or len(head) < _SNIFF:  # not a character cut at the end
            return "not UTF-8 text"
    return None


def binary_findings(root: str, changes: Iterable[tuple[str, str]], allow: Sequence[str] = ()) -> list[Finding]:
    """One ``binary-file`` finding per in-scope file added or changed since the loop started
    (``changes``: (relative path, how) pairs) that is not text and that no ``allow`` glob names.
    Python sources are audited as text; bytecode caches are removed after every revise step."""
    from pytest_loops.runtime.protect.rules import matches

    allow = (*TOOL_FILES, *(a for a in allow if a))
    findings: list[Finding] = []
    for rel, how in changes:
        if how == "deleted" or rel.endswith(".py") or "__pycache__" in rel.split("/"):
            continue
        if matches(rel, allow):
            continue
        why = not_text(os.path.join(root, rel))
        if why is None:
            continue
        try:
            size = f"<{os.path.getsize(os.path.join(root, rel))} bytes>"
        except OSError:
            size = "<gone>"
        findings.append(Finding(
            rel, 1, "binary-file",
            f"the revise step {'added' if how == 'added' else 'changed'} a file that is not text ({why}): "
            f"the audit cannot read what it does, and compiled code or an archive can stand in for the "
            f"code under repair (--audit-allow GLOB, under pytest --loop-audit-allow GLOB, allows it)", size))
    return findings

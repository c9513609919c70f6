"""What a revise step may change: an allow-list, enforced around every revise.

A loop has a *scope*: the paths its revise step may change. By default that is
every file under the loop's working directory except the ones that judge the
code: test files and everything under test directories, ``conftest.py``
anywhere, every configuration file pytest reads (of any name pytest knows, also
in the ancestor directories it searches), loop files and the harness config
(``loop-runner.config.yaml`` by name, and the files the loop's settings came from),
virtual environments (those there at loop start), ``.pth`` and ``sitecustomize``
files, new modules that would shadow any module importable from outside the tree,
distribution metadata on the judged ``sys.path`` (:mod:`.syspath`), symbolic links
and executables, and the git files that name programs git runs: ``.gitattributes``
anywhere, and outside the walk ``.git/config``, ``.git/hooks/``,
``.git/info/attributes`` and ``.git`` itself (:mod:`~pytest_loops.runtime.protect.gitpaths`).
``scope`` globs narrow the scope; ``protect`` globs add read-only paths.

:class:`TreeGuard` copies the read-only files (and the in-scope Python files,
for the diff audit) into a private store when the loop starts. Around each
revise it learns what changed from the change journal (inotify; a stat walk
where the journal cannot vouch), so the cost is proportional to what changed,
not to the tree. A change to a read-only path is undone from the store, never
through a symbolic link (a link is replaced, not followed), and ends the loop
ESCALATE. The clean room (:mod:`pytest_loops.runtime.cleanroom`) is built from the same
store: loop-start read-only files plus the in-scope files as they are now.
"""

from __future__ import annotations

from pytest_loops.runtime.protect.guard import TreeGuard
from pytest_loops.runtime.protect.rules import (
    ANCESTOR_NAMES,
    AUDIT_MAX_BYTES,
    CACHE_REASON,
    CONFIG_NAMES,
    COPY_BLOCK,
    DEFAULT_TEST_FILES,
    IGNORED_DIRS,
    MEMORY_FILE_BYTES,
    MEMORY_TOTAL_BYTES,
    PYCACHE,
    SHADOW_MODULES,
    SKIP_DIRS,
    STARTUP_NAMES,
    TEST_DIR,
    check_files,
    describe,
    matches,
    named_test_files,
    walk,
)
from pytest_loops.runtime.protect.tree import (
    Entry,
    RevisePass,
    Stored,
    Violation,
    file_digest,
    printable,
)

__all__ = [
    "ANCESTOR_NAMES",
    "AUDIT_MAX_BYTES",
    "CACHE_REASON",
    "CONFIG_NAMES",
    "COPY_BLOCK",
    "DEFAULT_TEST_FILES",
    "Entry",
    "IGNORED_DIRS",
    "MEMORY_FILE_BYTES",
    "MEMORY_TOTAL_BYTES",
    "PYCACHE",
    "RevisePass",
    "SHADOW_MODULES",
    "SKIP_DIRS",
    "STARTUP_NAMES",
    "Stored",
    "TEST_DIR",
    "TreeGuard",
    "Violation",
    "check_files",
    "describe",
    "file_digest",
    "matches",
    "named_test_files",
    "printable",
    "walk",
]

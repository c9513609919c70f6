"""Reading what a loop's first verify observed its tests read (the judge's closure).

The pytest runs of the first verify write ``closure-<pid>.json`` files
(:mod:`pytest_loops.pytest_plugin.closure`); this turns them into read-only
paths of the tree, each with its reason. A file that is not such a record, or a
path outside the tree, is ignored: the rules by name still hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_loops.limits import read_own_text

READ_REASON = "read by the tests (seen in the first verify)"
HELPER_REASON = "a helper module only the tests import (seen in the first verify)"
TESTS_REASON = "a file pytest collected tests from (seen in the first verify)"
MAX_RECORD_BYTES = 8 << 20


def read_closure(directory: Path, root: str) -> dict[str, str]:
    """Tree-relative path -> why it is read-only, from every record in ``directory``."""
    root = os.path.realpath(root)
    found: dict[str, str] = {}
    try:
        records = sorted(directory.glob("closure-*.json"))
    except OSError:
        return found
    for record in records:
        try:
            if record.stat().st_size > MAX_RECORD_BYTES:
                continue
            data = json.loads(read_own_text(record))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for key, reason in (("tests", TESTS_REASON), ("helpers", HELPER_REASON), ("read", READ_REASON)):
            paths = data.get(key)
            if not isinstance(paths, list):
                continue
            for path in paths:
                if not isinstance(path, str) or not os.path.isabs(path):
                    continue
                full = os.path.realpath(path)
                if not full.startswith(root + os.sep):
                    continue
                found.setdefault(os.path.relpath(full, root).replace(os.sep, "/"), reason)
    return found

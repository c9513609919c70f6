"""The guard's private store on disk: named by its harness, swept when that harness is gone."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

STORE_PREFIX = "pytest-loops-store-"


def _owner_tag(pid: int) -> str | None:
    """``PID-START`` of a live process (start time in clock ticks since boot: a reused
    pid has another), None when it is gone."""
    from pytest_loops.runtime.reaper import read_stat

    proc = read_stat(pid)
    return None if proc is None or proc.zombie else f"{pid}-{proc.start}"


def store_prefix() -> str:
    """The private store's name: the harness's pid and start time, so a later loop can
    tell the store of a harness that was killed (SIGKILL leaves no chance to clean up)."""
    return f"{STORE_PREFIX}{_owner_tag(os.getpid()) or os.getpid()}-"


def sweep_stale_stores(directory: str | None = None) -> list[str]:
    """Remove the stores of harnesses that are gone (ours only: same owner); returns them."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(STORE_PREFIX)]
    except OSError:
        return removed
    for name in names:
        parts = name[len(STORE_PREFIX):].split("-")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            continue  # an older store, or not one: left alone
        path = os.path.join(directory, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        if _owner_tag(int(parts[0])) == f"{parts[0]}-{parts[1]}":
            continue  # its harness still runs
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed

"""Shared fixtures: a contract-test harness and a way to run the standalone runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import yaml  # noqa: F401
from plugin_helpers import clean_env

from pytest_loops.testing import LoopHarness

# yaml is loaded here, in the outer process: the plugin imports it on first use, and
# pytester's in-process runs drop modules first imported inside them, but pyyaml's C
# parser keeps the first import's classes, so a second import parses every scalar with
# no tag ("could not determine a constructor for the tag None").

# A suite started in the background of a shell without job control inherits SIGINT
# ignored, and so would every process it starts: the Ctrl-C tests would test nothing.
# Python's own handler here means the processes the tests start get the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Run-log keys of every loop the tests start (in this process and in the processes it
# spawns, which inherit the environment) go to a temporary directory, never the
# real home directory.
# The process that makes the directory (the controller under xdist: its workers and every
# process they start inherit the variable) removes it when it exits.
if "XDG_STATE_HOME" not in os.environ or "pytest-loops-tests-" not in os.environ["XDG_STATE_HOME"]:
    import atexit
    import shutil
    import tempfile

    os.environ["XDG_STATE_HOME"] = _STATE_DIR = tempfile.mkdtemp(prefix="pytest-loops-tests-state-")
    atexit.register(shutil.rmtree, _STATE_DIR, ignore_errors=True)

# A fix-loop records no impact map in a CI job: the tests say themselves when they are one.
for _ci in ("CI", "BUILD_NUMBER"):
    os.environ.pop(_ci, None)

# The session fix-loop's impact map is measured in its judged run here ('inline'), not by a
# detached recorder after the verdict (the default, 'background'): a test's tree is removed
# when it ends, and no process of the suite outlives its test. The recorder's own tests
# (test_fixloop_background_map.py, the map attacks) ask for 'background' and wait for it.
os.environ.setdefault("PYTEST_LOOPS_IMPACT_MAP", "inline")


@pytest.fixture(autouse=True)
def sandbox_writable(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loops run in the strongest isolation tier this machine has (the default, auto), where
    the revise step sees a private /tmp. Many tests keep evidence beside the project they
    make (a call log, a counter, pid files) under their own tmp_path: that directory is
    ``sandbox_writable``, as a user names the state their revise script keeps. Tests of
    the isolation itself (tests/test_sandbox*.py, the adversarial suite) set their own;
    tests marked ``floor`` test the detect-and-undo layer alone: the ``none`` tier."""
    if request.node.get_closest_marker("floor") is not None:
        monkeypatch.setenv("PYTEST_LOOPS_SANDBOX", "none")
    if "tmp_path" in request.fixturenames:
        monkeypatch.setenv("PYTEST_LOOPS_SANDBOX_WRITABLE", str(request.getfixturevalue("tmp_path")))
    elif "pytester" in request.fixturenames:  # its own directory, from tmp_path_factory
        monkeypatch.setenv("PYTEST_LOOPS_SANDBOX_WRITABLE", str(request.getfixturevalue("pytester").path))


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment for a subprocess running pytest-loops (see :func:`clean_env`)."""
    return clean_env()


@pytest.fixture
def harness(tmp_path: Path) -> LoopHarness:
    """A LoopHarness whose workspaces live under this test's tmp_path."""
    return LoopHarness(tmp_path / "harness")


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python -m pytest_loops ARGS`` in a subprocess (cwd: tmp_path by default)."""

    def run(*args: str, cwd: str | os.PathLike[str] | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest_loops", *args],
                              cwd=cwd or tmp_path, env=clean_env(env), capture_output=True,
                              text=True, timeout=timeout)

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """PYTEST_LOOPS_SLOW_SLICE=I/K keeps, of the tests marked slow, the I-th of K slices
    (by a digest of each test's id, so a test stays in its slice from run to run); the
    tests not marked slow all stay. CI's slow tail runs the slice the commit's hash picks;
    `-m slow` without the variable runs them all."""
    value = os.environ.get("PYTEST_LOOPS_SLOW_SLICE", "")
    if not value:
        return
    import zlib

    try:
        index, count = (int(part) for part in value.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"PYTEST_LOOPS_SLOW_SLICE={value!r}: give I/K with 0 <= I < K, "
                                "e.g. 0/4") from None
    keep, drop = [], []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        mine = zlib.crc32(item.nodeid.encode()) % count == index
        (keep if not slow or mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

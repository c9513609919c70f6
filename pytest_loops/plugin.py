"""pytest glue: options, collection, reporting. The loop logic lives in the engine."""

from __future__ import annotations

import pytest


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.fixture
def loop_harness(tmp_path_factory: pytest.TempPathFactory):
    """A :class:`pytest_loops.testing.LoopHarness` with its own temporary base directory."""
    from .testing import LoopHarness

    return LoopHarness(tmp_path_factory.mktemp("loop-harness"))

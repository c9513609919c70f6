"""The plugin manager the standalone runner uses for the `pytest_loop_*` hooks."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable

import pluggy

from pytest_loops.core import hookspecs
from pytest_loops.core.checks import BuiltinChecks
from pytest_loops.core.revise import BuiltinRevise
from pytest_loops.errors import LoopUsageError

ENTRY_POINT_GROUP = "pytest_loops.plugins"

_PLAIN_HOOK_OPTS = {"wrapper": False, "hookwrapper": False, "optionalhook": False,
                    "tryfirst": False, "trylast": False, "specname": None}


class LoopPluginManager(pluggy.PluginManager):
    """Takes ``pytest_loop_*`` functions without a ``@hookimpl`` marker too.

    pytest does so for conftest and plugin hooks; without this, the same plugin
    module would work under pytest and be silently ignored by ``pytest-loops run -p``.
    """

    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("pytest_loop_") and inspect.isroutine(getattr(plugin, name, None)):
            opts = dict(_PLAIN_HOOK_OPTS)
        return opts


def register_builtins(pm: pluggy.PluginManager) -> None:
    """Add the built-in check and revise implementations (both `trylast`)."""
    from pytest_loops.runtime.audit import BuiltinAuditor

    builtins = (("loop-builtin-checks", BuiltinChecks()), ("loop-builtin-revise", BuiltinRevise()),
                ("loop-builtin-audit", BuiltinAuditor()))
    for name, plugin in builtins:
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)


def make_plugin_manager(plugins: Iterable[object | str] = (), *, entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with our hookspecs, the built-ins and the given plugins.

    Strings are module names imported and registered (like pytest's ``-p``).
    """
    pm = LoopPluginManager("pytest")
    pm.add_hookspecs(hookspecs)
    register_builtins(pm)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in plugins:
        if isinstance(plugin, str):
            try:
                plugin = importlib.import_module(plugin)
            except ImportError as exc:  # a bad -p value is bad input, not an internal error
                raise LoopUsageError(f"cannot import plugin module {plugin!r}: {exc}", location="-p",
                                     fix="check the name and that its directory is on PYTHONPATH") from None
        pm.register(plugin)
    return pm

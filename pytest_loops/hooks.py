"""The plugin manager the standalone runner uses for the `pytest_loop_*` hooks."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

import pluggy

from . import hookspecs
from .checks import BuiltinChecks
from .revise import BuiltinRevise

ENTRY_POINT_GROUP = "pytest_loops.plugins"


def register_builtins(pm: pluggy.PluginManager) -> None:
    """Add the built-in check and revise implementations (both `trylast`)."""
    for name, plugin in (("loop-builtin-checks", BuiltinChecks()), ("loop-builtin-revise", BuiltinRevise())):
        if pm.get_plugin(name) is None:
            pm.register(plugin, name=name)


def make_plugin_manager(plugins: Iterable[object | str] = (), *, entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with our hookspecs, the built-ins and the given plugins.

    Strings are module names imported and registered (like pytest's ``-p``).
    """
    pm = pluggy.PluginManager("pytest")
    pm.add_hookspecs(hookspecs)
    register_builtins(pm)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in plugins:
        if isinstance(plugin, str):
            plugin = importlib.import_module(plugin)
        pm.register(plugin)
    return pm

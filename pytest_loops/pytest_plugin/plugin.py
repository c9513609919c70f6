"""pytest glue: options, settings, registration. The loop logic lives in the engine.

Without ``--loop`` nothing changes: no revise command runs and no artifact is
written, whatever markers or ``--loop-*`` options are present.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_loops.defaults import CLOSURE_ENV
from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.options import (
    AUDIT_CHOICES,
    CHILD_ENV,
    EXITCODE_CHOICES,
    SUSPECTS_CHOICES,
    TINE_CHOICES,
    artifact_options,
    choice_value,
    ini_value,
    option_value,
    usage_error,
)
from pytest_loops.settings import (
    BY_NAME,
    ENV_NAMES,
    MARKER_KEYS,
    PYTEST_DEFAULTS,
    Resolved,
    env_layer,
    option_rows,
    resolve,
)

MARKER = (
    "loop(" + ", ".join(f"{key}=None" for key in MARKER_KEYS) + "): under --loop, when this test fails, run "
    "the revise command and re-run the test in a fresh pytest process until it passes "
    "or a guard stops the loop (MAX_ITER, TIMEOUT, NO_PROGRESS, ESCALATE)."
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_loops.core import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loop", "pytest-loops: bounded fix-loops around tests")
    group.addoption("--loop", action="store_true", default=False,
                    help="run loops: fix-loops around failing tests (marker or --loop-revise) and loop files")
    for row in option_rows():  # generated from the settings table
        assert row.option is not None and row.ini is not None
        help_text = row.help + (" (repeatable)" if row.repeatable else "")
        for option in row.options:  # an old spelling keeps its own dest: the new one wins over it
            if row.bare:  # a flag alone: `--loop-watch`
                group.addoption(option, action="store_const", const="on", default=None,
                                dest=row.option_dest(option), help=help_text)
                continue
            group.addoption(option, action="append" if row.repeatable else "store", default=None,
                            dest=row.option_dest(option), metavar=row.shown_metavar,
                            help=help_text if option == row.option else f"the same as {row.option}")
        for ini in row.inis:
            ini_help = row.help if ini == row.ini else f"the same as {row.ini}"
            if row.repeatable:
                parser.addini(ini, ini_help, type="linelist", default=None)
            else:
                parser.addini(ini, ini_help, type="string", default=None)
    group.addoption("--loop-resume", action="store_true", default=False,
                    help="continue each loop from its latest unfinished or stopped run log in the "
                         "artifacts directory (iterations, streak and spent budget carry over)")
    parser.addini("loop_paths", "directories (or files) whose loop files are collected under --loop "
                  "when no paths are given on the command line", type="paths", default=[])


def _layer(spellings, read, where) -> dict[str, Any]:
    """One layer (ini or command line) of every setting with a pytest option, validated.

    ``spellings(row)`` lists the row's names on that surface, the new one first: the
    first one given wins, and a bad value names the spelling it was given under."""
    layer: dict[str, Any] = {}
    for row in option_rows():
        if row.name == "config":
            continue
        for spelling in spellings(row):
            raw = read(spelling)
            if raw is not None:
                layer[row.name] = row.parse(list(raw) if row.repeatable else raw, where(spelling))
                break
    return layer


def build_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Resolved:
    """The one place precedence is applied for pytest:
    defaults < config file < ini < environment < command line (< marker, per test)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    config_file = config.getoption("loop_config") or ini_value(config, "config")
    if config_file:
        path = Path(config_file)
        if not path.is_absolute():
            path = Path(config.rootpath) / path
        if not path.is_file():  # name our option, not the standalone runner's --config
            where = "--loop-config" if config.getoption("loop_config") else "ini loop_config"
            raise LoopUsageError(f"{config_file!r} is not a file (looked for {path})", location=where,
                                 fix="give a loop-runner yaml file; a relative path is from the rootdir")
        from pytest_loops.sources.config import read_runner_config

        file_layer = read_runner_config(path)
        file_layer.pop("unknown_keys", None)
        file_layer.pop("verified", None)
        file_layer.pop("verify", None)
        file_layer.pop("log_path", None)
        layers.append((str(path), file_layer))
    layers.append(("ini", _layer(lambda row: row.inis, lambda ini: ini_value(config, ini[len("loop_"):]),
                                 lambda ini: f"ini {ini}")))
    layers.append(("environment", env_layer(environ)))
    layers.append(("command line", _layer(lambda row: row.options,
                                          lambda option: config.getoption(option[2:].replace("-", "_")),
                                          lambda option: option)))
    return resolve(layers, defaults=PYTEST_DEFAULTS)


def _sandbox_origin(settings: Resolved) -> str:
    origin = settings.origin.get("sandbox", "")
    row = BY_NAME["sandbox"]
    return {"command line": str(row.option), "ini": f"ini {row.ini}", "environment": str(row.env)}.get(origin, origin)


def check_outputs(config: pytest.Config, settings: Resolved) -> None:
    """Every path a loop writes is checked before the first test runs (see outputs.py)."""
    from pytest_loops.runtime.outpaths import REPORT, check_output_path

    def where(key: str) -> str:
        """The spelling the path was given under (an old one when that was written)."""
        row, origin = BY_NAME[key], settings.origin.get(key, "default")
        given = {"command line": lambda: next((o for o in row.options if config.getoption(row.option_dest(o))), None),
                 "ini": lambda: next((f"ini {i}" for i in row.inis if ini_value(config, i[len("loop_"):])), None),
                 "environment": lambda: next((f"environment variable {v}" for v in row.envs if os.environ.get(v)),
                                             None)}.get(origin, lambda: None)()
        if given:
            return given
        return {"command line": str(row.option), "ini": f"ini {row.ini}", "default": str(row.option),
                "environment": "environment variable " + ENV_NAMES.get(key, "")}.get(
                    origin, f"{origin}: reflexion.episodic_memory_page")  # only the page comes from a file

    root = config.rootpath
    check_output_path(settings["artifacts"] or ".pytest-loops", where("artifacts"), base=root,
                      directory=True)
    if settings["lessons"]:
        check_output_path(settings["lessons_page"], where("lessons_page"), base=root)
    report = config.getoption("loop_report")
    check_output_path(report or ini_value(config, "report"), "--loop-report" if report else "ini loop_report",
                      base=config.invocation_params.dir, kind=REPORT)


VALUE_FLAGS = tuple(option for row in option_rows() if not row.bare for option in row.options)


def _given_flags(args: list[str]) -> list[str]:
    """The value-taking ``--loop-*`` flags on this command line (either form)."""
    return [a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in VALUE_FLAGS]


def _plain_rootdir(config: pytest.Config, args: list[str]) -> Path | None:
    """The rootdir pytest would take from ``args`` (None when that cannot be asked)."""
    try:
        import inspect

        from _pytest.config.findpaths import determine_setup

        kwargs: dict[str, Any] = {
            "inifile": config.known_args_namespace.inifilename, "args": args,
            "rootdir_cmd_arg": config.known_args_namespace.rootdir or None,
            "invocation_dir": Path(config.invocation_params.dir), "override_ini": None}
        accepted = inspect.signature(determine_setup).parameters
        return Path(determine_setup(**{k: v for k, v in kwargs.items() if k in accepted})[0])
    except Exception:  # a private helper: without it, the check below is skipped
        return None


def check_space_form(config: pytest.Config, args: list[str]) -> str | None:
    """The message when a ``--loop-* VALUE`` (space form) value moved the rootdir.

    pytest settles the rootdir before plugin options are known, so it reads such a value
    as a test path too: an existing path outside the project drags the rootdir (and with
    it artifacts, the revise step's cwd and the state) elsewhere.
    """
    for i, arg in enumerate(args[:-1]):
        value = args[i + 1]
        if arg not in VALUE_FLAGS or value.startswith("-"):
            continue
        if not (Path(config.invocation_params.dir) / value).exists():
            continue
        positional = [a for j, a in enumerate(args) if not a.startswith("-") and j != i + 1
                      and not (j > 0 and args[j - 1] in VALUE_FLAGS)]
        plain = _plain_rootdir(config, positional)
        if plain is None or plain == Path(config.rootpath):
            continue
        return (f"{arg} {value}: pytest reads a value given after a space as a test path too, "
                f"which moved the rootdir from {plain} to {config.rootpath}; write {arg}={value}")
    return None


_closure_started = False  # this process records the judge's closure (a loop's first verify)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: Any, args: Any) -> None:
    """A loop's first verify: what the tests read is recorded from before the first
    conftest is imported (:mod:`pytest_loops.pytest_plugin.closure`)."""
    global _closure_started
    fix_loop = _fix_loop_requested(early_config)
    if not (os.environ.get(CLOSURE_ENV) or fix_loop):
        return  # nothing imported: the usual run pays nothing
    if fix_loop:
        _open_map_store(early_config)
    from pytest_loops.pytest_plugin import closure

    _closure_started = True
    try:
        patterns = tuple(str(p) for p in early_config.getini("python_files"))
    except (ValueError, KeyError):
        patterns = ()
    out = None
    if fix_loop and not os.environ.get(closure.VARIABLE):
        import tempfile

        out = tempfile.mkdtemp(prefix="closure-")
        os.environ[closure.VARIABLE] = out  # the session's xdist workers record too
    closure.start(os.environ.get("LOOP_WORKDIR") or str(early_config.rootpath), patterns or None, out=out)


def _open_map_store(config: pytest.Config) -> None:
    """The session fix-loop's stored impact map, read (and taken off the disk) before the
    first conftest is imported: no code of the session's own run, which is no loop's and
    runs unconfined, can put a map of its own in its place. Settled when the session ends
    (:func:`pytest_unconfigure`) if no fix-loop did."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller's: a worker's run is the session's too
    if _early_setting(config, "confirm") == "full":
        return  # such a loop never reads the store
    from pytest_loops.localization.mapstore import MapStore
    from pytest_loops.pytest_plugin.state import MAP_STORE_KEY

    inipath = config.inipath
    store = MapStore(config.rootpath, str(inipath) if inipath else None)
    store.load()
    config.stash[MAP_STORE_KEY] = store


def _fix_loop_requested(config: pytest.Config) -> bool:
    """``--loop-revise`` (or its ini key or variable) on a session that is not itself one the
    harness started: its failing tests become a fix-loop whose first verify is this run."""
    if os.environ.get(CHILD_ENV) or _judged():
        return False
    known = getattr(config, "known_args_namespace", None)
    if not getattr(known, "loop", None):
        return False
    return bool(_early_setting(config, "revise"))


def _early_setting(config: pytest.Config, name: str) -> Any:
    """A setting as known before the first conftest is imported: the command line's
    (pytest's known arguments), else its environment variable, else its ini key."""
    row = BY_NAME[name]
    known = getattr(config, "known_args_namespace", None)
    return getattr(known, row.dest, None) or os.environ.get(str(row.env)) or ini_value(config, name)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The files the tests were collected from: read-only for the loop, whatever their names."""
    if _closure_started:
        from pytest_loops.pytest_plugin import closure

        closure.collected(list(session.items))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker's record is written before it tells the controller it finished."""
    if _closure_started and hasattr(session.config, "workerinput"):
        from pytest_loops.pytest_plugin import closure

        closure.finish()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _closure_started:
        from pytest_loops.pytest_plugin import closure

        closure.finish()
        # a fix-loop session (the closure's trigger too) opened the map's store early:
        # nothing is imported for the usual session
        from pytest_loops.pytest_plugin.state import MAP_STORE_KEY

        store = config.stash.get(MAP_STORE_KEY, None)
        if store is not None:  # opened before the session ran; settling twice changes nothing
            store.settle()


def _judged() -> bool:
    """Whether the harness judges this run (its witness found a channel)."""
    from pytest_loops.runtime import judge

    return judge.active()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``pytest --loop-watch``: this process watches, and every test run is a fresh one."""
    if os.environ.get(CHILD_ENV) or _judged():
        return None
    row = BY_NAME["watch"]
    if not (config.getoption(row.dest) or ini_value(config, "watch") or os.environ.get(str(row.env))):
        return None  # the usual session: nothing read, nothing checked here
    try:
        settings = build_settings(config)
    except LoopUsageError as exc:
        if config.getoption("loop_watch"):
            usage_error(config, str(exc))
        return None  # not watching: the session reports it where it always has
    if not settings.values.get("watch"):
        return None
    from pytest_loops.pytest_plugin.watching import run_watch

    return run_watch(config, settings)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    if config.getoption("loop_watch") and not os.environ.get(CHILD_ENV):
        return  # the watch runs every test in a fresh process (pytest_cmdline_main)
    # a re-run the harness started (and every run it judges) never starts loops itself
    judged = _judged()
    enabled = bool(config.getoption("loop")) and not os.environ.get(CHILD_ENV) and not judged
    args = list(config.invocation_params.args)
    if not enabled:
        given = _given_flags(args)
        if given and not judged and not os.environ.get(CHILD_ENV):
            config.issue_config_time_warning(pytest.PytestConfigWarning(
                f"{', '.join(dict.fromkeys(given))} {'has' if len(set(given)) == 1 else 'have'} no "
                "effect without --loop: add --loop to run loops"), stacklevel=2)
        return  # without --loop the plugin changes nothing, not even by erroring
    moved = check_space_form(config, args)
    if moved:
        usage_error(config, moved)
    try:
        settings = build_settings(config)
        exitcode = choice_value(config, "exitcode", EXITCODE_CHOICES)
        choice_value(config, "tine", TINE_CHOICES)
        if option_value(config, "sign_key_env") or option_value(config, "sign_key_file"):
            artifact_options(config)  # validates the signing key now, before any test runs
            from pytest_loops.runtime.procimage import hide_secrets

            hide_secrets([option_value(config, "sign_key_env")])  # out of what /proc shows of this process
        check_outputs(config, settings)
        if settings["revise"]:
            from pytest_loops.agents import program_to_check
            from pytest_loops.runtime.preflight import check_revise

            origin = settings.origin.get("revise", "")
            check_revise(program_to_check(settings["revise"]), config.rootpath, {
                "command line": "--loop-revise", "ini": "ini loop_revise",
                "environment": "PYTEST_LOOPS_REVISE"}.get(origin, f"{origin}: revise.cmd"))
        choice_value(config, "suspects", SUSPECTS_CHOICES)
        choice_value(config, "audit", AUDIT_CHOICES)
        if settings.values.get("grants") is not None:  # bad grant names: a usage error before anything runs
            from pytest_loops.settings import given_grants

            given_grants(settings)
        if settings.values.get("sandbox") not in (None, "auto"):  # a tier asked for by name: here?
            from pytest_loops.core.isolation import choose_sandbox

            try:
                choose_sandbox(settings["sandbox"])
            except LoopUsageError as exc:
                raise LoopUsageError(exc.message, location=_sandbox_origin(settings)) from None
        from pytest_loops.redact import export_masks

        # masked values go to this process's environment for the session only
        config.add_cleanup(export_masks(config.getoption("loop_mask") or (), where="--loop-mask"))
        config.add_cleanup(export_masks(ini_value(config, "mask") or (), where="ini loop_mask"))
    except LoopUsageError as exc:
        usage_error(config, str(exc))
    from pytest_loops.pytest_plugin.session import LoopSession
    from pytest_loops.pytest_plugin.terminal import ReportMasking

    config.pluginmanager.register(LoopSession(config, settings, exitcode), "loop-session")
    config.pluginmanager.register(ReportMasking(), "loop-report-masking")
    from pytest_loops.pytest_plugin.shadowing import use_layers

    use_layers(config)


@pytest.fixture
def loop_harness(tmp_path_factory: pytest.TempPathFactory):
    """A :class:`pytest_loops.testing.LoopHarness` with its own temporary base directory.

    Works without ``--loop``: contract tests run in ordinary sessions.
    """
    from pytest_loops.testing import LoopHarness

    return LoopHarness(tmp_path_factory.mktemp("loop-harness"))

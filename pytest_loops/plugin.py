"""pytest glue: options, settings, registration. The loop logic lives in the engine.

Without ``--loop`` nothing changes: no revise command runs and no artifact is
written, whatever markers or ``--loop-*`` options are present.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .checks import CHILD_ENV
from .config import (
    ENV_NAMES,
    GUARD_KEYS,
    Resolved,
    env_layer,
    parse_guard,
    parse_signal,
    parse_size,
    read_runner_config,
    resolve,
)
from .errors import LoopUsageError
from .spec import DEFAULT_OUTPUT_CAP
from .verdict import EXIT_USAGE

MARKER = (
    "loop(revise=None, max_iter=None, budget_seconds=None, no_progress_k=None, "
    "escalate_after=None, no_progress_signal=None, state=None): under --loop, when this test fails, run the "
    "revise command and re-run the test in a fresh pytest process until it passes "
    "or a guard stops the loop (MAX_ITER, TIMEOUT, NO_PROGRESS, ESCALATE)."
)
MARKER_KEYS = ("revise", *GUARD_KEYS, "no_progress_signal", "state")
EXITCODE_CHOICES = ("pytest", "verdict")
TINE_CHOICES = ("on", "off")
SUSPECTS_CHOICES = ("on", "off")
AUDIT_CHOICES = ("error", "warn", "off")

# name -> (help, ini type). One description serves the option and its ini twin.
OPTIONS: dict[str, tuple[str, str]] = {
    "max_iter": ("iteration cap of every loop, >= 1 (default 6)", "string"),
    "budget_seconds": ("wall-clock budget per loop in seconds, enforced during commands; 0 = off (default 900)", "string"),
    "no_progress_k": ("stop a loop after K iterations with unchanged state; 0 = off (default 2)", "string"),
    "escalate_after": ("hand a loop to a human after N failed iterations; 0 = off (default)", "string"),
    "no_progress_signal": ("what no-progress watches: 'state' (default: the state paths), 'failure' (the "
                           "same failure K times in a row, even when files changed) or 'both'", "string"),
    "revise": ("shell command that revises the code after a failed iteration; with --loop, failing tests "
               "become a fix-loop", "string"),
    "state": ("state paths (globs) the no-progress guard fingerprints (default: the rootdir)", "linelist"),
    "artifacts": ("directory for run logs, lessons and provenance (default: <rootdir>/.pytest-loops)", "string"),
    "memory": ("the reflexion page lessons are appended to and read from (markdown)", "string"),
    "config": ("a loop-runner config file (guards, progress, reflexion, revise) as a settings layer", "string"),
    "exitcode": ("'pytest' (default): exit 1 when a loop fails; 'verdict': exit with the highest loop "
                 "verdict code (5 ESCALATE > 4 NO_PROGRESS > 3 TIMEOUT > 2 MAX_ITER)", "string"),
    "tine": ("'on' (default) writes one .tine provenance file per loop beside its run log; 'off' none",
             "string"),
    "suspects": ("'on' (default): when a pytest check fails, re-run its tests under coverage and hand the "
                 "top suspect lines to the revise step (prompt and suspects.json); 'off' skips it", "string"),
    # the session fix-loop's cost (the settings table will take these two rows)
    "suspects_cap": ("time cap of fault localization in the session fix-loop: a fraction of the session's "
                     "plain run (0.2, or 20 with a percent sign), seconds ('30s'), or 0 = no cap (default 0.2)",
                     "string"),
    "confirm": ("what the clean-room run before SUCCESS covers in the session fix-loop: 'affected' (default: "
                "the tests a fresh impact map says the changes can reach, plus the failing ones; every test "
                "when there is no map) or 'full' (every test the session ran)", "string"),
    "audit": ("the diff audit of a revise step's in-scope changes (hard-coded failing inputs, constant "
              "__eq__, pytest in library code, added exits): 'error' (default) ends the loop ESCALATE, "
              "'warn' records the findings, 'off' skips it", "string"),
    "report": ("write a self-contained HTML report of this session's loops to this file", "string"),
    "mask": ("a value masked in everything the loops write or print, like a secret-named environment "
             "variable's", "linelist"),
    "sign_key_env": ("sign .tine files with the HMAC key in this environment variable (>= 16 bytes)",
                     "string"),
    "sign_key_file": ("sign .tine files with this Ed25519 private key file", "string"),
    "output_cap": ("bytes of each command's output kept (first and last halves), e.g. 16M; 0 = all "
                   "(default 16M)", "string"),
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loop", "pytest-loops: bounded fix-loops around tests")
    group.addoption("--loop", action="store_true", default=False,
                    help="run loops: fix-loops around failing tests (marker or --loop-revise) and loop files")
    for name, (help_text, ini_type) in OPTIONS.items():
        flag = "--loop-" + name.replace("_", "-")
        if ini_type == "linelist":
            group.addoption(flag, action="append", default=None, dest=f"loop_{name}",
                            metavar="VALUE" if name == "mask" else "GLOB", help=help_text + " (repeatable)")
        else:
            group.addoption(flag, action="store", default=None, dest=f"loop_{name}", help=help_text)
        parser.addini(f"loop_{name}", help_text, type=ini_type, default=None)
    group.addoption("--loop-resume", action="store_true", default=False,
                    help="continue each loop from its latest unfinished or stopped run log in the "
                         "artifacts directory (iterations, streak and spent budget carry over)")
    parser.addini("loop_paths", "directories (or files) whose loop files are collected under --loop "
                  "when no paths are given on the command line", type="paths", default=[])


def _ini(config: pytest.Config, key: str) -> Any:
    value = config.getini(f"loop_{key}")
    return value if value not in (None, "", []) else None


def _layer(config: pytest.Config, read, where) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    for key in GUARD_KEYS:
        raw = read(key)
        if raw is not None:
            layer[key] = parse_guard(key, raw, where(key))
    raw = read("no_progress_signal")
    if raw is not None:
        layer["no_progress_signal"] = parse_signal(raw, where("no_progress_signal"))
    if read("output_cap") is not None:
        layer["output_cap"] = parse_size(read("output_cap"), where("output_cap"))
    for key, target in (("revise", "revise"), ("state", "state_paths"), ("memory", "memory_page"),
                        ("artifacts", "artifacts")):
        raw = read(key)
        if raw is not None:
            layer[target] = list(raw) if key == "state" else raw
    return layer


def build_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Resolved:
    """The one place precedence is applied for pytest:
    defaults < config file < ini < environment < command line (< marker, per test)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    config_file = config.getoption("loop_config") or _ini(config, "config")
    if config_file:
        path = Path(config_file)
        if not path.is_absolute():
            path = Path(config.rootpath) / path
        if not path.is_file():  # name our option, not the standalone runner's --config
            where = "--loop-config" if config.getoption("loop_config") else "ini loop_config"
            raise LoopUsageError(f"{config_file!r} is not a file (looked for {path})", location=where,
                                 fix="give a loop-runner yaml file; a relative path is from the rootdir")
        file_layer = read_runner_config(path)
        file_layer.pop("unknown_keys", None)
        file_layer.pop("verify", None)
        file_layer.pop("log_path", None)
        layers.append((str(path), file_layer))
    layers.append(("ini", _layer(config, lambda k: _ini(config, k), lambda k: f"ini loop_{k}")))
    env = env_layer(environ)
    layers.append(("environment", env))
    layers.append(("command line", _layer(
        config, lambda k: config.getoption(f"loop_{k}"), lambda k: "--loop-" + k.replace("_", "-"))))
    defaults = {"max_iter": 6, "budget_seconds": 900.0, "no_progress_k": 2, "escalate_after": 0,
                "no_progress_signal": "state",
                "revise": None, "state_paths": [], "memory_page": None, "reflexion": True,
                "artifacts": None, "output_cap": DEFAULT_OUTPUT_CAP}
    return resolve(layers, defaults=defaults)


def marker_layer(marker: pytest.Mark, nodeid: str) -> dict[str, Any]:
    """Validate a `@pytest.mark.loop(...)` and turn it into the top settings layer."""
    if marker.args:
        raise LoopUsageError(f"@pytest.mark.loop takes keyword arguments only, got {marker.args!r}",
                             location=nodeid, fix=f"valid keywords: {', '.join(MARKER_KEYS)}")
    unknown = sorted(set(marker.kwargs) - set(MARKER_KEYS))
    if unknown:
        raise LoopUsageError(f"@pytest.mark.loop got unknown keyword(s) {', '.join(unknown)}",
                             location=nodeid, fix=f"valid keywords: {', '.join(MARKER_KEYS)}")
    layer: dict[str, Any] = {}
    for key, value in marker.kwargs.items():
        if value is None:
            continue
        where = f"{nodeid}: @pytest.mark.loop({key}=...)"
        if key in GUARD_KEYS:
            if isinstance(value, str):
                raise LoopUsageError(f"{value!r} is not a valid {key}; give a number", location=where)
            layer[key] = parse_guard(key, value, where)
        elif key == "no_progress_signal":
            layer[key] = parse_signal(value, where)
        elif key == "revise":
            if not isinstance(value, str) or not value.strip():
                raise LoopUsageError(f"{value!r} is not a valid revise; give a shell command string",
                                     location=where)
            layer["revise"] = value
        else:  # state
            paths = [value] if isinstance(value, str) else value
            if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
                raise LoopUsageError(f"{value!r} is not a valid state; give a glob or a list of globs",
                                     location=where)
            layer["state_paths"] = list(paths)
    return layer


def _option(config: pytest.Config, key: str) -> Any:
    return config.getoption(f"loop_{key}") or _ini(config, key)


def _choice(config: pytest.Config, key: str, choices: tuple[str, ...]) -> str:
    value = _option(config, key) or choices[0]
    if value not in choices:
        raise LoopUsageError(f"{value!r} is not a valid --loop-{key.replace('_', '-')}; valid: "
                             f"{', '.join(choices)}")
    return value


CONFIRM_CHOICES = ("affected", "full")
FIXLOOP_ENV = {"suspects_cap": "PYTEST_LOOPS_SUSPECTS_CAP", "confirm": "PYTEST_LOOPS_CONFIRM"}


def fixloop_settings(config: pytest.Config, environ: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(suspects_cap, confirm) of the session fix-loop: command line > environment > ini > default.

    The cap is ``("fraction", f)``, ``("seconds", s)`` or ``("off", 0)`` (see localize.parse_cap)."""
    from .localize import parse_cap

    env = os.environ if environ is None else environ
    values: dict[str, tuple[str, str]] = {}
    for key, name in FIXLOOP_ENV.items():
        flag = "--loop-" + key.replace("_", "-")
        given = config.getoption(f"loop_{key}")
        if given is not None:
            values[key] = (str(given), flag)
        elif env.get(name):
            values[key] = (env[name], f"environment variable {name}")
        elif _ini(config, key) is not None:
            values[key] = (str(_ini(config, key)), f"ini loop_{key}")
    raw_cap, where = values.get("suspects_cap", ("20%", "default"))
    cap = parse_cap(raw_cap, where)
    confirm, where = values.get("confirm", ("affected", "default"))
    if confirm not in CONFIRM_CHOICES:
        raise LoopUsageError(f"{confirm!r} is not a valid confirm ({where}); valid: {', '.join(CONFIRM_CHOICES)}")
    return cap, confirm


def artifact_options(config: pytest.Config):
    """The .tine / hand-off options of this session (the signing key is checked here)."""
    from .finish import ArtifactOptions

    options = ArtifactOptions(
        tine=_choice(config, "tine", TINE_CHOICES) == "on",
        hmac_key_env=_option(config, "sign_key_env"),
        ed25519_key=_option(config, "sign_key_file"),
        flags=("--loop-sign-key-env", "--loop-sign-key-file"),
    )
    options.signing_key()
    return options


class _VerdictModeUsageError(pytest.exit.Exception):
    """An exit pytest prints as ``<class name>: <message>``: named so the line reads
    ``ERROR: ...`` exactly like pytest's own usage errors."""


_VerdictModeUsageError.__name__ = _VerdictModeUsageError.__qualname__ = "ERROR"


def check_outputs(config: pytest.Config, settings: Resolved) -> None:
    """Every path a loop writes is checked before the first test runs (see outputs.py)."""
    from .outputs import check_output_path

    def where(key: str, option: str) -> str:
        origin = settings.origin.get(key, "default")
        return {"command line": f"--loop-{option}", "ini": f"ini loop_{option}", "default": f"--loop-{option}",
                "environment": "environment variable " + ENV_NAMES.get(key, "")}.get(
                    origin, f"{origin}: reflexion.episodic_memory_page")  # only the page comes from a file

    root = config.rootpath
    check_output_path(settings["artifacts"] or ".pytest-loops", where("artifacts", "artifacts"), base=root,
                      directory=True)
    if settings["reflexion"]:
        check_output_path(settings["memory_page"], where("memory_page", "memory"), base=root)
    report = config.getoption("loop_report")
    check_output_path(report or _ini(config, "report"), "--loop-report" if report else "ini loop_report",
                      base=config.invocation_params.dir)


def usage_error(config: pytest.Config, message: str) -> NoReturn:
    """pytest's usage error (exit 4, an `ERROR:` line). Under --loop-exitcode=verdict,
    where 4 means NO_PROGRESS, the same line exits 64 instead: there, 2-5 are verdicts only."""
    if (config.getoption("loop_exitcode") or _ini(config, "exitcode")) == "verdict":
        raise _VerdictModeUsageError(message, returncode=EXIT_USAGE)
    raise pytest.UsageError(message)


VALUE_FLAGS = tuple("--loop-" + name.replace("_", "-") for name in OPTIONS)


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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    # a re-run the harness started (and every run it judges) never starts loops itself
    judged = config.pluginmanager.hasplugin("pytest_loops.judge")
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
        exitcode = _choice(config, "exitcode", EXITCODE_CHOICES)
        artifact_options(config)  # validates the signing key now, before any test runs
        check_outputs(config, settings)
        if settings["revise"]:
            from .preflight import check_revise

            origin = settings.origin.get("revise", "")
            check_revise(settings["revise"], config.rootpath, {
                "command line": "--loop-revise", "ini": "ini loop_revise",
                "environment": "PYTEST_LOOPS_REVISE"}.get(origin, f"{origin}: revise.cmd"))
        _choice(config, "suspects", SUSPECTS_CHOICES)
        _choice(config, "audit", AUDIT_CHOICES)
        fixloop_settings(config)
        from .redact import export_masks

        # masked values go to this process's environment for the session only
        config.add_cleanup(export_masks(config.getoption("loop_mask") or (), where="--loop-mask"))
        config.add_cleanup(export_masks(_ini(config, "mask") or (), where="ini loop_mask"))
    except LoopUsageError as exc:
        usage_error(config, str(exc))
    from .hooks import register_builtins
    from .reporting import ReportMasking
    from .session import LoopSession

    register_builtins(config.pluginmanager)
    config.pluginmanager.register(LoopSession(config, settings, exitcode), "loop-session")
    config.pluginmanager.register(ReportMasking(), "loop-report-masking")
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        known = [Path(a).resolve() for a in config.args]
        for path in config.getini("loop_paths"):
            if not any(path == k or k in path.parents for k in known):
                config.args.append(str(path))


@pytest.fixture
def loop_harness(tmp_path_factory: pytest.TempPathFactory):
    """A :class:`pytest_loops.testing.LoopHarness` with its own temporary base directory.

    Works without ``--loop``: contract tests run in ordinary sessions.
    """
    from .testing import LoopHarness

    return LoopHarness(tmp_path_factory.mktemp("loop-harness"))

"""The session's settings as pytest reads them (option, ini, marker), and its usage errors.

Shared by the plugin's hooks, the ``--loop`` session and its fix-loop; imports only
the settings table, so a run without ``--loop`` pays for nothing more.
"""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import BY_NAME, MARKER_KEYS, Resolved
from pytest_loops.settings import marker_layer as _marker_settings
from pytest_loops.verdict import EXIT_USAGE

# checks.CHILD_ENV, named here so a run without loops never imports the checks
CHILD_ENV = "PYTEST_LOOPS_CHILD"

EXITCODE_CHOICES = BY_NAME["exitcode"].choices
TINE_CHOICES = BY_NAME["tine"].choices
SUSPECTS_CHOICES = BY_NAME["suspects"].choices
AUDIT_CHOICES = BY_NAME["audit"].choices


def ini_value(config: pytest.Config, key: str) -> Any:
    value = config.getini(f"loop_{key}")
    return value if value not in (None, "", []) else None


def marker_layer(marker: pytest.Mark, nodeid: str) -> dict[str, Any]:
    """Validate a `@pytest.mark.loop(...)` and turn it into the top settings layer."""
    if marker.args:
        raise LoopUsageError(f"@pytest.mark.loop takes keyword arguments only, got {marker.args!r}",
                             location=nodeid, fix=f"valid keywords: {', '.join(MARKER_KEYS)}")
    unknown = sorted(set(marker.kwargs) - set(MARKER_KEYS))
    if unknown:
        raise LoopUsageError(f"@pytest.mark.loop got unknown keyword(s) {', '.join(unknown)}",
                             location=nodeid, fix=f"valid keywords: {', '.join(MARKER_KEYS)}")
    return _marker_settings(marker.kwargs, f"{nodeid}: @pytest.mark.loop")


def option_value(config: pytest.Config, key: str) -> Any:
    return config.getoption(f"loop_{key}") or ini_value(config, key)


def choice_value(config: pytest.Config, key: str, choices: tuple[str, ...]) -> str:
    """A choice setting's value as text ("on"/"off" for a switch), validated by its row."""
    row = BY_NAME[key]
    given = config.getoption(row.dest)
    value = given or ini_value(config, key)
    if value is None:
        return choices[0]
    parsed = row.parse(value, str(row.option) if given else f"ini {row.ini}")
    return ("on" if parsed else "off") if row.kind == "switch" else parsed


def sandbox_values(settings: Resolved) -> dict[str, Any]:
    """The engine's isolation settings from the session's resolved settings."""
    values = settings.values
    network = values.get("sandbox_network")
    return {"sandbox": values.get("sandbox") or BY_NAME["sandbox"].default,
            "sandbox_writable": tuple(values.get("sandbox_writable") or ()),
            "sandbox_network": True if network is None else bool(network)}


def fixloop_settings(settings: Resolved) -> tuple[tuple[str, float], str, str]:
    """(suspects_cap, confirm, impact_map) of the session fix-loop, from the session's settings.

    The cap is ``("fraction", f)``, ``("seconds", s)`` or ``("off", 0)`` (see localize.parse_cap)."""
    from pytest_loops.localization.localize import parse_cap

    cap = settings.values.get("suspects_cap") or BY_NAME["suspects_cap"].default
    return (parse_cap(cap), settings.values.get("confirm") or BY_NAME["confirm"].default,
            settings.values.get("impact_map") or BY_NAME["impact_map"].default)


def artifact_options(config: pytest.Config):
    """The .tine / hand-off options of this session (the signing key is checked here)."""
    from pytest_loops.artifacts.finishers import ArtifactOptions
    from pytest_loops.settings import env_layer

    given = config.getoption(BY_NAME["private_artifacts"].dest)
    private = choice_value(config, "private_artifacts", ("off", "on")) == "on" if given or ini_value(
        config, "private_artifacts") is not None else bool(env_layer().get("private_artifacts", False))
    options = ArtifactOptions(
        private_artifacts=private,
        tine=choice_value(config, "tine", TINE_CHOICES) == "on",
        hmac_key_env=option_value(config, "sign_key_env"),
        ed25519_key=option_value(config, "sign_key_file"),
        flags=("--loop-sign-key-env", "--loop-sign-key-file"),
    )
    options.signing_key()
    return options


class _VerdictModeUsageError(pytest.exit.Exception):  # type: ignore[name-defined]
    """An exit pytest prints as ``<class name>: <message>``: named so the line reads
    ``ERROR: ...`` exactly like pytest's own usage errors."""


_VerdictModeUsageError.__name__ = _VerdictModeUsageError.__qualname__ = "ERROR"


def usage_error(config: pytest.Config, message: str) -> NoReturn:
    """pytest's usage error (exit 4, an `ERROR:` line). Under --loop-exitcode=verdict,
    where 4 means NO_PROGRESS, the same line exits 64 instead: there, 2-5 are verdicts only."""
    if (config.getoption("loop_exitcode") or ini_value(config, "exitcode")) == "verdict":
        raise _VerdictModeUsageError(message, returncode=EXIT_USAGE)
    raise pytest.UsageError(message)


def usage_exit(config: pytest.Config, message: str) -> NoReturn:
    """A usage error found once the session runs (at collection, in a running test):
    the session stops and its one ``ERROR:`` line goes to stderr at the end (the loop
    session prints it, in place of pytest's ``!`` banner); exit 64 under
    --loop-exitcode=verdict, else pytest's usage error 4."""
    verdict = (config.getoption("loop_exitcode") or ini_value(config, "exitcode")) == "verdict"
    raise _VerdictModeUsageError(message, returncode=EXIT_USAGE if verdict else int(pytest.ExitCode.USAGE_ERROR))


def is_usage_exit(exc: BaseException) -> bool:
    return isinstance(exc, _VerdictModeUsageError)

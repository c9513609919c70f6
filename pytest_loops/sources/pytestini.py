"""The two pytest ini keys loop discovery reads outside pytest: ``loop_paths`` and
``norecursedirs``, from the ini file pytest itself would choose.

pytest looks upward from the directory it starts in and takes the first of
``pytest.ini``, ``.pytest.ini``, ``pyproject.toml`` (with ``[tool.pytest.ini_options]``),
``tox.ini`` (with ``[pytest]``) and ``setup.cfg`` (with ``[tool:pytest]``) it finds;
so does :func:`find_ini`. A file that cannot be read is bad input naming it.
"""

from __future__ import annotations

import configparser
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pytest_loops.errors import LoopUsageError

# the extra layer's environment variable: loop directories, os.pathsep separated
LOOP_PATHS_ENV = "PYTEST_LOOPS_LOOP_PATHS"
# pytest's default norecursedirs (pytest 8)
DEFAULT_NORECURSE = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")


@dataclass(frozen=True)
class PytestIni:
    """The ini file found (None: none) and the raw values of the keys read from it."""

    path: Path | None = None
    values: dict[str, list[str]] = field(default_factory=dict)

    def paths(self, key: str) -> list[Path]:
        """A ``paths`` key: each entry relative to the ini file's directory."""
        base = self.path.parent if self.path else Path.cwd()
        return [(base / entry).resolve() for entry in self.values.get(key, [])]

    def norecursedirs(self) -> tuple[str, ...]:
        given = self.values.get("norecursedirs")
        return tuple(given) if given is not None else DEFAULT_NORECURSE


KEYS = ("loop_paths", "norecursedirs")


def _split(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise LoopUsageError(f"cannot split the value: {exc}", location=where) from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise LoopUsageError("not a string nor a list of strings", location=where)


def _read(candidate: Path) -> dict[str, list[str]] | None:
    """The keys of ``candidate`` when it is a pytest ini file (None when it is not one)."""
    name = candidate.name
    try:
        if name == "pyproject.toml":
            with open(candidate, "rb") as f:
                data = tomllib.load(f)
            section = data.get("tool", {}).get("pytest", {}).get("ini_options")
            if not isinstance(section, dict):
                return None
        else:
            parser = configparser.RawConfigParser(strict=False, interpolation=None)
            parser.read(candidate, encoding="utf-8")
            wanted = {"setup.cfg": "tool:pytest"}.get(name, "pytest")
            if not parser.has_section(wanted):
                return {} if name in ("pytest.ini", ".pytest.ini") else None
            section = dict(parser.items(wanted))
    except (OSError, UnicodeDecodeError, configparser.Error, tomllib.TOMLDecodeError) as exc:
        raise LoopUsageError(f"cannot read it: {exc}".replace("\n", " "), location=str(candidate),
                             fix="fix the file or give the loop directories in PYTEST_LOOPS_LOOP_PATHS") from None
    return {key: _split(section[key], f"{candidate}: {key}") for key in KEYS if key in section}


def find_ini(start: Path) -> PytestIni:
    """The pytest ini file of ``start`` (a directory) or of the nearest directory above it."""
    here = start.resolve()
    for directory in (here, *here.parents):
        for candidate in ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
            path = directory / candidate
            if path.is_file():
                values = _read(path)
                if values is not None:
                    return PytestIni(path, values)
    return PytestIni()

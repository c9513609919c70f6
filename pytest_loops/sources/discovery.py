"""Where loops come from: four layers of loop files, the higher layer winning a name.

Lowest first:

``package``
    installed distributions' entry points in the group ``pytest_loops.loops``, each
    naming a package (``acme_loops.loops``) or an attribute holding a directory
    (``acme_loops:LOOPS_DIR``) of loop files;
``user``
    ``$XDG_CONFIG_HOME/pytest-loops/loops`` (``~/.config/pytest-loops/loops`` when the
    variable is unset or not absolute);
``extra``
    the directories (or files) of the pytest ini key ``loop_paths`` and of
    ``PYTEST_LOOPS_LOOP_PATHS`` (an ``os.pathsep``-separated list);
``workspace``
    the loop files under the workspace directory, skipping what pytest's collection
    skips (``norecursedirs``, virtualenvs) and the artifacts directory.

A directory is read recursively, with the same skips. A loop file found by two
layers (an extra directory inside the workspace) belongs to the higher one, once.
A broken file, a missing directory or an entry point that points nowhere in a lower
layer is a warning naming it; in the workspace a broken file is bad input, and so
are two loops of one name.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import is_venv
from pytest_loops.sources.files import is_loop_file, load_any
from pytest_loops.sources.pytestini import LOOP_PATHS_ENV, PytestIni, find_ini
from pytest_loops.spec import LoopSpec

LAYERS = ("package", "user", "extra", "workspace")  # lowest first
ENTRY_POINT_GROUP = "pytest_loops.loops"
ARTIFACTS_DIR = ".pytest-loops"


@dataclass(frozen=True)
class Found:
    """One named loop (or pipeline) of one loop file in one layer."""

    name: str
    layer: str
    path: str  # the loop file
    line: int | None
    kind: str = "loop"  # "loop" or "pipeline"
    spec: LoopSpec | None = None  # the loop; None for a pipeline
    via: str = ""  # how the layer found the file: an entry point, a loop_paths entry
    shadows: tuple[Found, ...] = ()  # the same name in lower layers, highest first

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "kind": self.kind, "layer": self.layer,
                                "source": self.path, "line": self.line}
        if self.via:
            data["via"] = self.via
        data["shadows"] = [{"layer": s.layer, "source": s.path, "line": s.line} for s in self.shadows]
        return data


@dataclass(frozen=True)
class Catalogue:
    """The loops every layer gives, one per name (the winner), and the warnings."""

    loops: tuple[Found, ...]
    warnings: tuple[str, ...] = ()

    def get(self, name: str) -> Found | None:
        return next((f for f in self.loops if f.name == name), None)

    def close_names(self, name: str) -> list[str]:
        names = [f.name for f in self.loops]
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        lowered = name.lower()
        close += [n for n in names if n not in close and (lowered in n.lower() or n.lower() in lowered)]
        return close[:5]


# -- where each layer's files are -------------------------------------------------------

def user_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/pytest-loops/loops``, or ``~/.config/...`` (the XDG fallback)."""
    xdg = environ.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        home = environ.get("HOME") or os.path.expanduser("~")
        base = Path(home) / ".config"
    return base / "pytest-loops" / "loops"


def _skipped(entry: os.DirEntry[str], patterns: tuple[str, ...]) -> bool:
    if any(fnmatch.fnmatch(entry.name, p) for p in patterns):
        return True
    if entry.name in ("__pycache__", ARTIFACTS_DIR):
        return True
    return is_venv(entry.path)  # a virtualenv, as pytest skips it


def walk_loop_files(top: Path, patterns: tuple[str, ...], skip: Iterable[str] = ()) -> Iterator[Path]:
    """The loop files under ``top`` in sorted order, not following links to directories
    and not entering directories pytest's collection skips (``patterns``) or ``skip``."""
    skip_real = {os.path.realpath(s) for s in skip}
    stack = [str(top)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # unreadable: nothing found there
        subdirs = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not _skipped(entry, patterns) and os.path.realpath(entry.path) not in skip_real:
                        subdirs.append(entry.path)
                elif entry.is_file() and is_loop_file(entry.name):
                    yield Path(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def _entry_point_dirs(warn: list[str]) -> Iterator[tuple[Path, str]]:
    """(directory, "entry point NAME of DIST") of each entry point in the group."""
    from importlib import metadata

    points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP),
                    key=lambda ep: ((ep.dist.name if ep.dist else "") or "", ep.name))
    for ep in points:
        dist = f" of {ep.dist.name}" if ep.dist is not None else ""
        via = f"entry point {ep.name!r}{dist}"
        where = f"{via} ({ENTRY_POINT_GROUP}: {ep.name} = {ep.value})"
        fix = "point it at a package or a directory of loop files"
        directory, problem = _entry_point_target(ep)
        if problem is not None:
            warn.append(f"{where}: {problem}; skipped; {fix}")
            continue
        assert directory is not None
        if not directory.exists():
            warn.append(f"{where}: {directory} does not exist; skipped; {fix}")
        elif not directory.is_dir():
            warn.append(f"{where}: {directory} is a file, not a directory; skipped; {fix}")
        else:
            yield directory, via


def _entry_point_target(ep: Any) -> tuple[Path | None, str | None]:
    """The directory an entry point names, or why it names none. A module alone is
    found without being run (a package's directory); ``module:attr`` is loaded."""
    import importlib.util

    module, _, attr = ep.value.partition(":")
    module, attr = module.strip(), attr.strip()
    try:
        if not attr:
            found = importlib.util.find_spec(module)
            if found is None:
                return None, f"no module {module!r}"
            if found.submodule_search_locations:
                return Path(next(iter(found.submodule_search_locations))), None
            return None, f"{module!r} is a module file ({found.origin}), not a package"
        value = ep.load()
    except ModuleNotFoundError as exc:
        return None, f"no module {exc.name or module!r}"
    except Exception as exc:  # noqa: BLE001 - someone else's package: a warning, never our failure
        return None, f"cannot load it: {type(exc).__name__}: {exc}".replace("\n", " ")
    if hasattr(value, "__path__"):  # a package object
        return Path(next(iter(value.__path__))), None
    try:
        return Path(os.fspath(value) if isinstance(value, (str, os.PathLike)) else str(value)), None
    except TypeError:
        return None, f"{attr!r} is not a path"


# -- reading ----------------------------------------------------------------------------

def _line_of(source: str | None) -> int | None:
    if not source:
        return None
    _, _, tail = source.rpartition(":")
    return int(tail) if tail.isdigit() else None


def _read_file(path: Path, layer: str, via: str, warn: list[str]) -> list[Found]:
    try:
        loop_file = load_any(path)
    except LoopUsageError as exc:
        if layer == "workspace":
            raise
        warn.append(f"{layer} loop file skipped: {exc}" + ("" if exc.fix else "; fix it or remove it"))
        return []
    found = [Found(spec.name, layer, str(path), _line_of(spec.source), "loop", spec, via)
             for spec in loop_file.loops]
    found += [Found(p.name, layer, str(path), _line_of(p.source), "pipeline", None, via)
              for p in loop_file.pipelines]
    return found


def extra_paths(ini: PytestIni, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """The extra layer's entries: (path, where it was given), the ini's then the variable's."""
    paths = [(p, f"loop_paths in {ini.path}") for p in ini.paths("loop_paths")]
    raw = environ.get(LOOP_PATHS_ENV, "")
    paths += [(Path(p), LOOP_PATHS_ENV) for p in raw.split(os.pathsep) if p.strip()]
    return paths


def discover(workspace: str | os.PathLike[str] = ".", environ: Mapping[str, str] | None = None,
             artifacts: str | None = None) -> Catalogue:
    """Every layer's loops, one per name; the higher layer wins a name.

    Raises LoopUsageError (exit 64) for a broken workspace file and for two
    workspace loops of one name; every lower-layer problem is a warning.
    """
    environ = os.environ if environ is None else environ
    root = Path(workspace).resolve()
    ini = find_ini(root)
    patterns = ini.norecursedirs()
    warn: list[str] = []
    artifacts_dir = artifacts or environ.get("PYTEST_LOOPS_ARTIFACTS") or ARTIFACTS_DIR
    skip = [str(root / artifacts_dir)]
    files: dict[str, list[tuple[Path, str]]] = {layer: [] for layer in LAYERS}
    files["workspace"] = [(p, "") for p in walk_loop_files(root, patterns, skip)]
    for directory, via in _entry_point_dirs(warn):
        files["package"] += [(p, via) for p in walk_loop_files(directory, patterns)]
    user = Path(os.path.abspath(user_dir(environ)))  # shown without `..`
    if user.is_dir():
        files["user"] = [(p, "") for p in walk_loop_files(user, patterns)]
    for path, via in extra_paths(ini, environ):
        if path.is_dir():
            files["extra"] += [(p, via) for p in walk_loop_files(path, patterns)]
        elif path.is_file():
            files["extra"].append((path, via))
        else:
            warn.append(f"{via}: {str(path)!r} does not exist; skipped; give an existing directory of loop files")
    seen: set[str] = set()
    found: list[Found] = []
    for layer in reversed(LAYERS):  # a file two layers find belongs to the higher one, once
        for path, via in files[layer]:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            found += _read_file(path, layer, via, warn)
    return Catalogue(_resolve(found, warn), tuple(warn))


def _resolve(found: list[Found], warn: list[str]) -> tuple[Found, ...]:
    """One loop per name: the highest layer's; two of one name in the workspace is bad input,
    in a lower layer a warning (the first file in sorted order is taken)."""
    by_name: dict[str, list[Found]] = {}
    for item in found:
        by_name.setdefault(item.name, []).append(item)
    winners = []
    for name, items in by_name.items():
        items.sort(key=lambda f: -LAYERS.index(f.layer))  # stable: file order within a layer
        top = items[0]
        same = [f for f in items[1:] if f.layer == top.layer]
        if same:
            if top.layer == "workspace":
                raise LoopUsageError(f"two workspace loops are named {name!r}: {top.where} and {same[0].where}",
                                     fix="rename one; a loop's name must be unique in the workspace")
            warn.append(f"two {top.layer} loops are named {name!r}: {top.where} and {same[0].where}; "
                        f"the first is used; rename one")
        winners.append(Found(top.name, top.layer, top.path, top.line, top.kind, top.spec, top.via,
                             tuple(items[1:])))
    return tuple(sorted(winners, key=lambda f: f.name))

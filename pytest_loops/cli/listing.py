"""``pytest-loops list``: every discovered loop with its layer, source and what it
shadows; and ``pytest-loops run NAME``: the spec of a discovered loop."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import DEFAULTS, ENV_NAMES, env_layer, resolve, run_rows
from pytest_loops.sources.discovery import LAYERS, Catalogue, Found, discover
from pytest_loops.spec import LoopSpec

PROG = "pytest-loops"
LIST_SCHEMA = "pytest-loops.list/1"


def add_list_parser(sub: Any) -> None:
    """Register ``pytest-loops list`` on the subcommand parsers."""
    listing = sub.add_parser("list", help="list every loop found, with its layer, source and what it shadows",
                             description="Loops are found in layers, lowest first: installed packages "
                                         "(entry points in pytest_loops.loops), the user directory "
                                         "($XDG_CONFIG_HOME/pytest-loops/loops), extra directories "
                                         "(loop_paths, PYTEST_LOOPS_LOOP_PATHS) and the workspace. "
                                         "On a name clash the higher layer wins.")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument("--cwd", metavar="DIR", help="the workspace directory (default: .)")


def _workspace(cwd: str | None, flag: str = "--cwd") -> Path:
    root = Path(cwd or ".")
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise LoopUsageError(f"{str(root)!r} {what}", location=flag, fix="give an existing directory")
    return root


def _shown(path: str, root: Path) -> str:
    """A path relative to the workspace when it is inside it, else absolute."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def catalogue_for(cwd: str | None, artifacts: str | None = None) -> tuple[Path, Catalogue]:
    """The workspace and its catalogue, each warning printed to stderr as one line."""
    root = _workspace(cwd)
    catalogue = discover(root, artifacts=artifacts)
    from pytest_loops.redact import redact, strip_control

    for line in catalogue.warnings:
        print(strip_control(redact(f"{PROG}: warning: {line}")).replace("\n", " "), file=sys.stderr)
    return root, catalogue


def format_table(loops: tuple[Found, ...], root: Path) -> str:
    def where(f: Found) -> str:
        path = _shown(f.path, root)
        return f"{path}:{f.line}" if f.line else path

    rows = [("NAME", "LAYER", "SOURCE", "SHADOWS")]
    for f in loops:
        shadows = ", ".join(f"{s.layer} {where(s)}" for s in f.shadows) or "-"
        name = f.name if f.kind == "loop" else f"{f.name} (pipeline)"
        rows.append((name, f.layer, where(f), shadows))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip()
                     for r in rows)


def cmd_list(args: argparse.Namespace) -> int:
    from pytest_loops.redact import redact, redact_obj, strip_control

    root, catalogue = catalogue_for(args.cwd)
    if args.json:  # names and paths come from other people's files: masked, and JSON escapes controls
        print(json.dumps(redact_obj({"schema": LIST_SCHEMA, "workspace": str(root.resolve()),
                                     "layers": list(LAYERS), "loops": [f.as_dict() for f in catalogue.loops],
                                     "warnings": list(catalogue.warnings)}), indent=2))
    elif catalogue.loops:  # masked and without escape sequences, as every line the runner prints
        print(strip_control(redact(format_table(catalogue.loops, root))))
    else:
        print("no loops found (layers: package, user, extra, workspace; see `pytest-loops list --help`)")
    return 0


# -- run NAME ---------------------------------------------------------------------------

# flags that describe a loop of their own: not with a discovered loop's name
_OWN_LOOP_FLAGS = {"verify": "--verify", "hidden_verify": "--hidden-verify", "config": "--config",
                   "resume": "--resume", "name": "--name", "goal": "--goal"}


def looks_like_path(text: str) -> bool:
    return os.sep in text or (os.altsep or os.sep) in text or text.lower().endswith(
        (".loop", ".loop.yaml", ".loop.yml", ".yaml", ".yml", ".json")) or os.path.exists(text)


def named_spec(args: argparse.Namespace) -> tuple[LoopSpec, dict[str, Any]]:
    """The spec of the discovered loop ``args.loop`` with the session's settings
    (environment < command line) filling what its file left at the default; and the
    runner's extras as ``spec_from_args`` gives them."""
    name = args.loop
    where = f"{PROG} run"
    if looks_like_path(name):
        raise LoopUsageError(f"{name!r} is a path, not a loop name", location=where,
                             fix="run a loop file with `pytest --loop FILE`; `pytest-loops run NAME` takes a "
                                 "name that `pytest-loops list` shows")
    for dest, flag in _OWN_LOOP_FLAGS.items():
        if getattr(args, dest, None):
            raise LoopUsageError(f"{flag} with the loop name {name!r}", location=where,
                                 fix=f"a discovered loop has its own checks and name: drop {flag}, "
                                     "or drop the name to describe a loop on the command line")
    root, catalogue = catalogue_for(args.cwd, artifacts=args.artifacts)
    found = catalogue.get(name)
    if found is None:
        from pytest_loops.redact import redact, strip_control

        close = [strip_control(redact(n)) for n in catalogue.close_names(name)]
        hint = f"close names: {', '.join(close)}" if close else f"{len(catalogue.loops)} loop(s) found"
        raise LoopUsageError(f"no loop named {name!r}", location=where,
                             fix=f"{hint}; see `pytest-loops list`")
    if found.spec is None:
        raise LoopUsageError(f"{name!r} is a pipeline ({found.where}), not a single loop", location=where,
                             fix=f"run its stages with `pytest --loop {found.path}`")
    flags = {row.name: getattr(args, row.name) for row in run_rows() if row.name in DEFAULTS or row.name in ENV_NAMES}
    settings = resolve([("environment", env_layer()), ("command line", flags)])
    from pytest_loops.pytest_plugin.items import merge_file_spec

    spec = merge_file_spec(found.spec, settings)
    if found.layer != "workspace":  # a shared loop works on the project it is run in, not on its own folder
        spec = spec.replace(cwd=str(root.resolve()))
    if not spec.state_paths:  # as `pytest --loop` runs a loop file: no-progress watches the tree
        spec = spec.replace(state_paths=(".",))
    return spec, {"log_path": args.log_path, "unknown_keys": [], "config": None,
                  "artifacts": settings.values.get("artifacts") or str(root.resolve() / ".pytest-loops"),
                  "output_cap": settings["output_cap"]}

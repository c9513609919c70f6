"""The bundled demo: a tiny project with a bug, its test, and a deterministic fixer.

``pytest-loops demo`` runs the loop in a temporary copy of the project, removed
when the demo ends (success, failure, or Ctrl-C or SIGTERM during the loop, which
the runner turns into an exception after ending its commands); ``--dir DIR`` runs it in
DIR and keeps everything. ``pytest-loops demo --init [DIR]`` writes the project,
its config and a ``demo.loop`` into DIR for the user to edit and run.

This module does not import the command line: the caller hands it ``run``, which
runs ``pytest-loops run ARGV`` and returns its exit code.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from pytest_loops.errors import LoopUsageError

RunCommand = Callable[[Sequence[str]], int]

CONFIG_NAME = "loop-runner.config.yaml"
LOOP_NAME = "demo.loop"
TEMP_PREFIX = "pytest-loops-demo-"
GOAL = "make the calculator tests pass"


def _package_file(*parts: str) -> Path:
    return Path(str(resources.files(__package__).joinpath(*parts)))


def bundled_config() -> Path:
    return _package_file(CONFIG_NAME)


def _project_files() -> dict[str, Path]:
    """The demo project's files: relative path -> bundled source."""
    root = _package_file("project")
    files: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[path.relative_to(root).as_posix()] = path
    return files


def init_files() -> dict[str, Path]:
    """What ``demo --init`` writes: the project, its config where ``pytest-loops run``
    finds it (harness/ under the working directory) and the loop as a loop file."""
    return {**_project_files(), f"harness/{CONFIG_NAME}": bundled_config(),
            LOOP_NAME: _package_file(LOOP_NAME)}


def copy_project(directory: str | os.PathLike[str]) -> Path:
    """Copy the demo project into `directory` (created if needed)."""
    target = Path(directory)
    for rel, source in _project_files().items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target / rel)
    return target


# -- demo --init ----------------------------------------------------------------------

def init_project(directory: str) -> list[Path]:
    """Write the demo project, its config and demo.loop into `directory`.

    Refuses (LoopUsageError, naming the file) before writing anything when one of
    the files, or something in the way of one, already exists."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise LoopUsageError("is not a directory", location=str(target),
                             fix="give a directory for the demo project (default: .)")
    files = init_files()
    for rel in files:
        path = target / rel
        for parent in reversed(path.relative_to(target).parents[:-1]):
            if (target / parent).exists() and not (target / parent).is_dir():
                raise LoopUsageError("exists and is not a directory", location=str(target / parent),
                                     fix="choose another directory for `pytest-loops demo --init`")
        if os.path.lexists(path):
            raise LoopUsageError("already exists; nothing was written", location=str(path),
                                 fix="choose another directory for `pytest-loops demo --init`, or remove it")
    written: list[Path] = []
    for rel, source in files.items():
        path = target / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as out:
                out.write(source.read_bytes())
        except OSError as exc:
            raise LoopUsageError(f"cannot write: {exc.strerror or exc}", location=str(path),
                                 fix="choose a directory you can write to") from None
        written.append(path)
    return written


def _init_text(directory: str, written: list[Path]) -> str:
    where = "" if Path(directory).resolve() == Path.cwd().resolve() else f"cd {shlex.quote(directory)} && "
    names = ", ".join(p.relative_to(directory).as_posix() for p in written)
    return "\n".join([
        f"wrote the demo project to {directory}: {names}",
        f"run its loop:        {where}pytest-loops run   (reads harness/{CONFIG_NAME})",
        f"or as a loop file:   {where}pytest --loop {LOOP_NAME}",
        f"edit harness/{CONFIG_NAME} or {LOOP_NAME} to change the guards, the check or the "
        "revise command (fix_bug.py stands in for a coding agent)",
    ])


# -- demo -----------------------------------------------------------------------------

class _WithoutLines:
    """A text stream that passes whole lines to `stream`, but those containing `hidden`."""

    def __init__(self, stream: TextIO, hidden: str) -> None:
        self.stream, self.hidden, self._pending = stream, hidden, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if self.hidden not in line:
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def close_line(self) -> None:
        if self._pending:
            self.write("\n")

    def fileno(self) -> int:
        return self.stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _run_argv(config: Path, project: Path, quiet: bool) -> list[str]:
    argv = ["run", "--config", str(config), "--cwd", str(project), "--name", "demo", "--goal", GOAL]
    return [*argv, "--quiet"] if quiet else argv


def run_demo(run: RunCommand, directory: str | None = None, config: str | None = None,
             quiet: bool = False, default_config: Path | None = None) -> int:
    """Run the demo loop; returns its verdict's exit code (0 when the bug got fixed).

    Without `directory` the loop runs in a temporary copy that is removed whatever
    happens; with it, the project and its artifacts stay in `directory`."""
    bundled = config is None and not (default_config is not None and default_config.is_file())
    config_path = bundled_config() if bundled else Path(config or default_config).resolve()  # type: ignore[arg-type]
    if not bundled and not config_path.is_file():
        raise LoopUsageError("config file not found", location=str(config_path),
                             fix="check the path given to --config")
    out = sys.stdout

    def say(text: str) -> None:
        if not quiet:
            print(text, file=out, flush=True)

    config_line = ("config: the bundled demo config (`pytest-loops demo --init DIR` writes a copy to edit)"
                   if bundled else f"config: {config_path}  (edit it to change the guards or the revise command)")
    if directory is not None:
        try:
            project = copy_project(directory).resolve()
        except OSError as exc:
            raise LoopUsageError(f"cannot copy the demo project there: {exc.strerror or exc}",
                                 location=f"--dir {directory}", fix="give a directory you can write to") from None
        say(config_line)
        say(f"demo project: {project}")
        code = run(_run_argv(config_path, project, quiet))
        say(f"artifacts: {project / '.pytest-loops'}")
        return code
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as temp:
        project = copy_project(temp).resolve()
        say(config_line)
        say("demo project: a temporary copy of the bundled project, removed when the demo ends")
        # the run's closing lines name its files in the copy: they are gone by the end
        filtered = _WithoutLines(out, str(project))
        sys.stdout = filtered
        try:
            code = run(_run_argv(config_path, project, quiet))
        finally:
            filtered.close_line()
            sys.stdout = out
    say("the temporary copy is removed, with its run log, lessons and provenance: "
        "`pytest-loops demo --dir DIR` keeps them in DIR")
    say("to edit the project and its loop: `pytest-loops demo --init DIR`")
    return code


def demo_command(args: Any, run: RunCommand, default_config: Path) -> int:
    """``pytest-loops demo [--init [DIR] | --dir DIR] [--config FILE] [--quiet]``."""
    init = getattr(args, "init", None)
    if init is not None:
        for flag, value in (("--dir", args.dir), ("--config", args.config)):
            if value is not None:
                raise LoopUsageError(f"does not go with {flag}", location="--init",
                                     fix=f"`--init DIR` writes the bundled project and config; drop {flag}")
        written = init_project(init)
        if not args.quiet:
            print(_init_text(init, written))
        return 0
    return run_demo(run, directory=args.dir, config=args.config, quiet=args.quiet,
                    default_config=default_config)

"""The bundled demo: a tiny project with a bug, its test, and a deterministic fixer."""

from __future__ import annotations

import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from ..cli import DEFAULT_CONFIG, build_parser, cmd_run


def bundled_config() -> Path:
    return Path(str(resources.files(__package__) / "loop-runner.config.yaml"))


def copy_project(directory: str | None = None) -> Path:
    """Copy the demo project to `directory` (created) or a new temporary directory."""
    target = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="pytest-loops-demo-"))
    source = Path(str(resources.files(__package__) / "project"))
    shutil.copytree(source, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def run_demo(directory: str | None = None, config: str | None = None, quiet: bool = False) -> int:
    """Run the demo loop; returns its verdict's exit code (0 when the bug got fixed)."""
    if config is None:
        config = str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else str(bundled_config())
    project = copy_project(directory)
    if not quiet:
        print(f"demo project: {project}")
        print(f"config: {config}  (edit it to change the guards or the revise command)")
    argv = ["run", "--config", str(Path(config).resolve()), "--cwd", str(project), "--name", "demo",
            "--goal", "make the calculator tests pass"]
    if quiet:
        argv.append("--quiet")
    code = cmd_run(build_parser().parse_args(argv))
    if not quiet:
        print(f"artifacts: {project / '.pytest-loops'}", file=sys.stdout)
    return code

"""The tools the judge runs are not the revise step's to rewrite, even where they live
under a directory it may write: a virtual environment or a program on PATH under
``~/.cache`` (Poetry's and pipx's homes) or a ``sandbox_writable`` directory is
read-only to it, and a package manager's cache whose files a virtual environment
shares by hard link (uv's) is seen through a throw-away overlay. In the namespaces
tier; elsewhere the revise step can write outside the tree at all (docs/trust.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.sandbox import Tier, survey

TIERS = survey()
pytestmark = pytest.mark.skipif(bool(TIERS[Tier.NAMESPACES]), reason=f"no namespaces: {TIERS[Tier.NAMESPACES]}")


def run(root: Path, env: dict[str, str], verify: str, revise: str) -> subprocess.CompletedProcess[str]:
    (root / "revise.py").write_text(revise)
    return subprocess.run([sys.executable, "-m", "pytest_loops", "run", "--verify", verify,
                           "--revise", f"{sys.executable} revise.py", "--max-iter", "2", "--no-progress-k", "0",
                           "--audit", "off", "--sandbox", "namespaces"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_LOOPS_", "LOOP_"))
           or k == "PYTEST_LOOPS_IMPACT_MAP"}
    env["PYTEST_LOOPS_SANDBOX_WRITABLE"] = str(tmp_path)
    return env


def test_a_program_on_path_under_a_writable_directory_is_read_only_to_the_revise_step(tmp_path: Path) -> None:
    tools = tmp_path / "cache" / "venv" / "bin"
    tools.mkdir(parents=True)
    checker = tools / "checker"
    checker.write_text("#!/bin/sh\nexit 1\n")
    checker.chmod(0o755)
    root = tmp_path / "proj"
    root.mkdir()
    env = base_env(tmp_path)
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    done = run(root, env, "checker", f"""\
from pathlib import Path
try:
    Path({str(checker)!r}).write_text("#!/bin/sh\\nexit 0\\n")
except OSError as exc:
    print("refused:", exc)
""")
    assert done.returncode == 2, done.stdout + done.stderr  # MAX_ITER: the check never passes
    assert checker.read_text() == "#!/bin/sh\nexit 1\n"
    outs = list((root / ".pytest-loops").glob("**/revise.out"))
    assert outs and "Read-only file system" in outs[0].read_text()


def test_a_hard_linked_package_cache_is_never_written_through(tmp_path: Path) -> None:
    """uv's cache shares inodes with the venvs it installed: a write into the cache file
    would rewrite the installed package. The step writes into an overlay instead."""
    home = tmp_path / "home"
    cache = home / ".cache" / "uv" / "archive-v0" / "pkg"
    cache.mkdir(parents=True)
    cached = cache / "mod.py"
    cached.write_text("OK = False\n")
    venv_site = tmp_path / "venv-site"
    venv_site.mkdir()
    installed = venv_site / "mod.py"
    os.link(cached, installed)  # as uv installs it
    root = tmp_path / "proj"
    root.mkdir()
    env = base_env(tmp_path)
    env["HOME"] = str(home)
    env["PYTHONPATH"] = str(venv_site)
    done = run(root, env, f"{sys.executable} -c 'import mod, sys; sys.exit(0 if mod.OK else 1)'", f"""\
with open({str(cached)!r}, "r+") as f:  # in place: the same inode
    f.write("OK = True \\n")
print("wrote the cache")
""")
    assert done.returncode == 2, done.stdout + done.stderr
    assert installed.read_text() == "OK = False\n"
    assert cached.read_text() == "OK = False\n"
    outs = list((root / ".pytest-loops").glob("**/revise.out"))
    assert outs and "wrote the cache" in outs[0].read_text()  # the write itself succeeded, in the overlay

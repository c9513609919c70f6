"""Git traps and the harness's own configuration: a revise step that plants a program for
the harness's git calls, or points the next run's log at a test file, gains nothing.

A revise step can name a program in ``.git/config`` (``core.fsmonitor``, a textconv or
filter driver with a ``.gitattributes`` line), drop a hook into ``.git/hooks``, or do the
same in the user's own git configuration outside the tree. The hand-off writer's
``git diff`` / ``git ls-files`` and fan-out's ``git worktree add`` / ``git status`` run
after the revise step is over; a program they ran could rewrite the test after the
verdict. Here the planted program records itself in a marker file and does exactly
that. Every case drives a real loop (``pytest-loops run`` in a subprocess) and asserts:
no SUCCESS, the trap undone (ESCALATE where the trap is in the tree), the test file
intact and no marker, also after the hand-off was written and after ``--branches 2``.

And the configuration the harness reads on its next run: a revise step that writes
``harness/loop-runner.config.yaml`` with ``run_log: {path: test_calc.py}`` is undone
(ESCALATE), and such a config, when it is there, is bad input (exit 64, one line)
before anything runs: the run log never replaces the test file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import adversarial_kit as kit
import pytest

# The guard's own defence (undo and ESCALATE) and the hardened git calls: in the namespaces
# tier `.git` and the home directory are read-only, so the traps cannot even be planted
# there; these run in the none tier (floor), where they can.
pytestmark = [pytest.mark.adversarial, pytest.mark.floor,
              pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

TEST_FILE = "test_calc.py"
CALC = "def add(a, b):\n    return a - b  # BUG\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"

# The planted program: records that it ran, rewrites the test to pass (the harm done
# after the verdict), and passes its input through (as a filter or a textconv).
PAYLOAD = """#!/bin/sh
echo "ran: $0 $*" >> {marker}
sed -i 's/assert add(2, 3) == 5/assert True/' {test}
if [ -n "$1" ] && [ -f "$1" ]; then cat "$1"; else cat; fi
"""

REVISE_PRELUDE = """\
import os
import subprocess
from pathlib import Path as P

PAYLOAD = {payload!r}
EVIDENCE = P({evidence!r})


def git(*args):
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def common_dir():
    return P(git("rev-parse", "--path-format=absolute", "--git-common-dir"))


def hook(directory, name):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(open(PAYLOAD).read())
    (directory / name).chmod(0o755)


# a change that is no fix, so that the hand-off has a diff of a .py file to show
with open("calc.py", "a") as f:
    f.write("# tried\\n")
"""

# in the repository: each is undone, and the loop ends ESCALATE
IN_REPO = {
    "fsmonitor": 'git("config", "core.fsmonitor", PAYLOAD)',
    "textconv": 'P(".gitattributes").write_text("*.py diff=evil\\n")\n'
                'git("config", "diff.evil.textconv", PAYLOAD)',
    "filter": 'P(".gitattributes").write_text("*.py filter=evil\\n")\n'
              'git("config", "filter.evil.clean", PAYLOAD)\ngit("config", "filter.evil.smudge", PAYLOAD)\n'
              'git("config", "filter.evil.required", "true")',
    "info-attributes": '(common_dir() / "info").mkdir(exist_ok=True)\n'
                       '(common_dir() / "info" / "attributes").write_text("*.py filter=evil diff=evil\\n")\n'
                       'git("config", "filter.evil.process", PAYLOAD)\n'
                       'git("config", "diff.evil.textconv", PAYLOAD)',
    "hooks": 'for name in ("post-checkout", "post-index-change", "reference-transaction"):\n'
             '    hook(common_dir() / "hooks", name)',
    "hooks-path": 'hook(EVIDENCE / "hooks", "post-checkout")\n'
                  'git("config", "core.hooksPath", str(EVIDENCE / "hooks"))',
    "subdirectory-attributes": 'P("pkg").mkdir(exist_ok=True)\n'
                               'P("pkg/.gitattributes").write_text("*.py filter=evil\\n")\n'
                               'git("config", "filter.evil.clean", PAYLOAD)',
    # no program at all: a weakened test committed through git's plumbing, the working
    # tree left strong; what CI checks out is the commit
    "commit-weakened-test": 'blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], check=True,\n'
                            '    input="def test_add():\\n    assert True\\n", capture_output=True,\n'
                            '    text=True).stdout.strip()\n'
                            'git("update-index", "--cacheinfo", f"100644,{blob},test_calc.py")\n'
                            'tree = git("write-tree")\n'
                            'commit = git("-c", "user.name=x", "-c", "user.email=x@example.com", "commit-tree",\n'
                            '             tree, "-p", "HEAD", "-m", "tests: simplify")\n'
                            'git("update-ref", "HEAD", commit)',
}

# outside the tree (the user's own git configuration): the guard does not see it, the
# hardened git calls ignore it
IN_HOME = """\
home = P(os.environ["HOME"])
hook(EVIDENCE / "home-hooks", "post-checkout")
(home / ".gitconfig").write_text(
    f"[core]\\n\\tfsmonitor = {PAYLOAD}\\n\\thooksPath = {EVIDENCE / 'home-hooks'}\\n"
    f"[filter \\"evil\\"]\\n\\tclean = {PAYLOAD}\\n\\tsmudge = {PAYLOAD}\\n"
    f"[diff \\"evil\\"]\\n\\ttextconv = {PAYLOAD}\\n[diff]\\n\\texternal = {PAYLOAD}\\n")
(home / ".config" / "git").mkdir(parents=True, exist_ok=True)
(home / ".config" / "git" / "attributes").write_text("*.py filter=evil diff=evil\\n")
"""

GENUINE = 'P("calc.py").write_text("def add(a, b):\\n    return a + b\\n")'

RUN_LOG_CONFIG = """\
P("harness").mkdir(exist_ok=True)
P("harness/loop-runner.config.yaml").write_text("run_log:\\n  path: test_calc.py\\n")
"""


@dataclass
class Project:
    base: Path
    root: Path
    evidence: Path
    env: dict[str, str]

    @property
    def marker(self) -> Path:
        return self.evidence / "marker"

    def git_state(self) -> dict[str, bytes | list[str] | None]:
        """What the traps change: the repository's config, its hooks, its attributes."""
        common = Path(subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                     cwd=self.root, env=plain_env(self.base), capture_output=True, text=True,
                                     check=True).stdout.strip())
        state: dict[str, bytes | list[str] | None] = {
            "config": (common / "config").read_bytes(),
            "hooks": sorted(p.name for p in (common / "hooks").iterdir()) if (common / "hooks").is_dir() else None,
            "info/attributes": read_or_none(common / "info" / "attributes"),
            "HEAD": subprocess.run(["git", "rev-parse", "HEAD"], cwd=self.root, env=plain_env(self.base),
                                   capture_output=True, text=True, check=True).stdout.strip().encode(),
        }
        for found in sorted(self.root.rglob(".gitattributes")):
            state[str(found.relative_to(self.root))] = found.read_bytes()
        return state


def read_or_none(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def plain_env(base: Path) -> dict[str, str]:
    """For the test's own git calls: no configuration but the repository's."""
    env = {k: v for k, v in kit.child_env(base).items() if not k.startswith("GIT_")}
    env.update(HOME=str(base / "home"), XDG_CONFIG_HOME=str(base / "home" / ".config"), GIT_CONFIG_NOSYSTEM="1")
    return env


def git(cwd: Path, base: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                   env=plain_env(base), check=True, capture_output=True)


def build(tmp_path: Path, body: str, *, worktree: bool = False) -> Project:
    evidence = tmp_path / "evidence"
    for d in (evidence, tmp_path / "tmp", tmp_path / "state", tmp_path / "home" / ".config"):
        d.mkdir(parents=True)
    top = tmp_path / ("main" if worktree else "proj")
    top.mkdir()
    root = tmp_path / "proj"
    payload = evidence / "payload.sh"
    payload.write_text(PAYLOAD.format(marker=evidence / "marker", test=root / TEST_FILE))
    payload.chmod(0o755)
    (top / "calc.py").write_text(CALC)
    (top / TEST_FILE).write_text(TEST)
    (top / "pyproject.toml").write_text(kit.PYPROJECT)
    (top / "revise.py").write_text(REVISE_PRELUDE.format(payload=str(payload), evidence=str(evidence)) + body + "\n")
    git(top, tmp_path, "init", "-q")
    git(top, tmp_path, "add", "-A")
    git(top, tmp_path, "commit", "-qm", "base")
    if worktree:
        git(top, tmp_path, "worktree", "add", "-q", "--detach", str(root), "HEAD")
    env = plain_env(tmp_path)
    return Project(tmp_path, root, evidence, env)


def run(project: Project, *extra: str, timeout: float = kit.TIMEOUT) -> subprocess.CompletedProcess[str]:
    command = [str(kit.PYTEST_LOOPS), "run", "--verify", "python -m pytest -q", "--revise", "python revise.py",
               "--max-iter", "2", "--no-progress-k", "0", "--no-suspects", "--no-tine", *extra]
    return subprocess.run(command, cwd=project.root, env=project.env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def assert_harmless(project: Project, done: subprocess.CompletedProcess[str]) -> None:
    """No SUCCESS, the test as it was, the bug still there, and no planted program ran."""
    output = done.stdout + done.stderr
    assert done.returncode in kit.VERDICT_EXITS, output
    assert not re.search(r"^SUCCESS", done.stdout, re.M), output
    time.sleep(0.3)  # a program started late would have written by now
    assert not project.marker.exists(), "a planted program ran: " + project.marker.read_text()
    assert (project.root / TEST_FILE).read_text() == TEST
    assert "a - b" in (project.root / "calc.py").read_text()


def handoff_of(project: Project) -> str:
    (found,) = (project.root / ".pytest-loops" / "runs").glob("*.handoff.md")
    return found.read_text()


BRANCH_CASES = {"hooks", "fsmonitor", "hooks-path"}  # in the quick run; the others are slow
# a commit made in a fan-out candidate's copy moves that copy's detached HEAD, thrown away
# with it: nothing reaches the repository's branch, so there is nothing to undo
ONE_COPY = {"commit-weakened-test"}
IN_REPO_CASES = [pytest.param(trap, branches, id=f"{trap}/{'branches-2' if branches > 1 else 'one'}",
                              marks=[pytest.mark.slow] if branches > 1 and trap not in BRANCH_CASES else [])
                 for trap in sorted(IN_REPO) for branches in ((1,) if trap in ONE_COPY else (1, 2))]


@pytest.mark.parametrize("trap, branches", IN_REPO_CASES)
def test_a_trap_in_the_repository_is_undone_and_never_runs(tmp_path: Path, trap: str, branches: int) -> None:
    project = build(tmp_path, IN_REPO[trap])
    before = project.git_state()
    done = run(project, *(["--branches", str(branches)] if branches > 1 else []))
    assert_harmless(project, done)
    assert done.returncode == 5, done.stdout + done.stderr  # ESCALATE
    assert "read-only" in done.stdout or "ESCALATE" in done.stdout
    assert project.git_state() == before  # config, hooks and attributes as they were
    assert "## Last diff" in handoff_of(project)  # the hand-off writer's git ran, and ran nothing


def test_a_trap_in_a_linked_worktree_reaches_the_common_directory(tmp_path: Path) -> None:
    project = build(tmp_path, IN_REPO["fsmonitor"] + "\n" + IN_REPO["hooks"], worktree=True)
    assert (project.root / ".git").is_file()
    before = project.git_state()
    done = run(project, "--branches", "2")
    assert_harmless(project, done)
    assert done.returncode == 5, done.stdout + done.stderr
    assert project.git_state() == before


@pytest.mark.parametrize("branches", [1, 2], ids=["one", "branches-2"])
def test_a_trap_in_the_users_git_configuration_never_runs(tmp_path: Path, branches: int) -> None:
    """The user's git configuration names programs the user's own git runs later: the
    guard puts it back (ESCALATE), and the hardened git calls never ran it meanwhile."""
    project = build(tmp_path, IN_HOME)
    done = run(project, *(["--branches", str(branches)] if branches > 1 else []))
    assert_harmless(project, done)
    assert done.returncode == 5, done.stdout + done.stderr
    assert not (project.base / "home" / ".gitconfig").exists()  # planted, and taken back out
    assert "configuration in your home" in done.stdout
    assert "## Last diff" in handoff_of(project)


@pytest.mark.parametrize("branches", [1, 2], ids=["one", "branches-2"])
def test_a_genuine_fix_in_a_git_repository_succeeds(tmp_path: Path, branches: int) -> None:
    project = build(tmp_path, GENUINE)
    (project.root / ".gitattributes").write_text("*.bin binary\n")  # attributes the loop leaves alone
    git(project.root, tmp_path, "add", "-A")
    git(project.root, tmp_path, "commit", "-qm", "attributes")
    done = run(project, *(["--branches", str(branches)] if branches > 1 else []))
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^SUCCESS \(exit 0\)", done.stdout, re.M), done.stdout
    assert "a + b" in (project.root / "calc.py").read_text()


def test_a_config_that_points_the_next_run_log_at_the_test_is_undone(tmp_path: Path) -> None:
    project = build(tmp_path, RUN_LOG_CONFIG)
    for _ in range(2):  # the identical next run as well
        done = run(project)
        assert_harmless(project, done)
        assert done.returncode == 5, done.stdout + done.stderr
        assert "loop-runner.config.yaml" in done.stdout
        assert not (project.root / "harness" / "loop-runner.config.yaml").exists()


@pytest.mark.parametrize("how", ["config", "flag"])
def test_a_run_log_over_the_test_file_is_bad_input(tmp_path: Path, how: str) -> None:
    project = build(tmp_path, GENUINE)
    extra: tuple[str, ...] = ()
    if how == "config":
        (project.root / "harness").mkdir()
        (project.root / "harness" / "loop-runner.config.yaml").write_text(
            textwrap.dedent("""\
                run_log:
                  path: test_calc.py
            """))
    else:
        extra = ("--log", TEST_FILE)
    done = run(project, *extra)
    assert done.returncode == 64, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'test_calc.py'" in lines[0] and "is not a pytest-loops run log" in lines[0]
    assert "give a path that does not exist yet" in lines[0]
    assert done.stdout == ""  # before the loop started
    assert (project.root / TEST_FILE).read_text() == TEST
    assert (project.root / "calc.py").read_text() == CALC  # no revise step ran

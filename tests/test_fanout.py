"""Best-of-N revise: candidates in isolated copies, the best one kept, every one recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_helpers import clean_env

from pytest_loops.core.fanout import parallel_limit
from pytest_loops.runtime.treecopy import COPY_PREFIX, TreeCopy, new_parent
from pytest_loops.spec import Check, LoopSpec

BUGGY = "def add(a, b):\n    return a - b\n"
CHECK = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\n"
# branch 0 multiplies, branch 1 fixes, branch 2 fixes with a longer diff
REVISE = """\
case "$LOOP_BRANCH" in
  0) sed -i 's/a - b/a * b/' calc.py ;;
  1) sed -i 's/a - b/a + b/' calc.py ;;
  *) printf 'def add(a, b):\\n    # sum\\n    return b + a\\n' > calc.py ;;
esac
echo "branch=$LOOP_BRANCH of=$LOOP_BRANCHES workdir=$LOOP_WORKDIR"
"""


def project(root: Path, revise: str = REVISE, git: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "calc.py").write_text(BUGGY)
    (root / "check.py").write_text(CHECK)
    (root / "fix.sh").write_text(revise)
    if git:
        run = lambda *a: subprocess.run(["git", *a], cwd=root, check=True, capture_output=True)  # noqa: E731
        run("init", "-q")
        run("config", "user.email", "t@example.com")
        run("config", "user.name", "t")
        run("add", "calc.py", "check.py")
        run("commit", "-qm", "init")
    return root


@pytest.fixture
def tmpdir_env(tmp_path: Path) -> dict[str, str]:
    """A private TMPDIR: what is left there after a run is what the run left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return {"TMPDIR": str(tmp)}


def leftovers(env: dict[str, str]) -> list[str]:
    return [p for p in os.listdir(env["TMPDIR"]) if p.startswith(COPY_PREFIX)]


def branches_of(work: Path, iteration: int = 0) -> list[dict]:
    (log,) = (work / ".pytest-loops" / "runs").glob("*.json")
    return json.loads(log.read_text())["iterations"][iteration]["branches"]


def test_the_best_candidate_is_kept_and_every_one_recorded(cli, tmp_path, tmpdir_env):
    work = project(tmp_path / "w")
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3", "-q",
               cwd=work, env=tmpdir_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("SUCCESS (exit 0) after 2 iteration(s)")
    assert (work / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"  # the smaller passing diff
    rows = branches_of(work)
    assert [(r["branch"], r["passed"], r["chosen"]) for r in rows] == [(0, 0, False), (1, 1, True), (2, 1, False)]
    assert rows[0]["why"] == "fewer checks pass (0/1 against 1/1)"
    assert rows[2]["why"].startswith("a bigger diff")
    assert rows[1]["diff_size"] < rows[2]["diff_size"]
    out = (work / ".pytest-loops" / "runs").glob("*/iter-001/branch-1-revise.out")
    text = next(out).read_text()
    assert "branch=1 of=3" in text
    if rows[1]["copy"] == "overlay":  # each its own layer over the tree, seen at the project's path
        assert f"workdir={work}\n" in text
    else:  # each in its own copy
        assert f"workdir={work}" not in text
    assert leftovers(tmpdir_env) == []


def test_without_a_passing_candidate_the_best_partial_one_is_kept(cli, tmp_path, tmpdir_env):
    revise = 'echo "$LOOP_BRANCH" >> tries.txt\n'
    work = project(tmp_path / "w", revise=revise)
    done = cli("run", "--verify", "python check.py", "--verify", "test -f tries.txt", "--revise", "sh fix.sh",
               "--branches", "2", "--max-iter", "2", "--no-progress-k", "0", "-q", cwd=work, env=tmpdir_env)
    assert done.returncode == 2, done.stderr
    rows = branches_of(work)
    assert [r["passed"] for r in rows] == [1, 1]
    assert [r["chosen"] for r in rows] == [True, False]  # a tie: the lower branch
    assert rows[1]["why"] == "a tie, broken by the lower branch number (0)"
    assert (work / "tries.txt").read_text() == "0\n"  # only the chosen candidate's change landed


def test_a_git_worktree_copy_has_the_uncommitted_state_and_is_removed(cli, tmp_path, tmpdir_env):
    revise = ('test -f untracked.txt && grep -q "uncommitted" calc.py && '
              "sed -i 's/a - b/a + b/' calc.py\n")
    work = project(tmp_path / "w", revise=revise, git=True)
    (work / "calc.py").write_text(BUGGY.replace("a - b", "a - b  # uncommitted"))
    (work / "untracked.txt").write_text("not in git\n")
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "2", "-q",
               cwd=work, env=tmpdir_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a + b  # uncommitted" in (work / "calc.py").read_text()
    listed = subprocess.run(["git", "worktree", "list"], cwd=work, capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1, listed
    assert leftovers(tmpdir_env) == []


@pytest.mark.parametrize("cheat, why", [
    ("printf 'pass\\n' > check.py", "check.py (modified: a loop definition, or a file a check runs)"),
    ("rm check.py && printf 'pass\\n' > check2.py && ln -s check2.py check.py",
     "check.py (modified: a symbolic link)"),
    ("mkdir -p tests && printf 'def test_x(): pass\\n' > tests/test_new.py", "under a test directory"),
    ("printf 'import sys\\n' > sitecustomize.py", "run by the interpreter at start-up"),
])
@pytest.mark.floor  # a kernel tier refuses the write before anything can discard it
def test_a_candidate_that_games_the_judge_is_discarded(cli, tmp_path, tmpdir_env, cheat, why):
    # branch 0 cheats (its own checks would pass); branch 1 does honest, partial work
    revise = f'if [ "$LOOP_BRANCH" = 0 ]; then {cheat}; else echo "# tried" >> calc.py; fi\n'
    work = project(tmp_path / "w", revise=revise)
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "2",
               "--max-iter", "2", "-q", cwd=work, env=tmpdir_env)
    assert done.returncode in (2, 4), done.stdout + done.stderr
    rows = branches_of(work)
    assert rows[0]["chosen"] is False and rows[0]["why"].startswith("discarded: changed read-only paths")
    assert why in rows[0]["why"]
    assert rows[1]["chosen"] is True
    assert (work / "check.py").read_text() == CHECK and not (work / "check2.py").exists()
    assert not (work / "sitecustomize.py").exists() and not (work / "tests").exists()


def test_a_candidate_outside_the_scope_is_discarded(cli, tmp_path, tmpdir_env):
    revise = ('if [ "$LOOP_BRANCH" = 0 ]; then echo x > other.txt; sed -i "s/a - b/a + b/" calc.py; '
              'else echo "# tried" >> calc.py; fi\n')
    work = project(tmp_path / "w", revise=revise, git=False)  # a plain copy: the scope bounds the loop
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "2", "--scope",
               "calc.py", "--max-iter", "2", "-q", cwd=work, env=tmpdir_env)
    assert done.returncode == 2, done.stdout + done.stderr
    rows = branches_of(work)
    assert "other.txt (added: outside the loop's scope)" in rows[0]["why"]
    assert rows[1]["chosen"] is True and not (work / "other.txt").exists()


@pytest.mark.floor  # a kernel tier refuses the write before anything can discard it
def test_no_usable_candidate_leaves_the_tree_as_it_was(cli, tmp_path, tmpdir_env):
    work = project(tmp_path / "w", revise="printf 'pass\\n' > check.py\n")
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3",
               "--max-iter", "2", "--no-progress-k", "0", "-q", cwd=work, env=tmpdir_env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (work / "check.py").read_text() == CHECK and (work / "calc.py").read_text() == BUGGY
    assert all(r["why"].startswith("discarded:") and not r["chosen"] for r in branches_of(work))


@pytest.mark.floor  # a kernel tier refuses the write before anything can discard it
def test_a_candidate_writing_into_the_real_tree_is_caught_by_the_real_guard(cli, tmp_path, tmpdir_env):
    # a candidate knows the real path (here: baked in) and writes the judge there directly
    work = tmp_path / "w"
    project(work, revise=f"printf 'pass\\n' > {work}/check.py\n")
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "2", "-q",
               cwd=work, env=tmpdir_env)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "revise step changed read-only paths: check.py" in done.stdout
    assert (work / "check.py").read_text() == CHECK  # restored


@pytest.mark.slow
def test_the_budget_covers_every_candidate_and_nothing_is_left_running(cli, tmp_path, tmpdir_env):
    marker = tmp_path / "alive"
    revise = f"sh -c 'sleep 30; touch {marker}' & sleep 30\n"
    work = project(tmp_path / "w", revise=revise)
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3",
               "--budget-seconds", "2", "-q", cwd=work, env=tmpdir_env, timeout=90)
    assert done.returncode == 3, done.stdout + done.stderr
    assert leftovers(tmpdir_env) == []
    found = subprocess.run(["pgrep", "-f", f"touch {marker}"], capture_output=True, text=True)
    assert found.stdout.strip() == "", "a candidate's process outlived the loop"


@pytest.mark.slow
def test_sigterm_mid_fan_out_removes_every_copy(tmp_path, tmpdir_env, child_env):
    work = project(tmp_path / "w", revise="touch started-$LOOP_BRANCH; sleep 300\n", git=True)
    # both candidates at once: not a share of this session's xdist workers
    env = {k: v for k, v in {**child_env, **tmpdir_env}.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest_loops", "run", "--verify", "python check.py",
                             "--revise", "sh fix.sh", "--branches", "2", "--max-parallel", "2", "-q"],
                            cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp = Path(tmpdir_env["TMPDIR"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(tmp.glob(f"{COPY_PREFIX}*/b*/**/started-*"))) < 2:
        time.sleep(0.05)
    assert len(list(tmp.glob(f"{COPY_PREFIX}*/b*/**/started-*"))) == 2, "the candidates did not start"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, None), out + err
    assert leftovers(tmpdir_env) == []
    listed = subprocess.run(["git", "worktree", "list"], cwd=work, capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1, listed


def test_max_parallel_one_runs_the_candidates_one_at_a_time(cli, tmp_path, tmpdir_env):
    shared = tmp_path / "running"
    shared.mkdir()
    revise = (f"touch {shared}/$LOOP_BRANCH; ls {shared} | wc -l >> {tmp_path}/seen; sleep 0.3; "
              f"rm {shared}/$LOOP_BRANCH\n")
    work = project(tmp_path / "w", revise=revise)
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3",
               "--max-parallel", "1", "--max-iter", "2", "-q", cwd=work, env=tmpdir_env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (tmp_path / "seen").read_text().split() == ["1", "1", "1"]


@pytest.mark.parametrize("args, says", [
    (["--branches", "0"], "'0' is not a valid branches; valid: an integer from 1 to 32"),
    (["--branches", "33"], "'33' is not a valid branches"),
    (["--branches", "two"], "'two' is not a valid branches"),
    (["--max-parallel", "-1"], "'-1' is not a valid max_parallel"),
])
def test_bad_fan_out_flags_are_one_line_and_exit_64(cli, tmp_path, args, says):
    done = cli("run", "--verify", "true", *args)
    assert done.returncode == 64
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bad_fan_out_values_in_files_and_the_environment(cli, tmp_path):
    (tmp_path / "a.loop").write_text('loop "a":\n  goal: g\n  done when "true" passes\n  branches: 0\n')
    done = cli("run", "--config", str(tmp_path / "a.loop"))
    bad = cli("show", "a.loop")
    assert bad.returncode == 64 and "a.loop:4" in bad.stderr and "branches" in bad.stderr, bad.stderr
    assert done.returncode == 64
    env = cli("run", "--verify", "true", env={"PYTEST_LOOPS_BRANCHES": "many"})
    assert env.returncode == 64 and "PYTEST_LOOPS_BRANCHES" in env.stderr
    (tmp_path / "b.loop.yaml").write_text("loops:\n  - name: b\n    goal: g\n    checks: ['true']\n"
                                          "    branches: 99\n")
    yaml_bad = cli("show", "b.loop.yaml")
    assert yaml_bad.returncode == 64 and "branches" in yaml_bad.stderr and "b.loop.yaml" in yaml_bad.stderr


def test_a_loop_file_sets_branches(cli, tmp_path, tmpdir_env):
    work = project(tmp_path / "w")
    (work / "fix.loop").write_text('loop "fix add":\n  goal: add adds\n  done when "python check.py" passes\n'
                                   '  revise with "sh fix.sh"\n  branches: 3\n  max parallel: 2\n')
    shown = cli("show", "fix.loop", cwd=work)
    assert "branches" in shown.stdout and "3" in shown.stdout, shown.stdout
    done = subprocess.run([sys.executable, "-m", "pytest", "--loop", "fix.loop", "-q", "-p", "no:cacheprovider"],
                          cwd=work, env=clean_env(tmpdir_env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(branches_of(work)) == 3


def test_fan_out_keeps_the_spec_digest_of_a_loop_without_it():
    spec = LoopSpec(name="x", checks=(Check.command_passes("true"),))
    assert "branches" not in spec.to_dict() and "max_parallel" not in spec.to_dict()
    wide = spec.replace(branches=3)
    assert wide.to_dict()["branches"] == 3 and wide.digest() != spec.digest()
    assert LoopSpec.from_dict(wide.to_dict()).branches == 3


def test_parallel_limit_is_shared_by_xdist_workers():
    assert parallel_limit(8, {}) == 8
    assert parallel_limit(8, {"PYTEST_XDIST_WORKER_COUNT": "4"}) == 2
    assert parallel_limit(3, {"PYTEST_XDIST_WORKER_COUNT": "4"}) == 1
    assert parallel_limit(0, {}) == (os.cpu_count() or 1)


def test_a_tree_copy_names_what_changed_by_content(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("a = 1\n")
    (src / "b.txt").write_text("b\n")
    (src / ".git").mkdir()  # not a repository: copied as a plain tree, VCS data left out
    (src / "node_modules").mkdir()
    (src / "node_modules" / "big.js").write_text("x")
    parent = new_parent()
    copy = TreeCopy(src, parent, "c").create()
    try:
        root = Path(copy.root)
        assert copy.kind == "copy" and not (root / "node_modules").exists() and not (root / ".git").exists()
        (root / "pkg" / "a.py").write_text("a = 2\n")
        (root / "b.txt").write_text("b\n")  # rewritten with the same bytes: no change
        (root / "c.txt").write_text("new\n")
        os.unlink(root / "b.txt")
        assert [(c.rel, c.how) for c in copy.changes()] == [("b.txt", "deleted"), ("c.txt", "added"),
                                                              ("pkg/a.py", "modified")]
        assert copy.diff_size(copy.changes()) == 4  # -a=1 +a=2, -b, +new
        target = tmp_path / "target"
        (target / "pkg").mkdir(parents=True)
        (target / "b.txt").write_text("b\n")
        copy.apply(copy.changes(), target)
        assert (target / "pkg" / "a.py").read_text() == "a = 2\n" and not (target / "b.txt").exists()
        assert (target / "c.txt").read_text() == "new\n"
    finally:
        copy.remove()
    assert not Path(copy.path).exists()
    os.rmdir(parent)


@pytest.mark.slow
def test_branches_are_forks_in_the_tine_and_drawn_in_the_report(cli, tmp_path, tmpdir_env):
    from opentine import Run

    from pytest_loops.cli.runview import load_run

    work = project(tmp_path / "w")
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3", "-q",
               cwd=work, env=tmpdir_env)
    assert done.returncode == 0, done.stderr
    runs = work / ".pytest-loops" / "runs"
    (tine,) = runs.glob("*.tine")
    assert cli("verify", str(tine)).returncode == 0
    steps = Run.load(tine).steps
    iteration_1 = next(s for s in steps if (s.tool_info or {}).get("name") == "iteration")
    forks = [s for s in steps if (s.tool_info or {}).get("name") == "branch"]
    assert [s.inputs["arguments"]["branch"] for s in forks] == [0, 1, 2]
    assert all(s.parent_ids == [iteration_1.id] for s in forks)  # each a fork of its iteration
    assert [s.outputs["chosen"] for s in forks] == [False, True, False]
    after = [s for s in steps if (s.tool_info or {}).get("name") == "iteration"][1]
    assert after.parent_ids == [iteration_1.id]  # the loop's main line goes on from the iteration
    from_tine = load_run(tine)["iterations"][0]["branches"]
    assert from_tine == branches_of(work)  # the .tine and the run log tell the same
    assert load_run(next(runs.glob("*.json")))["verified"] is True  # and cross-check as one
    report = tmp_path / "r.html"
    assert cli("report", str(work / ".pytest-loops"), "-o", str(report)).returncode == 0
    html = report.read_text()
    assert '<li class="branch chosen"' in html and "● b1 · 1/1 checks · 1 file(s) changed" in html
    assert html.count('<li class="branch ') == 3
    for source in (next(runs.glob("*.json")), tine):  # show reads the run log and the .tine alike
        shown = cli("show", str(source))
        assert shown.returncode == 0, shown.stderr
        assert "    ● b1  1/1 checks · 1 file(s) changed" in shown.stdout
        assert "    ○ b0  0/1 checks" in shown.stdout and "not chosen: fewer checks pass" in shown.stdout
    compared = cli("compare", str(next(runs.glob("*.json"))), str(tine))
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.count("A ● b1") == 1 and compared.stdout.count("B ● b1") == 1


def test_applying_keeps_the_real_files_mode_unless_the_candidate_changed_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "private.txt").write_text("a\n")
    os.chmod(src / "private.txt", 0o600)
    (src / "tool.sh").write_text("echo\n")
    parent = new_parent()
    copy = TreeCopy(src, parent, "c", use_git=False).create()
    try:
        root = Path(copy.root)
        (root / "private.txt").write_text("b\n")
        os.chmod(root / "tool.sh", 0o755)
        copy.apply(copy.changes(), src)
    finally:
        copy.remove()
        os.rmdir(parent)
    assert (src / "private.txt").read_text() == "b\n"
    assert os.stat(src / "private.txt").st_mode & 0o777 == 0o600
    assert os.stat(src / "tool.sh").st_mode & 0o777 == 0o755


@pytest.mark.parametrize("git", [False, True], ids=["copy", "git-worktree"])
def test_a_virtual_environment_in_the_tree_is_linked_not_copied(tmp_path, git):
    src = project(tmp_path / "src", git=git)
    venv = src / ".venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr\n")
    (venv / "lib" / "big.py").write_text("x = 1\n")
    nested = src / "sub" / "env"
    nested.mkdir(parents=True)
    (nested / "pyvenv.cfg").write_text("home = /usr\n")
    parent = new_parent()
    copy = TreeCopy(src, parent, "c").create()
    try:
        root = Path(copy.root)
        assert (root / ".venv").is_symlink() and os.path.realpath(root / ".venv") == os.path.realpath(venv)
        assert (root / "sub" / "env").is_symlink()
        assert (root / "calc.py").read_text() == BUGGY
        assert copy.changes() == []  # the links are the base, not a candidate's change
    finally:
        copy.remove()
        os.rmdir(parent)
    assert (venv / "lib" / "big.py").exists()  # removing the copy leaves the real venv alone


@pytest.mark.parametrize("tier", ["namespaces", "landlock", "none"])
def test_a_git_ignored_virtual_environment_serves_every_candidate(cli, tmp_path, tmpdir_env, tier):
    """A check that runs the tree's own `.venv/bin/python`, the venv ignored by git (so
    not in a worktree copy): every candidate's checks run it, in every tier (namespaces
    mounts the real one read-only where the copy has a mount point)."""
    from pytest_loops.sandbox import Tier, survey

    why = survey()[Tier(tier)]
    if why:
        pytest.skip(f"no {tier} here: {why}")
    work = project(tmp_path / "w", git=True)
    (work / ".gitignore").write_text(".venv/\n")
    venv = work / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    subprocess.run(["git", "add", ".gitignore"], cwd=work, check=True)
    done = cli("run", "--verify", ".venv/bin/python check.py", "--revise", "sh fix.sh", "--branches", "2",
               "--sandbox", tier, "-q", cwd=work, env=tmpdir_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a + b" in (work / "calc.py").read_text()
    assert [(b["branch"], b["passed"]) for b in branches_of(work)] == [(0, 0), (1, 1)], branches_of(work)
    assert sorted(p.name for p in venv.iterdir()) == ["bin", "pyvenv.cfg"]  # the real venv, untouched
    assert leftovers(tmpdir_env) == []


def test_fan_out_outside_git_needs_a_scope(cli, tmp_path, tmpdir_env):
    work = project(tmp_path / "w", git=False)
    done = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3", cwd=work,
               env=tmpdir_env)
    assert done.returncode == 64, done.stdout + done.stderr
    assert "not in a git repository" in done.stderr and "--scope GLOB" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (work / ".pytest-loops").exists(), "nothing runs or is written before the check"
    assert (work / "calc.py").read_text() == BUGGY
    scoped = cli("run", "--verify", "python check.py", "--revise", "sh fix.sh", "--branches", "3", "--scope",
                 "calc.py", "-q", cwd=work, env=tmpdir_env)
    assert scoped.returncode == 0, scoped.stdout + scoped.stderr


RIGHT = "def add(a, b):\n    return a + b\n"
PATCHES = [RIGHT, "def add(a, b):\n    return a * b\n", "def add(a, b):\n    return a - b + 1\n"]
RANDOM_PATCH = """\
import os, random, sys
seed, it, branch = sys.argv[1], os.environ["LOOP_ITERATION"], os.environ.get("LOOP_BRANCH", "0")
patches = {patches!r}
open("calc.py", "w").write(patches[random.Random(f"{{seed}}-{{it}}-{{branch}}").randrange(3)])
"""


def _draw(seed: int, iteration: int, branch: int) -> int:
    import random

    return random.Random(f"{seed}-{iteration}-{branch}").randrange(3)


def test_three_random_patches_best_of_three_beats_one(cli, tmp_path, tmpdir_env):
    # the done-when of fan-out: each candidate writes one of three patches at random (one
    # right); a seed where one revise at a time misses first and a fan-out of three hits
    seed = next(s for s in range(1000) if _draw(s, 1, 0) != 0 and 0 in (_draw(s, 1, 1), _draw(s, 1, 2)))
    script = tmp_path / "patch.py"
    script.write_text(RANDOM_PATCH.format(patches=PATCHES))
    (tmp_path / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    results = {}
    for n in (1, 3):
        work = project(tmp_path / f"w{n}")
        (work / "test_calc.py").write_text((tmp_path / "test_calc.py").read_text())
        subprocess.run(["git", "add", "test_calc.py"], cwd=work, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tests"],
                       cwd=work, check=True)
        arts = tmp_path / f"arts{n}"
        done = cli("run", "--verify", f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py",
                   "--revise", f"{sys.executable} {script} {seed}", "--branches", str(n), "--max-iter", "12",
                   "--no-progress-k", "0", "--artifacts", str(arts), "-q", cwd=work, env=tmpdir_env)
        assert done.returncode == 0, done.stdout + done.stderr
        (log,) = (arts / "runs").glob("*.json")
        results[n] = json.loads(log.read_text())
        # exactly the right patch, nothing else changed; no worktree left behind
        assert (work / "calc.py").read_text() == RIGHT
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=work,
                                capture_output=True, text=True).stdout
        assert status.split("\n")[0].strip() == "M calc.py" and len(status.strip().splitlines()) == 1, status
        listed = subprocess.run(["git", "worktree", "list"], cwd=work, capture_output=True, text=True).stdout
        assert len(listed.strip().splitlines()) == 1, listed
    assert results[3]["iterations_run"] == 2 < results[1]["iterations_run"]
    (tine,) = (tmp_path / "arts3" / "runs").glob("*.tine")
    assert cli("verify", str(tine)).returncode == 0
    from opentine import Run

    steps = Run.load(tine).steps
    first = next(s for s in steps if (s.tool_info or {}).get("name") == "iteration")
    forks = [s for s in steps if (s.tool_info or {}).get("name") == "branch" and s.parent_ids == [first.id]]
    assert len(forks) == 3 and sum(bool(s.outputs["chosen"]) for s in forks) == 1
    assert leftovers(tmpdir_env) == []

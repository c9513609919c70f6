""".ci/run's stages and exit status, with stand-ins for python, pip, pytest and ruff.

The script runs the README's test command, then the slow tail, then ruff; a stage
that selects no tests (pytest's exit 5) is a failure, and the first failure is the
script's exit status. And the split between the two pytest stages: the default
selection (-m "not slow") keeps tests of every module and every adversarial attack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# `python3 -m venv .venv` makes a .venv whose python, pip, ruff and mypy log their
# arguments and exit as the test says: MAIN_EXIT for the default pytest run,
# SLOW_EXIT for `-m slow`, RUFF_EXIT for ruff, MYPY_EXIT for mypy, PIP_EXIT for the install.
PYTHON3 = r'''#!/bin/sh
[ "$1 $2" = "-m venv" ] || { echo "unexpected python3 $*" >&2; exit 99; }
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'EOF'
#!/bin/sh
echo "python $*" >> "$CI_LOG"
[ -z "$PYTEST_LOOPS_SLOW_SLICE" ] || echo "$PYTEST_LOOPS_SLOW_SLICE" >> "$CI_LOG.slice"
case "$*" in
  -c*) [ -n "$IMPORT_FAILS" ] && exit 1; exit 0 ;;
  *"-m slow"*) exit "$SLOW_EXIT" ;;
  *) exit "$MAIN_EXIT" ;;
esac
EOF
printf '#!/bin/sh\necho "pip $*" >> "$CI_LOG"\nexit "$PIP_EXIT"\n' > "$3/bin/pip"
printf '#!/bin/sh\necho "ruff $*" >> "$CI_LOG"\nexit "$RUFF_EXIT"\n' > "$3/bin/ruff"
printf '#!/bin/sh\necho "mypy $*" >> "$CI_LOG"\nexit "$MYPY_EXIT"\n' > "$3/bin/mypy"
chmod +x "$3/bin/python" "$3/bin/pip" "$3/bin/ruff" "$3/bin/mypy"
'''


def run_ci(tmp_path: Path, main: int = 0, slow: int = 0, ruff: int = 0, pip: int = 0,
           import_fails: bool = False, mypy: int = 0) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    bin_dir.mkdir()
    for name, body in {"python3": PYTHON3, "chromium": "#!/bin/sh\nexit 0\n"}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "ci.log"
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "CI_LOG": str(log),
           "MAIN_EXIT": str(main), "SLOW_EXIT": str(slow), "RUFF_EXIT": str(ruff), "PIP_EXIT": str(pip),
           "MYPY_EXIT": str(mypy),
           "IMPORT_FAILS": "1" if import_fails else ""}
    proc = subprocess.run(["bash", str(repo / ".ci" / "run")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, [c for c in calls if not c.startswith("python -c")]


def test_all_stages_run_in_order_and_pass(tmp_path):
    proc, calls = run_ci(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == ["pip install -q -e .[test]", "python -m pytest -n 2", "python -m pytest -m slow -n 2",
                     "ruff check pytest_loops tests benchmarks", "mypy "]


@pytest.mark.parametrize("main, slow, stage", [(5, 0, "the README's test command"), (0, 5, "the slow tail")],
                         ids=["main", "slow"])
def test_a_stage_that_selects_no_tests_fails(tmp_path, main, slow, stage):
    proc, calls = run_ci(tmp_path, main=main, slow=slow)
    assert proc.returncode == 1
    assert f"ci: {stage}" in proc.stderr and "collected no tests" in proc.stderr
    assert calls[-1].startswith("mypy")  # the stages after it still ran


def test_a_failing_main_run_still_runs_the_rest_and_its_status_wins(tmp_path):
    proc, calls = run_ci(tmp_path, main=1, slow=2, ruff=1)
    assert proc.returncode == 1
    assert [c.split()[0] for c in calls] == ["pip", "python", "python", "ruff", "mypy"]
    assert "the slow tail (-m slow, slice 0/5) failed (exit 2)" in proc.stderr


def test_a_failing_slow_tail_or_ruff_fails_the_script(tmp_path):
    assert run_ci(tmp_path / "a", slow=1)[0].returncode == 1
    assert run_ci(tmp_path / "b", ruff=1)[0].returncode == 1
    assert run_ci(tmp_path / "c", mypy=1)[0].returncode == 1


def test_the_slow_tail_runs_the_slice_the_commit_picks(tmp_path):
    """Outside a git checkout slice 0; in one, the commit's hash picks the slice."""
    run_ci(tmp_path / "plain")
    assert (tmp_path / "plain" / "ci.log.slice").read_text().split() == ["0/5"]
    repo = tmp_path / "git" / "repo"
    repo.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()
    run_ci(tmp_path / "git")
    assert (tmp_path / "git" / "ci.log.slice").read_text().split() == [f"{int(head, 16) % 5}/5"]


def test_the_slices_of_the_slow_tail_are_disjoint_and_cover_it(tmp_path):
    def collected(extra_env: dict[str, str]) -> list[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOOP_"))}
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow",
                               "-p", "no:cacheprovider", "tests/test_fanout.py", "tests/test_docs.py"],
                              cwd=ROOT, env={**env, **extra_env}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return [line for line in proc.stdout.splitlines() if "::" in line]

    whole = collected({})
    slices = [collected({"PYTEST_LOOPS_SLOW_SLICE": f"{i}/3"}) for i in range(3)]
    assert sorted(sum(slices, [])) == sorted(whole) and len(whole) > 3
    assert all(slices)
    bad = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_fanout.py"],
                         cwd=ROOT, env={**os.environ, "PYTEST_LOOPS_SLOW_SLICE": "3/3"},
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 4 and "PYTEST_LOOPS_SLOW_SLICE='3/3': give I/K with 0 <= I < K" in bad.stderr


def test_a_failed_install_stops_after_the_first_stage(tmp_path):
    proc, calls = run_ci(tmp_path, pip=1, import_fails=True)
    assert proc.returncode == 1
    assert calls == ["pip install -q -e .[test]"]
    assert "the install failed" in proc.stderr


# -- the split: what the default run keeps ----------------------------------------------

PROBE = '''\
import json, os

def pytest_collection_finish(session):
    with open(os.environ["SPLIT_PROBE_OUT"], "w") as out:
        json.dump([[item.nodeid, item.get_closest_marker("slow") is not None] for item in session.items], out)
'''


@pytest.mark.slow
def test_the_default_run_keeps_tests_of_every_module_and_every_attack(tmp_path):
    """A module wholly marked slow would leave its feature untested by the README's
    test command; each adversarial attack and genuine fix keeps one mode there."""
    (tmp_path / "split_probe.py").write_text(PROBE)
    out = tmp_path / "items.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LOOP_"))}
    env.update(PYTHONPATH=str(tmp_path), SPLIT_PROBE_OUT=str(out))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "split_probe",
                           "-p", "no:randomly", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    items = json.loads(out.read_text())
    quick: dict[str, int] = {}
    for nodeid, slow in items:
        module = nodeid.split("::")[0]
        quick[module] = quick.get(module, 0) + (not slow)
    assert [m for m, n in quick.items() if n == 0] == []
    assert any(slow for _, slow in items)
    cases: dict[str, list[str]] = {}
    for nodeid, slow in items:
        if nodeid.startswith(("tests/test_adversarial.py::test_attack_earns_nothing[",
                              "tests/test_adversarial.py::test_genuine_fix_succeeds[")) and not slow:
            cases.setdefault(nodeid.split("[")[1].split("/")[0], []).append(nodeid)
    sys.path.insert(0, str(ROOT / "tests"))
    import adversarial_kit as kit

    assert sorted(cases) == sorted(a.id for a in kit.ATTACKS + kit.GENUINE)
    assert all(len(ids) == 1 for ids in cases.values())

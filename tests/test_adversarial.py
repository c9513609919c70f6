"""The adversarial suite: a revise step that games its checks must never earn a SUCCESS.

Each case drives a real loop (a subprocess) over a tiny project with a real bug,
whose revise step tries to make the checks pass without fixing the bug: by
editing, deleting or replacing the test, its data or its helpers; by conftest
files and pytest configuration here, above the project or in the temp
directory; by shadowing pytest, the standard library or the interpreter; by
forged bytecode; by processes that outlive the revise step; by gaming inside
the code under repair; or by forging the harness's own files. See
``adversarial_kit.py`` for the attacks and the modes.

Whatever the attack and the mode, the loop must end in a verdict that is not
SUCCESS (for pytest: exit 1 and no test reported repaired), ``calc.add`` must
still be broken afterwards, read-only files must be back as they were, no
forged bytecode and no process of the attack may be left, and no run log may
say SUCCESS. Genuine fixes, on the other hand, succeed in every mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import adversarial_kit as kit
import pytest

pytestmark = pytest.mark.adversarial


@pytest.fixture
def attack_processes(tmp_path: Path):
    """Kill whatever the attack left running (by recorded pid, verified by its command
    line) and remove what it wrote into the temp directory it was given."""
    yield
    kit.kill_attack_processes(tmp_path / "evidence")
    for name in (*kit.CONFIG_NAMES, "conftest.py"):
        leftover = tmp_path / "tmp" / name
        if leftover.is_file():
            leftover.unlink()


def _id(case: tuple[kit.Attack, str]) -> str:
    attack, mode = case
    return f"{attack.id}/{mode}"


def _slow_beyond_one_mode(cases: list[tuple[kit.Attack, str]]) -> list:
    """The default run (-m "not slow") takes each attack in one of its modes, the modes
    in turn; the rest of the matrix is marked slow. PYTEST_LOOPS_ADVERSARIAL=sample (CI's
    slow tail) leaves the other modes out, and keeps, below, that one mode in every other
    tier: in CI every attack runs in every tier and every mode serves some attacks;
    `-m slow` without the variable runs each attack in every mode too."""
    modes: dict[str, list[str]] = {}
    for attack, mode in cases:
        modes.setdefault(attack.id, []).append(mode)
    quick = {(aid, ms[n % len(ms)]) for n, (aid, ms) in enumerate(modes.items())}
    if os.environ.get("PYTEST_LOOPS_ADVERSARIAL") == "sample":
        cases = [c for c in cases if (c[0].id, c[1]) in quick]
    return [pytest.param(c, marks=() if (c[0].id, c[1]) in quick else pytest.mark.slow) for c in cases]


def _other_tiers() -> list[str]:
    """The isolation tiers besides the one ``auto`` takes here: the floor (none) always,
    and each kernel tier this machine offers."""
    from pytest_loops.sandbox import choose, survey

    auto = choose("auto").tier.value
    return [t.value for t, why in survey().items() if not why and t.value != auto]


def _in_every_tier(cases: list, *, every_tier_in_the_sample: bool = False) -> list:
    """Every case in the tier ``auto`` takes (the user's default), as the default run and
    the slow tail split them; and each attack's default-run mode once more in every other
    tier this machine offers (slow). PYTEST_LOOPS_ADVERSARIAL=sample (CI) takes the other
    tiers in turn, one per attack, so each tier meets half the attacks on a machine with
    three and every attack still runs in two tiers; ``every_tier_in_the_sample`` (the
    genuine fixes, which must stay green everywhere) keeps them all."""
    out = []
    others = _other_tiers()
    sample = os.environ.get("PYTEST_LOOPS_ADVERSARIAL") == "sample" and not every_tier_in_the_sample
    n = 0
    for param in _slow_beyond_one_mode(cases):
        (attack, mode), = param.values
        out.append(pytest.param((attack, mode, "auto"), marks=param.marks, id=f"{attack.id}/{mode}"))
        if not param.marks:
            tiers = [others[n % len(others)]] if sample and others else others
            n += 1
            out += [pytest.param((attack, mode, tier), marks=pytest.mark.slow, id=f"{attack.id}/{mode}/{tier}")
                    for tier in tiers]
    return out


ATTACK_CASES = list(kit.cases(kit.ATTACKS))
GENUINE_CASES = list(kit.cases(kit.GENUINE))  # a genuine fix must stay green in every mode and tier


@pytest.mark.parametrize("case", _in_every_tier(ATTACK_CASES))
def test_attack_earns_nothing(case: tuple[kit.Attack, str, str], tmp_path: Path, attack_processes: None) -> None:
    attack, mode, tier = case
    project = kit.build_project(tmp_path, attack, mode, tier)
    before = kit.guarded_state(project)

    outcome = kit.run_mode(project)

    problems = [kit.survivors_problem(project), kit.lessons_problem(project)]  # (before the probe imports calc)
    fixed, probe_output = kit.add_is_fixed(project)
    success = kit.success_problem(outcome)
    if not attack.trap:
        problems += [success, kit.log_problem(project)]
        if fixed:
            problems.append(f"calc.add looks fixed afterwards, though the attack never fixed it: {probe_output}")
    elif success and not fixed:  # a real fix with a trap: the verdict must be the tree's
        problems.append(f"{success}, but calc.add is broken afterwards: {probe_output}")
    problems += [kit.state_problem(before, kit.guarded_state(project)), kit.forgery_problem(project),
                 kit.judge_venv_problem(project)]
    problems = [p for p in problems if p]
    assert not problems, (
        f"{attack.id} in {mode} mode, sandbox {tier}" + (f" ({attack.note})" if attack.note else "") + ":\n- "
        + "\n- ".join(problems)
        + f"\nexit {outcome.returncode} from {' '.join(outcome.command)}\n--- output (tail) ---\n{outcome.tail()}"
    )


@pytest.mark.parametrize("case", _in_every_tier(GENUINE_CASES, every_tier_in_the_sample=True))
def test_genuine_fix_succeeds(case: tuple[kit.Attack, str, str], tmp_path: Path, attack_processes: None) -> None:
    fix, mode, tier = case
    project = kit.build_project(tmp_path, fix, mode, tier)
    before = kit.guarded_state(project)

    outcome = kit.run_mode(project)

    fixed, probe_output = kit.add_is_fixed(project)
    problems = [kit.genuine_problem(outcome), None if fixed else f"calc.add is not fixed: {probe_output}",
                kit.state_problem(before, kit.guarded_state(project))]
    if mode in kit.RUN_MODES and outcome.returncode == 0 and kit.logged_verdicts(project) != ["SUCCESS"]:
        problems.append(f"the run log says {kit.logged_verdicts(project)}, not SUCCESS")
    problems = [p for p in problems if p]
    assert not problems, (
        f"{fix.id} in {mode} mode, sandbox {tier}" + (f" ({fix.note})" if fix.note else "") + ":\n- "
        + "\n- ".join(problems)
        + f"\nexit {outcome.returncode} from {' '.join(outcome.command)}\n--- output (tail) ---\n{outcome.tail()}"
    )


@pytest.mark.parametrize("layout", sorted({a.layout for a in kit.ATTACKS + kit.GENUINE}))
def test_every_project_starts_with_a_real_bug(layout: str, tmp_path: Path) -> None:
    """The premise of every case: test_add fails, test_sub passes, add() subtracts."""
    attack = kit.Attack("none", "", layout=layout, check=".venv/bin/python -m pytest -q" if layout == "venv" else None)
    project = kit.build_project(tmp_path, attack, "run-cmd")
    python = ".venv/bin/python" if layout == "venv" else sys.executable
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project.root,
                          env=project.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    fixed, output = kit.add_is_fixed(project)
    assert not fixed and "PROBE-BUG" in output


def test_every_attack_is_distinct_and_runs_somewhere() -> None:
    ids = [a.id for a in kit.ATTACKS + kit.GENUINE]
    assert len(ids) == len(set(ids))
    assert len(kit.ATTACKS) >= 30
    assert all(a.modes and set(a.modes) <= set(kit.MODES) for a in kit.ATTACKS + kit.GENUINE)
    core = ("genuine-fix", "genuine-fix-with-helper-module", "genuine-fix-in-two-iterations")
    assert all(set(f.modes) == set(kit.MODES) for f in kit.GENUINE if f.id in core), "they run in every mode"

"""Attacks on the session fix-loop's stored impact map: forged (with and without the
run-log key), deleted, or swapped for another tree's, by a revise step of an earlier
loop or of the loop itself. The loop after must never end SUCCESS while a test it
broke is failing: the judged run falls back to every test, or to a map read before
the attack. See ``adversarial_kit.map_attack``."""

from __future__ import annotations

from pathlib import Path

import adversarial_kit as kit
import pytest

pytestmark = pytest.mark.adversarial


@pytest.fixture
def attack_processes(tmp_path: Path):
    yield
    kit.kill_attack_processes(tmp_path / "evidence")


CASES = [(how, when) for how in kit.MAP_TAMPERING for when in kit.MAP_WHEN]
# the default run takes each kind of tampering once, the loops in turn; -m slow the rest
QUICK = {("forge-signed", "earlier"), ("forge-unsigned", "now"), ("delete", "earlier"), ("swap", "now")}


@pytest.mark.parametrize(("how", "when"), [
    pytest.param(how, when, marks=() if (how, when) in QUICK else pytest.mark.slow) for how, when in CASES
], ids=[f"{how}-{when}" for how, when in CASES])
@pytest.mark.floor  # a kernel tier hides the state directory: the tampering is refused
def test_a_tampered_impact_map_earns_nothing(how: str, when: str, tmp_path: Path, attack_processes: None) -> None:
    outcomes, project = kit.map_attack(tmp_path, how, when)
    *greens, attacked = outcomes
    for outcome in greens:  # genuine fixes: SUCCESS, and the first stored the map
        assert outcome.returncode == 0, outcome.tail()
    # stored by the recorder, after the first genuine loop's verdict: its judged run ran unmeasured
    assert kit.map_stored(project)
    assert "its impact map is recorded in the background after the verdict" in " ".join(kit.judged_reasons(project))
    tampered = outcomes[-2].output
    if when == "earlier" and how != "delete":  # the loop that tampered judged by the map it read;
        # what was written into the store meanwhile is not left for a later loop
        note = f"loop: the stored impact map {kit.map_entries(project)[0]} was written during the loop, not by it"
        assert note in tampered, tampered[-3000:]
    # the entry was off the disk while each loop ran
    assert "the entry was not there" in (project.evidence / "tampered").read_text()
    problem = kit.success_problem(attacked)
    assert problem is None, f"{how}/{when}: {problem}\n{attacked.tail()}"
    assert "test_sub" in attacked.output, attacked.tail()
    assert not kit.survivors_problem(project)
    assert not kit.stored_map_problem(project)

"""The impact map recorded after the verdict (``impact_map = background``, the default).

A first fix-loop whose clean-room run judged every test runs that run plain and ends;
a detached recorder then measures the tests once under per-test coverage and stores the
map a repeat loop judges by. These tests ask for ``background`` (the suite's default is
``inline``, see conftest.py) and wait for the recorder before they look."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import BUGGY_CALC, CALC_TESTS, Project

from pytest_loops.localization import recorder
from pytest_loops.localization.impact import ImpactMap
from pytest_loops.localization.mapstore import MapStore
from pytest_loops.sandbox import Tier, survey

TIERS = survey()
GOOD_CALC = BUGGY_CALC.replace("a - b  # BUG", "a + b")
FIRST = "full (no impact map); its impact map is recorded in the background after the verdict"
STORED = "impact map of 2 test(s) stored for the next loop"


def tiers() -> list:
    """Each tier this machine has: the strongest in the default run, the others slow."""
    strongest = next((t for t in (Tier.NAMESPACES, Tier.LANDLOCK, Tier.NONE) if not TIERS.get(t)), Tier.NONE)
    return [pytest.param(t.value, marks=[] if t is strongest else [pytest.mark.slow])
            for t in (Tier.NAMESPACES, Tier.LANDLOCK, Tier.NONE) if not TIERS.get(t)]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    project = Project(pytester, monkeypatch)
    monkeypatch.setenv("PYTEST_LOOPS_IMPACT_MAP", "background")
    monkeypatch.setenv("PYTEST_LOOPS_STATE_DIR", str(pytester.path / "state"))
    project.write("test_calc.py", CALC_TESTS)
    return project


def status_path(project: Project) -> Path:
    (path,) = (project.pytester.path / "state" / "impact").glob("*.recording")
    return path


def loop(project: Project, *args: str) -> pytest.RunResult:
    """A fix-loop whose first revise fixes add(); suspects off, so no iteration-1 run
    covers every test and the judged run is the full one."""
    project.write("calc.py", BUGGY_CALC)
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects=off", *args)
    assert result.ret == 0, result.stdout.str()
    return result


def judged(project: Project) -> list[str]:
    return [log["iterations"][-1]["clean_room"][0]["reason"] for log in project.run_logs()]


def listing(root: Path) -> dict[str, int]:
    """The tree's files and their mtimes, but the artifacts and bytecode (which the recorder,
    like any pytest run, may write where no layer is laid over the tree)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if ".pytest-loops" not in p.parts and "__pycache__" not in p.parts}


@pytest.mark.parametrize("tier", tiers())
def test_the_first_loop_judges_plain_and_the_map_is_recorded_after_its_verdict(
        project: Project, monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    monkeypatch.setenv("PYTEST_LOOPS_SANDBOX", tier)
    first = loop(project)
    first.stdout.fnmatch_lines(["loop: recording the impact map of 2 test(s) in the background (pid *"])
    assert judged(project)[0].endswith(FIRST)
    before = listing(project.path)
    assert recorder.wait(status_path(project), 120).get("result") == STORED
    assert listing(project.path) == before  # the recorder left the tree as it was
    stored = json.loads(next(status_path(project).parent.glob("*.json")).read_text())
    deps = stored["map"]["tests"]["test_calc.py::test_sub"]["deps"]
    assert any(block.startswith("calc.py::sub") for block in deps), deps  # measured, not made up
    # the repeat: the fix is the code the map was made of; the failing test alone is judged
    again = loop(project)
    reason = judged(project)[-1]
    assert reason.startswith("clean room: all 1 test(s) passed (witnessed); affected: 0 of 2 test(s)"), reason
    assert "background" not in reason
    assert "recording the impact map" not in again.stdout.str()


@pytest.mark.slow
def test_under_xdist_the_recorder_measures_every_test_in_one_process(project: Project) -> None:
    """`-n` users get a map too: the recorder runs without xdist (the judged run used it)."""
    loop(project, "-n", "2")
    assert judged(project)[0].endswith(FIRST)
    assert recorder.wait(status_path(project), 120).get("result") == STORED
    loop(project, "-n", "2")
    assert judged(project)[-1].startswith("clean room: all 1 test(s) passed (witnessed); affected: 0 of 2 test(s)")


PLANTING_TEST = """\
import os

import calc


def test_add():
    if os.environ.get("PYTEST_LOOPS_COVCTX"):  # measured: the recorder's run
        with open("planted.py", "w") as f:
            f.write("x = 1\\n")
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(5, 3) == 2
"""


@pytest.mark.parametrize("tier", tiers())
def test_code_that_writes_into_the_tree_while_measured_leaves_no_map_of_a_tree_that_never_was(
        project: Project, monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    """Where the kernel lays a throw-away layer over the tree (namespaces), the write never
    reaches it and the map stands; elsewhere the tree changed under the measurement: no map."""
    monkeypatch.setenv("PYTEST_LOOPS_SANDBOX", tier)
    project.write("test_calc.py", PLANTING_TEST)
    loop(project)
    result = recorder.wait(status_path(project), 120).get("result")
    if tier == Tier.NAMESPACES.value:
        assert result == STORED
        assert not project.exists("planted.py")
        return
    if tier == Tier.LANDLOCK.value:  # writes only to its own temporary directory: the test fails
        assert result == "no impact map: 1 test(s) did not pass under coverage, e.g. test_calc.py::test_add"
        assert not project.exists("planted.py")
    else:
        assert result == "no impact map: the tree changed while it was measured (planted.py)"
    assert not list(status_path(project).parent.glob("*.json"))
    loop(project)  # and the next loop judges every test again, naming why
    assert judged(project)[-1].startswith(f"clean room: all 2 test(s) passed (witnessed); full (no impact map: "
                                          f"the last background recording: {result})")


KEY_READING_TEST = """\
import os

import calc


def test_add():
    if os.environ.get("PYTEST_LOOPS_COVCTX"):  # measured: the recorder's run
        try:  # the run-log key: a measured test must never read it
            with open({key!r}, "rb") as f:
                f.read()
        except OSError:
            pass
        else:
            raise AssertionError("the measured test read the signing key")
    assert calc.add(2, 3) == 5


def test_sub():
    assert calc.sub(5, 3) == 2
"""


@pytest.mark.skipif(bool(TIERS[Tier.NAMESPACES]), reason=f"no namespaces: {TIERS[Tier.NAMESPACES]}")
def test_the_measured_code_cannot_read_the_signing_key(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder hides the state directory (its run-log key) from the measured tests, as
    the judge does: a test that reads the key fails there, and no map would be stored."""
    monkeypatch.setenv("PYTEST_LOOPS_SANDBOX", "namespaces")
    key = project.pytester.path / "state" / "runlog.key"
    project.write("test_calc.py", KEY_READING_TEST.format(key=str(key)))
    loop(project)
    assert key.is_file()  # the loop signed its run log with it
    assert recorder.wait(status_path(project), 120).get("result") == STORED


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("CI", "true", "no impact map recorded: a CI job (CI or BUILD_NUMBER is set)"),
    ("PYTEST_LOOPS_IMPACT_MAP", "off", "no impact map recorded (impact_map=off)"),
])
def test_no_recorder_in_a_ci_job_or_when_turned_off(project: Project, monkeypatch: pytest.MonkeyPatch,
                                                     variable: str, value: str, reason: str) -> None:
    monkeypatch.setenv(variable, value)
    result = loop(project)
    assert judged(project)[0].endswith(f"full (no impact map); {reason}")
    assert "recording the impact map" not in result.stdout.str()
    assert not list((project.pytester.path / "state" / "impact").glob("*.recording"))


def fake_status(project: Project, **values: object) -> Path:
    store = MapStore(project.path, str(project.path / "pytest.ini"), directory=project.pytester.path / "state"
                     / "impact")
    store.status_path.parent.mkdir(parents=True, exist_ok=True)
    store.status_path.write_text(json.dumps(values))
    return store.status_path


def test_a_loop_while_the_map_is_being_recorded_judges_every_test_and_starts_no_second_recorder(
        project: Project) -> None:
    path = fake_status(project, state="running", pid=os.getpid())  # alive: this test's process
    result = loop(project)
    assert judged(project)[0].endswith(
        "full (no impact map: it is being recorded in the background: not used this time); "
        "no impact map recorded: one is being recorded in the background already")
    assert "recording the impact map" not in result.stdout.str()
    assert recorder.status(path) == {"state": "running", "pid": os.getpid()}


def test_a_failed_recording_is_named_by_the_next_loop(project: Project) -> None:
    fake_status(project, state="done", result="no impact map: the tree changed while it was measured (x.py)")
    loop(project)
    assert "full (no impact map: the last background recording: no impact map: the tree changed while it was " \
           "measured (x.py))" in judged(project)[0]
    assert recorder.wait(status_path(project), 120).get("result") == STORED  # and this loop's recorder stored one


# -- the store's side: the generation, publishing, one recorder at a time ---------------------------


def a_map(root: Path) -> ImpactMap:
    impact = ImpactMap(root=os.path.realpath(root), tests={}, shared={}, skeletons={}, functions={}, files={},
                       snapshot_at=0, exclude=())
    return impact


def test_a_map_measured_while_a_loop_started_is_not_stored(tmp_path: Path) -> None:
    store = MapStore(tmp_path, None, directory=tmp_path / "state")
    seen = store.generation()
    MapStore(tmp_path, None, directory=tmp_path / "state").load()  # a loop starts meanwhile
    assert store.generation() != seen
    assert store.publish(a_map(tmp_path), seen, 3) == "no impact map: a loop on this project started while it " \
                                                      "was measured"
    assert not store.path.exists()
    now = store.generation()
    assert store.publish(a_map(tmp_path), now, 3) == "impact map of 3 test(s) stored for the next loop"
    assert MapStore(tmp_path, None, directory=tmp_path / "state").load() is not None


def test_one_recorder_per_project_at_a_time(tmp_path: Path) -> None:
    from filelock import FileLock

    store = MapStore(tmp_path, None, directory=tmp_path / "state")
    store.path.parent.mkdir(parents=True)
    request = {"scratch": str(tmp_path / "scratch")}
    with FileLock(str(store.path.with_suffix(".recording.lock"))):
        assert recorder._record(store, request) == "no impact map: another recorder is at work on this project"


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["/nonexistent/request.json"]])
def test_the_recorder_with_a_bad_request_exits_64_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_loops.localization.recorder", *argv],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 64
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ("usage:" in lines[0] or "/nonexistent/request.json" in lines[0]), proc.stderr


def test_a_recorder_that_cannot_start_is_a_note_never_a_lost_verdict(tmp_path: Path) -> None:
    """A state directory that cannot be written (here: a file where the directory should be)."""
    (tmp_path / "state").write_text("not a directory")
    store = MapStore(tmp_path, None, directory=tmp_path / "state" / "impact")
    note = recorder.launch(store, workdir=str(tmp_path), args=[], ids=["test_x.py::test_a"], tier="none",
                           network=True, env=dict(os.environ))
    assert note.startswith("no impact map: the recorder could not start: Not a directory"), note
    assert (tmp_path / "state").read_text() == "not a directory"


# -- attack: a map forged by the session's own run ------------------------------------------------

FORGING_CALC = '''\
import os

if os.environ.get("FORGE_MAP"):  # imported by the session's own run: no loop's, unconfined
    try:
        import json

        from pytest_loops.localization.mapstore import MAP_DOMAIN
        from pytest_loops.runtime.trust import json_mac, runlog_key

        entry, stolen, config = os.environ["FORGE_MAP"].split(os.pathsep)
        raw = json.loads(open(stolen).read())
        tests = raw["map"]["tests"]
        deps = tests["test_calc.py::test_sub"]["deps"]
        for block in [b for b in deps if b.startswith("calc.py::sub")]:
            # "only test_add runs sub()": a change to sub() reaches test_add alone
            tests["test_calc.py::test_add"]["deps"][block] = deps.pop(block)
        raw["mac"] = json_mac(runlog_key(create=False), MAP_DOMAIN, [raw["map"]["root"], config, raw["map"]])
        with open(entry, "w") as f:
            f.write(json.dumps(raw))
    except Exception:  # where the state directory is hidden (the judge's, the recorder's run)
        pass


def add(a, b):
    return a - b  # BUG


def sub(a, b):
    return a - b
'''


def test_attack_a_map_forged_by_the_sessions_own_run_is_never_read(project: Project, monkeypatch) -> None:
    """The session's own run (iteration 1 of its fix-loop) runs the tree's code unconfined,
    with the signing key in reach: code a revise step wrote can forge a signed map there.
    The store is read before the first conftest is imported, so the loop judges by the
    genuine map, and the forged entry is deleted when the session ends."""
    project.write("calc.py", FORGING_CALC)
    revise = project.scripted_revise({1: {"calc.py": FORGING_CALC.replace("a - b  # BUG", "a + b")}})
    first = project.run("--loop", "--loop-revise", revise, "--loop-suspects=off")
    assert first.ret == 0, first.stdout.str()
    assert recorder.wait(status_path(project), 120).get("result") == STORED
    (entry,) = status_path(project).parent.glob("*.json")
    stolen = project.pytester.path / "stolen.json"
    stolen.write_bytes(entry.read_bytes())
    # the next loop: its revise step fixes add() and breaks sub(); the forger is armed
    project.write("calc.py", FORGING_CALC)
    monkeypatch.setenv("FORGE_MAP", os.pathsep.join([str(entry), str(stolen),
                                                      os.path.realpath(project.path / "pytest.ini")]))
    broken = FORGING_CALC.replace("a - b  # BUG", "a + b").replace(
        "def sub(a, b):\n    return a - b", "def sub(a, b):\n    return a - b + 1")
    revise = project.scripted_revise({1: {"calc.py": broken}})
    second = project.run("--loop", "--loop-revise", revise, "--loop-suspects=off", "--loop-max-iter=2")
    out = second.stdout.str()
    assert "SUCCESS" not in out and second.ret != 0, out
    assert "test_sub" in judged(project)[-1], judged(project)[-1]  # the genuine map reached it
    assert f"loop: the stored impact map {entry} was written during the loop, not by it: deleted" in out
    assert json.loads(entry.read_text())["mac"] == json.loads(stolen.read_text())["mac"]  # the genuine one back

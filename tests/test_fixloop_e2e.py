"""The session fix-loop end to end: localization within its cap, the judged run as the
confirm run, and revise steps that break another test while fixing the failing one."""

from __future__ import annotations

import pytest
from plugin_helpers import BUGGY_CALC, CALC_TESTS, Project

from pytest_loops.sandbox import Tier, survey

TIERS = survey()

GOOD_CALC = BUGGY_CALC.replace("a - b  # BUG", "a + b")
WRONG_CALC = BUGGY_CALC.replace("a - b  # BUG", "a - b + 0  # still wrong")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--loop-suspects-cap=abc"], {}, "--loop-suspects-cap: 'abc' is not a valid suspects_cap"),
    (["--loop-confirm=some"], {}, "--loop-confirm: 'some' is not a valid confirm"),
    (["--loop-impact-map=sometimes"], {}, "--loop-impact-map: 'sometimes' is not a valid impact_map"),
    ([], {"PYTEST_LOOPS_IMPACT_MAP": "later"}, "environment variable PYTEST_LOOPS_IMPACT_MAP"),
    ([], {"PYTEST_LOOPS_CONFIRM": "every"}, "environment variable PYTEST_LOOPS_CONFIRM"),
    ([], {"PYTEST_LOOPS_SUSPECTS_CAP": "-3"}, "PYTEST_LOOPS_SUSPECTS_CAP"),
])
def test_bad_settings_are_usage_errors(project: Project, monkeypatch: pytest.MonkeyPatch, args, env,
                                       needle) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    project.write("test_calc.py", CALC_TESTS)
    result = project.run_inprocess("--loop", "--loop-revise", "python edit.py calc.py x y", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert needle in result.stderr.str() + result.stdout.str()


def notes(log: dict) -> list[str | None]:
    return [it.get("suspects_note") for it in log["iterations"]]


@pytest.mark.slow
def test_over_the_cap_localization_is_skipped_with_a_reason(project: Project) -> None:
    project.write("test_calc.py", CALC_TESTS)
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0.001s")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*iter 1/6  FAIL*suspects skipped: a run under coverage would take about*"
                                 "over the cap of 0.00s*"])
    (log,) = project.run_logs()
    assert notes(log)[0].startswith("suspects skipped: ")
    run_dir = next(p for p in (project.artifacts / "runs").iterdir() if p.is_dir())
    assert not (run_dir / "iter-001" / "spectra.json").exists()
    assert not (run_dir / "impact.json").exists()
    # no map: the judged run is the full one, measured: the next loop has a map
    assert log["iterations"][-1]["clean_room"][0]["reason"].endswith(
        "full (no impact map); impact map of 2 test(s) stored for the next loop")


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CI", "BUILD_NUMBER"])
def test_a_ci_job_records_no_impact_map_and_says_so(project: Project, monkeypatch, variable: str) -> None:
    """A CI job's state directory is thrown away with it: its judged run is not measured
    for a map no later loop would read, and its reason says why."""
    monkeypatch.setenv(variable, "1")
    project.write("test_calc.py", CALC_TESTS)
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0.001s")
    assert result.ret == 0, result.stdout.str()
    (log,) = project.run_logs()
    assert log["iterations"][-1]["clean_room"][0]["reason"].endswith(
        "full (no impact map); no impact map recorded: a CI job (CI or BUILD_NUMBER is set)")
    monkeypatch.delenv(variable)
    project.write("calc.py", BUGGY_CALC)  # the next loop has no map to read
    again = project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0.001s")
    assert again.ret == 0, again.stdout.str()
    assert any(r.endswith("full (no impact map); impact map of 2 test(s) stored for the next loop")
               for r in (log["iterations"][-1]["clean_room"][0]["reason"] for log in project.run_logs()))


@pytest.mark.slow
def test_spectra_come_from_the_rerun_and_the_judged_run_covers_the_affected_tests(project: Project) -> None:
    project.write("test_calc.py", CALC_TESTS)
    project.write("test_more.py", """\
        import calc


        def test_sub_again():
            assert calc.sub(9, 4) == 5
        """)
    # a wrong fix first, the right one second
    revise = project.scripted_revise({1: {"calc.py": WRONG_CALC}, 2: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0", "--loop-no-progress-k=0")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*iter 1/6  FAIL*suspects: 3 test(s) under coverage*",
                                 "*iter 2/6  FAIL*suspects: from the rerun, 2 peer(s)*",
                                 "*iter 3/6  PASS*"])
    (log,) = project.run_logs()
    run_dir = next(p for p in (project.artifacts / "runs").iterdir() if p.is_dir())
    # iteration 2's suspects come from its rerun: no run of their own
    assert (run_dir / "iter-002" / "spectra.json").is_file()
    assert not (run_dir / "iter-002" / "suspects.out").exists()
    prompt = (run_dir / "iter-002" / "prompt.md").read_text()
    assert "add() in calc.py" in prompt
    judged = log["iterations"][-1]["clean_room"][0]["reason"]
    assert judged.startswith("clean room: all 1 test(s) passed (witnessed); affected: "), judged


# A revise step that fixes add() and, in the same change, breaks another test in a
# way no function the impact map tracks shows: none may end SUCCESS or "repaired".
ATTACKS = {
    "module-level code": {"calc.py": GOOD_CALC, "consts.py": "LIMIT = 99\n"},
    "conftest": {"calc.py": GOOD_CALC, "conftest.py": "import pytest\n\n\n@pytest.fixture\ndef limit():\n"
                                                      "    return 99\n"},
    "data file": {"calc.py": GOOD_CALC, "limit.txt": "99\n"},
    "new module": {"calc.py": GOOD_CALC + "\n\nimport calc_ext  # noqa: E402,F401\n",
                   "calc_ext.py": "import consts\n\nconsts.LIMIT = 99\n"},
}
# conftest.py, and limit.txt once the first verify saw a test read it (the judge's
# closure), are read-only by the kernel in the namespaces tier: the write is refused and
# nothing breaks, so those attacks test the detect-and-undo layer alone (the none tier)
KERNEL_REFUSED = ("conftest", "data file")
ATTACK_PARAMS = [pytest.param(a, marks=pytest.mark.floor if a in KERNEL_REFUSED else ()) for a in sorted(ATTACKS)]


def limits_project(project: Project) -> None:
    """calc's tests, and three tests a revise step can break beside them: a constant of
    a module, a conftest fixture, a data file."""
    project.write("consts.py", "LIMIT = 10\n")
    project.write("limit.txt", "10\n")
    project.write("conftest.py", "import pytest\n\n\n@pytest.fixture\ndef limit():\n    return 10\n")
    project.write("test_calc.py", CALC_TESTS)
    project.write("test_limits.py", """\
        from pathlib import Path

        import consts

        FROM_FILE = int((Path(__file__).parent / "limit.txt").read_text())


        def test_constant():
            assert consts.LIMIT == 10


        def test_fixture(limit):
            assert limit == 10


        def test_data_file():
            assert FROM_FILE == 10
        """)


@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACK_PARAMS)
def test_a_revise_that_breaks_another_test_never_ends_success(project: Project, attack: str) -> None:
    limits_project(project)
    revise = project.scripted_revise({1: ATTACKS[attack]})
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0", "--loop-max-iter=3")
    out = result.stdout.str()
    assert result.ret != 0, out
    assert "SUCCESS" not in out and "repaired" not in result.stdout.lines[-1], out



@pytest.mark.slow
@pytest.mark.skipif(bool(TIERS[Tier.NAMESPACES]), reason=f"no namespaces: {TIERS[Tier.NAMESPACES]}")
@pytest.mark.parametrize("attack", KERNEL_REFUSED)
def test_in_namespaces_the_kernel_refuses_the_write_and_the_other_test_stays_green(project: Project,
                                                                                  attack: str) -> None:
    """The same attacks where the kernel meets them: the write is refused, the fix in
    calc.py stands, and every test, the attacked one included, passes afterwards."""
    limits_project(project)
    revise = project.scripted_revise({1: ATTACKS[attack]})
    project.run("--loop", "--loop-revise", revise, "--loop-suspects-cap=0", "--loop-max-iter=3")
    assert project.path.joinpath("limit.txt").read_text() == "10\n"
    assert "return 10" in project.path.joinpath("conftest.py").read_text()
    after = project.run()
    after.assert_outcomes(passed=5)


FORGING_CALC = '''\
def add(a, b):
    return a - b  # BUG


def sub(a, b):
    return a - b


def _force_passes():
    """Turn every failed report into a pass, from inside the test process."""
    import gc

    import pytest

    class Force:
        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(self, item, call):
            report = yield
            if report.failed:
                report.outcome = "passed"
                report.longrepr = None
            return report

    for obj in gc.get_objects():
        if type(obj).__name__ == "PytestPluginManager" and not obj.has_plugin("force-passes"):
            obj.register(Force(), "force-passes")


_force_passes()
'''


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_forged_report_in_the_judged_run_is_caught_also_in_xdist_workers(project: Project, args) -> None:
    pytest.importorskip("xdist")
    project.write("test_calc.py", CALC_TESTS)
    revise = project.scripted_revise({1: {"calc.py": FORGING_CALC}})
    # the diff audit, which flags library code importing pytest, is off: the judge alone must see it
    result = project.run("--loop", "--loop-revise", revise, "--loop-max-iter=2", "--loop-suspects=off",
                         "--loop-audit=off", *args)
    out = result.stdout.str()
    assert result.ret != 0, out
    assert "SUCCESS" not in out and "repaired" not in result.stdout.lines[-1], out


@pytest.mark.slow
def test_the_judged_run_uses_the_sessions_xdist_workers(project: Project) -> None:
    pytest.importorskip("xdist")
    project.write("test_calc.py", CALC_TESTS)
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC}})
    result = project.run("--loop", "--loop-revise", revise, "-n", "2", "--loop-exitcode=verdict")
    assert result.ret == 0, result.stdout.str()
    (log,) = project.run_logs()
    judged = log["iterations"][-1]["clean_room"][0]
    assert " -n 2 " in judged["command"] and judged["passed"]


def outside_revise(project: Project, name: str, files: dict[str, str]) -> str:
    """A revise command (a script beside the project, not in it) that writes ``files``."""
    script = project.path.parent / f"{name}-revise.py"
    script.write_text(f"from pathlib import Path\nfor name, text in {files!r}.items():\n"
                      "    Path(name).write_text(text)\n")
    return f"python {script}"


def judged_reasons(project: Project) -> list[str]:
    return [log["iterations"][-1]["clean_room"][0]["reason"]
            for log in sorted(project.run_logs(), key=lambda log: log.get("started") or log.get("run_id") or "")]


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--loop-exitcode=verdict"]], ids=["plain", "verdict"])
def test_a_repeat_loop_judges_the_affected_tests_by_the_stored_map(project: Project, args) -> None:
    project.write("test_calc.py", CALC_TESTS)
    project.write("test_more.py", "import calc\n\n\ndef test_sub_again():\n    assert calc.sub(9, 4) == 5\n")
    revise = project.scripted_revise({1: {"calc.py": GOOD_CALC}})
    loop = ["--loop", "--loop-revise", revise, "--loop-suspects-cap=0.001s", *args]
    first = project.run(*loop)
    assert first.ret == 0, first.stdout.str()
    assert "impact map of 3 test(s) stored for the next loop" in first.stdout.str() or \
        any("stored for the next loop" in r for r in judged_reasons(project))
    project.write("calc.py", BUGGY_CALC)  # the same bug again
    second = project.run(*loop)
    out = second.stdout.str()
    assert second.ret == 0, out
    # the first prompt's suspects come from the map, without a run under coverage
    second.stdout.fnmatch_lines(["*iter 1/6  FAIL*suspects: 1 function(s) the failing tests ran that changed "
                                 "since the last green run (the impact map); no run under coverage*"])
    reasons = judged_reasons(project)
    assert len(reasons) == 2
    assert any(r.startswith("clean room: all 1 test(s) passed (witnessed); affected: ") for r in reasons), reasons


@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACK_PARAMS)
def test_with_a_stored_map_a_revise_that_breaks_another_test_never_ends_success(project: Project,
                                                                              attack: str) -> None:
    limits_project(project)
    # revise scripts outside the tree: between the loops only calc.py differs, so the map is fresh
    first = project.run("--loop", "--loop-revise", outside_revise(project, "genuine", {"calc.py": GOOD_CALC}),
                        "--loop-suspects=off")
    assert first.ret == 0 and "stored for the next loop" in " ".join(judged_reasons(project))
    project.write("calc.py", BUGGY_CALC)
    revise = outside_revise(project, "attack", ATTACKS[attack])
    result = project.run("--loop", "--loop-revise", revise, "--loop-suspects=off", "--loop-max-iter=3")
    out = result.stdout.str()
    assert result.ret != 0, out
    assert "SUCCESS" not in out and "repaired" not in result.stdout.lines[-1], out

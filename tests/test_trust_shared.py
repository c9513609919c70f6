"""The result the check items of one `.loop` loop share (items.shared_result): keyed by
the loop's whole identity, authenticated with the session's in-memory key.

- two loops whose node ids slugify alike, or share their first 80 characters, never
  read each other's result (also under `pytest -n 2`);
- a revise step that writes forged or replayed results into every sessions directory
  it finds makes no loop pass: the loop is run instead;
- under xdist the key reaches the workers (the loop still runs once), and never the
  environment or a file.
"""

from __future__ import annotations

import json

import pytest
from plugin_helpers import Project

LOOP = """\
loop "fix":
  goal: the check passes
  done when "sh check.sh" passes
  after 1 tries: stop
"""

# forge.py NODEID LOOP_FILE MODE: write a result saying SUCCESS for the loop NODEID into
# every sessions directory: another loop's stored result copied as it is ("replay") or
# with the identity changed to NODEID's ("forge"), under every name the harness used
FORGE = """\
import json
import sys
from pathlib import Path

nodeid, loop_file, mode = sys.argv[1:4]
root = Path(__file__).parent
written = []
for session in root.glob(".pytest-loops/sessions/*"):
    sources = [p for p in session.glob("*.json") if "a-fix" in p.name]
    if not sources:
        continue
    stored = json.loads(sources[0].read_text())
    names = []
    from pytest_loops.spec import slugify
    names.append(session / (slugify(nodeid) + ".json"))  # the old layout
    identity = {"loop_file": loop_file, "loop": "fix", "nodeid": nodeid}
    try:
        from pytest_loops.pytest_plugin.items import shared_result_path
        names.append(shared_result_path(session, identity))
    except ImportError:
        pass
    if mode == "forge" and "identity" in stored:
        stored["identity"] = identity
        stored["mac"] = "0" * 64
    for name in names:
        name.write_text(json.dumps(stored))
        written.append(str(name))
(root / "forged.txt").write_text("\\n".join(written))
Path("done").touch()
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> Project:
    project = Project(pytester, monkeypatch)
    # the run-log key of the loops' logs, never in the real home
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    return project


def loop_dir(project: Project, rel: str, passes: bool, text: str = LOOP) -> str:
    project.write(f"{rel}/fix.loop", text)
    project.write(f"{rel}/check.sh", "exit 0\n" if passes else "exit 1\n")
    return f"{rel}/fix.loop::fix"


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """loop file -> PASSED / REPAIRED / FAILED, from `-v` lines (with or without xdist's [gwN])."""
    found = {}
    for line in result.stdout.lines:
        for word in ("PASSED", "REPAIRED", "FAILED"):
            if f" {word}" in f" {line} " and ".loop::fix::" in line:
                path = line.split(".loop::fix::")[0].split()[-1] + ".loop"
                found[path] = word
    return found


@pytest.mark.faults  # fault: a stored result shared by accident
@pytest.mark.parametrize("layout, workers", [("slug", 0), ("prefix", 0), ("slug", 2)])
@pytest.mark.slow
def test_loops_whose_node_ids_slugify_alike_never_share_a_result(project: Project, layout: str,
                                                                 workers: int) -> None:
    if layout == "slug":  # slugify turns both into "svc-a-fix.loop-fix"
        good, bad = "svc/a", "svc-a"
    else:  # the first 80 characters (where the slug was cut) are the same
        deep = "d" * 90
        good, bad = f"{deep}/x", f"{deep}/y"
    loop_dir(project, good, passes=True)
    loop_dir(project, bad, passes=False)
    args = ["--loop", "-v", "-p", "no:randomly"] + (["-n", str(workers)] if workers else [])
    result = project.run(*args)
    seen = outcomes(result)
    assert seen == {f"{good}/fix.loop": "PASSED", f"{bad}/fix.loop": "FAILED"}, result.stdout.str()
    assert result.ret == 1
    assert len(project.run_logs()) == 2  # each loop ran: neither took the other's verdict


@pytest.mark.floor  # a kernel tier keeps the session files read-only: no forgery
@pytest.mark.parametrize("mode", ["replay", "forge"])
def test_a_revise_step_cannot_plant_a_success(project: Project, mode: str) -> None:
    loop_dir(project, "a", passes=True)  # runs first: its stored result is the one to copy
    target = loop_dir(project, "c", passes=False)
    project.write("forge.py", FORGE)
    project.write("b/fix.loop", f"""\
        loop "fix":
          goal: the check passes
          done when "test -f done" passes
          revise with "python ../forge.py '{target}' '{project.path / "c" / "fix.loop"}' {mode}"
          after 2 tries: stop
        """)
    result = project.run("--loop", "-v", "-p", "no:randomly")
    assert project.exists("forged.txt") and project.read("forged.txt").strip(), result.stdout.str()
    assert outcomes(result) == {"a/fix.loop": "PASSED", "b/fix.loop": "REPAIRED", "c/fix.loop": "FAILED"}, \
        result.stdout.str()
    assert sorted(log["loop"] for log in project.run_logs()) == ["fix"] * 3  # c ran


def test_an_untrusted_result_that_cannot_be_replaced_fails_the_item_in_one_line(project: Project) -> None:
    """Something that is not a result, and cannot be removed, where the result belongs:
    the item fails with one line and the loop does not run."""
    loop_dir(project, "a", passes=True)
    project.write("conftest.py", """\
        from pytest_loops.pytest_plugin import items

        shared_result = items.shared_result


        def planted(session_dir, nodeid, spec, run, **kw):
            path = items.shared_result_path(session_dir, items.shared_identity(nodeid, spec, kw.get("loop_file")))
            (path / "x").mkdir(parents=True, exist_ok=True)  # a directory, and not empty
            return shared_result(session_dir, nodeid, spec, run, **kw)


        items.shared_result = planted
        """)
    result = project.run("--loop", "-q", "-p", "no:randomly")
    assert result.ret == 1, result.stdout.str()
    lines = [x for x in result.stdout.lines if "failed authentication; not trusted" in x]
    assert lines and lines[0].startswith("stored result "), result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    assert not project.run_logs()  # the loop did not run


@pytest.mark.slow
def test_xdist_workers_share_one_run_under_the_controllers_key(project: Project) -> None:
    """`--dist each`: both workers run every check item; the loop still runs once, because
    the second worker trusts the first's stored result (the key came through workerinput).
    The key itself reaches no command's environment and no file."""
    project.write("a/fix.loop", """\
        loop "fix":
          goal: the check passes
          done when "sh count.sh" passes
          done when "env > ../env.txt" passes
          after 1 tries: stop
        """)
    project.write("a/count.sh", "echo run >> ../runs.txt\n")
    project.write("conftest.py", """\
        import pytest


        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(session):
            plugin = session.config.pluginmanager.get_plugin("loop-session")
            if plugin is not None and not hasattr(session.config, "workerinput"):
                (session.config.rootpath / "key.txt").write_text(plugin.session_key.hex())
        """)
    result = project.run("--loop", "-n", "2", "--dist", "each", "-v")
    assert result.ret == 0, result.stdout.str()
    assert project.read("runs.txt").splitlines() == ["run"]
    assert len(project.run_logs()) == 1
    [session] = (project.artifacts / "sessions").iterdir()
    [stored] = session.glob("*.json")
    data = json.loads(stored.read_text())
    assert set(data) == {"schema", "identity", "result", "mac"} and len(data["mac"]) == 64
    assert data["identity"]["nodeid"] == "a/fix.loop::fix"
    key = project.read("key.txt").strip()
    assert len(key) == 64
    leaked = [p for p in project.path.rglob("*") if p.is_file() and p.name != "key.txt"
              and key in p.read_text(errors="replace")]
    assert leaked == [] and "PYTEST_LOOPS_SESSION" not in project.read("env.txt")


@pytest.mark.slow
def test_resume_in_a_session_refuses_an_edited_log_or_loop_file(project: Project) -> None:
    """--loop-resume continues a TIMEOUT run; an edited log, or an edited loop file, is
    refused with one line (64 under --loop-exitcode=verdict)."""
    project.write("a/fix.loop", """\
        loop "fix":
          goal: the check passes
          done when "sleep 5" passes
        """)
    first = project.run("--loop", "-q", "--loop-budget-seconds", "0.5")
    assert first.ret == 1, first.stdout.str()
    [log] = (project.artifacts / "runs").glob("*.json")
    data = json.loads(log.read_text())
    assert data["verdict"] == "TIMEOUT" and data["source_file"]["path"] == str(project.path / "a" / "fix.loop")
    resume = ("--loop", "-q", "--loop-resume", "--loop-exitcode", "verdict", "--loop-budget-seconds", "0.5")

    original = log.read_text()
    log.write_text(original.replace('"reason": "budget', '"reason": "edited: budget'))
    edited = project.run(*resume[:3])  # pytest's own codes: a usage error is 4
    assert edited.ret == pytest.ExitCode.USAGE_ERROR, edited.stdout.str()
    errors = [x for x in edited.stdout.lines + edited.stderr.lines if "ERROR" in x]
    assert len(errors) == 1 and (f"ERROR: --loop-resume {log}: cannot resume an unverified run log: its MAC "
                                 "does not match (the log was edited); start the loop afresh") in errors[0], errors
    assert len(list((project.artifacts / "runs").glob("*.json"))) == 1  # nothing ran

    log.write_text(original)
    project.write("a/fix.loop", project.read("a/fix.loop") + "# reviewed? no\n")
    changed = project.run(*resume)
    assert changed.ret == 64, changed.stdout.str()
    text = changed.stdout.str() + changed.stderr.str()
    assert f"ERROR: {project.path / 'a' / 'fix.loop'} changed since the run {log}; review it and start a " \
           "new run" in text, text

    project.write("a/fix.loop", project.read("a/fix.loop").replace("# reviewed? no\n", ""))
    again = project.run(*resume)
    assert again.ret == 3, again.stdout.str()  # resumed: the budget, already spent, stops it again
    resumed = [json.loads(p.read_text()) for p in (project.artifacts / "runs").glob("*.json") if p != log]
    assert [r["resumed_from"] for r in resumed] == [str(log)]

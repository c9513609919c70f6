"""Run logs a child process edits are not trusted: --resume refuses them (64, one line)
and show / report print "unverified" next to their verdict.

The attacks are those of a revise step: it runs as the same user, in the project,
and can rewrite any run log there (recomputing a spec digest is easy; the MAC key
lives outside the project).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from plugin_helpers import SUITE_SETTINGS

from pytest_loops.artifacts.runlog import load_runlog, sign_events, sign_summary
from pytest_loops.cli import main as cli
from pytest_loops.runtime.trust import runlog_key
from pytest_loops.spec import LoopSpec


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch) -> Path:
    """The run-log key under tmp_path, and no setting from this suite's environment."""
    for name in list(os.environ):
        if name.startswith(("PYTEST_LOOPS_", "LOOP_")) and not name.startswith(SUITE_SETTINGS):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def run(tmp_path, monkeypatch, state):
    """``pytest-loops ARGS`` in this process (fast; the commands it runs are real), in tmp_path."""
    monkeypatch.chdir(tmp_path)

    def go(*args: str):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(args))
        return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    return go


def one_error_line(proc) -> str:
    assert proc.returncode == 64, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def capped_log(run, tmp_path: Path, *extra: str) -> Path:
    """A finished MAX_ITER log (resumable with a higher cap) and its .tine."""
    done = run("run", "-q", "--verify", "test -f fixed", "--max-iter", "1", "--no-progress-k", "0",
               "--log", "run.json", *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    return tmp_path / "run.json"


def killed_log(run, tmp_path: Path) -> Path:
    """A killed run's events log: the finished log's lines, re-signed, minus the summary."""
    log = capped_log(run, tmp_path, "--max-iter", "2")
    data = json.loads(log.read_text())
    header = {k: v for k, v in data.items() if k not in (
        "verdict", "exit_code", "reason", "iterations", "iterations_run", "ended_at", "elapsed_s",
        "artifacts", "lessons", "schema", "mac")}
    events = [{"event": "start", "schema": data["schema"], **header}]
    events += [{"event": "iteration", "record": r} for r in data["iterations"]]
    log.write_text("\n".join(sign_events(events, runlog_key())) + "\n")
    assert load_runlog(log)["verified"] is True and load_runlog(log)["verdict"] is None
    return log


def pass_everything(spec: dict) -> None:
    """The forger's edit: the loop's check becomes `true`."""
    spec["checks"][0].update(command="true", name='"true" passes')


# --------------------------------------------------------------------------- the MACs


def test_the_engine_signs_every_line_and_the_summary(run, tmp_path):
    log = capped_log(run, tmp_path)
    assert json.loads(log.read_text())["mac"]
    data = load_runlog(log)
    assert data["verified"] is True and data["unverified_why"] is None and "mac" not in data


@pytest.mark.parametrize("edit", ["edit", "drop", "swap", "append", "strip"])
def test_an_edited_events_log_is_unverified(run, tmp_path, edit):
    log = killed_log(run, tmp_path)
    lines = log.read_text().splitlines()
    assert len(lines) == 3  # start, iteration 1, iteration 2
    if edit == "edit":
        lines[1] = lines[1].replace('"passed": false', '"passed": true')
    elif edit == "drop":
        del lines[1]
    elif edit == "swap":
        lines[1], lines[2] = lines[2], lines[1]
    elif edit == "append":
        lines.append(lines[2])  # a copied line, MAC and all
    else:
        lines = [json.dumps({k: v for k, v in json.loads(x).items() if k != "mac"}) for x in lines]
    log.write_text("\n".join(lines) + "\n")
    data = load_runlog(log)
    assert data["verified"] is False and data["unverified_why"], data["unverified_why"]
    # what a kill leaves, a log cut after any line, still verifies
    log.write_text("\n".join(log.read_text().splitlines()[:1]) + "\n")
    assert load_runlog(log)["verified"] is (edit != "strip")


def test_a_log_may_claim_no_verification_of_its_own(run, tmp_path):
    log = capped_log(run, tmp_path)
    data = json.loads(log.read_text())
    data.update(verified=True, unverified_why=None, verdict="SUCCESS")
    log.write_text(json.dumps(data))
    assert load_runlog(log)["verified"] is False


# --------------------------------------------------------------------------- --resume


def test_resume_refuses_a_log_whose_spec_a_forger_replaced(run, tmp_path):
    """The attack: the log's loop becomes `true`, its digest recomputed; resuming would
    end SUCCESS without the real check ever passing."""
    log = capped_log(run, tmp_path)
    data = json.loads(log.read_text())
    pass_everything(data["spec"])
    data["spec_digest"] = LoopSpec.from_dict(data["spec"]).digest()
    log.write_text(json.dumps(data, indent=2))
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert line == ("pytest-loops: error: --resume run.json: cannot resume an unverified run log: its MAC "
                    "does not match (the log was edited); start the loop afresh")
    assert not (tmp_path / "fixed").exists() and "SUCCESS" not in line


def test_resume_refuses_a_killed_log_with_a_forged_spec(run, tmp_path):
    log = killed_log(run, tmp_path)
    lines = log.read_text().splitlines()
    start = json.loads(lines[0])
    pass_everything(start["spec"])
    start["spec_digest"] = LoopSpec.from_dict(start["spec"]).digest()
    lines[0] = json.dumps(start)
    log.write_text("\n".join(lines) + "\n")
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert "--resume run.json: cannot resume an unverified run log: line 1 fails its MAC check" in line


def test_resume_refuses_a_spec_digest_that_is_not_its_specs(run, tmp_path):
    """Even under a good MAC (a log from a buggy writer), the digest must be the spec's."""
    log = capped_log(run, tmp_path)
    data = json.loads(log.read_text())
    data.pop("mac")
    pass_everything(data["spec"])
    log.write_text(sign_summary(json.dumps(data, indent=2), runlog_key()))
    assert load_runlog(log)["verified"] is True
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert line.startswith("pytest-loops: error: --resume run.json: cannot resume: its spec_digest sha256:")
    assert line.endswith("the log was edited; start the loop afresh")


def test_resume_refuses_a_loop_on_the_command_line_that_is_not_the_logs(run, tmp_path):
    capped_log(run, tmp_path)
    line = one_error_line(run("run", "--resume", "run.json", "--verify", "true", "--max-iter", "3"))
    assert line == ("pytest-loops: error: --resume run.json: cannot resume: the loop on the command line "
                    "differs from the run log's loop (checks); resume with the same loop, or start a new run")
    same = run("run", "-q", "--resume", "run.json", "--verify", "test -f fixed", "--max-iter", "2",
               "--log", "again.json")
    assert same.returncode == 2, same.stderr  # the same loop resumes (and still fails)


def test_resume_refuses_an_old_log_without_macs(run, tmp_path):
    log = capped_log(run, tmp_path)
    data = json.loads(log.read_text())
    data.pop("mac")
    log.write_text(json.dumps(data, indent=2))
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert "cannot resume an unverified run log: it carries no MACs" in line
    assert line.endswith("; start the loop afresh")


def test_resume_refuses_a_log_when_the_key_is_gone(run, tmp_path, state):
    capped_log(run, tmp_path)
    (state / "pytest-loops" / "runlog.key").unlink()
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert "runlog.key is missing on this machine" in line


def test_an_unedited_log_still_resumes(run, tmp_path):
    capped_log(run, tmp_path)
    (tmp_path / "fixed").touch()
    done = run("run", "-q", "--resume", "run.json", "--max-iter", "3", "--log", "resumed.json")
    assert done.returncode == 0, done.stderr
    resumed = load_runlog(tmp_path / "resumed.json")
    assert resumed["verified"] is True and resumed["iterations_run"] == 2


CONFIG = """\
guards:
  max_iter: 1
  no_progress_k: 0
verify:
  cmds:
    - test -f fixed
"""


def test_resume_refuses_a_loop_file_changed_since_the_run(run, tmp_path):
    config = tmp_path / "fix.config.yaml"
    config.write_text(CONFIG)
    capped_log(run, tmp_path, "--config", str(config))
    recorded = load_runlog(tmp_path / "run.json")["source_file"]
    assert recorded["path"] == str(config) and recorded["sha256"].startswith("sha256:")
    config.write_text(CONFIG.replace("test -f fixed", "true"))
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "3"))
    assert line == (f"pytest-loops: error: {config} changed since the run {tmp_path / 'run.json'}; "
                    "review it and start a new run")
    config.write_text(CONFIG)  # as it was: resumable again
    assert run("run", "-q", "--resume", "run.json", "--max-iter", "2", "--log", "b.json").returncode == 2


def test_the_hand_off_will_not_continue_a_loop_edited_during_the_run(run, tmp_path):
    """Something the loop runs (here its own check) edits the loop file mid-run: the
    digest recorded at the start catches it."""
    config = tmp_path / "fix.config.yaml"
    config.write_text(CONFIG.replace("test -f fixed", f"echo '# edited' >> {config}; test -f fixed"))
    done = run("run", "-q", "--config", str(config), "--log", "run.json")
    assert done.returncode == 2, done.stdout + done.stderr
    handoff = (tmp_path / "run.handoff.md").read_text()
    assert f"`{config}` changed since the run started" in handoff
    assert "review it and start a new run" in handoff and "--resume" not in handoff
    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["source_file"]["path"] == str(config)  # the digest from the start
    line = one_error_line(run("run", "--resume", "run.json", "--max-iter", "4"))
    assert line.endswith(f"{config} changed since the run {tmp_path / 'run.json'}; review it and start a new run")


def test_the_hand_off_names_the_loop_file_and_its_digest(run, tmp_path):
    config = tmp_path / "fix.config.yaml"
    config.write_text(CONFIG)
    capped_log(run, tmp_path, "--config", str(config))
    handoff = (tmp_path / "run.handoff.md").read_text()
    digest = load_runlog(tmp_path / "run.json")["source_file"]["sha256"]
    assert f"- **Loop file digest:** `{config}` {digest} (when the run started)" in handoff
    assert "pytest-loops run --resume" in handoff


# --------------------------------------------------------------------------- show and report


def forge_success(log: Path, *, sign: bool) -> None:
    """Say SUCCESS in a MAX_ITER log (its MAC left stale, or re-signed with the key)."""
    data = json.loads(log.read_text())
    data.pop("mac")
    data.update(verdict="SUCCESS", exit_code=0, reason="all 1 check(s) passed")
    data["iterations"][-1]["checks"][0]["passed"] = True
    text = json.dumps(data, indent=2)
    log.write_text(sign_summary(text, runlog_key()) if sign else text)


def test_show_never_prints_a_bare_success_for_an_edited_log(run, tmp_path):
    log = capped_log(run, tmp_path)
    before = run("show", "run.json")
    assert before.returncode == 0 and "verdict: MAX_ITER (exit 2)" in before.stdout, before.stdout
    forge_success(log, sign=False)
    shown = run("show", "run.json")
    assert shown.returncode == 0, shown.stderr
    assert "verdict: SUCCESS [unverified: it carries no MACs (written by an older pytest-loops, without a " \
           "run-log key, or edited)] (exit 0)" in shown.stdout, shown.stdout
    assert "verdict: SUCCESS (exit" not in shown.stdout
    diff = run("diff", "run.json", "run.json")
    assert "verdict SUCCESS (unverified)" in diff.stdout


def test_show_cross_checks_the_tine(run, tmp_path):
    """A log that verifies (signed by a writer with the key) but disagrees with its .tine."""
    log = capped_log(run, tmp_path)
    forge_success(log, sign=True)
    assert load_runlog(log)["verified"] is True
    shown = run("show", "run.json")
    assert ("verdict: SUCCESS [unverified: the log says SUCCESS after 1 iteration(s), its .tine says "
            "MAX_ITER after 1] (exit 0)") in shown.stdout, shown.stdout
    (tmp_path / "run.tine").write_bytes(b"TINEZ1\0garbage")
    assert "[unverified: its .tine fails verification" in run("show", "run.json").stdout
    (tmp_path / "run.tine").unlink()
    assert f"[unverified: its .tine {tmp_path / 'run.tine'} is missing]" in run("show", "run.json").stdout


def test_show_marks_a_tine_read_on_its_own_and_an_old_log(run, tmp_path, monkeypatch):
    log = capped_log(run, tmp_path)
    shown = run("show", "run.tine")  # vouched by this machine's key
    assert "verdict: MAX_ITER (exit 2)" in shown.stdout, shown.stdout
    with monkeypatch.context() as elsewhere:  # another machine: another key
        elsewhere.setenv("PYTEST_LOOPS_STATE_DIR", str(tmp_path / "other-machine"))
        shown = run("show", "run.tine")
    assert "verdict: MAX_ITER [unverified: its .tine is not authenticated: vouched, but not by a key " \
           "this machine has (" in shown.stdout, shown.stdout
    data = json.loads(log.read_text())
    data.pop("mac")
    log.write_text(json.dumps(data))
    assert "verdict: MAX_ITER [unverified: it carries no MACs" in run("show", "run.json").stdout


def test_report_marks_an_edited_log_unverified(run, tmp_path):
    (tmp_path / "good").mkdir()
    capped_log(run, tmp_path, "--cwd", "good")
    assert (tmp_path / "good" / "run.json").is_file()
    capped_log(run, tmp_path)
    forge_success(tmp_path / "run.json", sign=False)
    done = run("report", ".", "-o", "report.html")
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "report.html").read_text()
    assert "1 MAX_ITER, 1 SUCCESS (unverified)" in html
    # the overview row and the loop's heading, with why in the tooltip
    assert html.count('<span class="unverified" title="unverified: it carries no MACs') == 2
    assert html.count(">unverified</span>") == 2

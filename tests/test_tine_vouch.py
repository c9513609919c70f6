"""A `.tine` is vouched by this machine's key; `verify` passes only what is authentic.

opentine's integrity digest is a checksum anyone can recompute, so a `.tine`
rewritten to say SUCCESS, digest recomputed, is "intact". These pin that such a
file fails `pytest-loops verify` (exit 1, "integrity ok, not authenticated"), that
a genuine file of a real loop passes it (vouched by this machine's key), that a
file from another machine (another state directory, another key) passes only
with `--integrity-only` or its signature's key, and that `show` and the MCP
server's `verify_run` say the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_loops.artifacts.provenance import write_tine
from pytest_loops.artifacts.tineread import load_tine_summary, verify_tine
from pytest_loops.artifacts.tinevouch import VOUCH_FIELD
from pytest_loops.cli.runsdir import RunsDir
from pytest_loops.cli.runview import load_run

NOT_AUTHENTICATED = "integrity ok, not authenticated"


def tine_json(path: Path) -> dict[str, Any]:
    """The JSON document inside a .tine (opentine compresses it by default)."""
    blob = path.read_bytes()
    if blob.startswith(b"TINEZ1\0"):
        from opentine._codec import unwrap

        blob = unwrap(blob, limit=1 << 30)
    return json.loads(blob)


def rewrite(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` back with opentine's integrity digest recomputed, as a forger would."""
    from opentine._canon import _integrity_digest

    doc["metadata"]["integrity"] = {"algorithm": "sha256", "digest": _integrity_digest(doc)}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")


def forge_success(path: Path, *, steps: bool = True, metadata: bool = True) -> None:
    """Rewrite a failed run's verdict to SUCCESS (in its done step and/or its metadata)."""
    doc = tine_json(path)
    if steps:
        for step in doc["graph"]["steps"].values():
            if step["kind"] == "done":
                step["outputs"].update(verdict="SUCCESS", exit_code=0, reason="all 1 check(s) passed")
    if metadata:
        doc["metadata"].update(verdict="SUCCESS", reason="all 1 check(s) passed")
    rewrite(path, doc)


def intact(path: Path) -> bool:
    from opentine import Run

    return bool(Run.verify_integrity(path).ok)


@pytest.fixture
def failed_loop(tmp_path, cli) -> Path:
    """The .tine of a real loop that ended MAX_ITER (its check never passes)."""
    result = cli("run", "-q", "--name", "gate", "--verify", "false", "--max-iter", "2",
                 "--log", "run.json")
    assert result.returncode == 2, result.stderr
    return tmp_path / "run.tine"


def test_a_real_loop_writes_a_tine_that_verify_passes_as_vouched(tmp_path, cli):
    result = cli("run", "-q", "--verify", "test -f ok", "--revise", "touch ok", "--log", "run.json")
    assert result.returncode == 0, result.stderr
    checked = cli("verify", "run.tine")
    assert checked.returncode == 0, checked.stderr
    assert "integrity ok (4 steps, verdict SUCCESS); vouched by this machine's key" in checked.stdout
    summary = json.loads((tmp_path / "run.json").read_text())
    assert "tine_unvouched" not in summary["artifacts"]
    shown = load_run(tmp_path / "run.tine")
    assert shown["verified"] is True and shown["authenticated"] is True


@pytest.mark.parametrize(("steps", "metadata"), [(True, True), (True, False), (False, True)],
                         ids=["step and metadata", "step only", "metadata only"])
def test_a_verdict_rewritten_to_success_with_the_digest_recomputed_fails_verify(failed_loop, cli, steps,
                                                                               metadata):
    forge_success(failed_loop, steps=steps, metadata=metadata)
    assert intact(failed_loop)  # opentine's checksum holds: it proves nothing
    checked = cli("verify", "run.tine")
    assert checked.returncode == 1
    line = checked.stderr.strip()
    assert NOT_AUTHENTICATED in line and "\n" not in line, line
    assert "its vouch does not match: the file was changed after it was written" in line
    assert checked.stdout == ""
    # --integrity-only: today's check, for files from elsewhere; it says what it is not
    loose = cli("verify", "run.tine", "--integrity-only")
    assert loose.returncode == 0, loose.stderr
    assert "integrity ok" in loose.stdout and "not authenticated (integrity only)" in loose.stdout


def test_a_forged_file_without_a_vouch_or_with_one_copied_from_a_genuine_file_fails(tmp_path, cli,
                                                                                    failed_loop):
    genuine = cli("run", "-q", "--verify", "true", "--log", "good.json")
    assert genuine.returncode == 0, genuine.stderr
    borrowed = tine_json(tmp_path / "good.tine")["metadata"][VOUCH_FIELD]
    doc = tine_json(failed_loop)
    del doc["metadata"][VOUCH_FIELD]
    rewrite(failed_loop, doc)
    checked = cli("verify", "run.tine")
    assert checked.returncode == 1
    assert "not signed, and not vouched by this machine's key" in checked.stderr
    forge_success(failed_loop)
    doc = tine_json(failed_loop)
    doc["metadata"][VOUCH_FIELD] = borrowed
    rewrite(failed_loop, doc)
    checked = cli("verify", "run.tine")
    assert checked.returncode == 1 and "its vouch does not match" in checked.stderr


def test_a_tine_from_another_machine_passes_only_with_integrity_only(tmp_path, cli):
    elsewhere = {"PYTEST_LOOPS_STATE_DIR": str(tmp_path / "other-machine")}
    made = cli("run", "-q", "--verify", "true", "--log", "run.json", env=elsewhere)
    assert made.returncode == 0, made.stderr
    assert cli("verify", "run.tine", env=elsewhere).returncode == 0  # there, it is vouched
    checked = cli("verify", "run.tine")
    assert checked.returncode == 1
    assert NOT_AUTHENTICATED in checked.stderr and "vouched by another machine's key" in checked.stderr
    loose = cli("verify", "run.tine", "--integrity-only")
    assert loose.returncode == 0 and "not authenticated (integrity only)" in loose.stdout
    # a machine with no local key at all
    empty = {"PYTEST_LOOPS_STATE_DIR": str(tmp_path / "keyless")}
    checked = cli("verify", "run.tine", env=empty)
    assert checked.returncode == 1 and "not by a key this machine has" in checked.stderr
    assert not (tmp_path / "keyless").exists()  # verify never makes a key
    shown = load_run(tmp_path / "run.tine")
    assert shown["verified"] is False
    assert shown["unverified_why"].startswith("its .tine is not authenticated: vouched by another machine")


def test_signed_files_still_verify_with_their_key_on_any_machine(tmp_path, cli):
    hmac = "0123456789abcdef0123456789abcdef"
    elsewhere = {"PYTEST_LOOPS_STATE_DIR": str(tmp_path / "ci-machine"), "LOOPS_HMAC_KEY": hmac}
    made = cli("run", "-q", "--verify", "true", "--sign-key-env", "LOOPS_HMAC_KEY", "--log", "hmac.json",
               env=elsewhere)
    assert made.returncode == 0, made.stderr
    with_key = cli("verify", "hmac.tine", "--key-env", "LOOPS_HMAC_KEY", env={"LOOPS_HMAC_KEY": hmac})
    assert with_key.returncode == 0 and "signature verified (hmac-sha256)" in with_key.stdout
    here = cli("verify", "hmac.tine")  # signed, but no key given: not checked, and not vouched here
    assert here.returncode == 1
    assert "not authenticated: signed (hmac-sha256), signature not checked: no key given" in here.stderr
    there = cli("verify", "hmac.tine", env=elsewhere)  # vouched there; the signature is noted
    assert there.returncode == 0 and "vouched by this machine's key; signed (hmac-sha256)" in there.stdout
    private, public = tmp_path / "signing.key", tmp_path / "signing.key.pub"
    tine = Path(sys.executable).with_name("tine")
    if not tine.exists():
        pytest.skip("opentine's `tine` script is not installed beside python")
    subprocess.run([str(tine), "keygen", "--out", str(private)], check=True, capture_output=True)
    made = cli("run", "-q", "--verify", "true", "--sign-key-file", str(private), "--log", "ed.json",
               env=elsewhere)
    assert made.returncode == 0, made.stderr
    checked = cli("verify", "ed.tine", "--pubkey", str(public))
    assert checked.returncode == 0 and "signature verified (ed25519)" in checked.stdout


def test_a_signature_does_not_cover_a_forged_verdict(tmp_path, cli):
    hmac = {"LOOPS_HMAC_KEY": "0123456789abcdef0123456789abcdef"}
    made = cli("run", "-q", "--verify", "false", "--max-iter", "1", "--sign-key-env", "LOOPS_HMAC_KEY",
               "--log", "run.json", env=hmac)
    assert made.returncode == 2, made.stderr
    forge_success(tmp_path / "run.tine")
    for args in ((), ("--key-env", "LOOPS_HMAC_KEY")):
        checked = cli("verify", "run.tine", *args, env=hmac)
        assert checked.returncode == 1, (args, checked.stdout)


def test_no_local_key_still_writes_the_tine_unvouched_and_the_run_log_says_so(tmp_path, cli):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    env = {"PYTEST_LOOPS_STATE_DIR": str(blocked / "state")}
    made = cli("run", "-q", "--verify", "true", "--log", "run.json", env=env)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "run.tine").is_file()
    summary = json.loads((tmp_path / "run.json").read_text())
    assert "the run-log key" in summary["artifacts"]["tine_unvouched"]
    assert "tine_error" not in summary["artifacts"]
    checked = cli("verify", "run.tine")
    assert checked.returncode == 1 and "not signed, and not vouched by this machine's key" in checked.stderr
    assert cli("verify", "run.tine", "--integrity-only").returncode == 0


def test_the_vouch_holds_when_opentines_redaction_changed_the_file(tmp_path):
    from test_cost_tine import make_result

    notes: list[str] = []
    path = write_tine(make_result(3, tail="first\nsshkey: s3cr3t-vouch-value-1\nlast"), tmp_path / "r.tine",
                      on_unvouched=notes.append)
    assert notes == []
    ok, message = verify_tine(path)
    assert ok and "vouched by this machine's key" in message, message
    assert load_tine_summary(path)["authenticated"] is True


def test_write_tine_without_a_vouch_key_writes_no_vouch(tmp_path):
    from test_cost_tine import make_result

    path = write_tine(make_result(2), tmp_path / "r.tine", vouch_key=None)
    ok, message = verify_tine(path)
    assert not ok and NOT_AUTHENTICATED in message
    ok, message = verify_tine(path, integrity_only=True)
    assert ok and "not authenticated (integrity only)" in message


def test_the_mcp_verify_run_and_show_say_the_same(tmp_path, cli, failed_loop):
    runs = RunsDir(tmp_path)
    answer = runs.verify_run("run.json")
    assert answer["tine"]["ok"] is True and answer["tine"]["authenticated"] is True, answer
    assert answer["ok"] is True
    forge_success(failed_loop)
    answer = runs.verify_run("run.json")
    assert answer["tine"]["authenticated"] is False and answer["ok"] is False
    assert NOT_AUTHENTICATED in answer["tine"]["why"]
    shown = load_run(failed_loop)
    assert shown["verified"] is False and "not authenticated" in shown["unverified_why"]
    log = load_run(tmp_path / "run.json")  # the run log's MACs hold, its .tine is forged
    assert log["verified"] is False and "not authenticated" in log["unverified_why"]


VOUCH_EDITS = {
    "vouch not an object": lambda meta: meta.update({VOUCH_FIELD: "x"}),
    "vouch a list": lambda meta: meta.update({VOUCH_FIELD: []}),
    "mac not a string": lambda meta: meta[VOUCH_FIELD].update(mac=5, key_id=None),
    "unknown scheme": lambda meta: meta[VOUCH_FIELD].update(scheme="pytest-loops.tine-vouch/9"),
    "mac cut short": lambda meta: meta[VOUCH_FIELD].update(mac=meta[VOUCH_FIELD]["mac"][:10]),
    "a number no JSON can hold": lambda meta: meta.update(elapsed=float("nan")),
}


@pytest.mark.parametrize("edit", [*VOUCH_EDITS, "metadata not an object"])
def test_a_damaged_vouch_is_one_line_and_exit_1_never_a_traceback(tmp_path, failed_loop, edit):
    import contextlib
    import io

    from pytest_loops.cli import main as cli_main

    doc = tine_json(failed_loop)
    if edit == "metadata not an object":
        doc["metadata"] = [doc["metadata"]]
    else:
        VOUCH_EDITS[edit](doc["metadata"])
    failed_loop.write_text(json.dumps(doc), encoding="utf-8")  # NaN is written as NaN
    for argv, codes in ((["verify", str(failed_loop)], {1}), (["show", str(failed_loop)], {0, 64})):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main.main(argv)
        assert code in codes, (argv, code, out.getvalue(), err.getvalue())
        assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
        if argv[0] == "verify":
            assert len((out.getvalue() + err.getvalue()).strip().splitlines()) == 1
        elif code == 0:
            assert "unverified" in out.getvalue()


@pytest.mark.parametrize("field", ["status", "tags", "goal", "run_id"])
def test_the_vouch_covers_more_than_the_steps_and_the_verdict(tmp_path, field):
    from test_cost_tine import make_result

    path = Path(write_tine(make_result(2), tmp_path / "r.tine"))
    doc = tine_json(path)
    if field == "status":
        doc["status"] = "completed"  # the run failed (MAX_ITER)
    elif field == "tags":
        doc["metadata"]["tags"] = ["pytest-loops", "success"]
    elif field == "goal":
        doc["metadata"]["goal"] = "something else"
    else:
        doc["run_id"] = "0" * len(doc["run_id"])
    rewrite(path, doc)
    assert intact(path)
    ok, message = verify_tine(path)
    assert not ok and "its vouch does not match" in message, message

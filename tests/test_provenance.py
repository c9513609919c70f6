"""The .tine provenance file: what is recorded, opentine's pitfalls, signing, verify."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_loops.artifacts import provenance
from pytest_loops.artifacts.provenance import premask, tail_text, write_tine
from pytest_loops.artifacts.tineread import load_tine_summary, verify_tine
from pytest_loops.errors import LoopUsageError
from pytest_loops.redact import make_redactor, redact, redact_obj
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

REPO = Path(__file__).resolve().parents[1]
TINE = Path(sys.executable).with_name("tine")
SECRET = "s3cr3t-value-for-tests-91"


def make_result(iterations: int = 3, verdict: Verdict = Verdict.MAX_ITER, *, tail: str = "E   assert 1 == 2",
                identical: bool = False, **record_overrides) -> LoopResult:
    """A loop of two checks (a command and a pytest node id) and a revise step."""
    spec = LoopSpec(
        name="fix parser", goal="make the parser tests pass", revise="./agent.sh",
        checks=(Check.command_passes("make lint"), Check.test_passes("tests/test_p.py::test_parse")),
        guards=Guards(max_iter=iterations), state_paths=("src",),
    )
    records = []
    for i in range(1, iterations + 1):
        last = i == iterations
        passed = verdict is Verdict.SUCCESS and last
        checks = [
            CheckResult(name=spec.checks[0].name, kind="command", passed=True, exit_code=0,
                        duration_s=0.25, output_tail="lint ok", command="make lint"),
            CheckResult(name=spec.checks[1].name, kind="pytest", passed=passed,
                        exit_code=0 if passed else 1, duration_s=1.5, output_tail=tail),
        ]
        fields = dict(
            iter=i, started_at="2026-01-01T00:00:00+00:00", checks=checks,
            verify_exit=0 if passed else 1, passed=passed, duration_s=2.0,
            state_hash="h" if identical else f"h{i}", state_changed=False if identical else True,
            unchanged_streak=0, lesson=None if passed else f"lesson {i}",
            revise_exit=None if last else 0, revise_duration_s=None if last else 3.0,
            revise_tail="" if last else "edited src/parser.py",
            guard="max_iter" if last and not passed else None,
            guards_seen={"max_iter": iterations, "budget_left_s": 800.0},
            elapsed_s=5.0 * i,
        )
        if identical:  # only the iteration number tells them apart
            fields.update(elapsed_s=5.0, lesson="same", guard=None)
        fields.update(record_overrides)
        records.append(IterationRecord(**fields))
    return LoopResult(
        spec=spec, verdict=verdict,
        reason="the iteration cap was reached" if verdict is Verdict.MAX_ITER else "all checks pass",
        iterations=records, started_at="2026-01-01T00:00:00+00:00",
        ended_at="2026-01-01T00:01:00+00:00", elapsed_s=60.0,
        log_path="runs/fix-parser/run.json", run_dir="runs/fix-parser",
    )


def steps_of(path: Path):
    from opentine import Run

    return Run.load(path).steps


# --------------------------------------------------------------------------- import cost


@pytest.mark.parametrize("module", [
    "pytest_loops.artifacts.provenance", "pytest_loops.cli.runview",
    "pytest_loops.artifacts.report", "pytest_loops.artifacts.handoff",
])
def test_importing_does_not_import_opentine(module):
    code = f"import sys, {module}; print('opentine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- what is recorded


def test_round_trip_gives_the_run_log_shape(tmp_path):
    result = make_result(3)
    path = write_tine(result, tmp_path / "run.tine")
    summary = load_tine_summary(path)
    assert summary["loop"] == "fix parser"
    assert summary["goal"] == "make the parser tests pass"
    assert summary["verdict"] == "MAX_ITER" and summary["exit_code"] == 2
    assert summary["reason"] == "the iteration cap was reached"
    assert summary["iterations_run"] == 3
    assert summary["spec_digest"] == result.spec.digest()
    assert summary["guards"]["max_iter"] == 3
    assert summary["state_paths"] == ["src"]
    assert summary["revise"] == "./agent.sh"
    assert summary["lessons"] == ["lesson 1", "lesson 2", "lesson 3"]
    assert summary["integrity_ok"] is True
    its = summary["iterations"]
    assert [it["iter"] for it in its] == [1, 2, 3]
    assert [[c["passed"] for c in it["checks"]] for it in its] == [[True, False]] * 3
    assert [it["revise_exit"] for it in its] == [0, 0, None]
    assert [it["guard"] for it in its] == [None, None, "max_iter"]
    assert [it["state_hash"] for it in its] == ["h1", "h2", "h3"]
    assert its[0]["checks"][0]["command"] == "make lint"
    assert its[0]["checks"][1]["output_tail"] == "E   assert 1 == 2"
    assert its[0]["revise_tail"] == "edited src/parser.py"
    assert set(RUNLOG_KEYS) <= set(summary)


RUNLOG_KEYS = [
    "schema", "loop", "goal", "source", "verdict", "exit_code", "reason", "iterations_run",
    "guards", "state_paths", "started_at", "ended_at", "elapsed_s", "cwd", "revise", "spec",
    "spec_digest", "memory_page", "lessons_read", "lessons", "run_dir", "artifacts",
    "iterations", "pytest_loops_version",
]


def test_one_step_per_iteration_between_a_start_and_a_verdict_step(tmp_path):
    path = Path(write_tine(make_result(3), tmp_path / "run.tine"))
    steps = steps_of(path)
    assert [s.kind.value for s in steps] == ["think", "tool", "tool", "tool", "done"]
    assert steps[0].outputs["schema"] == "pytest-loops.tine/2"
    assert {s.tool_info["name"] for s in steps[1:4]} == {"iteration"}
    assert steps[1].inputs == {"name": "iteration", "arguments": {
        "iteration": 1, "checks": ['"make lint" passes', 'the test "tests/test_p.py::test_parse" passes'],
        "revise": "./agent.sh"}}
    assert "revise" not in steps[3].inputs["arguments"]  # no revise after the last iteration
    first = steps[1].outputs
    lint, parse = first["checks"]
    assert lint["passed"] is True and lint["exit_code"] == 0
    assert "tail" not in lint  # a passing check's output is its digest alone
    assert not {"kind", "command", "node_id"} & (set(lint) | set(parse))  # as the spec declares them
    assert set(parse) >= {"exit_code", "passed", "duration_s", "output_digest", "tail"}
    assert first["revise"]["exit_code"] == 0 and first["revise"]["tail"] == "edited src/parser.py"
    assert "revise" not in steps[3].outputs
    assert first["decision"] == "no guard fired, loop goes on; 1/2 checks pass; state changed; revise exit 0"
    assert first["guards_seen"] == {"max_iter": 3, "budget_left_s": 800.0}
    assert steps[3].outputs["decision"].startswith("guard max_iter stops the loop")
    assert steps[3].outputs["guard"] == "max_iter"
    assert steps[1].duration == 2.0
    done = steps[-1]
    assert done.outputs["verdict"] == "MAX_ITER"
    assert done.outputs["reason"] == "the iteration cap was reached"
    assert all(isinstance(s.outputs, dict) for s in steps)


def check_outputs(path, iteration: int = 1, index: int = 1) -> dict:
    """What the step of iteration ``iteration`` holds for its check number ``index``."""
    step = [s for s in steps_of(Path(path))
            if (s.inputs.get("arguments") or {}).get("iteration") == iteration][0]
    return step.outputs["checks"][index]


def test_verdict_lives_in_a_step_not_only_in_metadata(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")
    path = Path(write_tine(make_result(2), tmp_path / "run.tine"))
    data = json.loads(path.read_text())
    assert data["metadata"]["verdict"] == "MAX_ITER"
    data["metadata"]["verdict"] = "SUCCESS"  # metadata is outside the digest
    path.write_text(json.dumps(data))
    ok, message = verify_tine(path, integrity_only=True)
    assert ok and "not authenticated" in message  # opentine's digest does not notice...
    assert load_tine_summary(path)["verdict"] == "MAX_ITER"  # ...we never read it...
    ok, message = verify_tine(path)
    assert not ok and "its vouch does not match" in message  # ...and the vouch covers it


def test_tampered_step_fails_verification(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")
    path = Path(write_tine(make_result(2), tmp_path / "run.tine"))
    data = json.loads(path.read_text())
    for step in data["graph"]["steps"].values():
        if step["kind"] == "done":
            step["outputs"]["verdict"] = "SUCCESS"
    path.write_text(json.dumps(data))
    ok, message = verify_tine(path)
    assert not ok
    assert "integrity check failed" in message and "\n" not in message
    tine = subprocess.run([str(TINE), "verify", str(path)], capture_output=True, text=True)
    assert tine.returncode != 0


def test_output_digest_covers_the_full_output_file(tmp_path):
    full = tmp_path / "out.txt"
    full.write_text("line\n" * 10_000 + "E   the end\n")
    result = make_result(1)
    record = result.iterations[0]
    record.checks[1] = CheckResult(name=record.checks[1].name, kind="pytest", passed=False,
                                   exit_code=1, duration_s=1.0, output_tail="E   the end",
                                   output_file=str(full))
    path = write_tine(result, tmp_path / "run.tine")
    check = check_outputs(path)
    assert check["output_digest"] == "sha256:" + hashlib.sha256(full.read_bytes()).hexdigest()
    assert check["tail"].endswith("E   the end")
    assert check["tail"].count("\n") < 25  # a short tail, the rest stays in our file
    no_file = check_outputs(path, index=0)  # "lint ok", no output file: the tail is digested
    assert no_file["output_digest"] == "sha256:" + hashlib.sha256(b"lint ok").hexdigest()


# --------------------------------------------------------------------------- opentine's pitfalls


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -3.0])
def test_bad_durations_are_sanitized(tmp_path, bad):
    result = make_result(2, duration_s=bad, elapsed_s=bad, revise_duration_s=bad,
                         guards_seen={"budget_left_s": bad})
    result.iterations[0].checks[0] = CheckResult(name=result.iterations[0].checks[0].name,
                                                 kind="command", passed=True, exit_code=0,
                                                 duration_s=bad)
    result.elapsed_s = bad
    path = Path(write_tine(result, tmp_path / "run.tine"))
    assert verify_tine(path)[0]
    summary = load_tine_summary(path)
    first = summary["iterations"][0]
    assert first["duration_s"] == 0.0 and first["elapsed_s"] == 0.0
    assert first["checks"][0]["duration_s"] == 0.0
    assert first["revise_duration_s"] == 0.0
    assert summary["elapsed_s"] == 0.0
    assert all(s.duration >= 0 for s in steps_of(path))
    # a non-finite number elsewhere becomes null instead of an error; others stay
    expected = bad if math.isfinite(bad) else None
    assert first["guards_seen"]["budget_left_s"] == expected


def test_odd_values_in_guards_seen_are_made_json(tmp_path):
    result = make_result(1, guards_seen={"paths": {Path("a"), Path("b")}, "raw": b"bytes",
                                         "tuple": (1, 2), "verdict": Verdict.TIMEOUT})
    summary = load_tine_summary(write_tine(result, tmp_path / "run.tine"))
    seen = summary["iterations"][0]["guards_seen"]
    assert seen == {"paths": ["a", "b"], "raw": "bytes", "tuple": [1, 2], "verdict": "TIMEOUT"}


def test_identical_iterations_never_collapse(tmp_path):
    result = make_result(4, identical=True)
    path = Path(write_tine(result, tmp_path / "run.tine"))
    steps = steps_of(path)
    assert len(steps) == 1 + 4 + 1  # start, one per iteration, done
    assert len({s.id for s in steps}) == len(steps)
    assert [it["iter"] for it in load_tine_summary(path)["iterations"]] == [1, 2, 3, 4]


def test_a_check_the_spec_does_not_declare_keeps_its_kind_and_command(tmp_path):
    result = make_result(1)
    record = result.iterations[0]
    record.checks.append(CheckResult(name="extra", kind="pytest", passed=True, exit_code=0, duration_s=0.1,
                                     command="pytest -x"))
    lint = record.checks[0]
    record.checks[0] = CheckResult(name=lint.name, kind="human", passed=False, exit_code=None,
                                   duration_s=0.0, command=None, needs_human=True)
    summary = load_tine_summary(write_tine(result, tmp_path / "run.tine"))
    checks = summary["iterations"][0]["checks"]
    assert [(c["name"], c["kind"], c["command"]) for c in checks] == [
        ('"make lint" passes', "human", None),
        ('the test "tests/test_p.py::test_parse" passes', "pytest", None),
        ("extra", "pytest", "pytest -x")]
    assert checks[0]["needs_human"] is True and checks[0]["exit_code"] is None


def test_two_checks_with_one_name_stay_two_steps(tmp_path):
    result = make_result(1)
    same = result.iterations[0].checks[0]
    result.iterations[0].checks[:] = [same, same]
    summary = load_tine_summary(write_tine(result, tmp_path / "run.tine"))
    assert len(summary["iterations"][0]["checks"]) == 2


MULTILINE = "\n".join([
    "tests/test_p.py::test_parse FAILED",
    "E   assert parse('x') == 1",
    "api_token: abc123",
    "line after the token",
    "MY_PASSWORD=hunter2 and more",
    "DSN=postgres://u:p@h/db",
    "Authorization: Bearer abcdefghijklmnop",
    "secret:",
    "KeyError: 'token'",
    "last line",
])


def test_secret_looking_lines_are_masked_by_us_and_nothing_after_them_is_lost(tmp_path):
    path = Path(write_tine(make_result(1, tail=MULTILINE), tmp_path / "run.tine"))
    stored = check_outputs(path)["tail"]
    assert stored == tail_text(MULTILINE)  # what we wrote is what the file holds
    for kept in ("test_parse FAILED", "line after the token", "KeyError: 'token'", "last line",
                 "E   assert parse('x') == 1"):
        assert kept in stored
    for gone in ("abc123", "hunter2", "postgres://", "abcdefghijklmnop"):
        assert gone not in stored
    assert "api_token [REDACTED]" in stored


def test_what_opentine_would_still_cut_is_refitted_line_by_line(tmp_path):
    # "sshkey:" is a credential to opentine but not to our mask: opentine alone
    # would replace this whole string from "sshkey:" on.
    tail = "first line\nsshkey: abc123\nthird line\nfourth line"
    assert "sshkey: abc123" in premask(tail)
    path = Path(write_tine(make_result(1, tail=tail), tmp_path / "run.tine"))
    stored = check_outputs(path)["tail"]
    assert stored == "first line\nsshkey [REDACTED]\nthird line\nfourth line"
    assert verify_tine(path)[0]


def test_private_key_blocks_are_masked_whole(tmp_path):
    tail = ("before\n-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\nMIIEabc+/=\n"
            "QUJD\n-----END RSA PRIVATE KEY-----\nafter")
    stored = check_outputs(write_tine(make_result(1, tail=tail), tmp_path / "r.tine"))
    assert stored["tail"] == "before\n[REDACTED PRIVATE KEY]\nafter"


def test_saved_once_when_nothing_needs_refitting(tmp_path, monkeypatch):
    from opentine import Run

    calls = []
    real = Run.save
    monkeypatch.setattr(Run, "save", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    write_tine(make_result(5), tmp_path / "run.tine")
    assert len(calls) == 1


SECRETISH = st.sampled_from([
    "token: abc", "api_key=xyz", "PASSWORD = p4ss", "secret:", "sshkey: k", "DSN=pg://u:p@h",
    "Bearer abcdefghijkl", "ghp_" + "a" * 36, "https://user:pw@example.com/x", "--password hunter2",
    '"client_secret": "zz"', "KeyError: 'x'", "-----BEGIN PRIVATE KEY-----", "MIIabc",
    "x" * 50, "", "  indented: value", "ok=1",
])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(noise=st.lists(st.one_of(SECRETISH, st.text(max_size=30)), min_size=1, max_size=12))
def test_plain_lines_survive_any_mix_of_secret_looking_lines(tmp_path, noise):
    lines = []
    for i, item in enumerate(noise):
        lines.append(f"keep-{i}")
        lines.append(item.replace("\n", " ").replace("\r", " "))
    tail = "\n".join(lines)
    path = Path(write_tine(make_result(1, tail=tail), tmp_path / "fuzz.tine"))
    ok, message = verify_tine(path)
    assert ok, message
    stored = check_outputs(path)["tail"]
    window = tail_text(tail)
    for i in range(len(noise)):
        if f"keep-{i}\n" in window + "\n":
            assert f"keep-{i}" in stored.split("\n")


# --------------------------------------------------------------------------- secrets from the environment


def test_env_secrets_never_reach_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")
    result = make_result(2, tail=f"echo {SECRET}\n{SECRET}", lesson=f"lesson {SECRET}")
    result.reason = f"stopped, key was {SECRET}"
    output = tmp_path / "out.txt"
    output.write_text(f"full output with {SECRET} inside\n" * 3)
    result.iterations[0].checks[0] = CheckResult(name=f"check {SECRET}", kind="command", passed=True,
                                                 exit_code=0, duration_s=0.1, output_file=str(output),
                                                 command=f"curl -H {SECRET}")
    path = Path(write_tine(result, tmp_path / "run.tine"))
    text = path.read_text()
    assert SECRET not in text
    assert "[REDACTED:MY_API_TOKEN]" in text


def test_a_secret_cut_at_the_tail_boundary_is_not_half_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("CI_SECRET", SECRET)
    out = tmp_path / "big.txt"
    # the secret straddles the 64 KiB read window: the partial line must be dropped
    out.write_bytes(b"x" * (200_000 - 64 * 1024 - 5) + SECRET.encode() + b"\n" + b"tail line\n" * 3)
    tail = provenance.file_tail(str(out), "")
    assert SECRET[5:] not in tail and "tail line" in tail


def test_redact_masks_only_secret_named_values_of_length_4_or_more():
    env = {"GITHUB_TOKEN": "ghtokenvalue", "HOME": "/root", "DB_PASSWORD": "pw1", "AUTH_HEADER": "abcd",
           "api_key": "lowercase-name"}
    text = "ghtokenvalue /root pw1 abcd lowercase-name"
    assert redact(text, env) == ("[REDACTED:GITHUB_TOKEN] /root pw1 [REDACTED:AUTH_HEADER] "
                                 "[REDACTED:api_key]")
    assert redact_obj({"a": ["ghtokenvalue", ("abcd",)], "n": 1}, env) == {
        "a": ["[REDACTED:GITHUB_TOKEN]", ("[REDACTED:AUTH_HEADER]",)], "n": 1}
    assert make_redactor(env)("x abcd") == "x [REDACTED:AUTH_HEADER]"


def test_redact_replaces_the_longest_secret_first():
    env = {"A_KEY": "abcd", "B_KEY": "abcdefgh"}
    assert redact("abcdefgh", env) == "[REDACTED:B_KEY]"


# --------------------------------------------------------------------------- signing


def test_hmac_signed_file_verifies_with_the_key_and_not_without(tmp_path):
    key = b"0123456789abcdef0123"
    path = write_tine(make_result(2), tmp_path / "run.tine", hmac_key=key)
    ok, message = verify_tine(path, hmac_key=key)
    assert ok and "signature verified (hmac-sha256)" in message
    ok, message = verify_tine(path, hmac_key=b"another-key-of-16+bytes")
    assert not ok and "signature mismatch" in message
    ok, message = verify_tine(path)
    assert ok and "signature not checked" in message


def test_unsigned_file_with_a_key_given_is_not_ok(tmp_path):
    path = write_tine(make_result(1), tmp_path / "run.tine")
    ok, message = verify_tine(path, hmac_key=b"0123456789abcdef")
    assert not ok and "not signed" in message


@pytest.mark.parametrize("key", [b"", b"short", b"0123456789abcde"])
def test_short_hmac_key_is_a_usage_error_and_nothing_is_written(tmp_path, key):
    with pytest.raises(LoopUsageError, match="at least 16"):
        write_tine(make_result(1), tmp_path / "run.tine", hmac_key=key)
    assert not (tmp_path / "run.tine").exists()


def test_both_keys_is_a_usage_error(tmp_path):
    with pytest.raises(LoopUsageError, match="not both"):
        write_tine(make_result(1), tmp_path / "r.tine", hmac_key=b"0" * 16, ed25519_key_path="k")


def keygen(tmp_path: Path, name: str) -> tuple[Path, Path]:
    key = tmp_path / name
    subprocess.run([str(TINE), "keygen", "--out", str(key)], check=True, capture_output=True)
    return key, Path(str(key) + ".pub")


def test_ed25519_signed_file_verifies_with_its_public_key(tmp_path):
    key, pub = keygen(tmp_path, "signer")
    _, other_pub = keygen(tmp_path, "other")
    path = write_tine(make_result(2), tmp_path / "run.tine", ed25519_key_path=str(key))
    ok, message = verify_tine(path, pubkey_path=str(pub))
    assert ok and "signature verified (ed25519)" in message
    ok, message = verify_tine(path, pubkey_path=str(other_pub))
    assert not ok and "mismatch" in message
    ok, message = verify_tine(path, hmac_key=b"0123456789abcdef")
    assert not ok and "another algorithm" in message
    cli = subprocess.run([str(TINE), "verify", path, "--pubkey", str(pub)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stdout + cli.stderr


@pytest.mark.parametrize("content", [None, b"not a key\n"])
def test_bad_ed25519_key_file_is_a_usage_error(tmp_path, content):
    key = tmp_path / "key"
    if content is not None:
        key.write_bytes(content)
    with pytest.raises(LoopUsageError) as info:
        write_tine(make_result(1), tmp_path / "run.tine", ed25519_key_path=str(key))
    assert str(key) in str(info.value) and "tine keygen" in str(info.value)


def test_bad_public_key_file_is_reported_not_raised(tmp_path):
    key, _ = keygen(tmp_path, "signer")
    path = write_tine(make_result(1), tmp_path / "run.tine", ed25519_key_path=str(key))
    (tmp_path / "bad.pub").write_text("zz\n")
    for pub, expect in ((tmp_path / "bad.pub", "not an Ed25519 public key"),
                        (tmp_path / "missing.pub", "no such public key file")):
        ok, message = verify_tine(path, pubkey_path=str(pub))
        assert not ok and expect in message


# --------------------------------------------------------------------------- verify never raises


def bad_files(tmp_path: Path, good: Path) -> dict[str, Path]:
    files = {}
    files["missing"] = tmp_path / "missing.tine"
    (files.setdefault("empty", tmp_path / "empty.tine")).write_bytes(b"")
    (files.setdefault("random", tmp_path / "random.tine")).write_bytes(os.urandom(2048))
    data = good.read_bytes()
    (files.setdefault("truncated", tmp_path / "truncated.tine")).write_bytes(data[: len(data) // 2])
    (files.setdefault("magic-only", tmp_path / "magic.tine")).write_bytes(b"TINEZ1\0" + zlib.compress(b"[1]"))
    (files.setdefault("runlog", tmp_path / "run.json")).write_text(
        json.dumps({"schema": "pytest-loops.runlog/1", "iterations": []}))
    (files.setdefault("text", tmp_path / "notes.txt")).write_text("hello\n")
    (files.setdefault("json-list", tmp_path / "list.tine")).write_text("[]")
    files["directory"] = tmp_path
    return files


def test_verify_never_raises_and_says_why_in_one_line(tmp_path):
    good = Path(write_tine(make_result(1), tmp_path / "good.tine"))
    for label, path in bad_files(tmp_path, good).items():
        ok, message = verify_tine(path)
        assert ok is False, label
        assert message and "\n" not in message, label
        with pytest.raises(ValueError) as info:
            load_tine_summary(path)
        assert "\n" not in str(info.value)


def verdicts_of_every_kind(tmp_path: Path, monkeypatch) -> dict[str, tuple[Path, dict]]:
    """A .tine of each kind verify tells apart, with the keys to check it."""
    hmac_key = b"0123456789abcdef0123"
    signer, pub = keygen(tmp_path, "signer")
    files = {
        "vouched": (Path(write_tine(make_result(2), tmp_path / "vouched.tine")), {}),
        "hmac": (Path(write_tine(make_result(2), tmp_path / "hmac.tine", hmac_key=hmac_key)), {"hmac_key": hmac_key}),
        "hmac, other key": (tmp_path / "hmac.tine", {"hmac_key": b"another-key-of-16+bytes"}),
        "hmac, no key": (tmp_path / "hmac.tine", {}),
        "ed25519": (Path(write_tine(make_result(1), tmp_path / "ed.tine", ed25519_key_path=str(signer))),
                    {"pubkey_path": str(pub)}),
        "ed25519, hmac key": (tmp_path / "ed.tine", {"hmac_key": hmac_key}),
    }
    plain = tmp_path / "plain"
    plain.mkdir()
    with monkeypatch.context() as patch:
        patch.setenv("OPENTINE_COMPRESS", "0")
        tampered = Path(write_tine(make_result(2), plain / "tampered.tine"))
    data = json.loads(tampered.read_text())
    for step in data["graph"]["steps"].values():
        if step["kind"] == "done":
            step["outputs"]["verdict"] = "SUCCESS"
    tampered.write_text(json.dumps(data))
    files["tampered"] = (tampered, {})
    files.update({label: (path, {}) for label, path in bad_files(tmp_path / "bad", files["vouched"][0]).items()})
    return files


def test_verify_reads_each_file_once_and_says_what_the_public_verbs_say(tmp_path, monkeypatch):
    """verify reads a file once through opentine's reader (merge checks thousands); its
    answer is, word for word, the one of opentine's public verbs, which read it thrice."""
    import opentine._artifact_io as artifact_io

    from pytest_loops.artifacts import tineread

    (tmp_path / "bad").mkdir()
    files = verdicts_of_every_kind(tmp_path, monkeypatch)
    reads: list[str] = []
    real_read = artifact_io.read_artifact_bytes

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(artifact_io, "read_artifact_bytes", counted)
    once = {label: tineread.verify_and_summarize(path, **keys) for label, (path, keys) in files.items()}
    reads.clear()
    assert tineread.verify_tine(files["hmac"][0], hmac_key=files["hmac"][1]["hmac_key"])[0]
    assert reads == [str(files["hmac"][0])]

    monkeypatch.setattr(tineread, "_read_once", lambda path: (None, None))
    reads.clear()
    assert tineread.verify_tine(files["hmac"][0], hmac_key=files["hmac"][1]["hmac_key"])[0]
    assert len(reads) == 3  # what the public verbs cost: each reads the path again
    public = {label: tineread.verify_and_summarize(path, **keys) for label, (path, keys) in files.items()}
    assert once == public
    assert [label for label, (ok, _, _) in once.items() if ok] == ["vouched", "hmac", "hmac, no key", "ed25519"]
    assert once["vouched"][2] is not None and once["vouched"][2]["verdict"] == "MAX_ITER"


def test_a_foreign_tine_without_our_steps_is_not_ours(tmp_path):
    from opentine import Run, RunStatus, StepKind

    run = Run(metadata={})
    run.add_step(StepKind.think, inputs={"text": "hello"}, outputs={})
    run.status = RunStatus.completed
    run.save(tmp_path / "foreign.tine")
    ok, message = verify_tine(tmp_path / "foreign.tine")
    assert not ok and "not a pytest-loops run file" in message
    with pytest.raises(ValueError, match="not a pytest-loops run file"):
        load_tine_summary(tmp_path / "foreign.tine")


# --------------------------------------------------------------------------- opentine's own CLI


@pytest.mark.skipif(not TINE.exists(), reason="opentine's `tine` script is not installed beside python")
def test_tine_show_and_verify_work_on_our_files(tmp_path, monkeypatch):
    path = write_tine(make_result(3), tmp_path / "run.tine")
    shown = subprocess.run([str(TINE), "show", path], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "make lint" in shown.stdout
    assert "revise" in shown.stdout
    assert "verdict MAX_ITER after 3 iterations" in shown.stdout
    verified = subprocess.run([str(TINE), "verify", path], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    monkeypatch.setenv("LOOPS_HMAC", "0123456789abcdef0123456789abcdef")
    signed = write_tine(make_result(1), tmp_path / "signed.tine",
                        hmac_key=os.environ["LOOPS_HMAC"].encode())
    cli = subprocess.run([str(TINE), "verify", signed, "--key-env", "LOOPS_HMAC"],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    monkeypatch.setenv("LOOPS_HMAC", "another-key-0123456789")
    cli = subprocess.run([str(TINE), "verify", signed, "--key-env", "LOOPS_HMAC"],
                         capture_output=True, text=True)
    assert cli.returncode != 0


def test_a_step_output_that_is_not_a_dict_is_refused_before_save():
    from opentine import Run

    # opentine itself accepts a list here and only fails later, inside save().
    with pytest.raises(TypeError, match="must be dicts"):
        provenance._add_step(Run(metadata={}), "tool", {"name": "x", "arguments": {}}, [1, 2], 0.0, None)


def test_tail_text_keeps_the_last_lines_and_characters():
    many = "\n".join(f"line {i}" for i in range(100))
    assert tail_text(many).split("\n") == [f"line {i}" for i in range(80, 100)]
    long_line = "x" * 5000 + "END"
    cut = tail_text(long_line, max_chars=100)
    assert cut.startswith("...") and cut.endswith("END") and len(cut) == 103
    lines = "\n".join(["a" * 60, "b" * 60, "c" * 30])
    assert tail_text(lines, max_chars=100) == "b" * 60 + "\n" + "c" * 30  # cut at a line start
    assert tail_text("ok\r\nred \x1b[31mtext\x1b[0m\x00\n\n") == "ok\nred text"


def test_a_digest_the_engine_already_computed_is_kept(tmp_path):
    result = make_result(1)
    first = result.iterations[0].checks[0]
    result.iterations[0].checks[0] = CheckResult(
        name=first.name, kind="command", passed=True, exit_code=0, duration_s=0.1,
        output_tail="tail only", output_digest="abc123", output_file=str(tmp_path / "gone.txt"))
    path = write_tine(result, tmp_path / "run.tine")
    assert check_outputs(path, index=0)["output_digest"] == "sha256:abc123"


def test_verify_refuses_two_keys_and_a_short_key(tmp_path):
    path = write_tine(make_result(1), tmp_path / "run.tine")
    assert verify_tine(path, hmac_key=b"0" * 16, pubkey_path="k.pub") == (
        False, "pass an HMAC key or a public key, not both")
    ok, message = verify_tine(path, hmac_key="short")
    assert not ok and "at least 16" in message and "short" not in message


def test_verify_turns_any_internal_failure_into_a_line(tmp_path, monkeypatch):
    from opentine import Run

    path = write_tine(make_result(1), tmp_path / "run.tine")

    def boom(*args, **kwargs):
        raise RuntimeError("unexpected\nfailure")

    monkeypatch.setattr(Run, "verify_integrity", staticmethod(boom))
    assert verify_tine(path) == (False, f"{path}: cannot verify: unexpected failure")


def test_write_tine_is_whole_or_absent(tmp_path, monkeypatch):
    """A .tine is written by atomic rename: a save that fails (a full disk) leaves
    neither the target nor a temporary file, and an older .tine stays as it was."""
    target = tmp_path / "run.tine"
    target.write_text("older")

    def full(payloads, metadata, succeeded, path, *args):
        Path(path).write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(provenance, "_save", full)
    with pytest.raises(OSError):
        write_tine(make_result(), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.tine"]
    assert target.read_text() == "older"
    monkeypatch.undo()
    write_tine(make_result(), target)
    assert verify_tine(target)[0] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.tine"]


# --------------------------------------------------------------------------- the first shape, the compact forms

SCHEMA1 = Path(__file__).with_name("tinefiles") / "schema1.tine"


def test_a_file_of_the_first_shape_is_still_verified_read_shown_and_diffed(tmp_path):
    """tests/tinefiles/schema1.tine was written by the first shape's writer (a step
    per check, per guard decision and per revise) from ``make_result(3)``."""
    old = tmp_path / "old.tine"
    old.write_bytes(SCHEMA1.read_bytes())
    ok, message = verify_tine(old)  # written before files were vouched
    assert not ok and "integrity ok, not authenticated: not signed, and not vouched" in message, message
    ok, message = verify_tine(old, integrity_only=True)
    assert ok and "(13 steps, verdict MAX_ITER)" in message, message
    result = make_result(3)
    result.iterations[0].revise_output_file = "runs/fix-parser/iter-001/revise.out"
    new = Path(write_tine(result, tmp_path / "new.tine", vouch_key=None))  # unvouched too: alike
    assert len(steps_of(new)) == 5
    was, now = load_tine_summary(old), load_tine_summary(new)
    assert (was["schema"], now["schema"]) == ("pytest-loops.tine/1", "pytest-loops.tine/2")
    for summary in (was, now):  # the first shape kept a passing check's tail too
        for record in summary["iterations"]:
            record["checks"][0]["output_tail"] = ""
    assert {**was, "schema": None} == {**now, "schema": None}
    assert was["lessons"] == ["lesson 1", "lesson 2", "lesson 3"]
    assert was["iterations"][0]["revise_output_file"] == "runs/fix-parser/iter-001/revise.out"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pytest_loops", *args], capture_output=True, text=True,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})

    shown = cli("show", str(old))
    assert shown.returncode == 0, shown.stderr
    assert "verdict: MAX_ITER" in shown.stdout and "lesson 3" in shown.stdout
    assert "E   assert 1 == 2" in shown.stdout  # the last failure's tail
    assert shown.stdout == cli("show", str(new)).stdout
    diffed = cli("diff", str(old), str(new))
    assert diffed.returncode == 0, diffed.stderr
    assert "runs are identical at loop level" in diffed.stdout


def engine_shaped(iterations: int, tmp_path: Path, *, name: str = "fix parser") -> LoopResult:
    """Times, lessons and output files as the engine writes them."""
    result = make_result(iterations)
    result.spec = LoopSpec(name=name, goal=result.spec.goal, revise=result.spec.revise,
                           checks=result.spec.checks, guards=result.spec.guards)
    run_dir = tmp_path / "runs" / "loop"
    result.run_dir = str(run_dir)
    for record in result.iterations:
        i = record.iter
        folder = run_dir / f"iter-{i:03d}"
        folder.mkdir(parents=True)
        (folder / "check-2.out").write_text(f"E   assert {i} == 2\n")
        (folder / "revise.out").write_text("edited\n")
        record.started_at = f"2026-12-03T14:40:{i:02d}.{i * 7:03d}Z"
        record.state_hash = "sha256:" + hashlib.sha256(f"state {i}".encode()).hexdigest()
        record.guards_seen = {"iteration": f"{i}/{iterations}", "elapsed_s": float(i), "budget_left_s": 800.0 - i}
        record.lesson = f"- 2026-12-03T14:40:{i:02d}Z {name} iter {i}: exit 1, state moved: assert {i} == 2."
        check = record.checks[1]
        record.checks[1] = CheckResult(name=check.name, kind=check.kind, passed=False, exit_code=1,
                                       duration_s=1.0, output_tail="", output_file=str(folder / "check-2.out"),
                                       reason="exit 1")
        if record.revise_exit is not None:
            record.revise_output_file = str(folder / "revise.out")
    return result


def test_times_lessons_and_output_files_are_compact_in_the_file_and_exact_when_read(tmp_path):
    result = engine_shaped(3, tmp_path)
    path = Path(write_tine(result, tmp_path / "run.tine"))
    first = steps_of(path)[1].outputs
    assert first["started_at_ms"] == 1796308801007
    assert (first["lesson"], first["lesson_at_s"]) == ("exit 1, state moved: assert 1 == 2.", 1796308801)
    assert first["checks"][1]["output_name"] == "check-2.out" and first["revise"]["output_name"] == "revise.out"
    assert "reason" not in first["checks"][1]  # "exit 1": what the exit code says
    summary = load_tine_summary(path)
    assert [c["reason"] for c in summary["iterations"][0]["checks"]] == ["", "exit 1"]
    assert "iteration" not in first["guards_seen"] and first["guards_saw_iteration"] is True
    assert [r["guards_seen"] for r in summary["iterations"]] == [r.guards_seen for r in result.iterations]
    for record, read in zip(result.iterations, summary["iterations"], strict=True):
        assert read["started_at"] == record.started_at
        assert read["lesson"] == record.lesson
        assert read["checks"][1]["output_file"] == record.checks[1].output_file
        assert read["revise_output_file"] == record.revise_output_file
    assert summary["lessons"] == [r.lesson for r in result.iterations]


def test_what_has_no_compact_form_is_recorded_as_it_is(tmp_path):
    result = engine_shaped(2, tmp_path)
    first, second = result.iterations
    first.started_at = "2026-12-03T14:40:01+00:00"  # another layout
    first.lesson = "- 2026-12-03T14:40:01Z another loop iter 1: exit 1."  # another loop's name
    second.lesson = "- 2026-12-03T14:40:02Z fix parser iter 7: exit 1."  # another iteration
    second.started_at = "2026-02-30T00:00:00.000Z"  # no such day
    second.guards_seen["iteration"] = "2/9"  # not this loop's cap
    elsewhere = tmp_path / "elsewhere.out"
    elsewhere.write_text("E   boom\n")
    first.checks[1] = CheckResult(name=first.checks[1].name, kind="pytest", passed=False, exit_code=1,
                                  duration_s=1.0, output_file=str(elsewhere))
    first.revise_output_file = str(tmp_path / "runs" / "loop" / "iter-002" / "revise.out")  # not its own
    path = Path(write_tine(result, tmp_path / "run.tine"))
    stored = steps_of(path)[1].outputs
    assert stored["started_at"] == first.started_at and "started_at_ms" not in stored
    assert stored["lesson"] == first.lesson and "lesson_at_s" not in stored
    assert stored["checks"][1]["output_file"] == str(elsewhere)
    assert stored["revise"]["output_file"] == first.revise_output_file
    summary = load_tine_summary(path)
    assert [r["started_at"] for r in summary["iterations"]] == [first.started_at, second.started_at]
    assert summary["lessons"] == [first.lesson, second.lesson]
    assert summary["iterations"][0]["checks"][1]["output_file"] == str(elsewhere)
    assert summary["iterations"][0]["revise_output_file"] == first.revise_output_file
    assert steps_of(path)[2].outputs["guards_seen"]["iteration"] == "2/9"
    assert summary["iterations"][1]["guards_seen"] == second.guards_seen


def test_a_long_loop_gives_opentines_redaction_few_new_strings_per_iteration(tmp_path, monkeypatch):
    """opentine's save-time redaction costs per character of each distinct string:
    an iteration adds what truly differs, not its times, its output files' paths,
    its lesson's time stamp or a digest."""
    from opentine import redaction

    def scanned(iterations: int) -> set[str]:
        seen: set[str] = set()
        real = redaction.redact_text
        with monkeypatch.context() as m:
            m.setattr(redaction, "redact_text", lambda value: seen.add(value) or real(value))
            write_tine(engine_shaped(iterations, tmp_path / str(iterations)), tmp_path / f"{iterations}.tine")
        return seen

    few, many = scanned(5), scanned(25)
    # per iteration, what differs in this loop: the failing check's tail, the lesson's
    # words (the step's id, the output digests and the state hash are digests: not scanned)
    assert len(many) - len(few) == 20 * 2
    assert not [s for s in many if "T14:40:" in s or "iter-0" in s or s.startswith("- ")]
    assert not [s for s in many if len(s.removeprefix("sha256:")) == 64 and "_" not in s]


def test_a_compact_lesson_keeps_secrets_out(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")
    monkeypatch.setenv("LOOP_NAME_TOKEN", SECRET)
    result = engine_shaped(2, tmp_path, name=f"loop {SECRET}")
    result.iterations[0].lesson = (f"- 2026-12-03T14:40:01Z loop {SECRET} iter 1: "
                                   f"exit 1, state moved: printed {SECRET}.")
    path = Path(write_tine(result, tmp_path / "run.tine"))
    assert SECRET not in path.read_text()
    assert "lesson_at_s" in steps_of(path)[1].outputs
    lessons = load_tine_summary(path)["lessons"]
    assert lessons[0] == ("- 2026-12-03T14:40:01Z loop [REDACTED:LOOP_NAME_TOKEN] iter 1: exit 1, "
                          "state moved: printed [REDACTED:LOOP_NAME_TOKEN].")

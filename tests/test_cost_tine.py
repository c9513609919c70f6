"""The .tine writer's cost cuts keep what it records: redaction memo, no needless read-back.

opentine's save-time redaction is memoized for one write (each distinct string
scanned once) and the file is read back only when redaction changed something.
These pin that the file still verifies, that a secret in several steps is
redacted in every one, that opentine is left as it was found, and that a file
written without the memo (as before it) reads the same.
"""

from __future__ import annotations

import pytest

from pytest_loops.artifacts import tinememo
from pytest_loops.artifacts.provenance import write_tine
from pytest_loops.artifacts.tineread import load_tine_summary, verify_tine
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict

SECRET = "s3cr3t-memo-value-77"


def make_result(iterations: int, tail: str = "E   assert 1 == 2") -> LoopResult:
    spec = LoopSpec(name="memo", goal="pin the memo", revise="./agent.sh",
                    checks=(Check.command_passes("make lint"),), guards=Guards(max_iter=iterations))
    records = []
    for i in range(1, iterations + 1):
        check = CheckResult(name=spec.checks[0].name, kind="command", passed=False, exit_code=1,
                            duration_s=0.5, output_tail=tail, command="make lint")
        records.append(IterationRecord(
            iter=i, started_at="2026-01-01T00:00:00+00:00", checks=[check], verify_exit=1,
            duration_s=1.0, state_hash=f"h{i}", state_changed=True, lesson=f"lesson {i}",
            revise_exit=0 if i < iterations else None, revise_duration_s=1.0 if i < iterations else None,
            revise_tail=tail if i < iterations else "", elapsed_s=float(i),
            guard="max_iter" if i == iterations else None))
    return LoopResult(spec=spec, verdict=Verdict.MAX_ITER, reason="cap", iterations=records,
                      started_at="2026-01-01T00:00:00+00:00", ended_at="2026-01-01T00:01:00+00:00",
                      elapsed_s=60.0)


def steps_of(path):
    from opentine import Run

    return Run.load(path).steps


def parts_of(outputs):
    """An iteration step's checks and its revise step."""
    return [*outputs.get("checks", []), *([outputs["revise"]] if "revise" in outputs else [])]


def test_a_secret_in_several_steps_is_redacted_in_every_one_and_the_file_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENTINE_COMPRESS", "0")  # plain JSON: the bytes can be searched
    tail = f"first line\nsshkey: {SECRET}\nlast line"  # opentine's pattern, not our premask's
    path = write_tine(make_result(3, tail=tail), tmp_path / "run.tine")
    ok, message = verify_tine(path)
    assert ok, message
    with_tails = [part["tail"] for s in steps_of(path) for part in parts_of(s.outputs or {})
                  if "tail" in part]
    assert len(with_tails) == 5  # three checks, two revise steps: the same string five times
    for stored in with_tails:
        assert SECRET not in stored
        assert stored == "first line\nsshkey [REDACTED]\nlast line"
    raw = (tmp_path / "run.tine").read_bytes()
    assert raw.lstrip().startswith(b"{") and b"last line" in raw
    assert SECRET.encode() not in raw


def test_each_distinct_string_is_scanned_once_per_write(tmp_path, monkeypatch):
    from opentine import redaction

    seen: list[str] = []
    real = redaction.redact_text
    monkeypatch.setattr(redaction, "redact_text", lambda v: seen.append(v) or real(v))
    write_tine(make_result(20), tmp_path / "run.tine")
    assert seen, "opentine's redaction did not run"
    assert len(seen) == len(set(seen))


def test_opentine_is_left_as_it_was_found_even_when_the_save_fails(tmp_path, monkeypatch):
    from opentine import Run, _canon_redact, _graph_serde, redaction

    before = (redaction.redact_text, _graph_serde._redact, _graph_serde.redact_value,
              _canon_redact._field_name, _canon_redact._secret_field)
    write_tine(make_result(2), tmp_path / "ok.tine")

    def boom(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Run, "save", boom)
    with pytest.raises(OSError):
        write_tine(make_result(2), tmp_path / "full.tine")
    after = (redaction.redact_text, _graph_serde._redact, _graph_serde.redact_value,
             _canon_redact._field_name, _canon_redact._secret_field)
    assert after == before
    assert not list(tmp_path.glob(".full.tine.*"))


def test_no_read_back_when_redaction_changed_nothing(tmp_path, monkeypatch):
    from opentine import Run

    loads = []
    real = Run.load.__func__
    monkeypatch.setattr(Run, "load", classmethod(lambda cls, p: loads.append(p) or real(cls, p)))
    write_tine(make_result(4), tmp_path / "plain.tine")
    assert loads == []
    write_tine(make_result(2, tail=f"sshkey: {SECRET}"), tmp_path / "secret.tine")
    assert loads  # redaction changed a string: read back and refitted
    assert SECRET.encode() not in (tmp_path / "secret.tine").read_bytes()


def test_a_file_written_without_the_memo_reads_and_verifies_the_same(tmp_path, monkeypatch):
    result = make_result(3, tail=f"x\ntoken={SECRET}\ny")
    new = write_tine(result, tmp_path / "new.tine")
    with monkeypatch.context() as m:  # the writer as it was: every string scanned, read back
        m.setattr(tinememo.RedactionMemo, "_install", lambda self: self)
        old = write_tine(result, tmp_path / "old.tine")
    for path in (old, new):
        ok, message = verify_tine(path)
        assert ok, message
    old_summary, new_summary = load_tine_summary(old), load_tine_summary(new)
    assert old_summary == new_summary
    assert [(s.inputs, s.outputs) for s in steps_of(old)] == [(s.inputs, s.outputs) for s in steps_of(new)]


def test_writes_from_two_threads_at_once_leave_opentine_as_found(tmp_path):
    import threading

    from opentine import _canon_redact, _graph_serde, redaction

    def functions():
        return (redaction.redact_text, _graph_serde._redact, _graph_serde.redact_value,
                _canon_redact._field_name, _canon_redact._secret_field)

    before = functions()
    errors: list[BaseException] = []

    def write(name: str, tail: str) -> None:
        try:
            for k in range(3):
                write_tine(make_result(4, tail=tail), tmp_path / f"{name}-{k}.tine")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=("a", "plain tail")),
               threading.Thread(target=write, args=("b", f"x\nsshkey: {SECRET}\ny"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert functions() == before
    for path in sorted(tmp_path.glob("*.tine")):
        ok, message = verify_tine(path)
        assert ok, message
    for step in steps_of(tmp_path / "b-2.tine"):
        assert SECRET not in str(step.outputs)


def test_opentine_leaves_a_hex_digest_as_it_is_so_the_writer_need_not_scan_one():
    """The writer does not give opentine's redaction the digests of a write (step
    ids, output digests, state hashes): this pins that it would leave them as they
    are. Should opentine start to change them, this fails and the skip must go."""
    import hashlib

    from opentine.redaction import redact_text

    for i in range(200):
        digest = hashlib.sha256(f"output {i}".encode()).hexdigest()
        assert redact_text(digest) == digest
        assert redact_text("sha256:" + digest) == "sha256:" + digest


def test_only_the_digests_of_the_write_skip_the_scan(tmp_path, monkeypatch):
    from opentine import Run, redaction

    seen: list[str] = []
    real = redaction.redact_text
    monkeypatch.setattr(redaction, "redact_text", lambda v: seen.append(v) or real(v))
    hexy = "ab" * 32  # a tail that merely looks like a digest is scanned
    path = write_tine(make_result(3, tail=hexy), tmp_path / "run.tine")
    steps = Run.load(path).steps
    digests = {part["output_digest"] for s in steps for part in parts_of(s.outputs or {})}
    assert digests and not digests & set(seen)
    assert not {s.id for s in steps} & set(seen)
    assert hexy in seen and "h1" in seen  # a state hash that is no digest is scanned

"""A loop's memory stays flat however many iterations it runs: finished records spill
to an unlinked file, and the run log's summary is written from them piece by piece,
to the same bytes and MAC as a summary made whole in memory."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from pytest_loops.artifacts.runlog import SCHEMA, SUMMARY_DOMAIN, RunLogWriter, load_runlog
from pytest_loops.results import CheckResult, IterationRecord, IterationSpill
from pytest_loops.runtime.trust import canonical_json, json_mac, mac, mac_of_stream

KEY = b"k" * 32


def record(n: int, **extra: object) -> IterationRecord:
    check = CheckResult(name="c1", kind="command", passed=n % 3 == 0, exit_code=n % 3, duration_s=n / 7,
                        output_tail=f"tail {n}\n", output_file=f"/runs/iter-{n:03d}/check-1.out",
                        failing_tests=(f"t.py::test_{n}",), output_digest="sha256:" + "a" * 64)
    return IterationRecord(iter=n, started_at=f"2026-12-04T00:00:{n % 60:02d}.000Z", checks=[check],
                           lesson=f"- lesson {n}" if n % 2 else None, guards_seen={"iteration": f"{n}/9"},
                           **extra)  # type: ignore[arg-type]


def test_spill_keeps_the_last_records_and_reads_back_the_rest() -> None:
    spill = IterationSpill(keep=3)
    records = [record(n) for n in range(1, 21)]
    for r in records:
        spill.append(r)
    assert len(spill) == 20
    assert spill == records and records == list(spill)
    assert [r.iter for r in spill] == list(range(1, 21))
    assert [r.iter for r in reversed(spill)] == list(range(20, 0, -1))
    assert spill[0] == records[0] and spill[-1] is records[-1] and spill[-3] is records[-3]
    assert spill[0] is not records[0]  # read back from the file
    assert spill[0].checks[0].failing_tests == ("t.py::test_1",)  # tuples stay tuples
    assert [r.iter for r in spill[5:8]] == [6, 7, 8]
    assert list(spill.dicts()) == [json.loads(json.dumps(r.to_dict())) for r in records]
    with pytest.raises(IndexError):
        spill[20]
    with pytest.raises(IndexError):
        spill[-21]
    assert spill != records[:-1]
    spill.close()


def test_a_record_changed_while_it_is_recent_is_spilled_as_changed() -> None:
    spill = IterationSpill(keep=1)
    first = record(1)
    spill.append(first)
    first.lesson = "- written by a writer after the iteration ended"
    spill.append(record(2))
    assert spill[0].lesson == "- written by a writer after the iteration ended"


def test_spill_of_a_resumed_run_starts_with_its_records() -> None:
    prior = [record(n) for n in range(1, 12)]
    spill = IterationSpill(prior, keep=2)
    spill.append(record(12))
    assert [r.iter for r in spill] == list(range(1, 13))


def summary_of(records: object) -> dict:
    return {"schema": SCHEMA, "loop": "l", "verdict": "MAX_ITER", "exit_code": 2, "reason": "cap ünïcode",
            "iterations_run": 30, "artifacts": {"log": "x"}, "iterations": records,
            "lessons": [f"- lesson {n}" for n in range(30)], "empty": [], "nested": {"a": [1, {"b": None}]}}


def test_summary_written_piece_by_piece_is_the_whole_summary_to_the_byte(tmp_path: Path) -> None:
    records = [record(n) for n in range(1, 31)]
    spill = IterationSpill(records, keep=4)
    log = tmp_path / "run.json"
    writer = RunLogWriter(log, key=KEY)
    writer.start({"loop": "l"})
    assert writer.finish(summary_of(spill))
    whole = summary_of([r.to_dict() for r in records])
    text = json.dumps(whole, ensure_ascii=False, indent=2, default=str, allow_nan=False)
    expected_mac = json_mac(KEY, SUMMARY_DOMAIN, json.loads(text))
    assert log.read_text(encoding="utf-8") == text[:-2] + f',\n  "mac": "{expected_mac}"\n}}\n'
    loaded = load_runlog(log, key=KEY)
    assert loaded["verified"] is True, loaded["unverified_why"]
    assert [i["iter"] for i in loaded["iterations"]] == list(range(1, 31))


def test_summary_masked_piece_by_piece_still_verifies(tmp_path: Path) -> None:
    records = [record(n, revise_tail=f"token s3cr3tvalue {n}") for n in range(1, 8)]
    log = tmp_path / "run.json"
    writer = RunLogWriter(log, key=KEY, scrub=lambda text: text.replace("s3cr3tvalue", "***"))
    writer.start({"loop": "l"})
    assert writer.finish(summary_of(IterationSpill(records, keep=2)))
    assert "s3cr3tvalue" not in log.read_text(encoding="utf-8")
    loaded = load_runlog(log, key=KEY)
    assert loaded["verified"] is True, loaded["unverified_why"]
    assert loaded["iterations"][0]["revise_tail"] == "token *** 1"


def test_summary_without_a_key_has_no_mac(tmp_path: Path) -> None:
    log = tmp_path / "run.json"
    writer = RunLogWriter(log, key=None)
    writer.start({"loop": "l"})
    assert writer.finish(summary_of([record(1).to_dict()]))
    data = json.loads(log.read_text(encoding="utf-8"))
    assert "mac" not in data and data["iterations"][0]["iter"] == 1


def test_mac_of_a_stream_is_the_mac_of_its_bytes(tmp_path: Path) -> None:
    body = canonical_json({"a": [1, 2, {"b": "ü"}]})
    path = tmp_path / "body"
    path.write_bytes(b"xx" + body)
    with open(path, "rb") as f:
        f.seek(2)
        assert mac_of_stream(KEY, "d", "prev", f, len(body)) == mac(KEY, "d", "prev", body)
    assert mac(KEY, "d", "", body) == hmac.new(KEY, b"".join(
        len(p).to_bytes(8, "big") + p for p in (b"d", b"", body)), hashlib.sha256).hexdigest()


def test_events_with_keys_json_would_rewrite_are_signed_from_their_text(tmp_path: Path) -> None:
    log = tmp_path / "run.json"
    writer = RunLogWriter(log, key=KEY)
    writer.start({"loop": "l"})
    odd = record(1)
    odd.guards_seen = {1: "an int key", "b": ("a", "tuple")}  # type: ignore[dict-item]
    writer.iteration(odd.to_dict())
    writer.iteration(record(2).to_dict())
    writer.close()
    loaded = load_runlog(log, key=KEY)  # the events file, as a killed run leaves it
    assert loaded["verified"] is True, loaded["unverified_why"]
    assert loaded["iterations"][0]["guards_seen"] == {"1": "an int key", "b": ["a", "tuple"]}

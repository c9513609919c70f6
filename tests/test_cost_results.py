"""Records serialise field by field: the same dicts dataclasses.asdict gave, every field."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_loops.results import CheckResult, IterationRecord


def full_check(name: str) -> CheckResult:
    return CheckResult(name=name, kind="pytest", passed=False, exit_code=1, duration_s=1.5,
                       output_tail="E   assert 1 == 2", output_file="/r/out.txt", reason="failed",
                       runs=2, timed_out=True, needs_human=False, output_digest="sha256:ab",
                       command="pytest -x", failing_tests=("t.py::a", "t.py::b"))


def full_record() -> IterationRecord:
    return IterationRecord(
        iter=3, started_at="2026-01-01T00:00:00+00:00", checks=[full_check("a"), full_check("b")],
        verify_exit=1, passed=False, duration_s=2.0, verify_duration_s=1.0, output_tail="tail",
        state_hash="h", state_changed=True, unchanged_streak=1, failure_signature="sig",
        same_failure_streak=2, lesson="lesson", revise_exit=0, revise_duration_s=3.0,
        revise_output_file="/r/rev.txt", revise_tail="rev", suspects_file="/r/s.json",
        protected_changes=["tests/t.py (modified)"], scope_reverted=["x.py"],
        clean_room=[full_check("c")], clean_room_s=4.0, audit_findings=["constant __eq__"],
        caches_cleared=5, guard="max_iter", guards_seen={"budget_left_s": 1.0, "nested": {"k": [1]}},
        elapsed_s=9.0)


def test_check_to_dict_is_what_asdict_gave():
    check = full_check("a")
    assert check.to_dict() == dataclasses.asdict(check)
    assert list(check.to_dict()) == [f.name for f in dataclasses.fields(CheckResult)]


def test_iteration_to_dict_is_what_asdict_gave_and_round_trips():
    record = full_record()
    data = record.to_dict()
    # `branches` only with fan-out: other run logs keep the shape they always had
    only_when_set = ("branches", "context_adapter")  # fan-out, a context adapter
    assert data == {k: v for k, v in dataclasses.asdict(record).items() if k not in only_when_set}
    assert list(data) == [f.name for f in dataclasses.fields(IterationRecord) if f.name not in only_when_set]
    assert IterationRecord.from_dict(data) == record
    record.branches = [{"branch": 0, "chosen": True, "checks": [{"name": "c", "passed": True}]}]
    wide = record.to_dict()
    assert wide == {k: v for k, v in dataclasses.asdict(record).items() if k != "context_adapter"}
    assert IterationRecord.from_dict(wide) == record
    wide["branches"][0]["checks"].clear()
    assert record.branches[0]["checks"], "the dict shares no mutable value with the record"


def test_iteration_to_dict_shares_no_mutable_value_with_the_record():
    record = full_record()
    data = record.to_dict()
    data["guards_seen"]["nested"]["k"].append(2)
    data["protected_changes"].append("more")
    data["checks"].clear()
    assert record.guards_seen == {"budget_left_s": 1.0, "nested": {"k": [1]}}
    assert record.protected_changes == ["tests/t.py (modified)"]
    assert len(record.checks) == 2


@pytest.mark.parametrize("key, value", [("audit_findings", None), ("protected_changes", "x"),
                                        ("scope_reverted", 3), ("guards_seen", [])])
def test_a_record_with_a_field_of_the_wrong_type_is_refused(key, value):
    data = IterationRecord(iter=1, started_at="t").to_dict()
    data[key] = value
    with pytest.raises(TypeError, match=key):
        IterationRecord.from_dict(data)

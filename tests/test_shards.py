"""`--loop-shard=I/N`: a deterministic, balanced split of the loops across CI jobs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_helpers import Project

from pytest_loops.artifacts.shard import (
    Unit,
    assign,
    failure_site,
    read_durations,
    read_record,
    shard_loads,
)
from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import BY_NAME, parse_shard


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def loop_file(n: int, *, ok: bool = True) -> str:
    revise = f'revise with "touch f{n}"' if ok else 'revise with "true"'
    return f"""\
        loop "loop {n}":
          goal: f{n} exists
          done when "test -f f{n}" passes
          {revise}
          after 2 tries: stop
        """


def units(names: list[str]) -> list[Unit]:
    return [Unit(name, (name,)) for name in names]


# -- the split itself ------------------------------------------------------------------------


def test_every_unit_lands_in_exactly_one_shard_and_counts_are_balanced() -> None:
    found = assign(units([f"l{i}.loop::loop {i}" for i in range(23)]), 4)
    assert len(found) == 23 and set(found.values()) == {1, 2, 3, 4}
    counts = sorted(list(found.values()).count(s) for s in (1, 2, 3, 4))
    assert counts == [5, 6, 6, 6], "unknown durations: one unit each, round the lightest shards"


def test_the_split_is_the_same_whatever_order_the_units_come_in() -> None:
    names = [f"t{i}" for i in range(40)]
    assert assign(units(names), 3) == assign(units(list(reversed(names))), 3)


def test_durations_weigh_the_split_longest_first_onto_the_lightest_shard() -> None:
    durations = {"big": 10.0, "a": 4.0, "b": 3.0, "c": 3.0}
    found = assign(units(["big", "a", "b", "c"]), 2, durations)
    assert found["big"] != found["a"] and found["a"] == found["b"] == found["c"], found
    assert sorted(shard_loads(units(["big", "a", "b", "c"]), 2, durations)) == [10.0, 10.0]


def test_a_unit_without_a_duration_weighs_the_mean_of_the_known_ones() -> None:
    loads = shard_loads(units(["a", "b", "new"]), 3, {"a": 2.0, "b": 4.0})
    assert sorted(loads) == [2.0, 3.0, 4.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=2.0), min_size=40, max_size=120), st.integers(2, 8))
def test_balance_within_fifteen_percent_of_the_mean_when_durations_are_known(times: list[float], n: int) -> None:
    names = [f"loop{i}" for i in range(len(times))]
    loads = shard_loads(units(names), n, dict(zip(names, times, strict=True)))
    mean = sum(loads) / n
    assert max(abs(load - mean) for load in loads) <= 0.15 * mean


def test_durations_come_from_the_index_later_lines_winning(tmp_path: Path) -> None:
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join([
        json.dumps({"loop": "a", "elapsed_s": 1.0}), json.dumps({"loop": "a", "elapsed_s": 5.0}),
        "not json", json.dumps([1]), json.dumps({"loop": "b", "elapsed_s": "slow"}),
        json.dumps({"loop": "c", "elapsed_s": -1}), json.dumps({"loop": "d", "elapsed_s": 2}),
    ]) + "\n")
    assert read_durations(index) == {"a": 5.0, "d": 2.0}
    assert read_durations(tmp_path / "missing.jsonl") == {}


@pytest.mark.parametrize("raw", ["0/4", "5/4", "2", "a/b", "2/0", "-1/2", "1/2/3", "", " / ", "1.5/2"])
def test_a_bad_shard_is_one_line_naming_the_spelling(raw: str) -> None:
    with pytest.raises(LoopUsageError) as info:
        BY_NAME["shard"].parse(raw, "--loop-shard")
    assert str(info.value).startswith(f"--loop-shard: {raw!r} is not a valid shard; valid: I/N")
    with pytest.raises(ValueError):
        parse_shard(raw)


def test_a_good_shard_is_normalized() -> None:
    assert BY_NAME["shard"].parse(" 2/4 ", "x") == "2/4" and parse_shard("4/4") == (4, 4)


def _report(nodeid: str, paths: list[str]) -> SimpleNamespace:
    entries = [SimpleNamespace(reprfileloc=SimpleNamespace(path=p, lineno=1)) for p in paths]
    return SimpleNamespace(nodeid=nodeid, longrepr=SimpleNamespace(reprtraceback=SimpleNamespace(reprentries=entries),
                                                                   chain=None))


def test_a_failure_site_is_the_innermost_project_frame_outside_the_tests(tmp_path: Path) -> None:
    from pytest_loops.localization.spectra import is_test_file

    (tmp_path / "pkg").mkdir()
    site = failure_site(_report("tests/test_a.py::test_x", ["tests/test_a.py", "pkg/mod.py", "/usr/lib/x.py"]),
                        tmp_path, is_test_file)
    assert site == "pkg/mod.py"
    alone = failure_site(_report("tests/test_a.py::test_x", ["tests/test_a.py"]), tmp_path, is_test_file)
    assert alone == "tests/test_a.py", "failing in the test itself: its own file"
    assert failure_site(SimpleNamespace(nodeid="t.py::x", longrepr="text"), tmp_path, is_test_file) == "t.py"


def test_a_bad_shard_record_is_named(tmp_path: Path) -> None:
    (tmp_path / "shard.json").write_text('{"schema": "pytest-loops.shard/1", "shard": "3/2", "units": []}')
    with pytest.raises(ValueError, match="'shard' is '3/2'"):
        read_record(tmp_path)
    (tmp_path / "shard.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        read_record(tmp_path)
    assert read_record(tmp_path / "none") is None


# -- in a session ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "ini", "env"])
def test_a_bad_shard_value_is_a_usage_error_naming_where_it_came_from(project: Project, how: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    project.write("l1.loop", loop_file(1))
    args = ["--loop"]
    if how == "option":
        args.append("--loop-shard=5/4")
        where = "--loop-shard"
    elif how == "ini":
        project.write("pytest.ini", "[pytest]\nloop_shard = 5/4\n")
        where = "ini loop_shard"
    else:
        monkeypatch.setenv("PYTEST_LOOPS_SHARD", "5/4")
        where = "environment variable PYTEST_LOOPS_SHARD"
    result = project.run_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {where}: '5/4' is not a valid shard; valid: I/N *"])


def _ran(project: Project, artifacts: str) -> set[str]:
    record = read_record(project.path / artifacts)
    assert record is not None
    return {u["id"] for u in record["units"]}


@pytest.mark.slow
def test_three_shards_run_every_loop_once_and_deselect_the_rest(project: Project) -> None:
    for n in range(1, 8):
        project.write(f"l{n}.loop", loop_file(n))
    seen: list[set[str]] = []
    for index in (1, 2, 3):
        result = project.run("--loop", f"--loop-shard={index}/3", f"--loop-artifacts=art{index}")
        assert result.ret == 0, result.stdout.str()
        mine = _ran(project, f"art{index}")
        outcomes = result.parseoutcomes()
        assert outcomes.get("deselected", 0) == 7 - len(mine) and outcomes["repaired"] == len(mine)
        assert f"shard {index}/3" in result.stdout.str()
        seen.append(mine)
    assert sum(len(s) for s in seen) == 7 and set().union(*seen) == {f"l{n}.loop::loop {n}" for n in range(1, 8)}
    again = project.run("--loop", "--loop-shard=2/3", "--loop-artifacts=again")
    assert again.ret == 0 and _ran(project, "again") == seen[1], "the same split on every run"


@pytest.mark.slow
def test_shards_compose_with_xdist(project: Project) -> None:
    for n in range(1, 7):
        project.write(f"l{n}.loop", loop_file(n))
    plain = project.run("--loop", "--loop-shard=1/2", "--loop-artifacts=plain")
    spread = project.run("-n", "2", "--loop", "--loop-shard=1/2", "--loop-artifacts=spread")
    assert plain.ret == spread.ret == 0, spread.stdout.str()
    assert _ran(project, "plain") == _ran(project, "spread") and len(_ran(project, "plain")) == 3
    logs = list((project.path / "spread" / "runs").glob("*.json"))
    assert len(logs) == 3, "each of the shard's loops ran once, on one worker"


def test_marker_loops_are_split_and_ordinary_tests_run_everywhere(project: Project) -> None:
    for name in ("alpha", "beta", "gamma", "delta"):
        project.write(f"{name}.py", "def f():\n    return 0  # BUG\n")
        project.write(f"test_{name}.py", f"""\
            import pytest

            import {name}


            @pytest.mark.loop(revise='python edit.py {name}.py "return 0  # BUG" "return 1"')
            def test_{name}():
                assert {name}.f() == 1


            def test_{name}_plain():
                assert True
            """)
    ran = []
    for index in (1, 2):
        result = project.run("--loop", f"--loop-shard={index}/2", f"--loop-artifacts=art{index}")
        assert result.ret == 0, result.stdout.str()
        outcomes = result.parseoutcomes()
        assert outcomes["passed"] == 4 and outcomes["deselected"] == 2, "the plain tests run in every shard"
        ran.append(_ran(project, f"art{index}"))
    assert ran[0].isdisjoint(ran[1]) and len(ran[0] | ran[1]) == 4


@pytest.mark.slow
def test_an_empty_shard_exits_five_like_any_run_with_nothing_selected(project: Project) -> None:
    project.write("l1.loop", loop_file(1))
    results = [project.run("--loop", f"--loop-shard={i}/2", f"--loop-artifacts=art{i}") for i in (1, 2)]
    codes = sorted(r.ret for r in results)
    assert codes == [0, pytest.ExitCode.NO_TESTS_COLLECTED], [r.stdout.str() for r in results]
    empty = results[[r.ret for r in results].index(pytest.ExitCode.NO_TESTS_COLLECTED)]
    assert empty.parseoutcomes()["deselected"] == 1
    index = 1 + [r.ret for r in results].index(pytest.ExitCode.NO_TESTS_COLLECTED)
    verdict = project.run("--loop", "--loop-exitcode=verdict", f"--loop-shard={index}/2", "--loop-artifacts=v")
    assert verdict.ret == 0, "under --loop-exitcode=verdict 5 is ESCALATE: an empty shard exits 0 there"


# the session fix-loop: two bugs, each with two failing tests; a fix per bug
TWO_BUGS = {
    "lib_a.py": "def f():\n    return 0  # BUG\n",
    "lib_b.py": "def g():\n    return 0  # BUG\n",
    "test_a1.py": "import lib_a\n\ndef test_a1():\n    assert lib_a.f() == 1\n",
    "test_a2.py": "import lib_a\n\ndef test_a2():\n    assert lib_a.f() + 1 == 2\n",
    "test_b1.py": "import lib_b\n\ndef helper():\n    assert lib_b.g() == 1\n\ndef test_b1():\n    helper()\n",
    "test_b2.py": "import lib_b\n\ndef test_b2():\n    assert lib_b.g() * 2 == 2\n",
    "fix.py": "import sys\nfrom pathlib import Path\nfor name in sys.argv[1:]:\n"
              "    p = Path(name)\n    p.write_text(p.read_text().replace('return 0  # BUG', 'return 1'))\n",
}


def _raising_bugs() -> dict[str, str]:
    """The bugs raise inside the library, so the failure site is the library module."""
    files = dict(TWO_BUGS)
    files["lib_a.py"] = "def f():\n    raise ValueError('bug a')  # BUG\n"
    files["lib_b.py"] = "def g():\n    raise ValueError('bug b')  # BUG\n"
    files["fix.py"] = ("from pathlib import Path\nPath('lib_a.py').write_text('def f():\\n    return 1\\n')\n"
                       "Path('lib_b.py').write_text('def g():\\n    return 1\\n')\n")
    return files


@pytest.mark.slow
def test_the_fix_loop_splits_failing_tests_by_the_code_they_fail_in(project: Project) -> None:
    for name, text in _raising_bugs().items():
        project.write(name, text)
    groups = []
    for index in (1, 2):
        result = project.run("--loop", "--loop-revise=python fix.py", f"--loop-shard={index}/2",
                             f"--loop-artifacts=art{index}", "--loop-confirm=full")
        out = result.stdout.str()
        assert "2 failing test(s) belong to other shards' fix-loops" in out, out
        assert result.ret == 0, "the other shard's failures count in its own exit code, not this one's"
        record = read_record(project.path / f"art{index}")
        assert record is not None
        groups.append({u["id"] for u in record["units"] if u["kind"] == "fix-loop"})
        logs = [json.loads(p.read_text()) for p in (project.path / f"art{index}" / "runs").glob("*.json")]
        assert len(logs) == 1 and logs[0]["verdict"] == "SUCCESS"
        goal = logs[0]["spec"]["goal"]
        lib = "a" if "failing tests in lib_a.py" in groups[-1] else "b"
        assert f"test_{lib}1.py" in goal and f"test_{lib}2.py" in goal, goal
        for name, text in _raising_bugs().items():  # the next job starts from the same checkout
            project.write(name, text)
    assert groups[0] | groups[1] == {"failing tests in lib_a.py", "failing tests in lib_b.py"}
    assert groups[0].isdisjoint(groups[1])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.dictionaries(st.sampled_from(["schema", "shard", "units", "logs", "run"]),
                                 st.one_of(st.none(), st.integers(), st.text(max_size=12),
                                           st.lists(st.one_of(st.text(max_size=5), st.dictionaries(
                                               st.sampled_from(["id", "kind"]), st.text(max_size=5))),
                                               max_size=3)), max_size=5)))
def test_the_readers_of_a_jobs_files_fail_in_one_way(tmp_path_factory: pytest.TempPathFactory, raw) -> None:
    """shard.json: a record or ValueError; index.jsonl: durations or nothing; never a crash."""
    where = tmp_path_factory.mktemp("fuzz")
    if isinstance(raw, dict):
        raw = json.dumps({"schema": "pytest-loops.shard/1", **raw})
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    (where / "shard.json").write_bytes(data)
    (where / "index.jsonl").write_bytes(data)
    try:
        record = read_record(where)
    except ValueError as exc:
        assert str(exc).startswith(str(where / "shard.json"))
    else:
        assert record is not None and 1 <= record["index"] <= record["total"]
    assert all(isinstance(v, float) for v in read_durations(where / "index.jsonl").values())

"""Cost and tokens: the LOOP_USAGE_FILE contract, the max_cost / max_tokens guards, and
the figures in the run log, per iteration and per loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.core.usage import Usage, from_mapping, read_usage, total, write_usage
from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import BY_NAME
from pytest_loops.sources import parse_loop_text
from pytest_loops.spec import Guards

# a revise step reporting what it spent, as any script can: the file the harness names
REPORT = ("python -c \"import json, os; open(os.environ['LOOP_USAGE_FILE'], 'w')"
          ".write(json.dumps({'cost_usd': 0.75, 'input_tokens': 1000, 'output_tokens': 200, "
          "'session_id': 'sess-1'}))\"")


def run(cli, work: Path, *args: str):
    log = work.parent / "run.json"
    proc = cli("run", "--cwd", str(work), "--log", str(log), *args)
    return proc, load_runlog(log) if log.exists() else None


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


# -- the file's shape -------------------------------------------------------------------------


def test_a_usage_file_round_trips(tmp_path):
    path = tmp_path / "u.json"
    write_usage(path, Usage(cost_usd=0.5, input_tokens=10, output_tokens=2, session_id="s"))
    assert read_usage(path) == (Usage(0.5, 10, 2, "s"), None)
    assert json.loads(path.read_text()) == {"cost_usd": 0.5, "input_tokens": 10, "output_tokens": 2,
                                            "session_id": "s"}


def test_no_file_and_an_empty_file_report_nothing(tmp_path):
    assert read_usage(tmp_path / "none.json") == (None, None)
    (tmp_path / "empty.json").write_text("  \n")
    assert read_usage(tmp_path / "empty.json") == (None, None)


@pytest.mark.parametrize("text, says", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"cost_usd": -1}', "cost_usd is -1; expected a number >= 0"),
    ('{"cost_usd": "cheap"}', "expected a number >= 0"),
    ('{"input_tokens": 1.5}', "expected a whole number"),
    ('{"output_tokens": true}', "expected a number >= 0"),
    ('{"session_id": 7}', "session_id is not a one-line string"),
])
def test_a_bad_usage_file_is_one_warning_line(tmp_path, text, says):
    path = tmp_path / "u.json"
    path.write_text(text)
    usage, warning = read_usage(path)
    assert usage is None and warning is not None
    assert says in warning and str(path) in warning and "\n" not in warning


def test_an_oversized_usage_file_is_a_warning(tmp_path):
    path = tmp_path / "u.json"
    path.write_text(" " * (70 << 10) + "{}")
    assert "over" in (read_usage(path)[1] or "")


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner,
                                                                                max_size=5), max_leaves=12))
def test_any_json_is_a_usage_or_a_value_error(data):
    try:
        usage = from_mapping(data)
    except ValueError:
        return
    assert usage.cost_usd is None or usage.cost_usd >= 0
    assert usage.tokens is None or usage.tokens >= 0


def test_usages_sum_and_the_later_session_wins():
    spent = total([Usage(0.25, 10, 1, "a"), None, Usage(None, 5, None, "b"), Usage(0.5)])
    assert spent == Usage(0.75, 15, 1, "b") and spent.tokens == 16
    assert total([]).tokens is None and total([]).empty


# -- the settings rows ---------------------------------------------------------------------------


def test_the_guards_validate_and_stay_out_of_old_digests():
    assert BY_NAME["max_cost"].parse("2.5", "--max-cost") == 2.5
    with pytest.raises(LoopUsageError, match="valid: an amount in US dollars >= 0"):
        BY_NAME["max_cost"].parse("-1", "--max-cost")
    with pytest.raises(LoopUsageError, match="'1.5' is not a valid max_tokens"):
        BY_NAME["max_tokens"].parse("1.5", "--max-tokens")
    assert "max_cost" not in Guards().to_dict()  # a loop without the caps keeps its digest
    assert Guards(max_cost=2, max_tokens=10).to_dict()["max_cost"] == 2.0


@pytest.mark.parametrize("line, key, value", [
    ("max cost: $5", "max_cost", 5.0), ("max cost: 0.25 USD", "max_cost", 0.25),
    ("max tokens: 200k", "max_tokens", 200000), ("max tokens: 1500", "max_tokens", 1500)])
def test_loop_file_lines_set_the_caps(line, key, value):
    spec = parse_loop_text(f'loop "x":\n  goal: g\n  done when "true" passes\n  {line}\n').loops[0]
    assert getattr(spec.guards, key) == value


@pytest.mark.parametrize("line, fix", [("max cost: five dollars", "max cost: $5"),
                                       ("max tokens: lots", "max tokens: 200000")])
def test_a_bad_loop_file_cap_names_the_line_and_the_fix(line, fix):
    with pytest.raises(LoopUsageError) as info:
        parse_loop_text(f'loop "x":\n  goal: g\n  done when "true" passes\n  {line}\n', path="x.loop")
    assert fix in str(info.value) and "x.loop:4" in str(info.value)


# -- end to end: the runner ----------------------------------------------------------------------


def test_cost_lands_per_iteration_and_per_loop_in_the_run_log(cli, work):
    proc, log = run(cli, work, "--verify", "false", "--revise", REPORT, "--max-iter", "3")
    assert proc.returncode == 2, proc.stderr
    its = log["iterations"]
    assert [it["cost_usd"] for it in its] == [0.75, 0.75, None]  # the last iteration has no revise step
    assert its[0]["input_tokens"] == 1000 and its[0]["output_tokens"] == 200 and its[0]["session_id"] == "sess-1"
    assert its[1]["guards_seen"]["cost_usd"] == 1.5 and its[1]["guards_seen"]["tokens"] == 2400
    assert log["usage"] == {"cost_usd": 1.5, "input_tokens": 2000, "output_tokens": 400, "tokens": 2400}
    assert "cost $1.50" in proc.stdout


def test_max_cost_ends_the_loop_timeout_with_its_own_reason(cli, work):
    proc, log = run(cli, work, "--verify", "false", "--revise", REPORT, "--max-iter", "6", "--max-cost", "1")
    assert proc.returncode == 3, proc.stderr
    assert log["verdict"] == "TIMEOUT" and log["iterations_run"] == 2
    assert log["iterations"][-1]["guard"] == "max_cost"
    assert log["reason"] == ("max_cost of $1.00 reached: the revise steps have spent $1.50 after iteration 2")


def test_max_tokens_ends_the_loop_timeout(cli, work):
    proc, log = run(cli, work, "--verify", "false", "--revise", REPORT, "--max-tokens", "1200")
    assert proc.returncode == 3, proc.stderr
    assert log["iterations_run"] == 1 and log["iterations"][0]["guard"] == "max_tokens"
    assert "max_tokens of 1,200 reached" in log["reason"]


def test_a_bad_usage_file_is_a_warning_and_the_loop_goes_on(cli, work):
    bad = "echo '{oops' > \"$LOOP_USAGE_FILE\""
    proc, log = run(cli, work, "--verify", "false", "--revise", bad, "--max-iter", "2", "--max-cost", "1")
    assert proc.returncode == 2, proc.stderr  # MAX_ITER: nothing reported, nothing capped
    assert "not JSON" in log["iterations"][0]["usage_warning"]
    warnings = [line for line in proc.stderr.splitlines() if "LOOP_USAGE_FILE" in line]
    assert len(warnings) == 1 and "Traceback" not in proc.stderr


def test_a_bad_max_cost_flag_is_64(cli, work):
    proc, _ = run(cli, work, "--verify", "true", "--max-cost", "lots")
    assert proc.returncode == 64
    assert "--max-cost" in proc.stderr and "'lots' is not a valid max_cost" in proc.stderr


# -- end to end: pytest ------------------------------------------------------------------------


SPEND = ("import json, os\n"
         "spent = {'cost_usd': 0.4, 'input_tokens': 100, 'output_tokens': 10}\n"
         "json.dump(spent, open(os.environ['LOOP_USAGE_FILE'], 'w'))\n")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "marker"])
def test_pytest_loops_stop_on_max_cost_with_the_budget_verdict(pytester, how):
    pytester.makepyfile(spend=SPEND)
    marker = "@pytest.mark.loop(revise='python spend.py', max_iter=6" + (", max_cost=0.75)" if how == "marker" else ")")
    pytester.makepyfile(test_calc=f"import pytest\n\n\n{marker}\ndef test_add():\n    assert 1 == 2\n")
    args = ["--loop", "--loop-exitcode=verdict", "-p", "no:cacheprovider"]
    if how == "option":
        args.append("--loop-max-cost=0.75")
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str()
    assert result.ret == 3, out
    assert "max_cost of $0.7500 reached: the revise steps have spent $0.8000 after iteration 2" in out
    logs = sorted((pytester.path / ".pytest-loops" / "runs").glob("*.json"))
    log = load_runlog(logs[-1])
    assert log["usage"] == {"cost_usd": 0.8, "input_tokens": 200, "output_tokens": 20, "tokens": 220}


def test_a_loop_file_runs_a_preset_with_a_cost_cap(cli, tmp_path):
    from agent_fakes import install, path_with

    work = tmp_path / "work"
    work.mkdir()
    (work / "fix.loop").write_text('loop "fix":\n  goal: make fixed exist\n  done when "test -f fixed" passes\n'
                                   "  revise with claude\n  max cost: $0.75\n")
    install(tmp_path / "bin", "claude")
    proc = cli("run", "fix", cwd=work,
               env={"PATH": path_with(tmp_path / "bin"), "FAKE_AGENT_LOG": str(tmp_path / "calls.jsonl"),
                    "FAKE_FIX_AT": "9"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "max_cost of $0.7500 reached" in proc.stdout

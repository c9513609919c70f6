"""Faults in what the harness reads and where it writes: each is one usage-error line.

YAML bombs (aliases that expand a billionfold, nesting 100,000 deep, files of
100 MB), run logs and `.tine` files that are too big or nested too deeply, and
output paths the run cannot write (under a file, in /proc) are bad input: exit
64 from `pytest-loops`, pytest's usage error under pytest, never a traceback, an
internal error (70), minutes of parsing or a verdict code (2-5).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_loops import LoopUsageError
from pytest_loops.limits import (
    MAX_ALIAS_NODES,
    MAX_RUN_BYTES,
    MAX_YAML_BYTES,
    load_yaml,
    safe_loader,
)
from pytest_loops.runtime.outpaths import check_output_path
from pytest_loops.sources import load_any
from pytest_loops.sources.config import read_runner_config

pytestmark = pytest.mark.faults

PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not (PROC / "self").is_dir() or sys.platform != "linux", reason="needs /proc")


def bomb(levels: int = 9, under: str = "guards:\n  max_iter: ") -> str:
    """Billion laughs: each anchor is nine aliases of the one before."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels):
        lines.append(f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n" + under + "[" + ",".join([f"*a{levels - 1}"] * 9) + "]\n"


def deep_yaml(depth: int = 100_000) -> str:
    return "guards: " + "[" * depth + "]" * depth + "\n"


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space (the readers refuse it by size)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def one_error_line(err: str, prog: str = "pytest-loops: error: ") -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prog), err
    assert len(lines[0]) < 400, lines[0][:1000]
    return lines[0]


# --------------------------------------------------------------------------- YAML bombs


BAD_YAML = {
    "alias bomb": (bomb, ":5:", "aliases expand to more than"),
    "deep nesting": (deep_yaml, ":1:", "nested deeper than"),
    "deep block nesting": (lambda: "".join("  " * i + "k:\n" for i in range(3000)), ":101:", "nested deeper than"),
}


@pytest.mark.parametrize("kind", list(BAD_YAML))
def test_a_yaml_bomb_in_run_config_is_one_line_and_64(cli, tmp_path, kind):
    make, line, message = BAD_YAML[kind]
    (tmp_path / "cfg.yaml").write_text(make(), encoding="utf-8")
    result = cli("run", "--verify", "true", "--config", "cfg.yaml", "-q")
    assert result.returncode == 64, result.stderr[:500]
    error = one_error_line(result.stderr)
    assert f"cfg.yaml{line}" in error and message in error


def test_a_yaml_file_over_the_size_cap_is_refused_before_it_is_parsed(cli, tmp_path):
    sparse(tmp_path / "cfg.yaml", MAX_YAML_BYTES + 1)
    sparse(tmp_path / "big.loop.yaml", MAX_YAML_BYTES + 1)
    result = cli("run", "--verify", "true", "--config", "cfg.yaml", "-q")
    assert result.returncode == 64
    assert "cfg.yaml" in one_error_line(result.stderr) and "10.0 MB" in result.stderr
    result = cli("show", "big.loop.yaml")
    assert result.returncode == 64
    assert "big.loop.yaml" in one_error_line(result.stderr) and "10.0 MB" in result.stderr


@pytest.mark.parametrize("make", [bomb, deep_yaml], ids=["alias bomb", "deep nesting"])
def test_a_yaml_bomb_in_a_loop_file_is_one_line(tmp_path, make):
    path = tmp_path / "x.loop.yaml"
    path.write_text(make(), encoding="utf-8")
    with pytest.raises(LoopUsageError) as info:
        load_any(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_the_alias_bound_counts_expansion_not_aliases():
    """Aliases of small anchors are fine; nine levels of nine are not, though only 81 aliases."""
    text = "base: &b {x: 1, y: [1, 2]}\n" + "".join(f"k{i}: *b\n" for i in range(200))
    assert load_yaml(text, "ok.yaml")["k199"] == {"x": 1, "y": [1, 2]}
    with pytest.raises(LoopUsageError, match="aliases expand"):
        load_yaml(bomb(levels=5), "b.yaml")  # 9**5 nodes, 45 aliases
    assert 9 ** 5 > MAX_ALIAS_NODES


def test_importing_the_plugin_does_not_import_yaml():
    import subprocess
    import sys

    code = "import sys, pytest_loops.pytest_plugin.plugin; print('yaml' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_normal_yaml_keeps_merge_keys_and_libyaml():
    text = "defaults: &d {max_iter: 3}\nguards:\n  <<: *d\n  no_progress_k: 1\n"
    assert load_yaml(text, "c.yaml")["guards"] == {"max_iter": 3, "no_progress_k": 1}
    import yaml

    assert safe_loader() is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_a_huge_value_is_quoted_short_in_the_error(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("guards:\n  no_progress_signal: [" + ", ".join(["xxxxxxxx"] * 20000) + "]\n", encoding="utf-8")
    with pytest.raises(LoopUsageError) as info:
        read_runner_config(path)
    assert len(str(info.value)) < 300 and "no_progress_signal" in str(info.value)


def write_project(pytester: pytest.Pytester, config_text: str) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_a="def test_a():\n    assert True\n")
    (pytester.path / "cfg.yaml").write_text(config_text, encoding="utf-8")


@pytest.mark.parametrize("exitcode", ["pytest", "verdict"])
def test_a_yaml_bomb_in_loop_config_is_a_usage_error_under_pytest(pytester, exitcode):
    write_project(pytester, bomb())
    result = pytester.runpytest_subprocess("--loop", "--loop-config", "cfg.yaml", f"--loop-exitcode={exitcode}")
    assert result.ret == (4 if exitcode == "pytest" else 64), result.stderr.str()[:500]
    everything = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in everything and "Traceback" not in everything
    errors = [line for line in result.stderr.lines if "ERROR: " in line]
    assert len(errors) == 1 and "cfg.yaml:5:" in errors[0] and "aliases expand" in errors[0]


def test_deep_yaml_in_loop_config_is_a_usage_error_not_internalerror(pytester):
    write_project(pytester, deep_yaml())
    result = pytester.runpytest_subprocess("--loop", "--loop-config", "cfg.yaml", "--loop-exitcode=verdict")
    assert result.ret == 64
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert any("cfg.yaml:1:" in line for line in result.stderr.lines if "ERROR: " in line)


# --------------------------------------------------------------------------- run logs and .tine


def deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


RUN_FILES = {
    "deep summary": lambda p: p.write_text(
        '{"schema": "pytest-loops.runlog/1", "iterations": [], "spec": ' + deep_json() + "}"),
    "deep event": lambda p: p.write_text('{"event": "start", "x": ' + deep_json() + "}\n"),
    "moderately deep summary": lambda p: p.write_text(
        '{"schema": "pytest-loops.runlog/1", "iterations": [], "lessons": ' + deep_json(200) + "}"),
    "over the size cap": lambda p: sparse(p, MAX_RUN_BYTES + 1),
}


@pytest.mark.parametrize("kind", list(RUN_FILES))
def test_show_and_resume_refuse_a_bad_run_log_in_one_line(cli, tmp_path, kind):
    RUN_FILES[kind](tmp_path / "run.json")
    commands = [["show", "run.json"]] + ([["run", "--resume", "run.json", "-q"]] if kind == "deep summary" else [])
    for argv in commands:
        result = cli(*argv)
        assert result.returncode == 64, (argv, result.stderr[:500])
        assert "run.json" in one_error_line(result.stderr)


def test_report_skips_a_bad_run_log(cli, tmp_path):
    (tmp_path / "runs").mkdir()
    RUN_FILES["deep summary"](tmp_path / "runs" / "a.json")
    result = cli("report", "runs", "-o", "r.html")
    assert result.returncode == 0, result.stderr
    assert "0 loop run(s)" in result.stdout


def test_a_tine_over_the_size_cap_is_refused(cli, tmp_path):
    sparse(tmp_path / "x.tine", MAX_RUN_BYTES + 1)
    result = cli("show", "x.tine")
    assert result.returncode == 64 and "x.tine" in one_error_line(result.stderr)
    result = cli("verify", "x.tine")
    assert result.returncode == 1 and "larger than" in result.stderr


# --------------------------------------------------------------------------- output paths


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a directory\n")
    return path


def unwritable(a_file: Path) -> dict[str, str]:
    return {"under a file": str(a_file / "sub" / "out"), **(
        {"in /proc": "/proc/pytest-loops-out"} if (PROC / "self").is_dir() else {})}


@pytest.mark.parametrize(("flag", "where"), [
    ("--log", "under a file"), ("--artifacts", "under a file"), ("--lessons-page", "under a file"),
    ("--memory", "under a file"),
    ("--tine", "under a file"), ("--log", "in /proc"), ("--tine", "in /proc")])
def test_an_unwritable_output_path_stops_the_run_before_any_iteration(cli, tmp_path, a_file, flag, where):
    if where not in unwritable(a_file):
        pytest.skip("needs /proc")
    path = unwritable(a_file)[where]
    result = cli("run", "--verify", "touch ran", "--max-iter", "2", flag, path)
    assert result.returncode == 64, result.stderr
    error = one_error_line(result.stderr)
    assert error.startswith(f"pytest-loops: error: {flag}: cannot write {path!r}: ")
    assert ("Not a directory" if where == "under a file" else "No such file") in error
    assert not (tmp_path / "ran").exists() and result.stdout == ""


@needs_proc
def test_an_unwritable_existing_file_and_default_artifacts_dir_are_refused(cli, tmp_path):
    result = cli("run", "--verify", "true", "--log", "/proc/self/status")
    assert result.returncode == 64 and "--log: cannot write '/proc/self/status'" in one_error_line(result.stderr)
    result = cli("run", "--verify", "true", "--cwd", "/proc")  # the default .pytest-loops under --cwd
    assert result.returncode == 64 and "--artifacts (default .pytest-loops" in one_error_line(result.stderr)
    (tmp_path / "runs").mkdir()
    result = cli("report", "runs", "-o", "/proc/report.html")
    assert result.returncode == 64 and "--output" in one_error_line(result.stderr)


def test_checking_an_output_path_leaves_nothing_behind(tmp_path):
    before = sorted(tmp_path.iterdir())
    check_output_path("new/dir/run.json", "--log", base=tmp_path)
    check_output_path("artifacts", "--artifacts", base=tmp_path, directory=True)
    existing = tmp_path / "log.json"
    existing.write_text("kept")
    check_output_path(existing, "--log")
    assert existing.read_text() == "kept"
    assert sorted(tmp_path.iterdir()) == sorted([*before, existing])
    with pytest.raises(LoopUsageError, match="it is a directory"):
        check_output_path(tmp_path, "--log")
    with pytest.raises(LoopUsageError, match="not a directory"):
        check_output_path(existing, "--artifacts", directory=True)


@pytest.mark.parametrize(("args", "ini", "where"), [
    (["--loop-artifacts", "{file}/art"], "", "--loop-artifacts"),
    ([], "loop_lessons_page = {file}/lessons.md", "ini loop_lessons_page"),
    ([], "loop_memory = {file}/lessons.md", "ini loop_memory"),
    (["--loop-memory", "{file}/lessons.md"], "", "--loop-memory"),
    (["--loop-lessons-page", "{file}/lessons.md"], "", "--loop-lessons-page"),
    (["--loop-report", "{file}/r.html"], "", "--loop-report"),
])
def test_an_unwritable_output_path_is_a_usage_error_under_pytest(pytester, args, ini, where):
    target = pytester.path / "afile"
    target.write_text("x")
    pytester.makeini("[pytest]\n" + ini.format(file=target) + "\n")
    pytester.makepyfile(test_a="def test_a():\n    assert False\n")
    result = pytester.runpytest_subprocess("--loop", "--loop-revise", "touch revised", "--loop-exitcode=verdict",
                                           *(a.format(file=target) for a in args))
    assert result.ret == 64, result.stdout.str()[-500:] + result.stderr.str()
    errors = [line for line in result.stderr.lines if "ERROR: " in line]
    assert len(errors) == 1 and f"{where}: cannot write" in errors[0] and "Not a directory" in errors[0], errors
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / "revised").exists()


def test_the_json_of_a_good_log_still_loads():
    """The depth bound leaves room for what the engine writes."""
    from pytest_loops.limits import json_too_deep

    assert not json_too_deep(json.loads(deep_json(60)))
    assert json_too_deep(json.loads(deep_json(70)))


@pytest.mark.parametrize("where, value", [("checks", True), ("checks", {"a": 1}), ("iterations", "x")])
def test_a_run_log_with_a_list_of_the_wrong_type_is_one_line_for_every_reader(cli, tmp_path, where, value):
    """show and diff of a run log whose iterations (or an iteration's checks) are not
    a list: exit 64 and one line naming the key, never an internal error; a report of
    its directory leaves it out."""
    done = cli("run", "--verify", "false", "--revise", "true", "--max-iter", "1", "--log", "run.json", "-q",
               "--no-tine")
    assert done.returncode == 2, done.stderr
    data = json.loads((tmp_path / "run.json").read_text())
    data.pop("mac", None)
    if where == "checks":
        data["iterations"][0]["checks"] = value
    else:
        data["iterations"] = value
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "bad.json").write_text(json.dumps(data))
    for argv in (["show", "runs/bad.json"], ["diff", "run.json", "runs/bad.json"]):
        result = cli(*argv)
        assert result.returncode == 64, (argv, result.stderr)
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
        assert "not a list" in result.stderr, (argv, result.stderr)
    report = cli("report", "runs", "-o", "report.html")  # a directory's report leaves out what it cannot read
    assert report.returncode == 0 and "0 loop run(s)" in report.stdout, report.stderr
    assert "internal error" not in report.stderr and "Traceback" not in report.stderr

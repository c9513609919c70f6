"""A run pays only for what it uses: without --loop (and under --loop with nothing to
loop) the engine, the loop readers, yaml, filelock and opentine are never imported;
the per-report hooks are registered only once a loop exists and the marker hook only
when a test carries a loop marker; report masking still sees a secret set in the
middle of the session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_helpers import Project, clean_env

from pytest_loops.pytest_plugin.session import LOOP_FILE_ENDINGS
from pytest_loops.pytest_plugin.state import ARTIFACTS_DIRNAME

HEAVY = ("pytest_loops.core.engine", "pytest_loops.sources.loopfile", "pytest_loops.sources.yamlspec",
         "pytest_loops.sources.files", "pytest_loops.core.pluginmanager", "pytest_loops.pytest_plugin.fixloop",
         "pytest_loops.artifacts.finishers", "pytest_loops.pytest_plugin.items", "pytest_loops.results",
         "pytest_loops.spec", "yaml", "filelock", "opentine")
# all an unused plugin may import: its options and the settings table they come from
UNUSED = {"pytest_loops", "pytest_loops.errors", "pytest_loops.limits", "pytest_loops.defaults", "pytest_loops.verdict",
          "pytest_loops.settings", "pytest_loops.core", "pytest_loops.core.hookspecs", "pytest_loops.pytest_plugin",
          "pytest_loops.pytest_plugin.plugin", "pytest_loops.pytest_plugin.options",
          # the judge's witness: an entry point of its own, loaded in every run (it must be
          # there before any conftest, and alike in judged and plain runs)
          "pytest_loops.runtime", "pytest_loops.runtime.judge"}

# runs pytest in this fresh process, then prints the modules and plugins it ended with
PROBE = """\
import json, sys
import pytest

code = pytest.main(sys.argv[1:])
print("PROBE " + json.dumps({"code": int(code), "modules": sorted(sys.modules)}))
"""

MARKER_PROBE = """\
def pytest_collection_finish(session):
    pm = session.config.pluginmanager
    print("MARKER-HOOK", pm.get_plugin("loop-marker-loops") is not None)
"""

# the plugin's implementations of the hooks pytest calls once per test report, by plugin
# name, as registered when the tests run (on an xdist controller: at the session's end)
REPORT_HOOKS_PROBE = """\
import pytest

PER_REPORT = ("pytest_runtest_logreport", "pytest_report_teststatus", "pytest_runtest_makereport")


def ours(config):
    pm = config.pluginmanager
    found = set()
    for name in PER_REPORT:
        for impl in getattr(pm.hook, name).get_hookimpls():
            if (getattr(impl.function, "__module__", "") or "").startswith("pytest_loops"):
                found.add(f"{name}:{impl.plugin_name}")
    return sorted(found)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    print("REPORT-HOOKS", ",".join(ours(session.config)))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    terminalreporter.write_line("REPORT-HOOKS-END " + ",".join(ours(config)))
"""

NOTHING_LINE = "loop: nothing to loop"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(pytester, monkeypatch)


def probe(project: Project, *args: str, autoload: bool = True) -> dict:
    project.write("probe.py", PROBE)
    env = clean_env({} if autoload else {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    proc = subprocess.run([sys.executable, "probe.py", "-q", "-p", "no:cacheprovider", *args],
                          cwd=project.path, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1].removeprefix("PROBE "))


def loaded(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]


def test_the_package_names_load_on_first_use() -> None:
    import pytest_loops

    for name in pytest_loops.__all__:
        assert getattr(pytest_loops, name) is not None, name
    assert pytest_loops.LoopSpec.__module__ == "pytest_loops.spec"


def test_without_loop_the_plugin_imports_nothing_heavy(project: Project) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    project.write("release.loop", 'loop "x":\n  goal: g\n  done when "true" passes\n')
    out = probe(project, "-p", "pytest_loops.pytest_plugin.plugin", autoload=False)
    assert out["code"] == 0
    assert "pytest_loops.pytest_plugin.plugin" in out["modules"]
    assert loaded(out["modules"]) == []
    assert "pytest_loops.results" not in out["modules"] and "pytest_loops.core.checks" not in out["modules"]


def test_installed_but_unused_the_plugin_imports_its_options_alone(project: Project) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    project.write("release.loop", 'loop "x":\n  goal: g\n  done when "true" passes\n')
    project.write("test_marked.py", "import pytest\n\n@pytest.mark.loop(max_iter=2)\ndef test_m():\n    pass\n")
    out = probe(project)
    assert out["code"] == 0
    ours = {m for m in out["modules"] if m == "pytest_loops" or m.startswith("pytest_loops.")}
    assert "pytest_loops.pytest_plugin.plugin" in ours
    assert ours <= UNUSED, sorted(ours - UNUSED)
    assert loaded(out["modules"]) == []


def test_loop_with_nothing_to_loop_imports_nothing_heavy(project: Project) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    out = probe(project, "--loop")
    assert out["code"] == 0
    assert "pytest_loops.pytest_plugin.session" in out["modules"]
    assert loaded(out["modules"]) == []


def test_loop_with_nothing_to_loop_under_xdist_imports_nothing_heavy(project: Project) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    out = probe(project, "--loop", "-n", "2")
    assert out["code"] == 0
    assert "pytest_loops.pytest_plugin.session" in out["modules"]
    assert loaded(out["modules"]) == []


def report_hooks(result: pytest.RunResult) -> tuple[list[str], list[str]]:
    """The plugin's per-report hooks when the tests start, and at the session's end."""
    lines = result.stdout.lines
    start = [line.split(" ", 1)[1] if " " in line else "" for line in lines if line.startswith("REPORT-HOOKS ")]
    end = [line.split(" ", 1)[1] if " " in line else "" for line in lines if line.startswith("REPORT-HOOKS-END")]
    return (start[-1].split(",") if start and start[-1] else []), (end[-1].split(",") if end and end[-1] else [])


def test_nothing_to_loop_registers_no_per_report_hook_but_masking_and_says_so(project: Project) -> None:
    project.write("conftest.py", REPORT_HOOKS_PROBE)
    project.write("test_green.py", "def test_green():\n    pass\n\n\ndef test_red():\n    assert 0\n")
    result = project.run("--loop", "-s")
    assert result.ret == 1
    start, end = report_hooks(result)
    assert start == end == ["pytest_runtest_logreport:loop-report-masking"]
    assert result.stdout.str().count(NOTHING_LINE) == 1


@pytest.mark.parametrize("what", ["marker", "loop file", "revise"])
def test_a_loop_registers_the_per_report_hooks_and_is_not_called_nothing(project: Project, what: str) -> None:
    project.write("conftest.py", REPORT_HOOKS_PROBE)
    project.write("test_green.py", "def test_green():\n    pass\n")
    args = ["--loop", "-s"]
    if what == "marker":
        project.write("test_marked.py", "import pytest\n\n@pytest.mark.loop(max_iter=2)\ndef test_m():\n    pass\n")
    elif what == "loop file":
        project.write("release.loop", 'loop "x":\n  goal: g\n  done when "true" passes\n')
    else:
        args.append("--loop-revise=true")
    result = project.run(*args)
    assert result.ret == 0, result.stdout.str()
    start, _ = report_hooks(result)
    assert {"pytest_runtest_logreport:loop-reports", "pytest_report_teststatus:loop-reports",
            "pytest_runtest_logreport:loop-report-masking"} <= set(start)
    assert ("pytest_runtest_makereport:loop-marker-loops" in start) == (what == "marker")
    assert ("pytest_runtest_makereport:loop-report-timer" in start) == (what == "revise")
    assert NOTHING_LINE not in result.stdout.str()


@pytest.mark.slow
def test_under_xdist_the_controller_hears_whether_a_worker_had_anything_to_loop(project: Project) -> None:
    project.write("conftest.py", REPORT_HOOKS_PROBE)
    for i in range(3):
        project.write(f"test_green{i}.py", "def test_green():\n    pass\n")
    result = project.run("--loop", "-n", "2")
    assert result.ret == 0
    assert result.stdout.str().count(NOTHING_LINE) == 1
    _, end = report_hooks(result)  # the controller: its workers' loops report to it
    assert "pytest_runtest_logreport:loop-reports" in end
    project.write("test_marked.py", "import pytest\n\n@pytest.mark.loop(max_iter=2)\ndef test_m():\n    pass\n")
    result = project.run("--loop", "-n", "2")
    assert result.ret == 0
    assert NOTHING_LINE not in result.stdout.str()


def test_a_marker_on_a_class_or_module_counts_as_a_loop(project: Project) -> None:
    project.write("conftest.py", REPORT_HOOKS_PROBE)
    project.write("test_cls.py", "import pytest\n\n\n@pytest.mark.loop(max_iter=2)\nclass TestC:\n"
                                 "    def test_m(self):\n        pass\n")
    result = project.run("--loop", "-s")
    assert "pytest_runtest_makereport:loop-marker-loops" in report_hooks(result)[0]
    project.write("test_cls.py", "import pytest\n\npytestmark = pytest.mark.loop(max_iter=0)\n\n\n"
                                 "def test_m():\n    pass\n")
    result = project.run("--loop")
    assert result.ret == 4  # a bad module marker is still found and rejected before anything runs
    assert "max_iter" in result.stderr.str() + result.stdout.str()


def test_a_loop_file_loads_the_readers(project: Project) -> None:
    project.write("release.loop", 'loop "x":\n  goal: g\n  done when "true" passes\n')
    out = probe(project, "--loop")
    assert out["code"] == 0
    assert "pytest_loops.sources" in out["modules"] and "pytest_loops.core.engine" in out["modules"]


def test_the_marker_hook_is_registered_only_with_a_marker(project: Project) -> None:
    project.write("conftest.py", MARKER_PROBE)
    project.write("test_green.py", "def test_green():\n    pass\n")
    assert "MARKER-HOOK False" in project.run("--loop", "-s").stdout.str()
    project.write("test_marked.py", "import pytest\n\n@pytest.mark.loop(max_iter=2)\ndef test_m():\n    pass\n")
    assert "MARKER-HOOK True" in project.run("--loop", "-s").stdout.str()


def test_a_secret_set_in_the_middle_of_the_session_is_still_masked(project: Project) -> None:
    project.write("test_secret.py", """\
        def test_first():
            pass


        def test_second(monkeypatch):
            monkeypatch.setenv("DEPLOY_TOKEN", "s3cr3t-value-42")
            print("token is s3cr3t-value-42")
            assert "s3cr3t-value-42" == ""
        """)
    result = project.run("--loop", "-rA")
    assert result.ret == 1
    text = result.stdout.str()
    assert "s3cr3t-value-42" not in text
    assert "[REDACTED:DEPLOY_TOKEN]" in text


def test_a_secret_a_passing_test_printed_is_masked_with_nothing_to_loop(project: Project) -> None:
    project.write("test_secret.py", """\
        def test_quiet():
            pass


        def test_prints(monkeypatch):
            monkeypatch.setenv("DEPLOY_TOKEN", "s3cr3t-value-42")
            print("token is s3cr3t-value-42")
        """)
    result = project.run("--loop", "-rP")
    assert result.ret == 0
    text = result.stdout.str()
    assert "token is [REDACTED:DEPLOY_TOKEN]" in text  # the passing report's captured output
    assert "s3cr3t-value-42" not in text


def test_the_names_spared_the_readers_are_the_readers_own() -> None:
    from pytest_loops.core import checks, context
    from pytest_loops.pytest_plugin import options
    from pytest_loops.sources import files

    assert ARTIFACTS_DIRNAME == context.ARTIFACTS_DIRNAME
    assert options.CHILD_ENV == checks.CHILD_ENV
    from pytest_loops.sources.reading import RUNNER_CONFIG_NAMES

    assert set(LOOP_FILE_ENDINGS) == {files.LOOP_SUFFIX, *files.YAML_LOOP_SUFFIXES, *RUNNER_CONFIG_NAMES}
    for name in ("a.loop", "A.LOOP", "x.loop.yaml", "x.Loop.yml", "loop", "x.yaml", "x.loops", "x.py",
                 "loop-runner.config.yaml"):
        assert Path(name).name.lower().endswith(LOOP_FILE_ENDINGS) == files.is_loop_file(name), name

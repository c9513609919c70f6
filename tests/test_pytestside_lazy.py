"""A run pays only for what it uses: without --loop (and under --loop with nothing to
loop) the engine, the loop readers, yaml and filelock are never imported; the marker
hook is registered only when a test carries a loop marker; report masking still sees
a secret set in the middle of the session."""

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
         "pytest_loops.artifacts.finishers", "yaml", "filelock")

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


def test_loop_with_nothing_to_loop_imports_nothing_heavy(project: Project) -> None:
    project.write("test_green.py", "def test_green():\n    pass\n")
    out = probe(project, "--loop")
    assert out["code"] == 0
    assert "pytest_loops.pytest_plugin.session" in out["modules"]
    assert loaded(out["modules"]) == []


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


def test_the_names_spared_the_readers_are_the_readers_own() -> None:
    from pytest_loops.core import checks, context
    from pytest_loops.pytest_plugin import options
    from pytest_loops.sources import files

    assert ARTIFACTS_DIRNAME == context.ARTIFACTS_DIRNAME
    assert options.CHILD_ENV == checks.CHILD_ENV
    assert set(LOOP_FILE_ENDINGS) == {files.LOOP_SUFFIX, *files.YAML_LOOP_SUFFIXES}
    for name in ("a.loop", "A.LOOP", "x.loop.yaml", "x.Loop.yml", "loop", "x.yaml", "x.loops", "x.py"):
        assert Path(name).name.lower().endswith(LOOP_FILE_ENDINGS) == files.is_loop_file(name), name

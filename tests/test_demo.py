"""`pytest-loops demo` and `pytest-loops demo --init`, run as a user runs them (subprocesses).

The demo runs in a temporary copy that must be gone afterwards, whatever the
verdict, and after Ctrl-C or SIGTERM; its closing lines must not name files in
that copy. `--init` writes the project, its config and a demo.loop for the user
to edit, and never overwrites a file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_helpers import clean_env

from pytest_loops.cli import demo

INIT_FILES = ["calc.py", "fix_bug.py", "tests/conftest.py", "tests/test_calc.py",
              "harness/loop-runner.config.yaml", "demo.loop"]

# Any attempt at an internet socket, in the demo or any Python process it starts,
# is written down and refused.
NO_NETWORK = '''\
import os, socket

def _refuse(what):
    with open(os.environ["NETWORK_ATTEMPTS"], "a") as log:
        log.write(f"{os.getpid()} {what}\\n")
    raise OSError("network refused by the test")

_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"connect {address!r}")
    return _connect(self, address)
def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"connect_ex {address!r}")
    return _connect_ex(self, address)
socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.getaddrinfo = lambda *a, **k: _refuse(f"getaddrinfo {a!r}")
'''


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    """An empty working directory, home and temp directory for the demo."""
    made = {name: tmp_path / name for name in ("cwd", "home", "tmp")}
    for path in made.values():
        path.mkdir()
    return made


def demo_env(dirs: dict[str, Path], **extra: str) -> dict[str, str]:
    return {"HOME": str(dirs["home"]), "TMPDIR": str(dirs["tmp"]), **extra}


def write_config(path: Path, **replace: str) -> Path:
    """The bundled demo config with some lines replaced (old text -> new text)."""
    text = demo.bundled_config().read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


@pytest.mark.slow
def test_demo_succeeds_offline_and_leaves_nothing_behind(cli, dirs, tmp_path):
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    attempts = tmp_path / "network-attempts"
    proc = cli("demo", cwd=dirs["cwd"], env=demo_env(
        dirs, PYTHONPATH=str(guard), NETWORK_ATTEMPTS=str(attempts)), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS (exit 0) after 2 iteration(s)" in proc.stdout
    assert not attempts.exists(), attempts.read_text()
    assert list(dirs["tmp"].iterdir()) == []
    assert list(dirs["cwd"].iterdir()) == []
    assert list(dirs["home"].iterdir()) == []
    # nothing printed points into the removed copy; the way to keep it is named
    assert str(dirs["tmp"]) not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("config: the bundled demo config")
    assert "`pytest-loops demo --init DIR`" in lines[0]
    assert lines[-3].startswith("SUCCESS (exit 0)")
    assert "removed" in lines[-2] and "`pytest-loops demo --dir DIR`" in lines[-2]
    assert lines[-1] == "to edit the project and its loop: `pytest-loops demo --init DIR`"
    assert proc.stderr == ""


def test_demo_that_fails_still_removes_its_copy(cli, dirs, tmp_path):
    config = write_config(tmp_path / "never.yaml", **{
        'cmd: "python fix_bug.py"': 'cmd: "python -c pass"',
        "max_iter: 6": "max_iter: 2", "no_progress_k: 2": "no_progress_k: 0"})
    proc = cli("demo", "--config", str(config), cwd=dirs["cwd"], env=demo_env(dirs), timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "MAX_ITER (exit 2) after 2 iteration(s)" in proc.stdout
    assert proc.stdout.splitlines()[0] == f"config: {config}  (edit it to change the guards or the revise command)"
    assert str(dirs["tmp"]) not in proc.stdout
    assert list(dirs["tmp"].iterdir()) == []
    assert list(dirs["cwd"].iterdir()) == []


def test_demo_with_a_bad_config_exits_64_and_removes_its_copy(cli, dirs, tmp_path):
    config = write_config(tmp_path / "bad.yaml", **{"max_iter: 6": "max_iter: lots"})
    proc = cli("demo", "--config", str(config), cwd=dirs["cwd"], env=demo_env(dirs))
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "max_iter" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(dirs["tmp"].iterdir()) == []


def test_demo_with_a_missing_config_exits_64_before_copying(cli, dirs):
    proc = cli("demo", "--config", "nope.yaml", cwd=dirs["cwd"], env=demo_env(dirs))
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"pytest-loops: error: {dirs['cwd'] / 'nope.yaml'}: config file not found; "
                                        "check the path given to --config"]
    assert proc.stdout == ""
    assert list(dirs["tmp"].iterdir()) == []


def test_demo_dir_that_is_a_file_exits_64(cli, dirs):
    (dirs["cwd"] / "afile").write_text("x\n")
    proc = cli("demo", "--dir", "afile", cwd=dirs["cwd"], env=demo_env(dirs))
    assert proc.returncode == 64, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pytest-loops: error: --dir afile: cannot copy the demo project")
    assert proc.stdout == ""
    assert (dirs["cwd"] / "afile").read_text() == "x\n"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
def test_demo_interrupted_removes_its_copy(dirs, tmp_path, sig, code):
    # the revise step says it started, then waits to be interrupted
    revise = "python -c \\\"open('started', 'w').close(); import time; time.sleep(600)\\\""
    config = write_config(tmp_path / "waits.yaml", **{'cmd: "python fix_bug.py"': f'cmd: "{revise}"'})
    out = tmp_path / "demo.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_loops", "demo", "--config", str(config)], cwd=dirs["cwd"],
            env=clean_env(demo_env(dirs)), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        end = time.monotonic() + 120
        while not list(dirs["tmp"].glob(f"{demo.TEMP_PREFIX}*/started")):
            assert proc.poll() is None, f"the demo ended early:\n{out.read_text()}"
            assert time.monotonic() < end, f"the revise step never started:\n{out.read_text()}"
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code, out.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert list(dirs["tmp"].iterdir()) == [], out.read_text()
    assert list(dirs["cwd"].iterdir()) == []


@pytest.mark.slow
def test_demo_dir_keeps_the_project_and_names_its_artifacts(cli, dirs):
    project = dirs["cwd"] / "kept"
    proc = cli("demo", "--dir", str(project), cwd=dirs["cwd"], env=demo_env(dirs), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == f"artifacts: {project / '.pytest-loops'}"
    assert f"log: {project / '.pytest-loops' / 'run.json'}" in proc.stdout
    assert (project / ".pytest-loops" / "run.json").is_file()
    assert list(dirs["tmp"].iterdir()) == []


# -- demo --init ----------------------------------------------------------------------

@pytest.mark.slow
def test_init_writes_the_project_config_and_loop_file_and_both_run(cli, dirs):
    target = dirs["cwd"] / "mine"
    proc = cli("demo", "--init", "mine", cwd=dirs["cwd"], env=demo_env(dirs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert written == sorted(INIT_FILES)
    for rel, source in demo.init_files().items():
        assert (target / rel).read_bytes() == source.read_bytes(), rel
    lines = proc.stdout.splitlines()
    assert lines[0] == f"wrote the demo project to mine: {', '.join(INIT_FILES)}"
    assert "cd mine && pytest-loops run" in lines[1]
    assert "cd mine && pytest --loop demo.loop" in lines[2]
    assert list(dirs["tmp"].iterdir()) == []

    # what the text says to run works: the config from harness/ ...
    run = cli("run", cwd=target, env=demo_env(dirs), timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS (exit 0) after 2 iteration(s)" in run.stdout
    assert "return a + b" in (target / "calc.py").read_text()


@pytest.mark.slow
def test_init_loop_file_repairs_the_project_under_pytest(cli, dirs):
    target = dirs["cwd"]
    assert cli("demo", "--init", cwd=target, env=demo_env(dirs)).returncode == 0
    proc = subprocess.run([sys.executable, "-m", "pytest", "--loop", "demo.loop", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-p", "no:hypothesispytest"],
                          cwd=target, env=clean_env(demo_env(dirs)), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 repaired" in proc.stdout
    assert "SUCCESS     demo: 2 iteration(s)" in proc.stdout
    assert "return a + b" in (target / "calc.py").read_text()


def test_init_defaults_to_the_current_directory(cli, dirs):
    proc = cli("demo", "--init", cwd=dirs["cwd"], env=demo_env(dirs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.relative_to(dirs["cwd"]).as_posix() for p in dirs["cwd"].rglob("*") if p.is_file()) \
        == sorted(INIT_FILES)
    assert "run its loop:        pytest-loops run" in proc.stdout  # no `cd` to the current directory


def test_init_quiet_prints_nothing(cli, dirs):
    proc = cli("demo", "--init", "q", "--quiet", cwd=dirs["cwd"], env=demo_env(dirs))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert (dirs["cwd"] / "q" / "demo.loop").is_file()


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 64, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pytest-loops: error: "), proc.stderr
    assert proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize("existing", ["calc.py", "tests/test_calc.py", "harness/loop-runner.config.yaml",
                                      "demo.loop"])
def test_init_refuses_to_overwrite_and_writes_nothing(cli, dirs, existing):
    target = dirs["cwd"] / "proj"
    (target / existing).parent.mkdir(parents=True)
    (target / existing).write_text("mine\n")
    proc = cli("demo", "--init", "proj", cwd=dirs["cwd"], env=demo_env(dirs))
    line = _one_error_line(proc)
    assert f"proj/{existing}: already exists; nothing was written" in line
    assert (target / existing).read_text() == "mine\n"
    assert [p for p in target.rglob("*") if p.is_file()] == [target / existing]


def test_init_refuses_a_dangling_link_in_the_way(cli, dirs):
    (dirs["cwd"] / "demo.loop").symlink_to(dirs["cwd"] / "nowhere")
    line = _one_error_line(cli("demo", "--init", cwd=dirs["cwd"], env=demo_env(dirs)))
    assert "demo.loop: already exists" in line
    assert not (dirs["cwd"] / "nowhere").exists()
    assert not (dirs["cwd"] / "calc.py").exists()


def test_init_refuses_a_file_where_a_directory_goes(cli, dirs):
    (dirs["cwd"] / "tests").write_text("not a directory\n")
    line = _one_error_line(cli("demo", "--init", ".", cwd=dirs["cwd"], env=demo_env(dirs)))
    assert "tests: exists and is not a directory" in line
    assert sorted(p.name for p in dirs["cwd"].iterdir()) == ["tests"]


def test_init_refuses_a_file_as_its_directory(cli, dirs):
    (dirs["cwd"] / "plain").write_text("x\n")
    line = _one_error_line(cli("demo", "--init", "plain", cwd=dirs["cwd"], env=demo_env(dirs)))
    assert "plain: is not a directory" in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_init_where_nothing_can_be_written_exits_64(cli, dirs):
    # procfs refuses a new directory, even to root
    line = _one_error_line(cli("demo", "--init", "/proc/self/demo", cwd=dirs["cwd"], env=demo_env(dirs)))
    assert line.startswith("pytest-loops: error: /proc/self/demo/") and "cannot write" in line


@pytest.mark.parametrize("other", [["--dir", "elsewhere"], ["--config", "some.yaml"]], ids=["--dir", "--config"])
def test_init_with_a_flag_it_does_not_take_exits_64(cli, dirs, other):
    line = _one_error_line(cli("demo", "--init", "x", *other, cwd=dirs["cwd"], env=demo_env(dirs)))
    assert f"--init: does not go with {other[0]}" in line
    assert list(dirs["cwd"].iterdir()) == []


def test_the_demo_module_does_not_import_the_command_line():
    code = "import sys, pytest_loops.cli.demo; print('pytest_loops.cli.main' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr

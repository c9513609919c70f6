"""End to end through the real entry points (`python -m pytest_loops`, `python -m pytest --loop`):

- resume: a loop SIGKILLed mid-iteration, or stopped by its budget, continues
  from its run log to the verdict and iteration count an uninterrupted run reaches;
- process hygiene: SIGTERM or SIGINT of the harness stops every command it runs
  and every descendant, background and `setsid` ones included;
- secrets: the value of a secret-named variable reaches no artifact.

Fuzzing of the readers is in test_fuzz_readers.py; concurrency of the lessons page
and the run index in test_lessons_page.py and test_runlog.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from plugin_helpers import SUITE_SETTINGS

from pytest_loops.artifacts.runlog import load_runlog

# The process-tree contract of the runner itself, checked by host pids: pids inside a PID
# namespace are not the host's, so these loops run in the none tier (floor);
# tests/test_sandbox.py shows the namespaces tier leaving nothing behind.
pytestmark = [pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"), pytest.mark.floor]

_LEAKY_PREFIXES = ("PYTEST_LOOPS_", "LOOP_", "PYTEST_XDIST_")
_LEAKY_NAMES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without settings a nested run would pick up by mistake."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES) and k not in _LEAKY_NAMES
           or k.startswith(SUITE_SETTINGS)}  # the suite's isolation settings (conftest.py)
    env.update(extra or {})
    return env


def cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", *args], cwd=cwd, env=child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def pytest_run(*args: str, cwd: Path, env: Mapping[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=child_env(env), capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- processes


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


class Processes:
    """The harness under test and every process it reported; nothing outlives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.harness: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, int] = {}  # pid -> start time
        self.groups: list[int] = []

    def start(self, argv: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """The harness in its own session, SIGINT at its default (a test runner may ignore it)."""
        with open(self.tmp_path / "harness.out", "wb") as out:
            self.harness = subprocess.Popen(
                argv, cwd=cwd, env=child_env(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return self.harness

    def output(self) -> str:
        return (self.tmp_path / "harness.out").read_text(errors="replace")

    def wait_for_pids(self, directory: Path, names: tuple[str, ...], timeout: float = 90) -> dict[str, int]:
        """Wait until each ``NAME.pid`` file in ``directory`` holds a pid; remember those processes."""
        assert self.harness is not None
        pids: dict[str, int] = {}
        end = time.monotonic() + timeout
        while len(pids) < len(names):
            for name in names:
                text = (directory / f"{name}.pid").read_text().strip() if (directory / f"{name}.pid").exists() else ""
                if name not in pids and text.isdigit():
                    pids[name] = int(text)
                    start = start_time(pids[name])
                    if start is not None:
                        self.seen[pids[name]] = start
            if len(pids) < len(names):
                assert self.harness.poll() is None, f"the harness ended early:\n{self.output()}"
                assert time.monotonic() < end, f"no pid files {names} after {timeout}s:\n{self.output()}"
                time.sleep(0.02)
        return pids

    def alive(self, pids: Mapping[str, int]) -> dict[str, int]:
        return {name: pid for name, pid in pids.items()
                if pid in self.seen and start_time(pid) == self.seen[pid]}

    def wait_gone(self, pids: Mapping[str, int], timeout: float) -> dict[str, int]:
        end = time.monotonic() + timeout
        while self.alive(pids) and time.monotonic() < end:
            time.sleep(0.05)
        return self.alive(pids)

    def cleanup(self) -> None:
        if self.harness is not None and self.harness.poll() is None:
            _killpg(self.harness.pid)
            self.harness.wait(30)
        for pgid in self.groups:
            _killpg(pgid)
        for pid, start in self.seen.items():
            if start_time(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for pid in [*self.seen, *self.groups]:
            try:  # ours to reap if this process became a subreaper (it runs loops too)
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    tracked = Processes(tmp_path)
    yield tracked
    tracked.cleanup()


# --------------------------------------------------------------------------- resume (the runner)

# python revise.py HANG_ITER [count]: on iteration HANG_ITER, once, record its process
# group and sleep (the test SIGKILLs the runner there); then add 1 to ./counter.
REVISE_SCRIPT = """\
import os
import sys
import time
from pathlib import Path

hang = os.environ.get("HANG_DIR")
if hang and os.environ["LOOP_ITERATION"] == sys.argv[1] and not Path(hang, "hung").exists():
    Path(hang, "hung").write_text("")
    Path(hang, "revise.pgid").write_text(str(os.getpgid(0)))
    Path(hang, "revise.pid").write_text(str(os.getpid()))
    time.sleep(300)
if "count" in sys.argv[2:]:
    counter = Path("counter")
    counter.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
"""

COUNTER_AT_LEAST = 'test "$(cat counter 2>/dev/null || echo 0)" -ge {n}'


def project(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "revise.py").write_text(REVISE_SCRIPT)
    (path / "app.txt").write_text("unchanged\n")
    return path


def kill_mid_revise(procs: Processes, argv: list[str], work: Path) -> None:
    """Run ``argv`` until its revise step hangs, then SIGKILL the harness's process group.

    The revise command runs in its own session, so it survives: kill it too, as a
    lost CI machine would have.
    """
    hang = work.parent / f"{work.name}-hang"
    hang.mkdir()
    harness = procs.start(argv, cwd=work, env={"HANG_DIR": str(hang)})
    pids = procs.wait_for_pids(hang, ("revise",))
    pgid = int((hang / "revise.pgid").read_text())
    procs.groups.append(pgid)
    os.killpg(harness.pid, signal.SIGKILL)
    harness.wait(30)
    _killpg(pgid)
    assert procs.wait_gone(pids, 10) == {}


def run_args(verify: str, revise: str, *extra: str) -> list[str]:
    return ["run", "--verify", verify, "--revise", revise, "--max-iter", "8", "--log", "run.json", *extra]


def test_a_sigkilled_loop_resumes_to_the_uninterrupted_verdict_and_count(tmp_path, procs):
    args = run_args(COUNTER_AT_LEAST.format(n=4), "python revise.py 2 count")
    straight = project(tmp_path / "straight")
    done = cli(*args, cwd=straight)
    assert done.returncode == 0, done.stdout + done.stderr
    expected = load_runlog(straight / "run.json")
    assert expected["verdict"] == "SUCCESS" and expected["iterations_run"] == 5

    work = project(tmp_path / "killed")
    kill_mid_revise(procs, [sys.executable, "-m", "pytest_loops", *args], work)
    killed = load_runlog(work / "run.json")
    assert killed["verdict"] is None and killed["iterations_run"] == 1  # iteration 2 died in its revise
    assert (work / "counter").read_text() == "1"

    resumed = cli("run", "--resume", str(work / "run.json"), "--log", "resumed.json", cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    data = load_runlog(work / "resumed.json")
    assert (data["verdict"], data["iterations_run"]) == (expected["verdict"], expected["iterations_run"])
    assert [it["iter"] for it in data["iterations"]] == [1, 2, 3, 4, 5]
    assert data["resumed_from"] == str(work / "run.json") and data["resumed_after_iterations"] == 1
    assert data["spec_digest"] == killed["spec_digest"]  # the loop came from the log, not from flags
    assert (work / "counter").read_text() == (straight / "counter").read_text() == "4"
    # the killed run's lessons were read back (iteration 2's was written before its revise
    # step died), and the page holds a lesson for every failed iteration
    assert [line.split(" iter ")[1].split(":")[0] for line in data["lessons_read"]] == ["1", "2"]
    page = Path(data["memory_page"]).read_text()
    assert {line.split(" iter ")[1].split(":")[0] for line in page.splitlines() if line.startswith("- ")} == \
        {"1", "2", "3", "4"}


@pytest.mark.slow
def test_the_no_progress_streak_carries_over_a_kill(tmp_path, procs):
    """Without the carried streak the resumed loop would stop two iterations later."""
    args = run_args("test -f never", "python revise.py 3 count", "--state", "app.txt", "--no-progress-k", "3")
    straight = project(tmp_path / "straight")
    done = cli(*args, cwd=straight)
    assert done.returncode == 4, done.stdout + done.stderr
    expected = load_runlog(straight / "run.json")
    assert expected["iterations_run"] == 4

    work = project(tmp_path / "killed")
    kill_mid_revise(procs, [sys.executable, "-m", "pytest_loops", *args], work)
    assert load_runlog(work / "run.json")["iterations_run"] == 2

    resumed = cli("run", "--resume", "run.json", "--log", "resumed.json", cwd=work)
    assert resumed.returncode == 4, resumed.stdout + resumed.stderr
    data = load_runlog(work / "resumed.json")
    assert (data["verdict"], data["iterations_run"]) == ("NO_PROGRESS", 4)
    assert data["resumed_from"] == str(work / "run.json")  # given relative, recorded absolute
    assert [it["unchanged_streak"] for it in data["iterations"]] == \
        [it["unchanged_streak"] for it in expected["iterations"]] == [0, 1, 2, 3]


INCREMENT = 'n=$(cat counter 2>/dev/null || echo 0); echo $((n + 1)) > counter'


@pytest.mark.slow
def test_a_timeout_stopped_loop_continues_with_a_larger_budget(tmp_path):
    work = project(tmp_path / "work")
    first = cli("run", "--verify", COUNTER_AT_LEAST.format(n=3), "--revise", f"{INCREMENT}; sleep 60",
                "--budget-seconds", "2.5", "--log", "run.json", cwd=work)
    assert first.returncode == 3, first.stdout + first.stderr
    stopped = load_runlog(work / "run.json")
    assert stopped["verdict"] == "TIMEOUT" and stopped["iterations_run"] == 1
    assert stopped["elapsed_s"] >= 2.5

    # the budget counts the time already spent: the same budget allows nothing more
    again = cli("run", "--resume", "run.json", "--log", "same.json", cwd=work)
    assert again.returncode == 3, again.stdout + again.stderr
    same = load_runlog(work / "same.json")
    assert same["iterations_run"] == 1 and "used up before iteration 2" in same["reason"]
    assert not (work / "same" / "iter-002").exists()

    resumed = cli("run", "--resume", "run.json", "--budget-seconds", "120", "--revise", INCREMENT,
                  "--log", "resumed.json", cwd=work)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    data = load_runlog(work / "resumed.json")
    assert data["verdict"] == "SUCCESS" and data["iterations_run"] == 4
    assert data["guards"]["budget_seconds"] == 120 and data["resumed_from"] == str(work / "run.json")
    assert data["elapsed_s"] >= stopped["elapsed_s"]
    assert (work / "counter").read_text().strip() == "3"


def test_resuming_a_successful_loop_is_a_usage_error(tmp_path):
    work = project(tmp_path / "work")
    assert cli("run", "--verify", "true", "--log", "run.json", cwd=work).returncode == 0
    again = cli("run", "--resume", "run.json", cwd=work)
    assert again.returncode == 64
    assert again.stderr.strip().splitlines() == [
        "pytest-loops: error: --resume run.json: that loop already ended SUCCESS; nothing to resume"]


@pytest.mark.parametrize("damage", ["half", "garbage", "empty", "list", "no-start"])
def test_a_corrupt_log_given_to_resume_is_one_line_and_exit_64(tmp_path, damage):
    work = project(tmp_path / "work")
    assert cli("run", "--verify", "false", "--max-iter", "1", "--log", "run.json", cwd=work).returncode == 2
    text = (work / "run.json").read_text()
    broken = {"half": text[: len(text) // 2], "garbage": "\x00\x01 not a log \x7f", "empty": "",
              "list": "[1, 2]", "no-start": '{"event": "iteration", "record": {}}\n'}[damage]
    (work / "run.json").write_text(broken)
    again = cli("run", "--resume", "run.json", cwd=work)
    assert again.returncode == 64, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pytest-loops: error: run.json") and "Traceback" not in again.stderr


# --------------------------------------------------------------------------- resume (pytest --loop)


def marker_project(path: Path, revise: str, body: str, **marker: object) -> Path:
    project(path)
    (path / "pytest.ini").write_text("[pytest]\n")
    options = ", ".join(f"{k}={v!r}" for k, v in {"revise": revise, **marker}.items())
    (path / "test_loop.py").write_text(textwrap.dedent(f"""\
        import os
        from pathlib import Path

        import pytest

        HERE = Path(__file__).parent


        @pytest.mark.loop({options})
        def test_needs_fixing():
            {body}
        """))
    return path


@pytest.mark.slow
def test_pytest_loop_resume_continues_a_killed_marker_loop(tmp_path, procs):
    body = 'assert int((HERE / "counter").read_text() if (HERE / "counter").exists() else 0) >= 3'
    work = marker_project(tmp_path / "proj", "python revise.py 2 count", body, max_iter=8)
    kill_mid_revise(procs, [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--loop", "-q"], work)
    runs = work / ".pytest-loops" / "runs"
    [killed_log] = runs.glob("*.json")
    assert load_runlog(killed_log)["iterations_run"] == 1

    done = pytest_run("--loop", "--loop-resume", "-q", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    [resumed_log] = [p for p in runs.glob("*.json") if p != killed_log]
    data = load_runlog(resumed_log)
    assert data["verdict"] == "SUCCESS" and data["iterations_run"] == 4  # as without the kill
    assert data["resumed_from"] == str(killed_log) and data["resumed_after_iterations"] == 1
    assert [it["iter"] for it in data["iterations"]] == [1, 2, 3, 4]
    assert (work / "counter").read_text() == "3"


# --------------------------------------------------------------------------- process hygiene

# sh spawn.sh DIR: a background child, a `setsid` one (its own session) and a
# `setsid` one that ignores SIGTERM (only SIGKILL after the grace ends it), each
# recording its pid; then the command itself waits too.
SPAWN_SCRIPT = """\
d="$1"
sh -c 'echo $$ > "$0/bg.tmp" && mv "$0/bg.tmp" "$0/bg.pid"; exec sleep 300' "$d" &
setsid sh -c 'echo $$ > "$0/sid.tmp" && mv "$0/sid.tmp" "$0/sid.pid"; exec sleep 300' "$d" &
setsid sh -c 'trap "" TERM; echo $$ > "$0/deaf.tmp" && mv "$0/deaf.tmp" "$0/deaf.pid"; exec sleep 300' "$d" &
echo $$ > "$d/fg.tmp" && mv "$d/fg.tmp" "$d/fg.pid"
sleep 300
"""
SPAWNED = ("fg", "bg", "sid", "deaf")


@pytest.mark.parametrize("sig, where, code", [
    (signal.SIGTERM, "verify", 143),
    (signal.SIGINT, "revise", 130),
], ids=["SIGTERM-during-verify", "SIGINT-during-revise"])
def test_a_signal_to_the_runner_leaves_no_descendant(tmp_path, procs, sig, where, code):
    work = project(tmp_path / "work")
    (work / "spawn.sh").write_text(SPAWN_SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spawn = f"sh spawn.sh {pid_dir}"
    verify, revise = (spawn, "true") if where == "verify" else ("false", spawn)
    harness = procs.start([sys.executable, "-m", "pytest_loops", "run", "--verify", verify, "--revise", revise,
                           "--log", "run.json", "--no-tine"], cwd=work)
    pids = procs.wait_for_pids(pid_dir, SPAWNED)
    assert procs.alive(pids) == pids
    harness.send_signal(sig)
    assert harness.wait(30) == code, procs.output()
    assert procs.wait_gone(pids, 10) == {}, f"survivors: {procs.alive(pids)}"
    data = load_runlog(work / "run.json")
    assert data["verdict"] is None
    assert data["reason"].startswith("SystemExit" if sig == signal.SIGTERM else "KeyboardInterrupt")


def test_the_budget_stops_a_command_and_every_descendant(tmp_path, procs):
    work = project(tmp_path / "work")
    (work / "spawn.sh").write_text(SPAWN_SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    harness = procs.start([sys.executable, "-m", "pytest_loops", "run", "--verify", f"sh spawn.sh {pid_dir}",
                           "--budget-seconds", "4", "--log", "run.json", "--no-tine"], cwd=work)
    pids = procs.wait_for_pids(pid_dir, SPAWNED)
    assert harness.wait(60) == 3, procs.output()
    assert procs.wait_gone(pids, 5) == {}, f"survivors: {procs.alive(pids)}"
    data = load_runlog(work / "run.json")
    assert data["verdict"] == "TIMEOUT" and "a check was killed" in data["reason"]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 2)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_pytest_loop_leaves_no_descendant(tmp_path, procs, sig, code):
    """SIGTERM exits 143 as for the runner; Ctrl-C is pytest's own "interrupted" (2)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    work = marker_project(tmp_path / "proj", f"sh spawn.sh {pid_dir}", "assert False", max_iter=3,
                          no_progress_k=0)
    (work / "spawn.sh").write_text(SPAWN_SCRIPT)
    harness = procs.start([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--loop", "-q",
                           "--loop-tine", "off"], cwd=work)
    pids = procs.wait_for_pids(pid_dir, SPAWNED)
    assert procs.alive(pids) == pids
    harness.send_signal(sig)
    assert harness.wait(30) == code, procs.output()
    assert procs.wait_gone(pids, 10) == {}, f"survivors: {procs.alive(pids)}"
    assert "INTERNALERROR" not in procs.output() and "Traceback" not in procs.output()
    [log] = (work / ".pytest-loops" / "runs").glob("*.json")
    assert load_runlog(log)["reason"].startswith("SystemExit" if sig == signal.SIGTERM else "KeyboardInterrupt")


DAEMON_TEST_BODY = """\
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

PIDS = Path(os.environ["PIDS_DIR"])


@pytest.mark.loop(revise="true", max_iter=2, no_progress_k=0)
def test_starts_a_daemon():
    if os.environ.get("PYTEST_LOOPS_CHILD"):  # a run the harness started: a check or the localization re-run
        run = "localize" if os.environ.get("PYTEST_LOOPS_COVCTX") else "check"
        names = [PIDS / f"{run}-{how}-{uuid.uuid4().hex}" for how in ("bg", "setsid")]
        for name in names:
            subprocess.Popen(["sh", "-c", f'echo $$ > {name}.tmp && mv {name}.tmp {name}.pid; exec sleep 300'],
                             start_new_session="setsid" in name.name)
        end = time.monotonic() + 30
        while not all(name.with_suffix(".pid").exists() for name in names) and time.monotonic() < end:
            time.sleep(0.01)  # both recorded before the test ends
    assert False
"""


def test_no_descendant_of_a_rerun_test_outlives_the_session(tmp_path, procs):
    """The tests a loop re-runs (its checks and any re-run under coverage) may start
    daemons of their own; none of them is left when the harness's command ends."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    work = project(tmp_path / "proj")
    (work / "pytest.ini").write_text("[pytest]\n")
    (work / "test_daemon.py").write_text(DAEMON_TEST_BODY)
    done = pytest_run("--loop", "-q", "--loop-tine", "off", cwd=work, env={"PIDS_DIR": str(pid_dir)})
    assert done.returncode == 1, done.stdout + done.stderr
    pids = {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid")}
    # the check of iteration 2 and the localization re-run after iteration 1 started theirs
    assert {name.split("-")[0] for name in pids} == {"check", "localize"}, sorted(pids)
    for pid in pids.values():
        procs.seen.setdefault(pid, start_time(pid) or 0)
    assert procs.wait_gone(pids, 5) == {}, f"survivors: {procs.alive(pids)}"


# --------------------------------------------------------------------------- secrets

SECRET = "s3cr3t-" + os.urandom(8).hex()
MARKER = "[REDACTED:MY_API_TOKEN]"


def readable(path: Path) -> bytes:
    """A file's bytes, a compressed .tine decompressed first."""
    blob = path.read_bytes()
    if blob.startswith(b"TINEZ1\0"):
        from opentine._codec import unwrap

        blob = unwrap(blob, limit=1 << 30)
    return blob


def scan(root: Path, *more: Path) -> dict[str, bytes]:
    files = {str(p.relative_to(root.parent)): readable(p) for p in sorted(root.rglob("*")) if p.is_file()}
    files.update({p.name: readable(p) for p in more})
    return files


def assert_no_secret(files: Mapping[str, bytes], *secrets: str) -> None:
    leaks = [name for name, blob in files.items() for secret in secrets or (SECRET,) if secret.encode() in blob]
    assert leaks == [], f"a secret is in {leaks}"


# one secret-looking name per rule (TOKEN, SECRET, KEY, PASSWORD, CREDENTIAL, AUTH)
MORE_SECRETS = {name: f"{name.lower()}-{os.urandom(6).hex()}" for name in
                ("DB_SECRET", "SIGNING_KEY", "DB_PASSWORD", "AWS_CREDENTIALS", "BASIC_AUTH")}


def test_no_secret_in_any_artifact_of_a_run(tmp_path):
    work = project(tmp_path / "work")
    (work / "leaked.txt").write_text("nothing yet\n")
    has_git = shutil.which("git") is not None
    for git in (["init", "-q"], ["add", "leaked.txt"],
                ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false",
                 "commit", "-q", "-m", "start"]) if has_git else ():
        subprocess.run(["git", "-C", str(work), *git], check=True, capture_output=True)
    env = {"MY_API_TOKEN": SECRET, **MORE_SECRETS}
    echo_all = " ".join(f'"${name}"' for name in MORE_SECRETS)
    done = cli("run", "--verify", f'echo "verify sees $MY_API_TOKEN"; echo {echo_all}; exit 1',
               # the revise also leaves the secret in a working-tree file: the hand-off's diff shows it
               "--revise", 'echo "revise sees $MY_API_TOKEN"; echo "$MY_API_TOKEN" >&2; '
                           'echo "token=$MY_API_TOKEN" > leaked.txt',
               "--max-iter", "2", "--state", "app.txt", "--no-progress-k", "0", "--goal", "keep it secret",
               cwd=work, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    report = cli("report", ".pytest-loops", "-o", "report.html", cwd=work, env=env)
    assert report.returncode == 0, report.stderr
    files = scan(work / ".pytest-loops", work / "report.html")
    assert_no_secret(files, SECRET, *MORE_SECRETS.values())
    # not vacuous: the output was captured, masked, in every kind of artifact
    kinds = {"run log": ".json", "check output": "check-1.out", "revise output": "revise.out",
             "memory page": ".md", "provenance": ".tine", "hand-off": ".handoff.md", "report": "report.html"}
    for kind, suffix in kinds.items():
        holders = [name for name, blob in files.items() if name.endswith(suffix) and MARKER.encode() in blob]
        assert holders, f"no {kind} ({suffix}) shows the masked output: {sorted(files)}"
    [handoff] = [blob for name, blob in files.items() if name.endswith(".handoff.md")]
    if has_git:  # the working tree's diff, secret masked
        assert b"+++ b/leaked.txt" in handoff and f"+token={MARKER}".encode() in handoff
    assert all(f"[REDACTED:{name}]".encode() in files[next(n for n in files if n.endswith("check-1.out"))]
               for name in MORE_SECRETS)
    assert SECRET not in done.stdout + report.stdout


def test_no_secret_in_the_artifacts_of_a_pytest_marker_loop(tmp_path):
    work = marker_project(tmp_path / "proj", 'echo "revise sees $MY_API_TOKEN"',
                          'print("test sees", os.environ["MY_API_TOKEN"]); assert False',
                          max_iter=2, no_progress_k=0)
    done = pytest_run("--loop", "--loop-report", "report.html", cwd=work, env={"MY_API_TOKEN": SECRET})
    assert done.returncode == 1, done.stdout + done.stderr
    files = scan(work / ".pytest-loops", work / "report.html")
    assert_no_secret(files)
    for suffix in (".json", "revise.out", ".tine", ".handoff.md", "report.html"):
        assert any(name.endswith(suffix) and MARKER.encode() in blob for name, blob in files.items()), suffix

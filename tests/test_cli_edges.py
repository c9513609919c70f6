"""Edges of the runner: resuming past the cap, signing keys, closed pipes, pytest lessons off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_loops.artifacts.finishers import make_engine
from pytest_loops.artifacts.runlog import load_runlog
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import Verdict


def cli(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_loops", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, **kw)


def test_resuming_a_run_that_hit_the_cap_stops_before_any_work(tmp_path: Path) -> None:
    spec = LoopSpec(name="capped", checks=(Check.command_passes("echo run >> runs.txt; false"),),
                    cwd=str(tmp_path), guards=Guards(max_iter=2, no_progress_k=0))
    first = make_engine(write_index=False).run(spec)
    assert first.verdict is Verdict.MAX_ITER and first.iterations_run == 2
    again = make_engine(write_index=False).run(spec, resume_from=load_runlog(first.log_path))
    assert again.verdict is Verdict.MAX_ITER and again.iterations_run == 2
    assert "raise the cap (--max-iter) to continue" in again.reason
    assert (tmp_path / "runs.txt").read_text().count("run") == 2  # the check never ran again


@pytest.mark.slow
def test_the_hand_off_resume_command_raises_the_limit_that_stopped_the_loop(tmp_path: Path) -> None:
    done = cli("run", "--verify", "false", "--max-iter", "2", "--no-progress-k", "0", "-q", cwd=tmp_path)
    assert done.returncode == 2
    handoff = next((tmp_path / ".pytest-loops" / "runs").glob("*.handoff.md")).read_text()
    assert "--resume" in handoff and "--max-iter 4" in handoff
    log = next((tmp_path / ".pytest-loops" / "runs").glob("*.json"))
    resumed = cli("run", "--resume", str(log), "--max-iter", "4", "-q", cwd=tmp_path)
    assert resumed.returncode == 2
    data = json.loads(log.parent.joinpath(
        sorted(p.name for p in log.parent.glob("*.json"))[-1]).read_text())
    assert data["iterations_run"] == 4 and data["resumed_from"] == str(log)


def test_a_bad_ed25519_key_file_is_bad_input_before_the_loop_runs(tmp_path: Path) -> None:
    (tmp_path / "key.pem").write_text("not a key\n")
    done = cli("run", "--verify", "touch ran.txt", "--sign-key-file", "key.pem", cwd=tmp_path)
    assert done.returncode == 64, done.stderr
    assert "--sign-key-file key.pem" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "ran.txt").exists()


def test_a_short_hmac_key_names_the_flag(tmp_path: Path) -> None:
    env = {**__import__("os").environ, "SIGN_KEY": "short"}
    done = cli("run", "--verify", "true", "--sign-key-env", "SIGN_KEY", cwd=tmp_path, env=env)
    assert done.returncode == 64
    assert done.stderr.startswith("pytest-loops: error: --sign-key-env: the HMAC key in SIGN_KEY is 5 bytes")


def test_a_closed_stdout_never_stops_the_loop(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pytest_loops", "run", "--verify", "test -f done.txt",
                             "--revise", "sleep 0.3; touch done.txt", "--no-progress-k", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # read the header, then hang up like `| head -1`
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None
    with proc.stderr:
        assert b"internal error" not in proc.stderr.read()
    assert (tmp_path / "done.txt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("enabled", [True, False])
def test_reflexion_enabled_from_the_loop_config_applies_under_pytest(pytester: pytest.Pytester,
                                                                     enabled: bool) -> None:
    pytester.makepyfile(test_x="""
        import pytest

        @pytest.mark.loop(revise="true", max_iter=2)
        def test_x():
            assert False
    """)
    pytester.path.joinpath("cfg.yaml").write_text(f"reflexion:\n  enabled: {str(enabled).lower()}\n")
    result = pytester.runpytest_subprocess("--loop", "--loop-config", "cfg.yaml", "-p", "no:cacheprovider")
    assert result.ret == 1
    pages = list((pytester.path / ".pytest-loops" / "lessons").glob("*.md"))
    assert bool(pages) is enabled

"""pytest_loops.runtime.trust: the run-log key file, MACs and their chaining, what a child may see."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_loops.artifacts.finishers import ArtifactOptions
from pytest_loops.artifacts.runlog import RunLogWriter, load_runlog
from pytest_loops.runtime.trust import (
    KEY_BYTES,
    KeyFileError,
    MacChain,
    child_environment,
    identity_digest,
    runlog_key,
    runlog_key_path,
    signing_key_variables,
    source_file_record,
    state_dir,
)


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch) -> Path:
    """Every key of these tests lives under tmp_path, never in the real home."""
    path = tmp_path / "state"
    monkeypatch.setenv("PYTEST_LOOPS_STATE_DIR", str(path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    return path


# --------------------------------------------------------------------------- where the key lives


def test_the_state_dir_comes_from_the_variable_then_xdg_then_home(tmp_path):
    assert state_dir({"PYTEST_LOOPS_STATE_DIR": str(tmp_path / "s")}) == tmp_path / "s"
    assert state_dir({"XDG_STATE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "pytest-loops"
    home = Path.home() / ".local" / "state" / "pytest-loops"
    assert state_dir({}) == home
    assert state_dir({"XDG_STATE_HOME": "relative/dir"}) == home  # the XDG spec: absolute only


def test_the_key_is_made_once_private_and_outside_the_project(state):
    assert runlog_key(create=False) is None and not state.exists()
    key = runlog_key(create=True)
    assert isinstance(key, bytes) and len(key) == KEY_BYTES
    path = runlog_key_path()
    assert path == state / "runlog.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert runlog_key(create=True) == key == runlog_key()
    assert [p.name for p in state.iterdir()] == ["runlog.key"]  # no temporary file left


def _make_key(_: int) -> str:
    return runlog_key(create=True).hex()


def test_processes_making_the_key_at_once_agree_on_one(state):
    with multiprocessing.get_context("fork").Pool(6) as pool:
        keys = set(pool.map(_make_key, range(12)))
    assert len(keys) == 1 and bytes.fromhex(keys.pop()) == runlog_key()


@pytest.mark.parametrize("damage, message", [
    ("mode", "readable or writable by others"),
    ("size", "bytes, not 32"),
    ("dir", "not a regular file"),
    ("link", "cannot read"),
])
def test_a_key_file_that_proves_nothing_is_refused(state, tmp_path, damage, message):
    path = runlog_key_path()
    state.mkdir(mode=0o700)
    if damage == "mode":
        path.write_bytes(os.urandom(KEY_BYTES))
        path.chmod(0o644)
    elif damage == "size":
        path.write_bytes(b"short")
        path.chmod(0o600)
    elif damage == "dir":
        path.mkdir()
    else:
        (tmp_path / "elsewhere").write_bytes(os.urandom(KEY_BYTES))
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(KeyFileError, match=message):
        runlog_key(create=True)


def test_without_a_usable_key_the_log_is_written_and_unverified(state, tmp_path):
    state.mkdir(mode=0o700)
    runlog_key_path().write_bytes(os.urandom(KEY_BYTES))
    runlog_key_path().chmod(0o666)
    log = tmp_path / "run.json"
    writer = RunLogWriter(log)
    writer.start({"loop": "x"})
    writer.iteration({"iter": 1})
    assert "readable or writable by others" in writer.key_error
    assert all("mac" not in json.loads(line) for line in log.read_text().splitlines())
    data = load_runlog(log)
    assert data["iterations_run"] == 1 and data["verified"] is False
    assert "no MACs" in data["unverified_why"]


# --------------------------------------------------------------------------- MACs


def test_a_mac_chain_covers_order_and_content():
    key = os.urandom(KEY_BYTES)
    writer = MacChain(key, "d")
    macs = [writer.next({"n": n}) for n in range(3)]
    reader = MacChain(key, "d")
    assert all(reader.verify({"n": n}, m) for n, m in enumerate(macs))
    for values in ([0, 2], [1, 0], [0, 1, 3]):  # a line dropped, two swapped, one edited
        reader = MacChain(key, "d")
        assert not all(reader.verify({"n": v}, m) for v, m in zip(values, macs, strict=False))
    assert not MacChain(os.urandom(KEY_BYTES), "d").verify({"n": 0}, macs[0])  # another key
    assert not MacChain(key, "other").verify({"n": 0}, macs[0])  # another domain
    assert not MacChain(key, "d").verify({"n": 0}, None)
    assert MacChain(key, "d").next({"x": float("nan")}) is None  # no canonical form, no MAC


def test_identity_digests_never_collide_on_a_shared_prefix():
    long = "p" * 120
    one = identity_digest(loop_file=f"{long}/x.loop", loop="fix", nodeid=f"{long}/x.loop::fix")
    two = identity_digest(loop_file=f"{long}/y.loop", loop="fix", nodeid=f"{long}/y.loop::fix")
    three = identity_digest(loop_file="svc/a/fix.loop", loop="fix", nodeid="svc/a/fix.loop::fix")
    four = identity_digest(loop_file="svc-a/fix.loop", loop="fix", nodeid="svc-a/fix.loop::fix")
    assert len({one, two, three, four}) == 4 and all(len(d) == 64 for d in (one, two, three, four))


def test_the_source_file_record_names_a_loop_file_and_nothing_else(tmp_path):
    loop = tmp_path / "fix.loop"
    loop.write_text('loop "x":\n  done when "true" passes\n')
    record = source_file_record(f"{loop}:1", tmp_path)
    assert record["path"] == str(loop.resolve()) and record["sha256"].startswith("sha256:")
    assert source_file_record("fix.loop:1 (stage 2)", tmp_path)["path"] == str(loop.resolve())
    for source in ("command line", "test_x.py::test_y", None, f"{tmp_path}/gone.loop:3", "failing tests"):
        assert source_file_record(source, tmp_path) is None


# --------------------------------------------------------------------------- child processes


def test_child_environment_drops_signing_keys_and_session_variables():
    env = {"PATH": "/bin", "LOOP_SIGN_KEY": "k" * 20, "PYTEST_LOOPS_SESSION_KEY": "s",
           "PYTEST_LOOPS_SESSIONX": "y", "PYTEST_LOOPS_MEMORY": "m.md", "OTHER": "1"}
    options = ArtifactOptions(hmac_key_env="LOOP_SIGN_KEY")
    names = signing_key_variables(options)
    assert names == ["LOOP_SIGN_KEY"]
    child = child_environment(env, drop=names)
    assert child == {"PATH": "/bin", "PYTEST_LOOPS_MEMORY": "m.md", "OTHER": "1"}
    assert env["LOOP_SIGN_KEY"] == "k" * 20  # the caller's mapping is left alone
    assert child_environment(env, drop=[]) == {k: v for k, v in env.items() if "SESSION" not in k}


def test_signing_key_variables_reads_every_shape_of_options():
    assert signing_key_variables(ArtifactOptions()) == []
    assert signing_key_variables(SimpleNamespace(sign_key_env="A", key_env=None)) == ["A"]
    assert signing_key_variables({"hmac_key_env": "B", "key_env": "B"}) == ["B"]
    assert signing_key_variables(SimpleNamespace(hmac_key_env="", sign_key_env=None)) == []

"""The impact map, recorded after the verdict, off the loop's critical path.

A session fix-loop whose clean-room run judged every test (no map could vouch for
a subset) ends SUCCESS with that run unmeasured: under per-test coverage it would
take two to four times as long. Instead, once the verdict is known and the loop's
store is settled, :func:`launch` starts this module as a detached process (a
session of its own), which:

1. takes the store's recording lock (one recorder per project and config file at a
   time: another one running, it exits);
2. takes a snapshot of the tree, runs the judged tests once under per-test coverage
   (:mod:`~pytest_loops.localization.covctx`, one process, no xdist), confined as the
   loop's tier allows: ``namespaces``, the working tree under a throw-away layer with
   the state directory (the signing key) hidden and a private ``/tmp`` and ``$HOME``;
   ``landlock``, writes limited to its own temporary directory; ``none``, as the
   user's own pytest would run;
3. keeps the map only when every test passed and was measured and no file of the
   tree changed between the snapshots (a user who edits meanwhile gets no map, not a
   map of a tree that never was);
4. signs it and stores it (:meth:`MapStore.publish`) unless a loop on the project
   started since it began: that loop judges what it judges, and records its own.

The measured run is made as like the judged one as it can be: the same interpreter,
arguments and environment (without the harness's variables), the same priority (no
``nice``: code could read it and run one way when measured, another when judged)
and bytecode written as usual.

Its status file (:attr:`MapStore.status_path`) says ``running`` with its pid while
it runs, then its result in one line; the next loop shows that line when it finds
no map. A CI job (``CI`` or ``BUILD_NUMBER`` set) never starts one: its state
directory does not outlive it.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_loops.limits import replace_fresh
from pytest_loops.localization.mapstore import MapStore
from pytest_loops.runtime.pids import pid_alive

__all__ = ["launch", "main", "status", "wait"]

REQUEST = "request.json"
TIMEOUT_S = 6 * 3600.0  # a recording that has run this long is stopped: no map
STALE_START_S = 60.0  # a status still "starting" after this long: the recorder never ran
_children: list[subprocess.Popen[bytes]] = []  # started here; reaped at the next launch


def status(path: Path) -> dict[str, Any]:
    """The last recording's status (``path``: a store's :attr:`~MapStore.status_path`):
    ``{}`` when there was none, else ``state`` (``starting``, ``running``, ``done``)
    and ``pid``/``result``/``at``."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def running(path: Path) -> bool:
    """Whether the recorder of the store whose status file is ``path`` is still at work."""
    now = status(path)
    state = now.get("state")
    if state == "starting":
        return time.time() - float(now.get("at") or 0) < STALE_START_S
    if state == "running":
        pid = now.get("pid")
        return isinstance(pid, int) and not isinstance(pid, bool) and pid_alive(pid)
    return False


def wait(path: Path, timeout: float) -> dict[str, Any]:
    """Wait (at most ``timeout`` s) until the recorder of the store whose status file is
    ``path`` is done; its status."""
    end = time.monotonic() + timeout
    while running(path) and time.monotonic() < end:
        time.sleep(0.1)
    _reap()
    return status(path)


def _set_status(store: MapStore, **values: Any) -> None:
    values.setdefault("at", time.time())
    try:
        store.status_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_fresh(store.status_path, json.dumps(values))
    except OSError:
        pass


def _reap() -> None:
    for proc in list(_children):
        if proc.poll() is not None:
            _children.remove(proc)


def launch(store: MapStore, *, workdir: str, args: Sequence[str], ids: Sequence[str], tier: str,
           network: bool, env: Mapping[str, str]) -> str:
    """Start the recorder for ``ids`` (node ids, the judged run's) of ``store``'s root;
    the note for the session. ``env``: the recorder's environment (the harness's, without
    its command tag); the tests run in it without the harness's variables."""
    try:
        return _launch(store, workdir=workdir, args=args, ids=ids, tier=tier, network=network, env=env)
    except OSError as exc:  # no temporary directory, a state directory that cannot be written
        where = f" ({exc.filename})" if exc.filename else ""
        return f"no impact map: the recorder could not start: {exc.strerror or exc}{where}"


def _launch(store: MapStore, *, workdir: str, args: Sequence[str], ids: Sequence[str], tier: str,
            network: bool, env: Mapping[str, str]) -> str:
    _reap()
    if running(store.status_path):
        return "an impact map is being recorded in the background already: none started"
    scratch = tempfile.mkdtemp()  # a name like any temporary directory
    request = {"root": store.root, "config": store.config, "directory": str(store.path.parent),
               "workdir": os.path.realpath(workdir), "args": list(args), "ids": list(ids),
               "tier": tier, "network": network, "scratch": scratch}
    path = Path(scratch, REQUEST)
    log = store.status_path.with_suffix(".log")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(request, f)
        store.status_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(log, "wb") as out:
            _set_status(store, state="starting")
            proc = subprocess.Popen(  # noqa: S603 - our own module, by the running interpreter
                [sys.executable, "-m", __name__, str(path)], cwd=scratch, env=dict(env),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                close_fds=True)
    except OSError:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        raise
    _children.append(proc)
    return (f"recording the impact map of {len(ids)} test(s) in the background (pid {proc.pid}, "
            f"status: {store.status_path})")


def _leave_running() -> None:
    """At exit: a recorder still at work is left to finish, on purpose."""
    for proc in _children:
        if proc.returncode is None:
            proc.returncode = 0  # not reaped here: no warning that it still runs


atexit.register(_leave_running)


# -- the detached process ---------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_loops.localization.recorder REQUEST``: record, store, exit 0."""
    import shutil

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m pytest_loops.localization.recorder REQUEST", file=sys.stderr)
        return 64
    try:
        request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
        store = MapStore(request["root"], request["config"] or None, directory=Path(request["directory"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"the recording request {argv[0]} is unreadable: {exc}", file=sys.stderr)
        return 64
    try:
        result = _record(store, request)
    except Exception as exc:  # noqa: BLE001 - a detached process: every fault is its result line
        result = f"no impact map: the recorder failed ({type(exc).__name__}: {exc})"
    finally:
        shutil.rmtree(request.get("scratch") or argv[0] + ".none", ignore_errors=True)
    _set_status(store, state="done", result=result)
    print(result)
    return 0


def _record(store: MapStore, request: dict[str, Any]) -> str:
    from filelock import FileLock, Timeout

    lock = FileLock(str(store.path.with_suffix(".recording.lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return "no impact map: another recorder is at work on this project"
    try:
        _set_status(store, state="running", pid=os.getpid())
        generation = store.generation()
        return _measure(store, request, generation)
    finally:
        lock.release()


def _measure(store: MapStore, request: dict[str, Any], generation: str) -> str:
    from pytest_loops.localization.impact import ImpactMap, snapshot
    from pytest_loops.localization.spectra import PLUGIN, SpectraError, read_spectra, spectra_command
    from pytest_loops.runtime.cleanroom import clean_environment
    from pytest_loops.runtime.process import ProcessRunner

    root, workdir, ids = store.root, str(request["workdir"]), [str(i) for i in request["ids"]]
    scratch = Path(request["scratch"])
    ids_file = scratch / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n", encoding="utf-8")
    data = scratch / "spectra.json"
    env = clean_environment(os.environ)
    _, extra = spectra_command(root, [], data_file=data, base_env=env)
    env.update(extra)  # with the child marker: a --loop in PYTEST_ADDOPTS starts no loop there
    argv = [sys.executable, "-P", "-m", "pytest", "-p", PLUGIN, "-q", "-p", "no:cacheprovider",
            "-p", "no:randomly", *[str(a) for a in request["args"]], f"@{ids_file}"]
    sandbox = _confinement(str(request["tier"]), bool(request["network"]), root, workdir, str(scratch))
    if isinstance(sandbox, str):
        return sandbox
    before = snapshot(root)
    import shlex

    result = ProcessRunner().run(shlex.join(argv), cwd=workdir, env=env, timeout=TIMEOUT_S,
                                 output_path=scratch / "pytest.out", sandbox=sandbox)
    if result.start_error:
        return f"no impact map: pytest could not start ({result.start_error})"
    if result.timed_out:
        return f"no impact map: the run under coverage took over {TIMEOUT_S:g}s"
    try:
        spectra = read_spectra(data, exit_code=result.exit_code)
    except SpectraError as exc:
        return f"no impact map: the run's coverage was unusable ({exc})"
    missing = [t for t in ids if t not in spectra.passed]
    if missing:
        return f"no impact map: {len(missing)} test(s) did not pass under coverage, e.g. {missing[0]}"
    impact = ImpactMap.from_spectra(spectra, root, before=before)
    after, _ = snapshot(root)
    changed = sorted(p for p in set(before[0]) | set(after)
                     if before[0].get(p, [None])[0] != after.get(p, [None])[0])
    if changed:
        return f"no impact map: the tree changed while it was measured ({changed[0]})"
    if impact.incomplete or any(not impact.tests[t].deps for t in ids if t in impact.tests):
        return "no impact map: not every test was measured"
    impact.root = root
    return store.publish(impact, generation, len(ids))


def _confinement(tier: str, network: bool, root: str, workdir: str, scratch: str) -> Any:
    """The recorder's confinement in the loop's tier: a Confinement, None (tier none), or
    the result line when that tier cannot be had now."""
    from pytest_loops.runtime.reaper import TAG_VARIABLE
    from pytest_loops.runtime.trust import state_dir
    from pytest_loops.sandbox import Confinement, SandboxUnavailable, choose
    from pytest_loops.sandbox.policy import Policy, Tier, runtime_dirs

    if tier == Tier.NONE.value:
        return None
    try:
        choice = choose(tier)
    except SandboxUnavailable as exc:
        return f"no impact map: the loop's tier is not available to the recorder ({exc})"
    if choice.tier is Tier.NAMESPACES:
        if not choice.overlay:
            return "no impact map: bubblewrap here cannot lay a throw-away layer over the tree"
        policy = Policy(cwd=workdir, overlays=((root, root),), writable=(scratch,),
                        masked=(os.path.realpath(state_dir()), *runtime_dirs()), read_only_root=True,
                        private_tmp=True, private_home=True, network=network, unset_env=(TAG_VARIABLE,))
    else:
        tmp = os.path.join(scratch, "tmp")
        os.makedirs(tmp, exist_ok=True)
        policy = Policy(cwd=workdir, writable=(scratch,), tmpdir=tmp, network=network)
    return Confinement(choice, policy)


if __name__ == "__main__":
    sys.exit(main())

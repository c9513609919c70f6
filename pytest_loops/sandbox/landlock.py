"""The landlock tier: the kernel limits where a command may write.

Where namespaces cannot be made (Docker's default seccomp profile, Ubuntu's
AppArmor restriction of unprivileged user namespaces), Landlock (Linux 5.13+) still
can: a ruleset that handles every kind of write and allows them only beneath the
policy's writable paths and its temporary directory. From ABI 6 on, the command
also cannot signal processes outside its domain nor reach their abstract unix
sockets. There is no mount or PID isolation here: detection still runs.

The ruleset is built in the harness (its descriptor opened there); the child only
sets ``no_new_privs`` and restricts itself, two system calls between fork and exec.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from collections.abc import Callable

from pytest_loops.sandbox.policy import Launch, Policy

# system call numbers: the same on x86_64, aarch64 and the other generic tables
_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_VERSION_FLAG = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << n for n in range(6, 13))
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2  # ABI 6
_FILE_RIGHTS = WRITE_FILE | TRUNCATE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_lock = threading.Lock()
_abi: tuple[int, str] | None = None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def abi() -> tuple[int, str]:
    """``(ABI version, "")`` when Landlock can be used here, else ``(0, why not)``."""
    global _abi
    with _lock:
        if _abi is None:
            if platform.system() != "Linux":
                _abi = (0, "Landlock is a Linux feature")
            else:
                try:
                    found = _libc().syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION_FLAG))
                    err = ctypes.get_errno()
                except (OSError, AttributeError) as exc:
                    found, err = -1, 0
                    _abi = (0, f"Landlock cannot be called: {exc}")
                if _abi is None:
                    _abi = (int(found), "") if found > 0 else (
                        0, f"the kernel has no Landlock ({os.strerror(err) if err else 'not enabled'})")
        return _abi


def _handled(version: int) -> int:
    rights = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO \
        | MAKE_BLOCK | MAKE_SYM
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    return rights


def _ruleset(policy: Policy, version: int) -> int:
    libc = _libc()
    handled = _handled(version)
    attr = _RulesetAttr(handled, 0, (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if version >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if version >= 6 else 8 if version < 4 else 16
    fd = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    try:
        allowed = [*policy.writable, *(d for d in (policy.tmpdir,) if d), "/dev"]
        for path in allowed:
            try:
                target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = handled if os.path.isdir(path) else handled & _FILE_RIGHTS
                rule = _PathBeneath(rights if path != "/dev" else handled & _FILE_RIGHTS, target)
                if libc.syscall(_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
            finally:
                os.close(target)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _restrictor(fd: int) -> Callable[[], None]:
    libc = _libc()
    syscall, prctl = libc.syscall, libc.prctl

    def restrict() -> None:  # in the child, between fork and exec: two system calls
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or syscall(_RESTRICT, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")

    return restrict


def launch(policy: Policy, argv: list[str]) -> Launch:
    version, why = abi()
    if not version:
        raise OSError(why)
    fd = _ruleset(policy, version)
    env = {"TMPDIR": policy.tmpdir, "PYTEST_DEBUG_TEMPROOT": policy.tmpdir} if policy.tmpdir else {}
    return Launch(argv=list(argv), pass_fds=(fd,), preexec_fn=_restrictor(fd), env_set=env,
                  cleanup=lambda: os.close(fd))

"""SUCCESS is confirmed in a clean room, where the code under repair cannot reach the judge.

Before a loop whose revise step ran may end SUCCESS, every check runs once more:

- in a fresh copy of the tree as it was when the loop started, with only the
  in-scope changes applied (read-only files come from the guard's private
  store, never from the working tree);
- with a fresh bytecode cache: no ``__pycache__`` of the tree is copied, so no
  forged one is read (and the bytecode the revise step wrote into the tree was
  removed after it);
- with the user's environment without any harness variable or signing key, its
  ``PYTHONPATH`` entries inside the working tree moved into the room (a judged run
  imports nothing, and finds no plugin registration, from the working tree);
- pytest runs with ``python -P`` (nothing in the tree can stand in for pytest
  or the standard library) and with the harness's witness plugin
  (:mod:`pytest_loops.runtime.judge`), whose record, tagged with a per-run nonce, must
  agree with the exit code.

A check that fails there, or whose witness disagrees with its exit code, ends
the loop ESCALATE with the reason; so does a read-only file the code under test
changed while it was judged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_loops.results import CheckResult
from pytest_loops.spec import CheckKind

JUDGE_VARIABLE = "PYTEST_LOOPS_JUDGE"
JUDGE_PLUGIN = "pytest_loops.runtime.judge"
# Never passed into the clean room: the harness's own variables and those of the
# pytest process a loop may run in.
HARNESS_PREFIXES = ("LOOP_", "PYTEST_LOOPS_", "PYTEST_XDIST_", "COV_CORE_")
HARNESS_NAMES = frozenset({"PYTEST_CURRENT_TEST"})
MAX_RECORD_BYTES = 64 << 20  # a witness file larger than this is not read


@dataclass
class JudgeRecord:
    """What the witness saw in one command's pytest runs."""

    starts: int = 0
    finishes: list[int] = field(default_factory=list)  # pytest exit statuses
    outcomes: dict[str, set[str]] = field(default_factory=dict)  # nodeid -> {"passed", ...}
    called: set[str] = field(default_factory=set)  # node ids with a call-phase report
    collect_errors: int = 0
    foreign: int = 0  # lines it did not write (garbled, or without the nonce)

    @property
    def passed(self) -> set[str]:
        """Node ids whose call phase passed and that failed or skipped nowhere."""
        return {n for n in self.called if self.outcomes.get(n) == {"passed"}}

    def disagreement(self, exit_code: int | None) -> str | None:
        """Why this record and the exit code disagree (None: they agree)."""
        if self.foreign:
            return f"the witness's record holds {self.foreign} line(s) it did not write"
        if self.starts != len(self.finishes):
            if exit_code == 0:
                return ("a pytest run ended without finishing its session "
                        "(os._exit, a kill, or a crash) yet the command exited 0")
            return None
        if exit_code == 0:
            bad = [s for s in self.finishes if s != 0]
            if bad:
                return f"pytest's own exit status was {bad[0]} but the command exited 0"
            failed = sorted(n for n, o in self.outcomes.items() if "failed" in o)
            if failed or self.collect_errors:
                what = failed[0] if failed else "a collection error"
                return f"the witness saw {what} fail, yet the command exited 0"
        return None

    def unearned(self, expected: Iterable[str]) -> str | None:
        """Why a test the loop saw failing in the working tree did not earn its pass
        here (None: each one was run and passed). A test that is skipped, xfailed,
        deselected or no longer collected has not been repaired, whatever the exit code."""
        wanted = sorted(set(expected))
        if not wanted:
            return None
        if not self.starts:
            return (f"{wanted[0]} failed earlier, but no pytest run in the clean room "
                    "loaded the harness's witness")
        for node in wanted:
            seen = [n for n in self.outcomes if same_test(n, node)]
            if not seen:
                return f"{node} failed earlier but was not run in the clean room (deselected or not collected)"
            not_passed = [n for n in seen if n not in self.passed]
            if not_passed:
                seen_as = self.outcomes.get(not_passed[0], set())
                if seen_as == {"raised", "passed"}:
                    return f"{not_passed[0]} failed earlier; its call raised, yet its report says passed"
                how = "/".join(sorted(seen_as - {"raised"})) or "raised"
                return f"{not_passed[0]} failed earlier and is now {how}, not passed"
        return None


def same_test(nodeid: str, named: str) -> bool:
    """Whether the witness's ``nodeid`` (relative to pytest's rootdir) is the test a
    summary line ``named`` (relative to where pytest was started: ``cd tests && pytest``
    prints ``test_x.py::t`` for ``tests/test_x.py::t``). A summary line cuts a
    parametrized id at its first space, so such a name matches as a prefix."""
    while named.startswith(("./", "../")):
        named = named.split("/", 1)[1]
    if "[" in named and "]" not in named.split("[", 1)[1]:
        return nodeid.startswith(named) or f"/{named}" in nodeid
    return nodeid == named or nodeid.endswith(f"/{named}") or named.endswith(f"/{nodeid}")


_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)")


def failed_node_ids(lines: Iterable[str]) -> tuple[str, ...]:
    """The pytest node ids a command's output names as failed (`FAILED nodeid` and
    `ERROR nodeid` lines of pytest's summary), in order, once each."""
    ids: dict[str, None] = {}
    for line in lines:
        match = _FAILED_LINE.match(line)
        if match:
            ids.setdefault(match.group(1), None)
    return tuple(ids)


def note_failed_tests(seen: dict[str, set[str]], checks: Iterable[CheckResult]) -> None:
    """Add the node ids the failed command checks' output names as failed to ``seen``
    (check name -> ids): each must be witnessed passing in the clean room."""
    from pytest_loops.runtime.capture import output_lines

    for c in checks:
        if not c.passed and c.kind == CheckKind.COMMAND.value:
            seen.setdefault(c.name, set()).update(failed_node_ids(output_lines(c.output_file, c.output_tail)))


class JudgeChannel:
    """One command's witness channel: an anonymous file (no name in any directory) the
    judged command inherits as an open descriptor, its first line the nonce; where the
    witness is not loaded from its entry point, a file named in ``PYTEST_LOOPS_JUDGE``."""

    def __init__(self, directory: str) -> None:
        from pytest_loops.runtime import judge

        self.nonce = secrets.token_hex(16)
        self.inherited = witness_autoloads()
        self._named: str | None = None
        if self.inherited:
            self.fd = _anonymous_file(tempfile.gettempdir())
            os.write(self.fd, judge.MAGIC + self.nonce.encode() + b"\n")
        else:
            fd, self._named = tempfile.mkstemp(prefix="judge-", suffix=".jsonl", dir=directory)
            self.fd = fd

    @property
    def path(self) -> str:
        """A path this process can open the channel by."""
        return self._named or f"/proc/self/fd/{self.fd}"

    @property
    def value(self) -> str:
        return f"{self.nonce}:{self.path}"

    def extra_env(self) -> dict[str, str]:
        """What a judged command's environment needs (nothing, when it inherits the channel)."""
        return {} if self.inherited else {JUDGE_VARIABLE: self.value}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors a judged command inherits."""
        return (self.fd,) if self.inherited else ()

    def plugin_args(self) -> list[str]:
        """pytest arguments a judged pytest needs (none, when the entry point loads the witness)."""
        return [] if self.inherited else ["-p", JUDGE_PLUGIN]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._named:
            with contextlib.suppress(OSError):
                os.unlink(self._named)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def read(self) -> JudgeRecord:
        record = JudgeRecord()
        try:
            data = _read_all(self.fd, MAX_RECORD_BYTES + 1) if self.fd >= 0 else b""
        except OSError:
            return record
        from pytest_loops.runtime.judge import MAGIC

        if data.startswith(MAGIC):  # the header the harness wrote: not a record
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""
        if len(data) > MAX_RECORD_BYTES:
            record.foreign += 1
            data = data[:MAX_RECORD_BYTES]
        for line in data.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                record.foreign += 1
                continue
            if not isinstance(item, dict) or item.get("nonce") != self.nonce:
                record.foreign += 1
                continue
            event = item.get("event")
            if event == "start":
                record.starts += 1
            elif event == "finish":
                status = item.get("exitstatus")
                record.finishes.append(status if isinstance(status, int) else -1)
            elif event == "collect":
                record.collect_errors += 1
            elif event == "test" and isinstance(item.get("nodeid"), str):
                node = item["nodeid"]
                outcome = str(item.get("outcome"))
                if item.get("xfail"):
                    outcome = "xfail"
                record.outcomes.setdefault(node, set()).add(outcome)
                if item.get("when") == "call":
                    record.called.add(node)
            else:
                record.foreign += 1
        return record


def _read_all(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(1 << 20, limit - offset), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _anonymous_file(directory: str) -> int:
    """An open file with no name (``O_TMPFILE``; else a file unlinked at once), appended to."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.open(directory, flags | tmpfile, 0o600)
        except OSError:
            pass
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        os.close(fd)
        return os.open(path, flags)
    finally:
        os.unlink(path)


@functools.lru_cache(maxsize=1)
def witness_autoloads() -> bool:
    """Whether pytest loads the witness by itself here: its entry point is installed, plugin
    autoloading is on, and the process has ``/proc`` to find the inherited channel."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not os.path.isdir("/proc/self/fd"):
        return False
    from importlib.metadata import entry_points

    try:
        return any(ep.name == JUDGE_PLUGIN and ep.value == JUDGE_PLUGIN
                   for ep in entry_points(group="pytest11"))
    except Exception:  # noqa: BLE001 - a broken distribution: the named channel works anywhere
        return False


def clean_environment(env: Mapping[str, str], *, drop: Iterable[str] = ()) -> dict[str, str]:
    """The user's environment without the harness's variables (and ``drop``)."""
    dropped = set(drop) | HARNESS_NAMES
    return {k: v for k, v in env.items() if k not in dropped and not k.startswith(HARNESS_PREFIXES)}


def move_path(value: str, old: str, new: str) -> str:
    """``value``, a path (or ``--opt=path``) under the directory ``old`` (real, absolute),
    as the same path under ``new``; any other value as it is."""
    for prefix in ("", *(f"{opt}=" for opt in ("--rootdir", "--confcutdir", "-c", "--config-file"))):
        if prefix and not value.startswith(prefix):
            continue
        path = value[len(prefix):]
        real = os.path.realpath(path) if os.path.isabs(path) else None
        if real is not None and (real == old or real.startswith(old + os.sep)):
            return prefix + new + real[len(old):]
    return value


class CleanRoom:
    """A fresh tree for one confirmation; see the module docstring."""

    def __init__(self, workdir: str, env: Mapping[str, str], *, drop: Iterable[str] = ()) -> None:
        self.workdir = os.path.realpath(workdir)
        self.parent = tempfile.mkdtemp()  # a name like any temporary directory: no tell of the judge
        self.root = os.path.join(self.parent, os.path.basename(self.workdir) or "tree")
        self.env = clean_environment(env, drop=drop)
        self.mounted_at: str | None = None  # the namespaces tier: the room is seen at this path
        self.overlay = False  # the room is the working tree under a throw-away layer, not a copy
        self._pythonpath = self.env.get("PYTHONPATH")
        if self._pythonpath:  # the room's copy, never the working tree, on the judged path
            self.env["PYTHONPATH"] = os.pathsep.join(
                self.map_path(p) if p else p for p in self._pythonpath.split(os.pathsep))

    def mount(self, path: str) -> None:
        """The room's tree will be seen at ``path`` (the project's own): paths are not moved
        (there, the project's own path is the room's copy)."""
        self.mounted_at = os.path.realpath(path)
        if self._pythonpath:
            self.env["PYTHONPATH"] = self._pythonpath

    def overlay_of(self, tree: str) -> None:
        """No copy: the judge sees ``tree`` itself at its own path, under a throw-away
        writable layer (the namespaces tier with overlays); the tree holds only what the
        guard allowed once its read-only files are put back."""
        self.mount(tree)
        self.overlay = True
        self.root = os.path.realpath(tree)

    def map_path(self, value: str) -> str:
        """A path (or ``--opt=path``) under the working tree, moved into the room."""
        if self.mounted_at is not None:
            return value
        return move_path(value, self.workdir, self.root)

    def map_args(self, args: Sequence[str]) -> list[str]:
        return [self.map_path(str(a)) for a in args]

    def channel(self) -> JudgeChannel:
        return JudgeChannel(self.parent)

    def command_env(self, channel: JudgeChannel) -> dict[str, str]:
        """For a shell command: every pytest it starts loads the witness. Where pytest loads
        it from its entry point and the command inherits the channel, nothing at all."""
        if channel.inherited:
            return {}
        addopts = self.env.get("PYTEST_ADDOPTS", "")
        return {"PYTEST_ADDOPTS": f"-p {JUDGE_PLUGIN} {addopts}".strip(), **channel.extra_env()}

    def pytest_command(self, targets: Sequence[str], extra_args: Sequence[str],
                       channel: JudgeChannel | None = None) -> list[str]:
        """argv of a judged pytest: isolated from the tree's modules, fresh caches."""
        cache = [] if self.mounted_at is not None else ["-o", f"cache_dir={os.path.join(self.parent, 'cache')}"]
        plugin = channel.plugin_args() if channel is not None else ["-p", JUDGE_PLUGIN]
        return [sys.executable, "-P", "-m", "pytest", *plugin, "-q", *cache, "-p", "no:randomly",
                *self.map_args(extra_args), *targets]

    def close(self) -> None:
        shutil.rmtree(self.parent, ignore_errors=True)

    def __enter__(self) -> CleanRoom:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def relative_to_room(path: str | os.PathLike[str], room: CleanRoom) -> Path:
    return Path(room.root) / os.path.relpath(os.fspath(path), room.workdir)

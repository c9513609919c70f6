"""Each command of a loop in its tier: the policies of the revise step, the checks and the judge.

The engine chooses a tier once per loop (:func:`pytest_loops.sandbox.choose`);
:class:`Isolation` turns a command's role and context into a
:class:`~pytest_loops.sandbox.Confinement`:

- **the revise step** sees a read-only machine but for the working tree (or its
  fan-out copy), the agents' own state directories and ``sandbox_writable``; the
  tree's read-only files (tests, configuration, ``.git``, the harness's files)
  are read-only there too, by the kernel; ``/tmp`` is its own, the harness's keys
  and the user's session sockets are hidden, and it runs in its own PID namespace;
- **a check in the working tree** sees the same read-only machine: it writes the
  tree, its run directory and ``~/.cache``; the code under test it runs can change
  neither the read-only files nor the interpreter, nor see the harness;
- **the judge** (the clean room) runs with the verified tree mounted at the
  project's own path, its ``/tmp`` and ``$HOME`` throw-away, the root read-only;
- **a fan-out candidate** has its copy mounted at the project's path too, so
  its checks import its own code (an editable install resolves to that path).

In the landlock tier every command's writes are limited by the kernel (the revise
step: its tree, a temporary directory and the agents' state; a check: the tree, the
run directory, a temporary directory and ``~/.cache``; the judge: the clean room);
in the none tier nothing is confined.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_loops.runtime.process import TAG_VARIABLE
from pytest_loops.sandbox import Choice, Confinement, Policy, Tier
from pytest_loops.sandbox.policy import agent_state_paths, runtime_dirs, under

if TYPE_CHECKING:
    from pytest_loops.core.context import LoopContext
    from pytest_loops.runtime.protect import TreeGuard
    from pytest_loops.spec import LoopSpec

REVISE, CHECK = "revise", "check"


class Isolation:
    """The confinement of each command of one loop; see the module docstring."""

    def __init__(self, choice: Choice, watch: TreeGuard, *, own: Sequence[str | os.PathLike[str] | None] = (),
                 writable: Sequence[str] = (), network: bool = True) -> None:
        self.choice = choice
        self.watch = watch
        self.own = tuple(os.path.realpath(os.fspath(p)) for p in own if p)
        self.extra = tuple(os.path.realpath(os.path.expanduser(p)) for p in writable if p)
        self.network = network
        self._readonly: tuple[str, ...] | None = None
        self._tmp: str | None = None
        self._commands: dict[str, tuple[str, ...]] = {}  # the spec -> command_paths
        # a fan-out candidate's copy is mounted at the project's path: its paths are not moved
        self.mounts_copies = choice.tier is Tier.NAMESPACES
        # the judge sees the working tree itself under a throw-away layer: no copy to make
        self.overlays_room = choice.tier is Tier.NAMESPACES and choice.overlay

    @functools.cached_property
    def layers_candidates(self) -> bool:
        """A fan-out candidate is the working tree under an upper layer of its own, no
        copy (namespaces, where bwrap mounts an overlay with a kept upper layer)."""
        if not self.overlays_room:
            return False
        from pytest_loops.sandbox import bwrap

        return bwrap.layers_work()

    # -- what is read-only, once the guard knows ---------------------------------------

    def readonly_paths(self) -> tuple[str, ...]:
        """The guard's read-only paths at loop start, as few binds as possible: a test
        directory or a virtual environment whole, other files one by one, ``.git``."""
        if self._readonly is None:
            if not self.watch.started:
                return ()
            from pytest_loops.runtime.protect import TEST_DIR

            tops: dict[str, None] = {}
            for venv in sorted(self.watch.venvs):
                tops.setdefault(venv, None)
            for rel in sorted(self.watch.store):
                if any(under(rel, v) for v in self.watch.venvs):
                    continue
                parts = rel.split("/")
                cut = next((i for i, p in enumerate(parts[:-1]) if TEST_DIR.match(p)), None)
                top = "/".join(parts[:cut + 1]) if cut is not None else rel
                if not any(under(top, t) for t in tops):
                    tops.setdefault(top, None)
            git = os.path.join(self.watch.root, ".git")
            if os.path.lexists(git):
                tops.setdefault(".git", None)
            self._readonly = tuple(tops)
        return self._readonly

    @functools.cached_property
    def _git_dir(self) -> tuple[str, ...]:
        """A worktree's ``.git`` file names the real git directory: that is read-only too."""
        dot = os.path.join(self.watch.root, ".git")
        if not os.path.isfile(dot):
            return ()
        try:
            with open(dot, encoding="utf-8") as f:
                first = f.readline().strip()
        except (OSError, UnicodeDecodeError):
            return ()
        if not first.startswith("gitdir:"):
            return ()
        target = first.split(":", 1)[1].strip()
        target = os.path.realpath(os.path.join(self.watch.root, target))
        return (target,) if os.path.isdir(target) else ()

    def command_paths(self, spec: LoopSpec) -> tuple[str, ...]:
        """What the loop's commands name by absolute path (an interpreter in a virtual
        environment under /tmp, a script): kept visible, read-only, wherever it is. A
        path inside a virtual environment keeps the whole environment."""
        key = str(id(spec))  # one loop holds its spec for its whole run
        if key in self._commands:  # once per loop, not once per command
            return self._commands[key]
        found: dict[str, None] = {}
        commands = [c.command for c in spec.checks if c.command] + ([spec.revise] if spec.revise else [])
        for command in commands:
            try:
                words = shlex.split(command)
            except ValueError:
                continue
            for word in words:
                if not word.startswith("/") or not os.path.exists(word):
                    continue
                venv = next((str(p) for p in Path(word).parents if (p / "pyvenv.cfg").is_file()), None)
                found.setdefault(venv or word, None)
        self._commands[key] = tuple(found)
        return self._commands[key]

    def tmpdir(self) -> str:
        """The landlock tier's temporary directory for the revise step (one per loop)."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp()  # a name like any: no tell of the harness
        return self._tmp

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # -- one command ------------------------------------------------------------------

    def __call__(self, ctx: LoopContext, role: str) -> Confinement | None:
        tier = self.choice.tier
        if tier is Tier.NONE:
            return None
        if tier is Tier.LANDLOCK:
            return self._landlock(ctx, role)
        if ctx.clean_room is not None:
            return Confinement(self.choice, self._judge(ctx))
        return Confinement(self.choice, self._tree(ctx, role))

    def _masked(self) -> tuple[str, ...]:
        from pytest_loops.runtime.trust import state_dir

        return (os.path.realpath(state_dir()), *runtime_dirs())

    def _landlock(self, ctx: LoopContext, role: str) -> Confinement:
        """Writes limited to the tree (the clean room's copy for the judge), the run
        directory for a check's own files, a temporary directory, and for the revise step
        the agents' state; every other file of the machine is the kernel's to refuse."""
        tmpdir = self.tmpdir()
        if ctx.clean_room is not None:
            writable: tuple[str, ...] = (ctx.clean_room.parent, *_cache())
            # the judge's own temporary directory, inside the room: nothing the revise
            # step left in its temporary directory is seen by the judged run
            tmpdir = os.path.join(ctx.clean_room.parent, "tmp")
            os.makedirs(tmpdir, exist_ok=True)
        else:
            tree = os.path.realpath(ctx.workdir if ctx.real_workdir is not None else self.watch.root)
            run_dir = os.path.realpath(ctx.run_dir)
            writable = (tree, *self.extra, *(agent_state_paths() if role == REVISE else (run_dir, *_cache())))
        policy = Policy(cwd=os.fspath(ctx.workdir), writable=writable, tmpdir=tmpdir, network=self.network)
        return Confinement(self.choice, policy)

    def _binds(self, host_top: str, view_top: str, rels: Iterable[str]) -> list[tuple[str, str]]:
        return [(os.path.join(host_top, rel), os.path.join(view_top, rel)) for rel in rels]

    def _tree(self, ctx: LoopContext, role: str) -> Policy:
        """The revise step or a check, in the working tree or a fan-out candidate's copy."""
        root = self.watch.root
        rels = self.readonly_paths()
        readonly: list[tuple[str, str]] = []
        mounts: list[tuple[str, str]] = []
        writable: list[str] = []
        cwd = os.path.realpath(ctx.workdir)
        layers: list[tuple[str, str, str, str]] = []
        if ctx.layer is not None:  # a candidate: the tree under its own upper layer, at the project's path
            upper, work = ctx.layer
            layers.append((root, upper, work, root))
            readonly += self._binds(root, root, rels)  # the tree's read-only files, from the tree
        elif ctx.real_workdir is not None:  # a candidate: its copy, at its own path and the project's
            from pytest_loops.runtime.cleanroom import move_path

            copy_top = move_path(root, os.path.realpath(ctx.real_workdir), cwd)
            mounts.append((copy_top, root))
            writable.append(copy_top)
            # the copy's own read-only files; a virtual environment (not in the copy: a
            # mount point) is the project's own, and a file git does not track is not there
            venvs = self.watch.venvs
            own = [r for r in rels if r not in venvs and os.path.lexists(os.path.join(copy_top, r))]
            readonly += self._binds(copy_top, root, own) + self._binds(copy_top, copy_top, own)
            shared = [v for v in rels if v in venvs and os.path.isdir(os.path.join(copy_top, v))]
            readonly += self._binds(root, root, shared) + self._binds(root, copy_top, shared)
            cwd = os.path.normpath(os.path.join(root, os.path.relpath(cwd, copy_top)))
        else:
            writable.append(root)
            readonly += self._binds(root, root, rels)
        readonly += [(g, g) for g in self._git_dir]
        own = [p for p in self.own if os.path.lexists(p)]
        writable += self.extra
        run_dir = os.path.realpath(ctx.run_dir)
        if role == REVISE:
            writable += agent_state_paths()
        else:  # a check writes its JUnit file into the run directory, and caches
            writable += [run_dir, *_cache()]
            own = [p for p in own if p != run_dir]
        readonly += [(p, p) for p in own]  # the harness's run log, lessons and artifacts: read only
        commands = self.command_paths(ctx.spec)
        readonly += [(p, p) for p in _interpreters_under(writable, root, commands, ctx.spec)]
        return Policy(cwd=cwd, writable=tuple(writable), readonly=tuple(readonly), mounts=tuple(mounts),
                      overlays=_linked_caches(writable), layers=tuple(layers), masked=self._masked(),
                      keep=(*own, *commands),
                      read_only_root=True,
                      private_tmp=True, network=self.network, unset_env=(TAG_VARIABLE,))

    def _judge(self, ctx: LoopContext) -> Policy:
        """The clean room's tree at the project's path; nothing it writes survives."""
        room = ctx.clean_room
        assert room is not None
        root = self.watch.root
        view = room.mounted_at or root
        if room.overlay:
            return self._judge_overlay(ctx, view)
        readonly = self._binds(room.root, view, [r for r in self.readonly_paths()
                                                  if r != ".git" and r not in self.watch.venvs])
        readonly += [(os.path.join(root, v), os.path.join(view, v)) for v in sorted(self.watch.venvs)]
        own = [p for p in self.own if os.path.lexists(p)]
        # the harness's files are read-only to the judged code: it writes nowhere that lasts
        readonly += [(p, p) for p in own]
        return Policy(cwd=os.fspath(ctx.workdir), mounts=((room.root, view),),
                      writable=(room.parent,), readonly=tuple(readonly), masked=self._masked(),
                      keep=(*own, *self.command_paths(ctx.spec)), read_only_root=True, private_tmp=True,
                      private_home=True,
                      network=self.network, unset_env=(TAG_VARIABLE,))


    def _judge_overlay(self, ctx: LoopContext, view: str) -> Policy:
        """The judge on the working tree itself: an overlay with a throw-away upper layer,
        its read-only files bound read-only from the guard's store, every bytecode cache
        and tool cache covered by an empty directory (nothing the checks wrote there is read)."""
        room = ctx.clean_room
        assert room is not None
        root = self.watch.root
        readonly: list[tuple[str, str]] = []
        for rel in self.readonly_paths():
            stored = self.watch.store.get(rel)
            if stored is not None and stored.path and os.path.isfile(stored.path):
                readonly.append((stored.path, os.path.join(view, rel)))  # the loop-start bytes
            else:
                readonly.append((os.path.join(root, rel), os.path.join(view, rel)))
        readonly += [(g, g) for g in self._git_dir]
        readonly += [(p, p) for p in self.own if os.path.lexists(p)]
        return Policy(cwd=os.fspath(ctx.workdir), overlays=((root, view),), empty=self._caches(view),
                      writable=(room.parent,), readonly=tuple(readonly), masked=self._masked(),
                      keep=(*[p for p in self.own if os.path.lexists(p)], *self.command_paths(ctx.spec)),
                      read_only_root=True, private_tmp=True, private_home=True,
                      network=self.network, unset_env=(TAG_VARIABLE,))

    def _caches(self, view: str) -> tuple[str, ...]:
        """Directories of the tree the clean room never copies (bytecode caches, pytest's and
        tools' caches, build metadata), as the judge sees them."""
        from pytest_loops.runtime.protect import IGNORED_DIRS, PYCACHE

        skip = IGNORED_DIRS - {".git", ".pytest-loops"}
        found: list[str] = []
        for rel in sorted({"", *self.watch.dirs}):
            if rel.rsplit("/", 1)[-1] == PYCACHE or any(v == rel or rel.startswith(v + "/") for v in self.watch.venvs):
                continue
            try:
                entries = list(os.scandir(os.path.join(self.watch.root, rel)))
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and (
                        entry.name == PYCACHE or entry.name in skip or entry.name.endswith(".egg-info")):
                    found.append(os.path.join(view, rel, entry.name) if rel else os.path.join(view, entry.name))
        return tuple(found)


def choose_sandbox(requested: str) -> Choice:
    """The tier a loop runs in; a tier asked for by name and not available here is bad
    input (one line, exit 64)."""
    from pytest_loops.errors import LoopUsageError
    from pytest_loops.sandbox import SandboxUnavailable, choose

    try:
        return choose(requested)
    except SandboxUnavailable as exc:
        raise LoopUsageError(str(exc), location="sandbox") from None


def header(choice: Choice | None) -> dict[str, str]:
    """The run log header's ``sandbox`` entry."""
    return choice.to_dict() if choice is not None else {"tier": "none", "note": "a runner that spawns nothing"}


def from_environment(sandbox: str | None, writable: Sequence[str] | None, network: bool | None,
                     environ: Mapping[str, str] | None = None) -> tuple[str, tuple[str, ...], bool]:
    """An engine made without isolation settings takes them from ``PYTEST_LOOPS_SANDBOX*``
    (the lowest layer there is for it), else the table's defaults."""
    from pytest_loops.settings import BY_NAME

    env = os.environ if environ is None else environ
    given: dict[str, Any] = {"sandbox": sandbox, "sandbox_writable": writable, "sandbox_network": network}
    for name, value in list(given.items()):
        row = BY_NAME[name]
        if value is None:
            text = env.get(row.env or "")
            given[name] = row.parse_env(text, f"environment variable {row.env}") if text else row.default
    return str(given["sandbox"]), tuple(given["sandbox_writable"] or ()), bool(given["sandbox_network"])


def _interpreters_under(writable: Sequence[str], root: str, commands: Iterable[str], spec: LoopSpec) -> list[str]:
    """The interpreter's installation (its prefixes and package directories) and the
    programs the loop's commands run (by path, or by name through ``PATH``; a whole
    virtual environment when a program lies in one) wherever they lie under a directory
    the step may write outside the tree (a virtual environment under ``~/.cache``, a
    tool under a ``sandbox_writable`` directory): read-only, or a step could patch the
    test runner the judge runs. The tree's own virtual environments are the guard's."""
    import sys

    places = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]
    programs = [c for c in commands if os.path.isfile(c) or os.path.isfile(os.path.join(c, "pyvenv.cfg"))]
    for command in [c.command for c in spec.checks if c.command] + ([spec.revise] if spec.revise else []):
        try:
            words = shlex.split(command)
        except ValueError:
            continue
        first = next((w for w in words if "=" not in w or w.startswith(("/", "."))), None)
        found = shutil.which(first) if first and "/" not in first else None
        if found:  # a venv's python links out of it: the venv is found from the name on PATH
            venv = next((str(p) for p in Path(os.path.abspath(found)).parents if (p / "pyvenv.cfg").is_file()), None)
            programs += [venv] if venv else []
            programs.append(found)
    result = []
    for path in dict.fromkeys(os.path.realpath(p) for p in (*places, *programs) if p and os.path.isabs(p)):
        if under(path, root) or not os.path.exists(path):
            continue
        if any(under(path, top) for top in writable):
            result.append(path)
    return result


# Package managers' caches whose files a virtual environment shares by hard link (uv
# links a venv's site-packages to its cache): a write to the cache's inode would
# change the installed package, so a step sees them through a throw-away overlay.
LINKED_CACHES = ("uv",)


def _linked_caches(writable: Sequence[str]) -> tuple[tuple[str, str], ...]:
    from pytest_loops.sandbox.policy import home

    found: list[str] = []
    env = os.environ.get("UV_CACHE_DIR")
    if env and os.path.isabs(env):
        found.append(os.path.realpath(env))
    top = home()
    if top:
        found += [os.path.join(top, ".cache", name) for name in LINKED_CACHES]
    return tuple((p, p) for p in dict.fromkeys(found)
                 if os.path.isdir(p) and any(under(p, w) and p != w for w in writable))


def _cache() -> tuple[str, ...]:
    """``~/.cache``, where test tools keep their caches: writable for checks."""
    from pytest_loops.sandbox.policy import home

    top = home()
    path = os.path.join(top, ".cache") if top else ""
    return (path,) if path and os.path.isdir(path) else ()

"""The session fix-loop's impact map, kept between loops where a revise step cannot forge it.

A map (:class:`~pytest_loops.localization.impact.ImpactMap`) made from a green
clean-room run of every test lets a later fix-loop judge only the tests its
changes can reach. A revise step runs as the same user as the harness, so the
map is kept out of the tree and the artifacts directory, and guarded three ways:

- it lives in the user's private state directory
  (:func:`pytest_loops.runtime.trust.state_dir`, ``impact/``), one entry per
  project root and pytest config file, never in the project;
- it is signed with the per-user run-log key (:func:`~pytest_loops.runtime.trust.runlog_key`)
  over the root it was made for and its whole content; a map whose signature
  fails, that was made for another root, or that cannot be read, is not used
  (the judged run runs every test) and the note says why;
- the loop reads it once, before its first revise step (the session fix-loop:
  before the session's first conftest is imported, so no code of the session's
  own run can replace it), holds it in memory and
  takes the entry off the disk while it runs: a revise step finds nothing to
  edit, and a loop killed before its end leaves no map (the next one judges
  every test). When the loop ends, an entry that appeared meanwhile (written by
  a revise step or a process it started, even signed with the key) is deleted;
  then the map the loop stored, or else the one it read, is put back.

A map recorded after a loop's verdict, in the background
(:mod:`pytest_loops.localization.recorder`), is stored by :meth:`MapStore.publish`
only if no loop on the project started while it was measured: each loop marks its
start with a fresh *generation* (under the store's lock, with the read), and the
recorder compares it before it writes (under the same lock).

Whether the map is fresh for the files the revise step changed is the map's own
rule (:meth:`ImpactMap.affected`): any change it cannot vouch for means every test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pytest_loops.limits import replace_fresh
from pytest_loops.localization.impact import ImpactMap
from pytest_loops.runtime.trust import KeyFileError, json_mac, mac_matches, runlog_key, state_dir

__all__ = ["MAP_DOMAIN", "MapStore"]

MAP_DOMAIN = "pytest-loops.impact-map/1"
SUBDIR = "impact"


class MapStore:
    """The stored map of one project root (and pytest config file)."""

    def __init__(self, root: str | os.PathLike[str], config: str | None = None, *,
                 directory: Path | None = None) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.config = config or ""
        name = hashlib.sha256(json.dumps([self.root, self.config]).encode("utf-8")).hexdigest()[:32]
        self.path = (directory if directory is not None else state_dir() / SUBDIR) / f"{name}.json"
        self.status_path = self.path.with_suffix(".recording")  # the background recorder's status
        self.held: bytes | None = None  # the entry to store when the loop ends
        self.opened = False  # load() was called: the entry is this loop's until settle()
        self.loaded: ImpactMap | None = None
        self.note = ""

    def load(self) -> ImpactMap | None:
        """The stored map when its signature holds and it was made for this root, else
        None with :attr:`note` saying why (empty when there is simply none). The entry
        is taken off the disk until :meth:`settle`."""
        if self.opened:  # read once: the session's store is opened before its first test
            return self.loaded
        self.opened = True
        with self._locked():
            self._new_generation()
            impact = self._read()
            try:
                self.path.unlink()
            except OSError:
                pass
        if impact is None:
            self.held = None
        self.loaded = impact
        return impact

    def _read(self) -> ImpactMap | None:
        self.note = ""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.note = f"the stored impact map {self.path} is unreadable ({exc.strerror or exc}): not used"
            return None
        self.held = data
        try:
            raw = json.loads(data.decode("utf-8"))
            body, given = raw["map"], raw["mac"]
            key = runlog_key(create=False)
        except (ValueError, KeyError, TypeError, KeyFileError) as exc:
            self.note = f"the stored impact map {self.path} is unreadable ({type(exc).__name__}): not used"
            return None
        expected = json_mac(key, MAP_DOMAIN, [self.root, self.config, body]) if key is not None else None
        if expected is None or not mac_matches(expected, given):
            self.note = f"the stored impact map {self.path} failed its signature check: not used"
            return None
        impact = ImpactMap.from_dict(body)
        if impact is None:
            self.note = f"the stored impact map {self.path} is of another format: not used"
            return None
        if impact.root != self.root:
            self.note = f"the stored impact map was made for {impact.root}, not {self.root}: not used"
            return None
        self.note = f"impact map from {self.path}"
        return impact

    def save(self, impact: ImpactMap) -> bool:
        """Sign ``impact`` (made for this root) and hold it for :meth:`settle` to store;
        False when there is no key to sign with."""
        try:
            key = runlog_key(create=True)
        except KeyFileError:
            return False
        if key is None or impact.root != self.root:
            return False
        body = impact.to_dict()
        signature = json_mac(key, MAP_DOMAIN, [self.root, self.config, body])
        if signature is None:
            return False
        self.held = json.dumps({"map": body, "mac": signature}).encode("utf-8")
        return True

    # -- the lock, and the generation a background recorder checks ------------------------

    def _locked(self) -> Any:
        """The store's lock (a few milliseconds at a time); without it (a lock that cannot
        be had within 10 s, a directory that cannot be made) the operation goes on alone."""
        from filelock import FileLock, Timeout

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            return FileLock(str(self.path.with_suffix(".lock"))).acquire(timeout=10)  # released on exit
        except (OSError, Timeout):
            return contextlib.nullcontext()

    @property
    def _generation_path(self) -> Path:
        return self.path.with_suffix(".generation")

    def _new_generation(self) -> None:
        try:
            replace_fresh(self._generation_path, os.urandom(16).hex())
        except OSError:
            pass

    def generation(self) -> str:
        """The mark of the last loop that started on this store ("" before any)."""
        try:
            return self._generation_path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return ""

    def publish(self, impact: ImpactMap, generation: str, tests: int) -> str:
        """Store ``impact`` (recorded after a verdict) now, unless a loop started since
        ``generation`` was read; the result line."""
        if not self.save(impact):
            return "no impact map: it could not be signed (no run-log key)"
        with self._locked():
            if self.generation() != generation:
                return "no impact map: a loop on this project started while it was measured"
            if not self._write_held():
                return f"no impact map: it could not be written to {self.path}"
        return f"impact map of {tests} test(s) stored for the next loop"

    def _write_held(self) -> bool:
        if self.held is None:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.held)
            os.replace(tmp, self.path)
        except OSError:
            return False
        return True

    def settle(self) -> str:
        """At the end of a loop: delete an entry that appeared while it ran, then store the
        map it holds (the one it saved, else the one it read). Returns a note ("" when
        nothing appeared)."""
        note = ""
        if not self.opened and self.held is None:
            return ""  # a loop that never read the store (confirm=full) leaves it alone
        if self.path.exists() or self.path.is_symlink():
            try:
                self.path.unlink()
                note = f"the stored impact map {self.path} was written during the loop, not by it: deleted"
            except OSError as exc:
                return f"the stored impact map {self.path} was written during the loop and could not be deleted: {exc}"
        if self.held is not None:
            with self._locked():
                self._write_held()
        self.opened, self.held = False, None  # settled once: a second call changes nothing
        return note


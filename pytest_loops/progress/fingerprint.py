"""Progress detection: the incremental state fingerprint of the no-progress guard.

After every iteration the guard asks: did the files the loop is about change
(:class:`StateFingerprint`)? The answer must be cheap on big trees and must not
be fooled by what every run writes: caches, bytecode, the loop's own artifacts.
Whether the loop fails the same way as before is :mod:`pytest_loops.progress.signature`
(re-exported here).

The patterns and excludes are :mod:`pytest_loops.progress.matching`; how a file
is hashed, and when a cached digest is trusted, is :mod:`pytest_loops.progress.treehash`.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Sequence

from pytest_loops.deadline import DeadlineReached, ShouldStop
from pytest_loops.progress import journal as fswatch
from pytest_loops.progress import treehash
from pytest_loops.progress.matching import _OUTSIDE_ROOT, PatternMatcher, _to_key
from pytest_loops.progress.signature import (
    failure_signature,
    first_meaningful_line,
    normalize_failure,
)
from pytest_loops.progress.treehash import CachedDigest, error_marker

__all__ = [
    "JOURNAL_REWALK_EVERY",
    "StateFingerprint",
    "failure_signature",
    "first_meaningful_line",
    "normalize_failure",
]


# With a change journal, every this-many-th compute walks the tree anyway: a bound
# on how long a change inotify never reports (a write through mmap) can go unseen.
# A walk costs one stat per file, next to the seconds an iteration takes.
JOURNAL_REWALK_EVERY = 16

_FORMAT_TAG = b"pytest-loops.state/1\n"


def _open_journal(root: str) -> fswatch.DirectoryJournal:
    """The change journal for ``root`` (a seam: tests swap it to force walking)."""
    return fswatch.DirectoryJournal(root)


class StateFingerprint(PatternMatcher):
    """An incremental fingerprint of the files a loop may change.

    ``patterns`` are relative to ``root`` (absolute paths are allowed):

    * a glob: ``*.txt`` (top level only), ``src/**/*.py`` (``**`` = any depth);
      wildcards match dot-files too and never cross ``/``;
    * a directory: everything beneath it;
    * a file.

    A glob that matches a directory takes everything beneath it. A pattern that
    matches nothing contributes nothing; blank patterns are ignored.

    :data:`~pytest_loops.progress.matching.DEFAULT_EXCLUDES` are skipped by name at any depth. ``exclude`` adds
    more, read as in ``.gitignore``: a bare name or name glob (``build``,
    ``*.log``) is skipped at any depth; a path with a ``/`` in it (``logs/*.log``,
    ``./run.json`` for the top level only) is anchored at ``root``; an absolute
    path is that exact path (the engine passes its run log and memory page so).
    An excluded directory excludes everything beneath it, and an exclude wins over
    a pattern that names the same file.

    Symbolic links to files are hashed by content. Symbolic links to directories
    are recorded by their target and not descended into (no loops), unless a
    pattern names the link itself. Unreadable files, dangling links and special
    files are recorded as a marker of what they are, never an exception. Empty
    directories are not state.

    How ``compute()`` finds what changed (the value never depends on it):

    * **walk**: stat every file; re-read only files whose size, mtime, inode or
      ctime changed, or whose mtime was within :data:`~pytest_loops.progress.treehash.RACY_WINDOW_NS` of the moment
      they were last read.
    * **journal** (Linux): the first compute walks and puts an inotify watch on
      every directory it reads, before reading it. Later computes read the events
      since: they re-read the files an event named (whatever their mtime says) and
      re-list the directories whose entries changed; every other file keeps its
      digest without even a stat. Files the journal cannot vouch for are still
      statted every time, as in a walk: symbolic links, files with other hard
      links, files inside the racy window, markers.

    It walks whenever the journal cannot vouch for a complete account: no inotify,
    the watch limit reached, a network file system, a pattern through a symbolic
    link to a directory or outside ``root``, an overflowed event queue, a watch
    the kernel dropped, a fork; and every :data:`JOURNAL_REWALK_EVERY`-th compute
    regardless, for what inotify never reports (writes through ``mmap``).

    The journal holds a file descriptor: :meth:`close` (or ``with``) releases it,
    as does garbage collection. After :meth:`close`, computes walk.

    ``should_stop`` (the engine sets it from the loop's budget) is asked for every
    directory listed, before every file read and between chunks of a big file;
    when it answers true, ``compute()`` raises
    :class:`~pytest_loops.deadline.DeadlineReached` and keeps nothing of the
    interrupted compute (the next one starts over from the last complete one).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        patterns: Sequence[str],
        *,
        exclude: Sequence[str] = (),
        should_stop: ShouldStop | None = None,
    ) -> None:
        super().__init__(root, patterns, exclude, should_stop)
        self._cache: dict[str, CachedDigest] = {}
        self._cached_now = 0  # files hashed into the cache by the last compute
        self._read_now = 0  # files read so far by this compute (said when it is interrupted)
        self._files: list[str] = []  # sorted keys of the last compute
        self._lines: dict[str, str] = {}  # key -> its line in the fingerprinted text
        self._marked = False  # the last text held directory markers
        self._value = ""
        # The journal and what it lets a compute reuse.
        self._journal_off: str | None = None  # why the journal is off for good
        self._journal_note = "not started"
        outside = any(
            self._relative(os.path.normpath(os.path.join(self._root, p))) is None
            for p in self._patterns
        )
        if outside:  # the journal watches the root's tree only
            self._journal_off = self._journal_note = _OUTSIDE_ROOT
        self._since_walk = 0
        self._matches: dict[str, str] = {}
        self._digests: dict[str, str] = {}  # key -> digest or marker, for matched files
        self._volatile: set[str] = set()  # keys checked every compute, as a walk would
        self._pending: set[str] = set()  # matched but vanished before they were read
        self._stats: dict[str, int | str] = {
            "files": 0, "hashed": 0, "stat_only": 0, "mode": "none", "journal": self._journal_note,
        }

    # -- public API

    @property
    def root(self) -> str:
        """The absolute root the patterns are relative to."""
        return self._root

    @property
    def files(self) -> list[str]:
        """Keys (``/``-separated paths relative to root; absolute if outside it) of the last compute."""
        return list(self._files)

    @property
    def last_stats(self) -> dict[str, int | str]:
        """How the last compute went.

        * ``files``: keys fingerprinted, markers included (unreadable files, links
          to directories, special files, which are neither hashed nor cached);
        * ``hashed``: files read; ``stat_only``: files whose cached digest was kept
          without reading them (after a stat in a walk; in a journal compute, most
          without even that);
        * ``mode``: ``"walk"`` or ``"journal"`` (``"none"`` before the first compute);
        * ``journal``: ``"on"`` while a change journal watches the tree, else why not.
        """
        return dict(self._stats)

    def close(self) -> None:
        """Release the change journal's file descriptor; later computes walk."""
        self._journal_off = self._journal_note = "closed"
        self._drop_journal()
        self._stats["journal"] = self._journal_note

    def __enter__(self) -> StateFingerprint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def compute(self) -> str:
        """Return ``"sha256:<hex>"`` (:mod:`~pytest_loops.progress.treehash`) over the sorted
        (path, content digest) of all matched files."""
        journal = self._journal
        if journal is not None and self._since_walk < JOURNAL_REWALK_EVERY - 1:
            try:
                return self._compute_by_journal(journal)
            except fswatch.JournalLost as exc:
                self._lose_journal(exc)
            except BaseException:
                # Interrupted half way: the events read are gone, so walk next time.
                self._drop_journal()
                raise
        return self._compute_by_walk()

    # -- the journal's life

    def _drop_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._listings = {}
        self._trees = {}
        self._kinds = {}
        self._literal_links = set()

    def _lose_journal(self, exc: fswatch.JournalLost) -> None:
        self._drop_journal()
        self._journal_note = exc.reason
        if exc.sticky:
            self._journal_off = exc.reason

    # -- computing

    def _compute_by_walk(self) -> str:
        self._drop_journal()
        if self._journal_off is None:
            try:
                self._journal = _open_journal(self._root)
            except fswatch.JournalLost as exc:
                self._lose_journal(exc)
        if self._journal is not None:
            try:
                return self._walk()
            except fswatch.JournalLost as exc:
                # Even a fresh journal could not vouch for this tree: stop trying.
                exc.sticky = True
                self._lose_journal(exc)
            except BaseException:
                self._drop_journal()
                raise
        return self._walk()

    def _walk(self) -> str:
        """Expand every pattern from scratch and stat every match (arming the journal if any)."""
        journal = self._journal
        self._listings = {}
        self._trees = {}
        self._kinds = {}
        self._literal_links = set()
        self._reexpand = False
        self._prestat = {}
        self._markers = {}
        self._links = set()
        # A match is its path; file matches found by listing a directory come with
        # their stat, taken while the directory was open.
        matches: dict[str, str] = {}
        try:
            for pattern in self._patterns:
                self._expand_pattern(pattern, matches)
            digests, volatile, hashed = self._digest_all(matches)
        finally:
            self._prestat = {}
            if journal is None:
                self._listings = {}
                self._trees = {}
        if journal is not None:
            self._matches = matches
            self._digests = digests
            self._volatile = volatile
            self._pending = set(matches.keys() - digests.keys())
            self._since_walk = 0
            self._journal_note = "on"
        else:
            self._matches, self._digests, self._volatile, self._pending = {}, {}, set(), set()
        return self._finish(digests, hashed, "walk")

    def _compute_by_journal(self, journal: fswatch.DirectoryJournal) -> str:
        """Reuse the last compute, redoing only what the events since then name."""
        changes = journal.drain(self._ignore_event, should_stop=self.should_stop)
        invalidated = self._invalidate(changes)
        for path in self._literal_links:
            if os.path.isdir(path):
                raise fswatch.JournalLost(
                    f"{path} became a symbolic link to a directory", sticky=True
                )
        self._since_walk += 1
        expanded = invalidated or self._reexpand
        if expanded:
            self._reexpand = False
            self._markers = {}
            self._links = set()
            matches: dict[str, str] = {}
            for pattern in self._patterns:
                self._expand_pattern(pattern, matches)
            self._matches = matches
        prefix = self._root_prefix
        touched = {
            _to_key(p[len(prefix) :]) for p in changes.touched if p.startswith(prefix)
        }
        try:
            changed, removed, hashed = self._digest_changes(expanded, touched)
        finally:
            self._prestat = {}
        if self._markers or self._marked:  # rare: unreadable directories
            return self._finish(self._digests, hashed, "journal")
        if changed or removed or not self._value:
            self._publish(changed, removed)
        self._stats = self._stats_for(hashed, "journal")
        return self._value

    def _invalidate(self, changes: fswatch.Changes) -> bool:
        """Forget the listings and literal lookups the events make stale; any?"""
        listings, trees, kinds = self._listings, self._trees, self._kinds
        stale = [p for p in changes.relisted if p in listings]
        if changes.gone:
            stale += [p for p in listings if fswatch.within(p, changes.gone)]
        for path in stale:
            listings.pop(path, None)
            trees.pop(path, None)
        hit = bool(stale)
        if kinds:
            for path in [
                p
                for p in kinds
                if os.path.dirname(p) in changes.relisted
                or (changes.gone and fswatch.within(p, changes.gone))
            ]:
                del kinds[path]
                self._literal_links.discard(path)
                hit = True
        return hit

    def _finish(self, digests: dict[str, str], hashed: int, mode: str) -> str:
        """Fingerprint ``digests`` (and the markers) from scratch."""
        merged = {**self._markers, **digests} if self._markers else digests
        # key NUL digest LF: unambiguous, since neither a path nor a digest holds NUL
        # and digests hold no LF.
        self._lines = {key: f"{key}\0{value}\n" for key, value in merged.items()}
        self._files = sorted(self._lines)
        self._marked = bool(self._markers)
        self._value = self._hash_lines()
        self._stats = self._stats_for(hashed, mode)
        return self._value

    def _publish(self, changed: set[str], removed: set[str]) -> None:
        """Fingerprint again after ``changed`` keys got a new digest (or vanished)."""
        lines, keys, digests = self._lines, self._files, self._digests
        added: list[str] = []
        dropped: list[str] = []
        for key in removed:
            if lines.pop(key, None) is not None:
                dropped.append(key)
        for key in changed:
            digest = digests.get(key)
            if digest is None:
                if lines.pop(key, None) is not None:
                    dropped.append(key)
                continue
            if key not in lines:
                added.append(key)
            lines[key] = f"{key}\0{digest}\n"
        if len(added) + len(dropped) > 64:
            self._files = sorted(lines)
        else:  # a few keys come and go: keep the sorted list rather than sort again
            for key in dropped:
                del keys[bisect.bisect_left(keys, key)]
            for key in added:
                bisect.insort(keys, key)
        self._value = self._hash_lines()

    def _hash_lines(self) -> str:
        text = "".join(map(self._lines.__getitem__, self._files))
        outer = treehash.new_hash(_FORMAT_TAG)
        outer.update(text.encode("utf-8", "surrogateescape"))
        return treehash.PREFIX + outer.hexdigest()

    def _stats_for(self, hashed: int, mode: str) -> dict[str, int | str]:
        return {
            "files": len(self._files),
            "hashed": hashed,
            # Every cached file that was not read this time kept its digest.
            "stat_only": len(self._cache) - self._cached_now,
            "mode": mode,
            "journal": "on" if self._journal is not None else self._journal_note,
        }

    # -- digesting

    def _digest_all(
        self, matches: dict[str, str]
    ) -> tuple[dict[str, str], set[str], int]:
        """Digest every match: ``(digests, volatile keys, files read)``."""
        digests: dict[str, str] = {}
        volatile: set[str] = set()
        old_cache = self._cache
        new_cache: dict[str, CachedDigest] = {}
        cache_get = old_cache.get
        signature = treehash.stat_signature  # looked up per compute (tests swap it)
        is_reg = stat.S_ISREG
        links = self._links
        prestat = self._prestat.get
        evaluate = self._evaluate
        should_stop = self.should_stop
        hashed = 0
        self._cached_now = 0
        self._read_now = 0
        for key, path in matches.items():
            st = prestat(key)
            if st is not None and is_reg(st.st_mode):
                cached = cache_get(key)
                if cached is not None and cached.trusted and cached.signature == signature(st):
                    digests[key] = cached.digest
                    new_cache[key] = cached
                    if st.st_nlink > 1 or key in links:
                        volatile.add(key)
                    continue
            if should_stop is not None and should_stop():
                self._stop()
            hashed += evaluate(key, path, st, False, old_cache, new_cache, digests, volatile)
        # Deleted files drop out of the cache here.
        self._cache = new_cache
        return digests, volatile, hashed

    def _digest_changes(
        self, expanded: bool, touched: set[str]
    ) -> tuple[set[str], set[str], int]:
        """Digest what changed since the last compute.

        Returns the keys whose digest changed (new, or vanished when read), the
        keys no longer matched, and how many files were read.
        """
        matches, digests, cache, volatile = self._matches, self._digests, self._cache, self._volatile
        removed: set[str] = set()
        if expanded:
            current = matches.keys()
            removed = digests.keys() - current
            for key in removed:
                del digests[key]
                cache.pop(key, None)
                volatile.discard(key)
            todo = current - digests.keys()  # new, and any that vanished when last read
        else:
            todo = set(self._pending)
        self._pending = set()
        todo |= volatile
        todo.update(key for key in touched if key in matches)
        changed: set[str] = set()
        hashed = 0
        self._cached_now = 0
        self._read_now = 0
        should_stop = self.should_stop
        for key in todo:
            if should_stop is not None and should_stop():
                self._stop()
            before = digests.get(key)
            hashed += self._evaluate(
                key, matches[key], None, key in touched, cache, cache, digests, volatile
            )
            if digests.get(key) != before:
                changed.add(key)
        return changed, removed, hashed

    def _evaluate(
        self,
        key: str,
        path: str,
        st: os.stat_result | None,
        force: bool,
        old_cache: dict[str, CachedDigest],
        new_cache: dict[str, CachedDigest],
        digests: dict[str, str],
        volatile: set[str],
    ) -> int:
        """Digest one match into ``digests``; return 1 if it was read, else 0.

        ``force``: read it whatever its stat says (an event named it). A key whose
        digest a journal cannot vouch for next time goes into ``volatile``.
        """
        volatile.discard(key)
        if st is None:
            st = self._prestat.get(key)
        if st is None:
            try:
                st = os.stat(path)
            except OSError as exc:
                new_cache.pop(key, None)
                if os.path.lexists(path):  # dangling or looping link
                    digests[key] = error_marker(exc)
                    volatile.add(key)
                else:  # vanished since it was listed: not state
                    digests.pop(key, None)
                    self._pending.add(key)
                return 0
        if not stat.S_ISREG(st.st_mode):
            new_cache.pop(key, None)
            digests[key] = self._non_file_marker(path, st)
            volatile.add(key)
            return 0
        cached = old_cache.get(key)
        read = 0
        if (
            not force
            and cached is not None
            and cached.trusted
            and cached.signature == treehash.stat_signature(st)
        ):
            digests[key] = cached.digest
            new_cache[key] = cached
        else:
            self._read_now += 1
            result = treehash.hash_file(path, self.should_stop)
            read = 1
            if isinstance(result, str):  # errors are not cached: tried again next time
                new_cache.pop(key, None)
                digests[key] = result
                volatile.add(key)
                return read
            digests[key] = result.digest
            new_cache[key] = result
            self._cached_now += 1
            cached = result
        # Inside the racy window, another path to the same inode, or a link whose
        # target may live where no watch is: a journal cannot vouch for these.
        if not cached.trusted or st.st_nlink > 1 or key in self._links:
            volatile.add(key)
        return read

    @staticmethod
    def _non_file_marker(path: str, st: os.stat_result) -> str:
        if stat.S_ISDIR(st.st_mode):  # a link to a directory: recorded, not followed
            return StateFingerprint._link_marker(path)
        return f"special:{stat.S_IFMT(st.st_mode):o}"

    @staticmethod
    def _link_marker(path: str) -> str:
        try:
            return "symlink:" + os.readlink(path)
        except OSError as exc:
            return error_marker(exc)

    def _stop(self) -> None:
        """The budget ran out: say how far this compute got, and stop it."""
        self._stats = {**self._stats, "hashed": self._read_now, "mode": "interrupted"}
        raise DeadlineReached(
            f"while fingerprinting the state ({', '.join(self._patterns)}): "
            f"{self._read_now} file(s) read before it ran out"
        )


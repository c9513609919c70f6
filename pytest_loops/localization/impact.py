"""Affected reruns: which tests a change can reach (block fingerprints, as pytest-testmon does)::

    impact = ImpactMap.from_spectra(spectra, workdir)   # after a full run under coverage
    impact.save(run_dir / "impact.json")
    ...revise...
    impact = ImpactMap.load(run_dir / "impact.json")    # None when missing, corrupt or old
    selection = impact.affected(workdir) if impact else Selection.everything(...)
    if selection.run_all: run the loop's full checks (and rebuild the map)
    else: spectra = collect_spectra(workdir, selection.tests, ...)
          impact = impact.update(spectra, workdir)
    # before SUCCESS: one confirm run of the loop's full checks, always

A test's blocks are the innermost functions (methods, nested functions) of the
lines it ran, each fingerprinted by its AST (comments and blank lines do not
count). A test is affected when it failed last time or a block it ran has a
different fingerprint now. The selection falls back to every test, with the
reason, whenever it cannot vouch for a subset: no map, a map made from a run in
which not every test ran (collection errors, ``-x``), a test the map does not
know, a new, removed or changed non-Python file (data files count), a new or
removed Python file, a changed Python file no test ran, a change to module-level
code (imports, constants, class bodies, signatures: their effects reach tests
that never run a line of that module), a change to a function that ran outside
any one test (at import, or in a fixture wider than a function) or that no test
ran. Code run in subprocesses the tests start, in threads that outlive a test,
and state one test leaves for another (caches, globals), is not seen: that is
what the confirm run is for.

Files and blocks are hashed by :mod:`pytest_loops.progress.treehash`. A saved map
names its format (:data:`MAP_FORMAT`); a map of another format, such as one
whose digests were taken another way, loads as None, so it means "run
everything", never a wrong subset.

:func:`peer_tests` picks what to run with failing tests so that their spectrum
(:mod:`pytest_loops.localization.suspects`) has passing tests in it.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import os
import re
import time
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.limits import is_venv, read_own_text
from pytest_loops.localization.spectra import FAILING, Spectra, is_test_file, write_json
from pytest_loops.progress import treehash

__all__ = ["MAP_FORMAT", "ImpactMap", "Selection", "peer_tests", "snapshot"]

# What the map never tracks: the VCS, bytecode, the harness's artifacts, and the caches every
# test run rewrites (pytest's, hypothesis's, coverage's data file): tracking them would make
# every map stale. Everything else is tracked, data files and tool directories included (a
# `node_modules/x.txt` or `.coverage.x` the code reads is an input like any other), and a
# virtual environment is told by its pyvenv.cfg (a regular file), never by its name: a
# package directory named `venv` or `site-packages` is code the guard judges.
_NEVER_TRACKED = (".git", "__pycache__", "*.pyc", ".pytest-loops", ".pytest_cache", ".hypothesis", ".coverage")


def peer_tests(failing: Sequence[str], impact_map: ImpactMap | None = None) -> list[str]:
    """What to run with the failing tests so their spectrum has passing tests in it.

    With an impact map: the failing tests and every test that ran a non-test file
    they ran. Without one: the failing tests' files (``tests/test_x.py``).
    """
    if impact_map is not None and all(t in impact_map.tests for t in failing):
        files = {f for t in failing for f in impact_map.files_of(t) if not is_test_file(f)}
        peers = [t for t in impact_map.tests if t not in failing and files & impact_map.files_of(t)]
        return [*failing, *peers]
    seen: dict[str, None] = {}
    for nodeid in failing:
        seen.setdefault(nodeid.split("::", 1)[0], None)
    return list(seen)


# -------------------------------------------------------------- code blocks


@dataclass(frozen=True)
class _FileBlocks:
    """A Python file's blocks: module-level code and every function, fingerprinted."""

    skeleton: str
    functions: dict[str, str]
    owner: dict[int, str]  # body line -> innermost function (absent: module level)


def _fingerprint(node: ast.AST) -> str:
    return treehash.bytes_digest(ast.dump(node).encode("utf-8"))


def _scan(source: bytes) -> _FileBlocks:
    """Raises SyntaxError (or ValueError for NUL bytes) when the file does not parse."""
    tree = ast.parse(source)
    functions: dict[str, str] = {}
    owner: dict[int, str] = {}
    defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                if name in functions:  # redefined: f, f#2, f#3 ...
                    n = 2
                    while f"{name}#{n}" in functions:
                        n += 1
                    name = f"{name}#{n}"
                functions[name] = _fingerprint(child)
                # pre-order: an inner function's lines overwrite its outer one's
                for line in range(child.body[0].lineno, (child.end_lineno or child.lineno) + 1):
                    owner[line] = name
                defs.append(child)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    # what is left without function bodies runs at import: signatures, decorators,
    # defaults, class bodies, constants, imports
    for node in defs:
        node.body = []
    return _FileBlocks(skeleton=_fingerprint(tree), functions=functions, owner=owner)


class _BlockCache:
    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, _FileBlocks | None] = {}

    def get(self, path: str) -> _FileBlocks | None:
        if path not in self.files:
            try:
                self.files[path] = _scan(Path(self.root, path).read_bytes())
            except (OSError, SyntaxError, ValueError):
                self.files[path] = None
        return self.files[path]


def _deps(files: Mapping[str, Iterable[int]], blocks: _BlockCache) -> dict[str, str]:
    """``{"file::function": fingerprint}`` of the functions these lines ran in."""
    deps: dict[str, str] = {}
    for path, lines in files.items():
        scanned = blocks.get(path) if path.endswith(".py") else None
        if scanned is None:
            continue
        for line in lines:
            name = scanned.owner.get(line)
            if name is not None:
                deps[f"{path}::{name}"] = scanned.functions[name]
    return deps


# ---------------------------------------------------------------- the tree


@functools.lru_cache(maxsize=32)
def _globs(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One compiled regex for ``patterns`` (fnmatch's, case-sensitive); None for none."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


def _tracked(name: str, rel: str, exclude: Sequence[str]) -> bool:
    never = _globs(_NEVER_TRACKED)
    if never is not None and never.match(name):
        return False
    excluded = _globs(tuple(exclude))
    return excluded is None or not (excluded.match(rel) or excluded.match(name))


# What stands in for the stat of a snapshot entry that is not a file's content.
_NO_STAT = [-1, 0, 0, 0, 0]
# The digest of a file a map did not read (no test ran it): its stat signature after this.
STAT_ONLY = "stat:"


def _snapshot(root: str, exclude: Sequence[str],
              previous: Mapping[str, list[Any]] | None = None,
              previous_at: int = 0, hash_only: Container[str] | None = None) -> dict[str, list[Any]]:
    """``{file: [digest, *stat signature]}`` of every tracked file.

    The digest and the stat signature are :mod:`~pytest_loops.progress.treehash`'s.
    A file whose stat is unchanged and was old enough when last hashed keeps its
    digest (git's racy-clean rule); everything else is read. With ``hash_only``
    (the files a run covered), any other file is not read: its entry stands for
    its size, mtime and inode (:data:`STAT_ONLY`), so a later change of any of
    them counts as a change (the map then runs every test); so it does for an
    entry of ``previous`` that stands for a stat.
    """
    files: dict[str, list[Any]] = {}
    # a file written this recently may change again within its timestamp's granularity
    # unseen by its stat: it is read even when not covered (git's racy-clean rule)
    fresh_from = time.time_ns() - treehash.RACY_WINDOW_NS
    for dirpath, dirnames, filenames in os.walk(root):
        base = os.path.relpath(dirpath, root)
        base = "" if base == "." else base.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(
            d for d in dirnames
            if _tracked(d, base + d, exclude)
            and not is_venv(os.path.join(dirpath, d))
        )
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full):  # not descended into (no loops): its target is recorded
                try:
                    files[base + d] = [f"link:{os.readlink(full)}", *_NO_STAT]
                except OSError as exc:
                    files[base + d] = [treehash.error_marker(exc), *_NO_STAT]
        for name in filenames:
            rel = base + name
            if not _tracked(name, rel, exclude):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError as exc:
                files[rel] = [treehash.error_marker(exc), *_NO_STAT]
                continue
            sig = list(treehash.stat_signature(st))
            old = previous.get(rel) if previous else None
            if old is not None and str(old[0]).startswith(STAT_ONLY):  # never read: compared by its stat
                files[rel] = [_stat_marker(st), *sig]
            elif old is not None and old[1:] == sig and st.st_mtime_ns < previous_at - treehash.RACY_WINDOW_NS:
                files[rel] = [old[0], *sig]
            elif hash_only is not None and rel not in hash_only and st.st_mtime_ns < fresh_from:
                files[rel] = [_stat_marker(st), *sig]
            else:
                files[rel] = [_digest(full), *sig]
    return files


def _stat_marker(st: os.stat_result) -> str:
    # size, mtime and inode: not ctime, which the harness's own chmod of guarded files
    # moves (a hint map only: a rewrite that restores mtime and size goes unseen)
    return f"{STAT_ONLY}{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def snapshot(root: str | os.PathLike[str], exclude: Sequence[str] = ()) -> tuple[dict[str, list[Any]], int]:
    """Every tracked file under ``root`` as a map's baseline records it, and when (ns)."""
    at = time.time_ns()
    return _snapshot(os.path.realpath(os.fspath(root)), exclude), at


def _digest(path: str) -> str:
    """A file's digest, or a marker of why there is none (never blocks on a FIFO)."""
    result = treehash.hash_file(path)
    return result.digest if isinstance(result, treehash.CachedDigest) else result


# -------------------------------------------------------------- impact map


@dataclass(frozen=True)
class Selection:
    """Which tests to run next, and why.

    ``run_all``: the map cannot vouch for a subset; run the loop's full checks
    (``tests`` then lists every test the caller named).
    """

    tests: list[str]
    run_all: bool
    reason: str

    @classmethod
    def everything(cls, tests: Sequence[str], reason: str) -> Selection:
        return cls(list(tests), True, reason)


# /2: digests by treehash (sha256) and its stat signature. A map of /1 (blake2b
# digests) loads as None: compared with digests taken another way, every file
# would look changed at best, so it is not read at all and the loop runs everything.
MAP_FORMAT = "pytest-loops.impact/2"


@dataclass
class _TestRecord:
    outcome: str
    deps: dict[str, str]


class ImpactMap:
    """Each test's executed code blocks and their fingerprints; picks affected tests.

    Build it with :meth:`from_spectra` after a run of every test, refresh it with
    :meth:`update` after a run of a subset. The file snapshot stays the one of the
    full run (the baseline); Python files that differed from it at an update are
    remembered as ``dirty`` and re-parsed on every later :meth:`affected`, so a
    test that did not run since keeps being compared with what it last ran.
    """

    def __init__(self, *, root: str, tests: dict[str, _TestRecord], shared: dict[str, str],
                 skeletons: dict[str, str], functions: dict[str, dict[str, str]],
                 files: dict[str, list[Any]], snapshot_at: int, exclude: Sequence[str] = (),
                 dirty: Iterable[str] = (), incomplete: str = "") -> None:
        self.root = root
        self.tests = tests
        self.shared = shared
        self.skeletons = skeletons
        self.functions = functions
        self.files = files
        self.snapshot_at = snapshot_at
        self.exclude = tuple(exclude)
        self.dirty = set(dirty)
        self.incomplete = incomplete

    # -- building -----------------------------------------------------------------

    @classmethod
    def from_spectra(cls, spectra: Spectra, workdir: str | os.PathLike[str] | None = None, *,
                     exclude: Sequence[str] = (),
                     before: tuple[dict[str, list[Any]], int] | None = None,
                     previous: ImpactMap | None = None, covered_only: bool = False) -> ImpactMap:
        """A fresh map (a new baseline) from a run of every test under coverage.

        ``exclude``: globs (relative to the root, or file names) of files that
        are not inputs of the tests, e.g. files the tests themselves write.
        ``before``: the :func:`snapshot` taken just before that run (and when),
        so files the run itself wrote are not part of the baseline; default: now,
        reusing the digests of ``previous`` (an earlier map of the same root) where
        the stat says nothing changed. ``covered_only``: read only the files the run
        covered and record the others by their size, mtime and inode, so a failing
        iteration reads O(changed or covered) files; for a map that is a hint (which
        tests a narrowed rerun adds), never one a verdict rests on.
        """
        root = os.path.realpath(os.fspath(workdir)) if workdir is not None else spectra.root
        blocks = _BlockCache(root)
        measured = sorted({f for t in spectra.outcomes for f in spectra.ran(t)}
                          | {f for per_test in spectra.lines.values() for f in per_test}
                          | set(spectra.shared))
        if before is not None:
            files, snapshot_at = before
        else:
            snapshot_at = time.time_ns()
            reuse = previous if previous is not None and previous.root == root else None
            files = _snapshot(root, exclude, reuse.files if reuse else None,
                              reuse.snapshot_at if reuse else 0,
                              hash_only=set(measured) if covered_only else None)
        skeletons: dict[str, str] = {}
        functions: dict[str, dict[str, str]] = {}
        for path in measured:
            scanned = blocks.get(path) if path.endswith(".py") else None
            if scanned is not None and path in files:
                skeletons[path] = scanned.skeleton
                functions[path] = dict(scanned.functions)
        tests = {t: _TestRecord(o, _deps(spectra.ran(t), blocks))
                 for t, o in spectra.outcomes.items()}
        return cls(root=root, tests=tests, shared=_deps(spectra.shared, blocks),
                   skeletons=skeletons, functions=functions, files=files,
                   snapshot_at=snapshot_at, exclude=exclude, incomplete=_incomplete(spectra))

    def update(self, spectra: Spectra, workdir: str | os.PathLike[str] | None = None) -> ImpactMap:
        """This map with the tests of a partial run re-measured (a new map).

        Tests that did not run keep what they last ran. Use :meth:`from_spectra`
        instead after a run of every test.
        """
        root = os.path.realpath(os.fspath(workdir)) if workdir is not None else self.root
        blocks = _BlockCache(root)
        tests = dict(self.tests)
        for nodeid, outcome in spectra.outcomes.items():
            tests[nodeid] = _TestRecord(outcome, _deps(spectra.ran(nodeid), blocks))
        shared = dict(self.shared)
        for block, fp in _deps(spectra.shared, blocks).items():
            shared.setdefault(block, fp)  # a changed shared block keeps forcing full runs
        skeletons, functions = dict(self.skeletons), dict(self.functions)
        current = _snapshot(root, self.exclude, self.files, self.snapshot_at)
        measured = {f for t in spectra.outcomes for f in spectra.ran(t)}
        for path in sorted(measured - set(skeletons)):
            scanned = blocks.get(path) if path.endswith(".py") else None
            # only a file unchanged since the baseline can join it
            if scanned is not None and path in self.files and current.get(path, [None])[0] == self.files[path][0]:
                skeletons[path] = scanned.skeleton
                functions[path] = dict(scanned.functions)
        dirty = set(self.dirty) | {p for p, entry in current.items()
                                   if p.endswith(".py") and p in self.files
                                   and entry[0] != self.files[p][0]}
        return ImpactMap(root=self.root, tests=tests, shared=shared, skeletons=skeletons,
                         functions=functions, files=self.files, snapshot_at=self.snapshot_at,
                         exclude=self.exclude, dirty=dirty, incomplete=self.incomplete)

    def files_of(self, nodeid: str) -> set[str]:
        record = self.tests.get(nodeid)
        return {block.rsplit("::", 1)[0] for block in record.deps} if record else set()

    # -- selecting ----------------------------------------------------------------

    def affected(self, workdir: str | os.PathLike[str],
                 all_tests: Sequence[str] | None = None) -> Selection:
        """The failing tests plus the tests whose executed blocks changed, in ``all_tests`` order.

        ``all_tests`` defaults to every test the map knows. Falls back to
        ``Selection(all_tests, run_all=True, reason)`` whenever a subset cannot be
        trusted (see the module docstring).
        """
        tests = list(all_tests) if all_tests is not None else list(self.tests)
        root = os.path.realpath(os.fspath(workdir))
        if root != self.root:
            return Selection.everything(tests, f"the impact map was made for {self.root}, not {root}")
        if self.incomplete:
            return Selection.everything(tests, f"the run the impact map was made from was incomplete: "
                                               f"{self.incomplete}")
        unknown = [t for t in tests if t not in self.tests]
        if unknown:
            return Selection.everything(tests, f"{len(unknown)} test(s) unknown to the impact map "
                                               f"(first: {unknown[0]})")
        why = self._stale_files(root)
        if isinstance(why, str):
            return Selection.everything(tests, why)
        changed, current_functions = why
        for block, fp in self.shared.items():
            path, name = block.rsplit("::", 1)
            if path in current_functions and current_functions[path].get(name) != fp:
                return Selection.everything(tests, f"{block} changed and it ran outside any one test "
                                                   "(at import or in a shared fixture)")
        used = {block for record in self.tests.values() for block in record.deps} | set(self.shared)
        for block in changed:
            if block not in used:
                return Selection.everything(tests, f"{block} changed and no test ran it "
                                                   "(it may run in a subprocess)")
        failing: list[str] = []
        touched: list[str] = []
        hit: set[str] = set()
        for nodeid in tests:
            record = self.tests[nodeid]
            if record.outcome in FAILING:
                failing.append(nodeid)
                continue
            moved = [b for b, fp in record.deps.items()
                     if (path := b.rsplit("::", 1)[0]) in current_functions
                     and current_functions[path].get(b.rsplit("::", 1)[1]) != fp]
            if moved:
                touched.append(nodeid)
                hit.update(moved)
        selected = set(failing) | set(touched)
        ordered = [t for t in tests if t in selected]
        parts = [f"{len(failing)} failing"]
        if touched:
            shown = ", ".join(sorted(hit)[:3]) + (f" and {len(hit) - 3} more" if len(hit) > 3 else "")
            parts.append(f"{len(touched)} affected by changes to {shown}")
        elif not changed:
            parts.append("no code change since the last run")
        return Selection(ordered, False, f"{len(ordered)} of {len(tests)} test(s): " + "; ".join(parts))

    def changed_suspects(self, workdir: str | os.PathLike[str], failing: Sequence[str]) -> list[tuple[str, float]]:
        """The functions that changed since the map was made and that the ``failing`` tests
        ran when it was made, by Ochiai over the map's tests (``[("file::name", score)]``,
        best first); [] when the map cannot say (another root, changes it cannot vouch for)."""
        root = os.path.realpath(os.fspath(workdir))
        if root != self.root or self.incomplete:
            return []
        why = self._stale_files(root)
        if isinstance(why, str):
            return []
        changed, _ = why
        bad = set(failing)
        ranked: list[tuple[str, float]] = []
        for block in changed:
            ran = {t for t, r in self.tests.items() if block in r.deps}
            hits = len(ran & bad)
            if hits:
                ranked.append((block, hits / ((len(bad) * len(ran)) ** 0.5)))
        return sorted(ranked, key=lambda item: (-item[1], item[0]))

    def _stale_files(self, root: str) -> str | tuple[set[str], dict[str, dict[str, str]]]:
        """A reason to run everything, or (changed function blocks, current functions of
        every Python file that changed since the baseline or is dirty)."""
        if not os.path.isdir(root):
            return f"{root} is not a directory"
        current = _snapshot(root, self.exclude, self.files, self.snapshot_at)
        python: set[str] = set(self.dirty)
        for path in sorted(set(current) | set(self.files)):
            now, then = current.get(path), self.files.get(path)
            if now is not None and then is not None and now[0] == then[0]:
                continue
            what = "added" if then is None else "removed" if now is None else "changed"
            if not path.endswith(".py"):
                return f"non-Python file {path} {what}"
            if what != "changed":
                return f"Python file {path} {what}"
            python.add(path)
        blocks = _BlockCache(root)
        functions: dict[str, dict[str, str]] = {}
        changed: set[str] = set()
        for path in sorted(python):
            if path not in current:
                return f"Python file {path} removed"
            if path not in self.skeletons:
                return f"{path} changed and no test ran it"
            scanned = blocks.get(path)
            if scanned is None:
                return f"{path} does not parse"
            if scanned.skeleton != self.skeletons[path]:
                return f"module-level code in {path} changed (imports, constants, signatures or class bodies)"
            functions[path] = scanned.functions
            baseline = self.functions.get(path, {})
            changed.update(f"{path}::{name}" for name in set(baseline) | set(scanned.functions)
                           if baseline.get(name) != scanned.functions.get(name))
        return changed, functions

    # -- persistence --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MAP_FORMAT,
            "root": self.root,
            "snapshot_at": self.snapshot_at,
            "exclude": list(self.exclude),
            "files": self.files,
            "skeletons": self.skeletons,
            "functions": self.functions,
            "shared": self.shared,
            "dirty": sorted(self.dirty),
            "incomplete": self.incomplete,
            "tests": {t: {"outcome": r.outcome, "deps": r.deps} for t, r in self.tests.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the map as JSON (atomically)."""
        write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ImpactMap | None:
        """The saved map, or None when it is missing, unreadable or of another format."""
        try:
            raw = json.loads(read_own_text(path))
        except (OSError, ValueError):
            return None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Any) -> ImpactMap | None:
        """The map :meth:`to_dict` gave, or None when ``raw`` is not one of this format."""
        try:
            if not isinstance(raw, dict) or raw.get("format") != MAP_FORMAT:
                return None
            tests = {str(t): _TestRecord(str(r["outcome"]), {str(b): str(fp) for b, fp in r["deps"].items()})
                     for t, r in raw["tests"].items()}
            return cls(
                root=str(raw["root"]), tests=tests,
                shared={str(b): str(fp) for b, fp in raw["shared"].items()},
                skeletons={str(p): str(fp) for p, fp in raw["skeletons"].items()},
                functions={str(p): {str(n): str(fp) for n, fp in fs.items()}
                           for p, fs in raw["functions"].items()},
                files={str(p): list(entry) for p, entry in raw["files"].items()
                       if isinstance(entry, list) and len(entry) == 1 + len(_NO_STAT)},
                snapshot_at=int(raw["snapshot_at"]),
                exclude=[str(e) for e in raw.get("exclude", ())],
                dirty=[str(d) for d in raw.get("dirty", ())],
                incomplete=str(raw.get("incomplete") or ""),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def _incomplete(spectra: Spectra) -> str:
    """Why a run cannot be a baseline ("" if it can): not every test ran to an outcome."""
    if spectra.collect_errors:
        more = f" and {len(spectra.collect_errors) - 1} more" if len(spectra.collect_errors) > 1 else ""
        return f"collection error in {spectra.collect_errors[0] or 'the session'}{more}"
    if spectra.exit_code in (2, 3, 4):
        return f"pytest exited {spectra.exit_code}"
    if spectra.collected is not None and spectra.collected > len(spectra.outcomes):
        return f"{spectra.collected - len(spectra.outcomes)} collected test(s) did not run"
    return ""


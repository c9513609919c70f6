"""Coverage intelligence: fault localization and affected-test selection.

Both start from the same measurement: one pytest subprocess run under coverage
with one context per test (the :mod:`pytest_loops.localization.covctx` plugin), read back as
:class:`Spectra` -- each test's outcome and the lines it ran in each project file.

Fault localization (spectrum-based, Ochiai)::

    spectra = collect_spectra(workdir, ["tests/test_calc.py"], data_file=run_dir / "spectra.json")
    suspects = rank_suspects(spectra, top=10)      # highest score first
    write_suspects(iteration_dir / "suspects.json", suspects)
    context.suspects = format_suspects(suspects)   # "calc.py:12 in sub() (0.71): return a - b"

``Ochiai(line) = failed(line) / sqrt(total_failed * (failed(line) + passed(line)))``.
A useful spectrum needs passing tests that run the same code as the failing
ones: :func:`peer_tests` picks them (the failing tests' files, or with an impact
map every test that ran the same project files). Test files, ``conftest.py``
and code outside the project root are never suspects. Lines that run only at
import time (module-level code) are in no test's context, so they are not ranked.

Affected reruns (block fingerprints, as pytest-testmon does)::

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

Narrowing a check::

    command = narrow_pytest_command("python -m pytest -q tests/")   # None if not plain pytest
    command.with_targets(selection.tests)   # argv running only those tests

Node ids are pytest's, relative to its rootdir: run the child from the rootdir.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import tokenize
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.core.checks import CHILD_ENV
from pytest_loops.localization.covctx import ENV as COVCTX_ENV
from pytest_loops.localization.covctx import FORMAT as SPECTRA_FORMAT
from pytest_loops.localization.covctx import SHARED
from pytest_loops.localization.scopes import scopes_of
from pytest_loops.progress.matching import DEFAULT_EXCLUDES

__all__ = [
    "ImpactMap",
    "PytestCommand",
    "Selection",
    "Spectra",
    "SpectraError",
    "Suspect",
    "collect_spectra",
    "format_suspects",
    "group_suspects",
    "narrow_pytest_command",
    "ochiai",
    "peer_tests",
    "rank_suspects",
    "read_spectra",
    "spectra_command",
    "write_suspects",
]

PLUGIN = "pytest_loops.localization.covctx"
FAILING = frozenset({"failed", "error"})
PASSING = frozenset({"passed", "xpassed"})
OUTPUT_TAIL_CHARS = 4000

# Directories that are never part of the code under test (virtualenvs, tool caches).
_NEVER_TRACKED = (*DEFAULT_EXCLUDES, ".venv", "venv", ".tox", ".nox", "node_modules",
                  "site-packages", "dist-packages", "*.egg-info", ".eggs")
_OMIT_FROM_COVERAGE = ("*/site-packages/*", "*/dist-packages/*", "*/.pytest-loops/*",
                       "*/.tox/*", "*/.nox/*")
_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test|conftest)\.py\Z")


class SpectraError(RuntimeError):
    """No per-test coverage could be collected; run the checks without it."""


# --------------------------------------------------------------------- spectra


@dataclass(frozen=True)
class Spectra:
    """What one pytest run under per-test coverage saw.

    ``lines[nodeid][file]`` are the lines the test ran (setup, call, teardown);
    ``shared[file]`` the lines run outside any one test (imports, collection,
    fixtures wider than a function). Files are ``/``-separated and relative to
    ``root``. ``outcomes`` maps node ids to passed, failed, error, skipped, xfailed
    or xpassed; ``test_files`` are the files that define collected tests.
    """

    root: str
    outcomes: Mapping[str, str]
    lines: Mapping[str, Mapping[str, frozenset[int]]]
    shared: Mapping[str, frozenset[int]] = field(default_factory=dict)
    test_files: frozenset[str] = frozenset()
    collect_errors: tuple[str, ...] = ()
    exit_code: int | None = None
    output: str = ""
    collected: int | None = None

    @property
    def failed(self) -> list[str]:
        """Node ids that failed or errored, in run order."""
        return [t for t, o in self.outcomes.items() if o in FAILING]

    @property
    def passed(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o in PASSING]

    def files_of(self, nodeid: str) -> frozenset[str]:
        return frozenset(self.lines.get(nodeid, {}))


def _omit_patterns(root: str) -> list[str]:
    omit = list(_OMIT_FROM_COVERAGE)
    # a virtualenv inside the project (./.venv) is not the project's code
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        real = os.path.realpath(prefix)
        if _inside(real, root):
            omit.append(os.path.join(real, "*"))
    return omit


def _inside(path: str, root: str) -> bool:
    rel = os.path.relpath(path, root)
    return not (rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel))


def _package_parent(python: str | None) -> str | None:
    """The directory to add to a child's PYTHONPATH so it can import this package, or None.

    None when this interpreter finds the package on its own path (installed, or
    an editable install), and never a site-packages directory: another
    interpreter must have pytest-loops installed itself.
    """
    parent = os.path.realpath(Path(__file__).resolve().parent.parent)
    if os.path.basename(parent) in ("site-packages", "dist-packages"):
        return None
    same = python is None or os.path.realpath(python) == os.path.realpath(sys.executable)
    if same:
        cwd = os.path.realpath(os.getcwd())
        if parent in {os.path.realpath(p) for p in sys.path if p} - {cwd}:
            return None
    return parent


def spectra_command(workdir: str | os.PathLike[str], test_args: Sequence[str], *,
                    data_file: str | os.PathLike[str], python: str | None = None,
                    pytest_args: Sequence[str] = (),
                    base_env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment additions of one pytest run under per-test coverage.

    For callers that run commands their own way (with a budget): run ``argv`` in
    ``workdir`` with the additions on top of ``base_env`` (default ``os.environ``),
    then :func:`read_spectra` reads ``data_file``. ``test_args`` are node ids,
    files or directories; ``pytest_args`` go before them.
    """
    root = os.path.realpath(os.fspath(workdir))
    argv = [python or sys.executable, "-m", "pytest", "-p", PLUGIN,
            *[str(a) for a in pytest_args], *[str(a) for a in test_args]]
    env = {
        COVCTX_ENV: json.dumps({"out": os.path.abspath(os.fspath(data_file)), "root": root,
                                "omit": _omit_patterns(root)}),
        CHILD_ENV: "1",
    }
    parent = _package_parent(python)
    if parent:
        # last: the project's own path entries win
        existing = (os.environ if base_env is None else base_env).get("PYTHONPATH", "")
        parts = [p for p in existing.split(os.pathsep) if p]
        if parent not in parts:
            env["PYTHONPATH"] = os.pathsep.join([*parts, parent])
    return argv, env


def collect_spectra(workdir: str | os.PathLike[str], test_args: Sequence[str], *,
                    python: str | None = None, pytest_args: Sequence[str] = (),
                    data_file: str | os.PathLike[str] | None = None,
                    timeout: float | None = None,
                    env: Mapping[str, str] | None = None,
                    runner: Any = None) -> Spectra:
    """Run ONE pytest subprocess over ``test_args`` with a coverage context per test.

    ``data_file`` (default: a temporary file) receives the raw result and
    ``<data_file>.out`` the run's output. ``env`` replaces ``os.environ`` as the
    base environment. ``runner`` (default: a new
    :class:`~pytest_loops.runtime.process.ProcessRunner`) runs it, so nothing the tests
    start outlives the run. Failing tests are data, not errors:
    :class:`SpectraError` means no coverage could be collected at all (pytest
    could not start, the plugin could not load, the run timed out).
    """
    cwd = os.fspath(workdir)
    base = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="pytest-loops-spectra-") as scratch:
        data_path = Path(data_file) if data_file is not None else Path(scratch, "spectra.json")
        data_path.parent.mkdir(parents=True, exist_ok=True)
        data_path.unlink(missing_ok=True)
        argv, extra = spectra_command(cwd, test_args, data_file=data_path, python=python,
                                      pytest_args=pytest_args, base_env=base)
        out_path = data_path.with_name(data_path.name + ".out")
        exit_code = _run(argv, cwd, {**base, **extra}, out_path, timeout, runner)
        return read_spectra(data_path, exit_code=exit_code, output=_tail(out_path))


def _run(argv: list[str], cwd: str, env: Mapping[str, str], out_path: Path,
         timeout: float | None, runner: Any = None) -> int:
    # Through the runner like every command of a loop: a test that starts a daemon
    # (a background or `setsid` child) must not leave it running, and a SIGTERM or
    # Ctrl-C of the harness must stop this run with its whole process tree.
    if shutil.which(argv[0]) is None:
        raise SpectraError(f"could not start {argv[0]}: no such executable")
    if runner is None:
        from pytest_loops.runtime.process import ProcessRunner

        runner = ProcessRunner()
    result = runner.run(shlex.join(argv), cwd=cwd, env=dict(env), timeout=timeout, output_path=out_path)
    if result.start_error:
        raise SpectraError(f"could not start {argv[0]}: {result.start_error}")
    if result.timed_out:
        raise SpectraError(f"pytest under coverage timed out after {timeout:g}s")
    return result.exit_code


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - OUTPUT_TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_spectra(data_file: str | os.PathLike[str], *, exit_code: int | None = None,
                 output: str = "") -> Spectra:
    """Read what :mod:`pytest_loops.localization.covctx` wrote; :class:`SpectraError` if unusable."""
    path = Path(data_file)
    why = "pytest wrote no coverage data (did it start? is coverage installed for it?)"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpectraError(_with_output(why, output)) from None
    except (OSError, ValueError) as exc:
        raise SpectraError(f"{path}: unreadable coverage data ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != SPECTRA_FORMAT:
        raise SpectraError(f"{path}: not a {SPECTRA_FORMAT} file")
    if raw.get("error"):
        raise SpectraError(f"coverage could not start in the pytest run: {raw['error']}")
    try:
        contexts = raw["contexts"]
        lines = {ctx: {f: frozenset(ls) for f, ls in files.items()}
                 for ctx, files in contexts.items() if ctx != SHARED}
        return Spectra(
            root=str(raw["root"]),
            outcomes=dict(raw["outcomes"]),
            lines=lines,
            shared={f: frozenset(ls) for f, ls in contexts.get(SHARED, {}).items()},
            test_files=frozenset(raw.get("test_files", ())),
            collect_errors=tuple(raw.get("collect_errors", ())),
            exit_code=exit_code if exit_code is not None else raw.get("exitstatus"),
            output=output,
            collected=raw.get("collected"),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise SpectraError(f"{path}: malformed coverage data ({exc!r})") from None


def _with_output(message: str, output: str) -> str:
    last = [line for line in output.strip().splitlines() if line.strip()]
    return f"{message}: {last[-1].strip()}" if last else message


# ------------------------------------------------------------------ suspects


@dataclass(frozen=True)
class Suspect:
    """A line ranked by how strongly failing tests point at it."""

    file: str
    line: int
    score: float
    source: str
    scope: str = ""  # the enclosing function or class: "windowed()", "class Cart"; "" at module level

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "score": round(self.score, 4),
                "source": self.source, "scope": self.scope}

    @property
    def where(self) -> str:
        """``more.py:1078 in windowed()`` (just ``file:line`` at module level)."""
        return f"{self.file}:{self.line} in {self.scope}" if self.scope else f"{self.file}:{self.line}"


def ochiai(failed_here: int, passed_here: int, total_failed: int) -> float:
    """``failed / sqrt(total_failed * (failed + passed))``; 0 when undefined."""
    if failed_here <= 0 or total_failed <= 0:
        return 0.0
    return failed_here / math.sqrt(total_failed * (failed_here + passed_here))


def is_test_file(path: str, test_files: Container[str] = frozenset()) -> bool:
    """A file that defines tests or fixtures (never a suspect)."""
    return path in test_files or _TEST_FILE.search(path) is not None


def rank_suspects(spectra: Spectra, *, top: int | None = None,
                  exclude_tests: bool = True) -> list[Suspect]:
    """Lines run by failing tests, by Ochiai score, highest first.

    Ties go to the line fewer passing tests ran, then by file and line, so the
    order is deterministic. Empty when no test failed.
    """
    failing, passing = spectra.failed, spectra.passed
    if not failing:
        return []
    tests_files = spectra.test_files
    fail_count: dict[tuple[str, int], int] = {}
    pass_count: dict[tuple[str, int], int] = {}
    for tests, counts in ((failing, fail_count), (passing, pass_count)):
        for nodeid in tests:
            for path, lines in spectra.lines.get(nodeid, {}).items():
                if exclude_tests and is_test_file(path, tests_files):
                    continue
                for line in lines:
                    counts[(path, line)] = counts.get((path, line), 0) + 1
    ranked = sorted(
        ((ochiai(f, pass_count.get(key, 0), len(failing)), pass_count.get(key, 0), key)
         for key, f in fail_count.items()),
        # rounded: equal scores computed along different paths must tie
        key=lambda item: (-round(item[0], 12), item[1], item[2]),
    )
    if top is not None:
        ranked = ranked[:max(0, top)]
    sources = _SourceCache(spectra.root)
    wanted: dict[str, list[int]] = {}
    for _, _, (path, line) in ranked:
        wanted.setdefault(path, []).append(line)
    scopes = {path: scopes_of(spectra.root, path, lines) for path, lines in wanted.items()}
    return [Suspect(file=path, line=line, score=score, source=sources.line(path, line),
                    scope=scopes[path][line])
            for score, _, (path, line) in ranked]


class _SourceCache:
    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, list[str]] = {}

    def line(self, path: str, line: int) -> str:
        if path not in self.files:
            try:
                with tokenize.open(os.path.join(self.root, path)) as f:
                    self.files[path] = f.read().splitlines()
            except (OSError, SyntaxError, UnicodeDecodeError):
                self.files[path] = []
        lines = self.files[path]
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def write_suspects(path: str | os.PathLike[str], suspects: Sequence[Suspect]) -> None:
    """``suspects.json``: a list of ``{file, line, score, source, scope}``, highest score first."""
    ordered = sorted(suspects, key=lambda s: -s.score)  # stable: ties keep their rank
    _write_json(Path(path), [s.to_dict() for s in ordered], indent=2)


def format_suspects(suspects: Sequence[Suspect], limit: int = 10) -> list[str]:
    """Prompt lines, e.g. ``calc.py:12 in sub() (0.71): return a - b``."""
    return [f"{s.where} ({s.score:.2f}): {s.source}" for s in suspects[:max(0, limit)]]


@dataclass(frozen=True)
class SuspectScope:
    """The suspect lines of one function or class (or one file's module level)."""

    file: str
    scope: str
    score: float  # its best line's
    lines: tuple[int, ...]  # in rank order

    def describe(self, total: int) -> str:
        """``windowed() in more.py (best 1.00; 7 of the 10 lines: 1062, 1078, ...)``."""
        name = f"{self.scope} in {self.file}" if self.scope else f"{self.file} (module level)"
        shown = ", ".join(str(n) for n in sorted(self.lines)[:8])
        more = ", ..." if len(self.lines) > 8 else ""
        count = f"{len(self.lines)} of the {total} lines" if total > 1 else "the one line"
        return f"{name} (best {self.score:.2f}; {count}: {shown}{more})"


def group_suspects(suspects: Sequence[Suspect]) -> list[SuspectScope]:
    """The suspects by enclosing function or class, best first: ties in score go to
    the scope holding more suspect lines, then to the one ranked first."""
    groups: dict[tuple[str, str], list[Suspect]] = {}
    for s in suspects:
        groups.setdefault((s.file, s.scope), []).append(s)
    order = {key: i for i, key in enumerate(groups)}
    ranked = sorted(groups.items(), key=lambda kv: (-round(kv[1][0].score, 12), -len(kv[1]), order[kv[0]]))
    return [SuspectScope(file=file, scope=scope, score=members[0].score,
                         lines=tuple(m.line for m in members))
            for (file, scope), members in ranked]


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
    return hashlib.blake2b(ast.dump(node).encode("utf-8"), digest_size=12).hexdigest()


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


def _tracked(name: str, rel: str, exclude: Sequence[str]) -> bool:
    if any(fnmatch.fnmatchcase(name, pat) for pat in _NEVER_TRACKED):
        return False
    return not any(fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(name, pat)
                   for pat in exclude)


_RACY_NS = 2_000_000_000  # a file changed this close to a snapshot is hashed again


def _snapshot(root: str, exclude: Sequence[str],
              previous: Mapping[str, list[Any]] | None = None,
              previous_at: int = 0) -> dict[str, list[Any]]:
    """``{file: [digest, size, mtime_ns, ctime_ns, inode]}`` of every tracked file.

    A file whose stat is unchanged and was old enough when last hashed keeps
    its digest (git's racy-clean rule); everything else is read.
    """
    files: dict[str, list[Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = os.path.relpath(dirpath, root)
        base = "" if base == "." else base.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(
            d for d in dirnames
            if _tracked(d, base + d, exclude)
            and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
        )
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full):  # not descended into (no loops): its target is recorded
                try:
                    files[base + d] = [f"link:{os.readlink(full)}", -1, 0, 0, 0]
                except OSError as exc:
                    files[base + d] = [f"error:{exc.errno}", -1, 0, 0, 0]
        for name in filenames:
            rel = base + name
            if not _tracked(name, rel, exclude):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError as exc:
                files[rel] = [f"error:{exc.errno}", -1, 0, 0, 0]
                continue
            sig = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            old = previous.get(rel) if previous else None
            if old is not None and old[1:] == sig and st.st_mtime_ns < previous_at - _RACY_NS:
                files[rel] = [old[0], *sig]
            else:
                files[rel] = [_digest(full), *sig]
    return files


def _digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                h.update(chunk)
    except OSError as exc:
        return f"error:{exc.errno}"
    return h.hexdigest()


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


_MAP_FORMAT = "pytest-loops.impact/1"


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
                     exclude: Sequence[str] = ()) -> ImpactMap:
        """A fresh map (a new baseline) from a run of every test under coverage.

        ``exclude``: globs (relative to the root, or file names) of files that
        are not inputs of the tests, e.g. files the tests themselves write.
        """
        root = os.path.realpath(os.fspath(workdir)) if workdir is not None else spectra.root
        snapshot_at = time.time_ns()
        files = _snapshot(root, exclude)
        blocks = _BlockCache(root)
        measured = sorted({f for per_test in spectra.lines.values() for f in per_test}
                          | set(spectra.shared))
        skeletons: dict[str, str] = {}
        functions: dict[str, dict[str, str]] = {}
        for path in measured:
            scanned = blocks.get(path) if path.endswith(".py") else None
            if scanned is not None and path in files:
                skeletons[path] = scanned.skeleton
                functions[path] = dict(scanned.functions)
        tests = {t: _TestRecord(o, _deps(spectra.lines.get(t, {}), blocks))
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
            tests[nodeid] = _TestRecord(outcome, _deps(spectra.lines.get(nodeid, {}), blocks))
        shared = dict(self.shared)
        for block, fp in _deps(spectra.shared, blocks).items():
            shared.setdefault(block, fp)  # a changed shared block keeps forcing full runs
        skeletons, functions = dict(self.skeletons), dict(self.functions)
        current = _snapshot(root, self.exclude, self.files, self.snapshot_at)
        measured = {f for t in spectra.outcomes for f in spectra.lines.get(t, {})}
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
            "format": _MAP_FORMAT,
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
        _write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ImpactMap | None:
        """The saved map, or None when it is missing, unreadable or of another format."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(raw, dict) or raw.get("format") != _MAP_FORMAT:
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
                       if isinstance(entry, list) and len(entry) == 5},
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


def _write_json(path: Path, payload: Any, indent: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------ narrowing


@dataclass(frozen=True)
class PytestCommand:
    """A plain pytest invocation, split so a subset of its tests can be run.

    ``python`` is the interpreter of ``python -m pytest`` (None for the ``pytest``
    script); ``options`` keep their order; ``targets`` are the files, directories
    or node ids it names (none: pytest's own default).
    """

    python: str | None
    options: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def prefix(self) -> list[str]:
        return [self.python, "-m", "pytest"] if self.python else ["pytest"]

    @property
    def argv(self) -> list[str]:
        return [*self.prefix, *self.options, *self.targets]

    def with_targets(self, targets: Sequence[str]) -> list[str]:
        """The same run over other targets (node ids)."""
        return [*self.prefix, *self.options, *targets]


_PYTHON = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?(?:\.exe)?\Z")
# short options that take a value: -k EXPR, -m MARK, -p NAME, -c FILE, -o K=V, -W F, -r CHARS, -n N
_SHORT_VALUE = frozenset("kmpcoWrn")
_SHORT_FLAG = frozenset("xqvslP")
_LONG_VALUE = frozenset("""
--maxfail --tb --rootdir --basetemp --confcutdir --deselect --ignore --ignore-glob --junitxml
--junit-xml --junit-prefix --log-level --log-format --log-date-format --log-file --log-file-level
--log-file-format --log-file-date-format --log-file-mode --log-cli-level --log-cli-format
--log-cli-date-format --log-disable --durations --durations-min --import-mode --capture --color
--code-highlight --pythonwarnings --override-ini --config-file --show-capture --lfnf
--last-failed-no-failures --assert --verbosity --dist --tx --numprocesses --maxprocesses
--max-worker-restart --timeout --timeout-method --reruns --reruns-delay --only-rerun
--hypothesis-seed --hypothesis-profile --hypothesis-verbosity --cov-report --cov-config
--cov-fail-under --cov-context --doctest-glob --doctest-report --randomly-seed
""".split())
_LONG_FLAG = frozenset("""
--exitfirst --verbose --quiet --showlocals --no-showlocals --strict-markers --strict-config
--strict --runxfail --disable-warnings --disable-pytest-warnings --no-header --no-summary
--doctest-modules --doctest-ignore-import-errors --doctest-continue-on-failure --pdb --trace
--full-trace --cache-clear --ff --failed-first --nf --new-first --setup-show --noconftest
--keep-duplicates --continue-on-collection-errors --pyargs --no-cov --no-cov-on-fail
--cov-append --cov-branch --force-sugar --instafail --loop --hypothesis-show-statistics
--hypothesis-explain
""".split())
# they change which tests run from one run to the next, or do not run tests at all
_NOT_NARROWABLE = frozenset("""
--lf --last-failed --sw --stepwise --sw-skip --stepwise-skip --looponfail --co --collect-only
--fixtures --fixtures-per-test --markers --help --version --cache-show --setup-only --setup-plan
-f -h -V
""".split())


def _needs_a_shell(command: str) -> bool:
    """True if ``sh`` would do more than split words: operators, expansions, globs."""
    quote = ""
    escaped = False
    for char in command:
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            if char in "$`":
                return True
            quote = "" if char == '"' else quote
        elif char in "'\"":
            quote = char
        elif char in ";&|<>()$`*?[]{}~#!\n":
            return True
    return bool(quote)


def narrow_pytest_command(command: str) -> PytestCommand | None:
    """``pytest ...`` / ``python -m pytest ...`` split into options and targets, else None.

    None for anything the harness cannot safely re-run with other targets:
    shell syntax (pipes, ``&&``, variables, globs, redirections), environment
    assignments, other programs, options it does not know the arity of, and
    options that change which tests run between runs (``--lf``, ``--sw``).
    """
    if not command or _needs_a_shell(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or "=" in words[0]:
        return None
    program = os.path.basename(words[0])
    python: str | None = None
    if program in ("pytest", "py.test"):
        rest = words[1:]
    elif _PYTHON.match(program) and words[1:3] == ["-m", "pytest"]:
        python, rest = words[0], words[3:]
    else:
        return None
    options: list[str] = []
    targets: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if word in _NOT_NARROWABLE or word.split("=", 1)[0] in _NOT_NARROWABLE:
            return None
        if word == "--" or word == "-":
            return None
        if word.startswith("--"):
            name, eq, _ = word.partition("=")
            if name in _LONG_VALUE or (name.startswith("--loop-") and name != "--loop"):
                if not eq:
                    if i >= len(rest):
                        return None
                    options += [word, rest[i]]
                    i += 1
                    continue
                options.append(word)
            elif name in _LONG_FLAG and not eq:
                options.append(word)
            else:
                return None
        elif word.startswith("-"):
            cluster = word[1:]
            taken = False
            for j, letter in enumerate(cluster):
                if letter in _SHORT_VALUE:
                    attached = cluster[j + 1:]
                    if not attached:
                        if i >= len(rest):
                            return None
                        options += [word, rest[i]]
                        i += 1
                    else:
                        options.append(word)
                    taken = True
                    break
                if letter not in _SHORT_FLAG:
                    return None
            if not taken:
                options.append(word)
        else:
            targets.append(word)
    return PytestCommand(python=python, options=tuple(options), targets=tuple(targets))

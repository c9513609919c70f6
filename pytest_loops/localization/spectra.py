"""Per-test coverage spectra: what one pytest run under coverage saw, test by test.

Fault localization (:mod:`pytest_loops.localization.suspects`) and affected-test
selection (:mod:`pytest_loops.localization.impact`) both start from the same
measurement: one pytest subprocess run under coverage with one context per test
(the :mod:`pytest_loops.localization.covctx` plugin), read back as
:class:`Spectra` -- each test's outcome and the lines it ran in each project file::

    spectra = collect_spectra(workdir, ["tests/test_calc.py"], data_file=run_dir / "spectra.json")

Callers that run commands their own way take :func:`spectra_command` and read
the result with :func:`read_spectra`. Node ids are pytest's, relative to its
rootdir: run the child from the rootdir.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_loops.core.checks import CHILD_ENV
from pytest_loops.limits import open_own, read_own_text, replace_fresh
from pytest_loops.localization.covctx import ENV as COVCTX_ENV
from pytest_loops.localization.covctx import FORMAT as SPECTRA_FORMAT
from pytest_loops.localization.covctx import SHARED

__all__ = [
    "FAILING",
    "PASSING",
    "PLUGIN",
    "Spectra",
    "SpectraError",
    "collect_spectra",
    "is_test_file",
    "read_spectra",
    "spectra_command",
    "write_json",
]

PLUGIN = "pytest_loops.localization.covctx"
FAILING = frozenset({"failed", "error"})
PASSING = frozenset({"passed", "xpassed"})
OUTPUT_TAIL_CHARS = 4000

_OMIT_FROM_COVERAGE = ("*/site-packages/*", "*/dist-packages/*", "*/.pytest-loops/*",
                       "*/.tox/*", "*/.nox/*")
_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test|conftest)\.py\Z")


class SpectraError(RuntimeError):
    """No per-test coverage could be collected; run the checks without it."""


@dataclass(frozen=True)
class Spectra:
    """What one pytest run under per-test coverage saw.

    ``lines[nodeid][file]`` are the lines the test ran (setup, call, teardown);
    ``shared[file]`` the lines run outside any one test (imports, collection,
    fixtures wider than a function); ``after[nodeid][file]`` the lines a failing
    test ran while its failure message was being made (``__repr__``, ``__eq__`` for a
    diff: not evidence of the bug; :meth:`ran` includes them). Files are
    ``/``-separated and relative to ``root``. ``outcomes`` maps node ids to passed, failed, error, skipped, xfailed
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
    after: Mapping[str, Mapping[str, frozenset[int]]] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        """Node ids that failed or errored, in run order."""
        return [t for t, o in self.outcomes.items() if o in FAILING]

    @property
    def passed(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o in PASSING]

    def files_of(self, nodeid: str) -> frozenset[str]:
        return frozenset(self.ran(nodeid))

    def ran(self, nodeid: str) -> Mapping[str, frozenset[int]]:
        """Every line the test ran, its failure's formatting included (what a change can reach)."""
        own = self.lines.get(nodeid, {})
        extra = self.after.get(nodeid)
        if not extra:
            return own
        return {f: own.get(f, frozenset()) | extra.get(f, frozenset()) for f in {*own, *extra}}


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
        with open_own(path) as f:  # never a file a check linked here
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
        raw = json.loads(read_own_text(path))
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
            after={test: {f: frozenset(ls) for f, ls in files.items()}
                   for test, files in (raw.get("after") or {}).items()},
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise SpectraError(f"{path}: malformed coverage data ({exc!r})") from None


def _with_output(message: str, output: str) -> str:
    last = [line for line in output.strip().splitlines() if line.strip()]
    return f"{message}: {last[-1].strip()}" if last else message


def is_test_file(path: str, test_files: Container[str] = frozenset()) -> bool:
    """A file that defines tests or fixtures (never a suspect)."""
    return path in test_files or _TEST_FILE.search(path) is not None


def write_json(path: Path, payload: Any, indent: int | None = None) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (a temp file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_fresh(path, json.dumps(payload, indent=indent, ensure_ascii=False) + "\n")

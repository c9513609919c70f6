"""Bad input anywhere gets one clear line: the readers fuzzed with hypothesis.

Each reader either returns its documented shape or raises LoopUsageError (exit
64 through the CLI), never another exception (exit 70). The loop-file and YAML
readers are fuzzed in test_loopfile.py and test_yamlspec.py; this file covers
the run log (``load_runlog``, ``--resume``, ``show``, ``diff``, ``report``), the
``.tine`` reader (``load_run``, ``verify``), the loop-runner config file and the
command line itself. ``benchmarks/fuzz_readers.py`` runs the same properties
with many more examples.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plugin_helpers import SUITE_SETTINGS

from pytest_loops import LoopUsageError
from pytest_loops.artifacts.runlog import RunLogWriter, load_runlog, sign_events, sign_summary
from pytest_loops.cli import main as cli
from pytest_loops.cli.runview import load_run
from pytest_loops.pytest_plugin.options import MARKER_KEYS, marker_layer
from pytest_loops.runtime.trust import runlog_key
from pytest_loops.sources.config import (
    ENV_NAMES,
    GUARD_KEYS,
    env_layer,
    parse_guard,
    parse_signal,
    read_runner_config,
)
from pytest_loops.spec import LoopSpec
from pytest_loops.testing import InstantRunner

EXPECTED_EXITS = {0, 2, 3, 4, 5, 64}
FUZZ = {"deadline": None, "database": None,
        "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


# --------------------------------------------------------------------------- helpers


def run_main(argv: Sequence[str]) -> tuple[int, str, str]:
    """``pytest_loops.cli.main.main(argv)`` in this process with its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_clean_exit(code: int, err: str, argv: Sequence[str]) -> None:
    """One of the documented exit codes; a usage error is one line on stderr, no traceback."""
    assert code in EXPECTED_EXITS, (code, argv, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if code == 64:
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
        errors = [line for line in lines if line.startswith("pytest-loops: error: ")]
        assert len(errors) == 1, (argv, err)


@contextlib.contextmanager
def scratch(base: Path) -> Iterator[Path]:
    """A fresh working directory under ``base`` for one example, made the current directory."""
    path = Path(tempfile.mkdtemp(prefix="fuzz-", dir=base))
    try:
        with contextlib.chdir(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)



@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch):
    """In-process runs read PYTEST_LOOPS_* like the console script would."""
    for name in list(os.environ):
        if name.startswith(("PYTEST_LOOPS_", "LOOP_")) and not name.startswith(SUITE_SETTINGS):
            monkeypatch.delenv(name)
    monkeypatch.setattr("pytest_loops.runtime.process.ProcessRunner", InstantRunner)


# --------------------------------------------------------------------------- corpus


class Corpus(dict):
    """A dict with a short repr: hypothesis prints a failing test's arguments."""

    def __repr__(self) -> str:
        return f"<{len(self)} corpus entries>"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    """Real artifacts to mutate: finished logs (MAX_ITER, SUCCESS), a killed run's
    events log, and a .tine. Written by in-process runs with no process spawned."""
    base = tmp_path_factory.mktemp("corpus")
    mp = pytest.MonkeyPatch()
    mp.setattr("pytest_loops.runtime.process.ProcessRunner", InstantRunner)
    try:
        work = base / "work"
        work.mkdir()
        code, _, err = run_main(["run", "-q", "--verify", "false", "--verify", "true", "--revise", "true",
                                 "--state", "*.txt", "--max-iter", "3", "--no-progress-k", "0",
                                 "--cwd", str(work), "--log", str(base / "max.json")])
        assert code == 2, err
        code, _, err = run_main(["run", "-q", "--verify", "true", "--cwd", str(work),
                                 "--log", str(base / "ok.json")])
        assert code == 0, err
    finally:
        mp.undo()
    finished = json.loads((base / "max.json").read_text(encoding="utf-8"))
    events = base / "killed.json"
    writer = RunLogWriter(events)
    header = {k: v for k, v in finished.items()
              if k not in ("verdict", "exit_code", "reason", "iterations", "iterations_run", "ended_at",
                           "elapsed_s", "artifacts", "lessons", "schema")}
    writer.start(header)
    for record in finished["iterations"][:2]:
        writer.iteration(record)
    return Corpus({
        "dir": base,
        "work": work,
        "finished": finished,
        "finished_text": (base / "max.json").read_text(encoding="utf-8"),
        "success_text": (base / "ok.json").read_text(encoding="utf-8"),
        "events_text": events.read_text(encoding="utf-8"),
        "tine": (base / "max.tine").read_bytes(),
    })


def test_the_corpus_is_what_the_fuzzers_mutate(corpus):
    assert load_runlog(corpus["dir"] / "max.json")["verdict"] == "MAX_ITER"
    killed = load_runlog(corpus["dir"] / "killed.json")
    assert killed["verdict"] is None and killed["iterations_run"] == 2
    assert corpus["tine"].startswith(b"TINEZ1\0") or corpus["tine"].startswith(b"{")
    assert load_run(corpus["dir"] / "max.tine")["verdict"] == "MAX_ITER"


# --------------------------------------------------------------------------- mutation


# Strings come from a small alphabet (no "/" or "..") so a mutated path can only
# point inside the example's scratch directory.
SAFE_TEXT = st.text(alphabet="ab -_*:\u00e9\n", max_size=8)
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    SAFE_TEXT, st.sampled_from(["", "SUCCESS", "TIMEOUT", "command", "pytest", "hook", "human", "state",
                                "sha256:00", "pytest-loops.runlog/1", "pytest-loops.runlog/9", "*"]),
    st.lists(st.one_of(st.integers(-1, 3), SAFE_TEXT, st.none()), max_size=3),
    st.dictionaries(SAFE_TEXT, st.one_of(st.integers(-1, 3), SAFE_TEXT, st.none()), max_size=2),
)


MUTATIONS = st.lists(st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=5), st.booleans(), JUNK),
                     min_size=1, max_size=3)
"""Each mutation: a path (indices taken modulo the size of each level), delete or
replace, and the new value. Drawn up front, so the document does not steer the draws."""


def mutate(doc: Any, mutations: list[tuple[list[int], bool, Any]]) -> Any:
    """Replace or delete one value per mutation at the depth its path reaches."""
    for path, delete, value in mutations:
        node = doc
        for depth, index in enumerate(path):
            if not isinstance(node, (dict, list)) or not node:
                break
            key = sorted(node, key=str)[index % len(node)] if isinstance(node, dict) else index % len(node)
            child = node[key]
            if depth + 1 < len(path) and isinstance(child, (dict, list)) and child:
                node = child
                continue
            if delete and isinstance(node, dict):
                del node[key]
            else:
                node[key] = copy.deepcopy(value)
            break
    return doc


def dump(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False, allow_nan=True)


def signed(doc: Any) -> str:
    """A summary as a writer with odd data would leave it: its spec_digest that of
    its (mutated) spec and its MAC good, so the checks after the MAC's are reached.
    A value JSON has no canonical form for (NaN, inf) gets no MAC."""
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k != "mac"}
        with contextlib.suppress(Exception):
            doc["spec_digest"] = LoopSpec.from_dict(doc["spec"]).digest()
    return sign_summary(dump(doc), runlog_key(create=True))


def signed_events(events: list[Any]) -> str:
    """Event lines with good chained MACs (see :func:`signed`)."""
    if not all(isinstance(e, dict) for e in events):
        return "\n".join(dump(e) for e in events) + "\n"
    start = events[0] if events else {}
    if isinstance(start.get("spec"), dict):
        with contextlib.suppress(Exception):
            start["spec_digest"] = LoopSpec.from_dict(start["spec"]).digest()
    return "\n".join(sign_events(events, runlog_key(create=True))) + "\n"


# --------------------------------------------------------------------------- load_runlog


def loads_or_refuses(path: Path) -> dict[str, Any] | None:
    try:
        data = load_runlog(path)
    except LoopUsageError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return None
    assert isinstance(data, dict) and isinstance(data["iterations"], list)
    assert data["log_path"] == str(path)
    return data


@settings(max_examples=150, **FUZZ)
@given(blob=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
def test_load_runlog_on_random_bytes(tmp_path, blob):
    path = tmp_path / "random.json"
    path.write_bytes(blob)
    loads_or_refuses(path)


@settings(max_examples=150, **FUZZ)
@given(which=st.sampled_from(["finished_text", "events_text", "success_text"]), cut=st.floats(0, 1),
       flip=st.one_of(st.none(), st.integers(0, 10**6)))
def test_load_runlog_on_truncated_and_corrupted_logs(tmp_path, corpus, which, cut, flip):
    blob = bytearray(corpus[which].encode())
    del blob[int(len(blob) * cut):]
    if flip is not None and blob:
        blob[flip % len(blob)] ^= 0x5A
    path = tmp_path / "cut.json"
    path.write_bytes(bytes(blob))
    data = loads_or_refuses(path)
    if data is not None and which == "events_text":  # a killed log cut short: fewer iterations
        assert data["verdict"] is None and len(data["iterations"]) <= 2


def test_a_log_cut_inside_its_last_event_loses_only_that_event(tmp_path, corpus):
    text = corpus["events_text"]
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 20], encoding="utf-8")
    data = load_runlog(path)
    assert data["iterations_run"] == 1 and data["incomplete"] is True


@settings(max_examples=150, **FUZZ)
@given(which=st.sampled_from(["finished", "events"]), mutations=MUTATIONS)
def test_load_runlog_on_mutated_logs(tmp_path, corpus, which, mutations):
    path = tmp_path / "mutated.json"
    if which == "finished":
        path.write_text(dump(mutate(copy.deepcopy(corpus["finished"]), mutations)), encoding="utf-8")
    else:
        events = [json.loads(line) for line in corpus["events_text"].splitlines()]
        path.write_text("\n".join(dump(e) for e in mutate(events, mutations)) + "\n", encoding="utf-8")
    loads_or_refuses(path)


# --------------------------------------------------------------------------- --resume, show, diff, report


def write_mutated(corpus: dict[str, Any], mutations: list[Any], directory: Path, which: str) -> Path:
    if which == "finished":
        doc = copy.deepcopy(corpus["finished"])
        doc["spec"]["cwd"] = str(directory)
        text = signed(mutate(doc, mutations))
    else:
        events = [json.loads(line) for line in corpus["events_text"].splitlines()]
        events[0]["spec"]["cwd"] = str(directory)
        text = signed_events(mutate(events, mutations))
    path = directory / "runs" / "mutated.json"
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    return path


@settings(max_examples=120, **FUZZ)
@given(which=st.sampled_from(["finished", "events"]), mutations=MUTATIONS, give_cwd=st.booleans())
@pytest.mark.slow
def test_resume_of_a_mutated_log_is_a_verdict_or_one_line(tmp_path, corpus, which, mutations, give_cwd):
    """LoopSpec.from_dict and the iteration records, read back by --resume: a run to a
    verdict or exit 64, never an internal error. --max-iter keeps a fuzzed cap small."""
    with scratch(tmp_path) as work:
        log = write_mutated(corpus, mutations, work, which)
        argv = ["run", "--resume", str(log), "-q", "--no-tine", "--max-iter", "3",
                "--log", str(work / "resumed.json"), "--artifacts", str(work / "art")]
        if give_cwd:
            argv += ["--cwd", str(work)]
        code, _, err = run_main(argv)
        assert_clean_exit(code, err, argv)
        if code != 64:
            resumed = load_runlog(work / "resumed.json")
            assert resumed["resumed_from"] == str(log) and resumed["exit_code"] == code


@settings(max_examples=120, **FUZZ)
@given(which=st.sampled_from(["finished", "events"]), mutations=MUTATIONS)
@pytest.mark.slow
def test_show_diff_and_report_of_a_mutated_log(tmp_path, corpus, which, mutations):
    with scratch(tmp_path) as work:
        log = write_mutated(corpus, mutations, work, which)
        good = corpus["dir"] / "max.json"
        for argv in (["show", str(log)], ["diff", str(good), str(log)],
                     ["report", str(work / "runs"), "-o", str(work / "report.html")]):
            code, _, err = run_main(argv)
            assert code in (0, 64), (argv, err)
            assert_clean_exit(code, err, argv)


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *keys, last = path.split(".")
    node: Any = doc
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value


# Inputs the fuzzers found that once ended in an internal error (exit 70).
RESUME_CASES = [
    ("elapsed_s", "abc", "elapsed_s"),
    ("elapsed_s", float("inf"), "unverified"),  # no MAC can cover an infinity
    ("iterations.2.unchanged_streak", "sha256:00", "unchanged_streak"),
    ("iterations.2.same_failure_streak", {"": {}}, "same_failure_streak"),
    ("iterations.1.protected_changes", float("inf"), "unverified"),
    ("iterations.0.checks.0.name", ["a"], "checks"),
    ("spec.cwd", 5, "cwd must be a string"),
    ("spec.memory_page", 1.5, "memory_page must be a string"),
    ("spec.memory_page", "dir", "memory_page"),
    ("spec.revise", ["true"], "revise must be a string"),
    ("spec.state_paths", [5], "state_paths must be a list of strings"),
    ("spec.checks.0.command", {"a": 1}, "checks.command must be a string"),
    ("spec.origin", {"max_iter": 3}, "origin"),
]


@pytest.mark.parametrize("path, value, expect", RESUME_CASES, ids=[f"{c[0]}={c[1]!r}" for c in RESUME_CASES])
def test_resume_of_a_log_with_a_wrong_type_is_one_line(tmp_path, corpus, path, value, expect):
    with scratch(tmp_path) as work:
        (work / "dir").mkdir()
        doc = copy.deepcopy(corpus["finished"])
        doc["spec"]["cwd"] = str(work)
        _set(doc, path, value)
        log = work / "bad.json"
        log.write_text(signed(doc), encoding="utf-8")
        argv = ["run", "--resume", str(log), "-q", "--no-tine", "--max-iter", "5"]
        code, _, err = run_main(argv)
        assert code == 64, err
        assert_clean_exit(code, err, argv)
        assert expect in err and str(log) in err or "not a valid loop spec" in err
        assert not (work / ".pytest-loops" / "runs").exists()  # refused before the loop started


def test_resume_refuses_a_log_path_that_is_a_directory(tmp_path, corpus):
    with scratch(tmp_path) as work:
        (work / "dir").mkdir()
        log = work / "run.json"
        doc = copy.deepcopy(corpus["finished"])
        doc["spec"]["cwd"] = str(work)
        log.write_text(signed(doc), encoding="utf-8")
        code, _, err = run_main(["run", "--resume", str(log), "--max-iter", "5", "--log", "dir"])
    assert code == 64 and "--log" in err and "is a directory" in err, err


SHOW_CASES = [("spec", "a:"), ("spec", 7), ("lessons", 3), ("artifacts", 1), ("artifacts", [{"a": 1}, "a"]),
              ("verdict", {"": {}}), ("spec.checks", 5), ("exit_code", "2"), ("elapsed_s", [0])]


@pytest.mark.parametrize("path, value", SHOW_CASES, ids=[f"{c[0]}={c[1]!r}" for c in SHOW_CASES])
def test_show_diff_and_report_refuse_a_log_with_a_wrong_type_in_one_line(tmp_path, corpus, path, value):
    with scratch(tmp_path) as work:
        doc = copy.deepcopy(corpus["finished"])
        _set(doc, path, value)
        (work / "runs").mkdir()
        log = work / "runs" / "bad.json"
        log.write_text(dump(doc), encoding="utf-8")
        for argv in (["show", str(log)], ["diff", str(log), str(corpus["dir"] / "max.json")]):
            code, _, err = run_main(argv)
            assert code == 64, (argv, err)
            assert_clean_exit(code, err, argv)
            assert f"{path.split('.')[0]!r}" in err or "spec.checks" in err
        code, out, err = run_main(["report", str(work / "runs"), "-o", str(work / "r.html")])
        assert code == 0 and "0 loop run(s)" in out, err  # the report skips what it cannot read


# --------------------------------------------------------------------------- load_run, verify (.tine)


@settings(max_examples=100, **FUZZ)
@given(suffix=st.sampled_from([".tine", ".json", ""]),
       blob=st.one_of(st.binary(max_size=300),
                      st.builds(lambda b: b"TINEZ1\0" + b, st.binary(max_size=200)),
                      st.builds(lambda b: b'{"format_version": 2, "graph": ' + b, st.binary(max_size=100))))
def test_load_run_and_verify_on_random_files(tmp_path, suffix, blob):
    path = tmp_path / f"random{suffix}"
    path.write_bytes(blob)
    try:
        run = load_run(path)
    except LoopUsageError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(run, dict)
    for argv in (["show", str(path)], ["verify", str(path)]):
        code, _, err = run_main(argv)
        assert code in (0, 1, 64), (argv, err)
        assert "Traceback" not in err and "internal error" not in err, (argv, err)


@settings(max_examples=60, **FUZZ)
@given(cut=st.floats(0, 1), flips=st.lists(st.integers(0, 10**6), max_size=3))
def test_verify_and_show_on_a_damaged_tine(tmp_path, corpus, cut, flips):
    blob = bytearray(corpus["tine"])
    del blob[max(1, int(len(blob) * cut)):]
    for at in flips:
        blob[at % len(blob)] ^= 0xA5
    path = tmp_path / "damaged.tine"
    path.write_bytes(bytes(blob))
    intact = bytes(blob) == corpus["tine"]
    code, out, err = run_main(["verify", str(path)])
    assert code == (0 if intact else 1), (code, out, err)
    assert len((out + err).strip().splitlines()) == 1
    code, _, err = run_main(["show", str(path)])
    assert code in (0, 64) and "internal error" not in err, err


def tine_json(blob: bytes) -> Any:
    """The JSON document inside a .tine (opentine compresses it by default)."""
    if blob.startswith(b"TINEZ1\0"):
        from opentine._codec import unwrap

        blob = unwrap(blob, limit=1 << 30)
    return json.loads(blob)


@settings(max_examples=40, **FUZZ)
@given(mutations=MUTATIONS)
def test_load_run_and_verify_on_an_edited_tine(tmp_path, corpus, mutations):
    """A readable .tine whose steps were edited: read or refused, and never verified."""
    doc = tine_json(corpus["tine"])
    original = dump(doc)
    mutate(doc["graph"]["steps"], mutations)
    path = tmp_path / "edited.tine"
    path.write_text(dump(doc), encoding="utf-8")
    try:
        assert isinstance(load_run(path), dict)
    except LoopUsageError as exc:
        assert "\n" not in str(exc)
    code, out, err = run_main(["verify", str(path)])
    assert code == (0 if dump(doc) == original else 1), (out, err)
    code, _, err = run_main(["show", str(path)])
    assert code in (0, 64) and "internal error" not in err, err


def edited_step(doc: dict[str, Any], kind: str, tool: str | None = None, failed: bool = False) -> dict[str, Any]:
    """The first step of this kind (and tool name; a failed check) in a .tine document."""
    return next(step for step in doc["graph"]["steps"].values()
                if step["kind"] == kind and (tool is None or (step.get("tool_info") or {}).get("name") == tool)
                and not (failed and step["outputs"].get("passed")))


# Edits the fuzzers found that once crashed the .tine reader (exit 70).
TINE_EDITS = {
    "iteration arguments not an object": lambda doc: edited_step(doc, "tool", "iteration")["inputs"].update(
        arguments="TIMEOUT"),
    "check tail not a string": lambda doc: edited_step(doc, "tool", "iteration")["outputs"]["checks"][0].update(
        tail=[[]]),
    "iteration number null": lambda doc: edited_step(doc, "tool", "iteration")["inputs"]["arguments"].update(
        iteration=None),
    "checks not a list": lambda doc: edited_step(doc, "tool", "iteration")["outputs"].update(checks="x"),
    "a check not an object": lambda doc: edited_step(doc, "tool", "iteration")["outputs"].update(
        checks=["x"]),
    "check names and results do not pair": lambda doc: edited_step(doc, "tool", "iteration")[
        "inputs"]["arguments"].update(checks=[]),
    "start artifacts not an object": lambda doc: next(
        step for step in doc["graph"]["steps"].values()
        if step["kind"] == "think" and "spec" in step["outputs"])["outputs"].update(artifacts="x"),
    "verdict elapsed not a number": lambda doc: edited_step(doc, "done")["outputs"].update(elapsed_s="soon"),
    "spec not an object": lambda doc: next(
        step for step in doc["graph"]["steps"].values()
        if step["kind"] == "think" and "spec" in step["outputs"])["outputs"].update(spec="TIMEOUT"),
}


# The same on a file of the first shape (a step per check, guard decision and revise).
TINE_V1 = Path(__file__).with_name("tinefiles") / "schema1.tine"
TINE_V1_EDITS = {
    "check arguments not an object": lambda doc: edited_step(doc, "tool", "check")["inputs"].update(
        arguments="TIMEOUT"),
    "check tail not a string": lambda doc: edited_step(doc, "tool", "check", failed=True)["outputs"].update(
        tail=[[]]),
    "iteration number null": lambda doc: next(
        step for step in doc["graph"]["steps"].values()
        if step["kind"] == "think" and "iteration" in step["outputs"])["outputs"].update(iteration=None),
}
EDITS = [*((name, "tine", edit) for name, edit in TINE_EDITS.items()),
         *((f"first shape: {name}", "tine/1", edit) for name, edit in TINE_V1_EDITS.items())]


@pytest.mark.parametrize(("edit", "source", "change"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_tine_is_refused_in_one_line_and_fails_verify(tmp_path, corpus, edit, source, change):
    doc = tine_json(corpus["tine"] if source == "tine" else TINE_V1.read_bytes())
    change(doc)
    path = tmp_path / "edited.tine"
    path.write_text(dump(doc), encoding="utf-8")
    with pytest.raises(LoopUsageError) as info:
        load_run(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    code, _, err = run_main(["show", str(path)])
    assert code == 64 and err.count("\n") == 1 and "internal error" not in err, err
    code, out, err = run_main(["verify", str(path)])
    assert code == 1 and "internal error" not in err, (out, err)


# --------------------------------------------------------------------------- the config file


SECTIONS = ["guards", "progress", "reflexion", "run_log", "revise", "verify", "protect", "scope", "other"]
KEYS = ["max_iter", "budget_seconds", "no_progress_k", "escalate_after_iter", "escalate_after",
        "no_progress_signal", "state_paths", "enabled", "episodic_memory_page", "path", "cmd", "cmds",
        "paths", "junk"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.sampled_from(["state", "both", "2", "1.5", "nan", ""]),
    st.lists(st.one_of(st.text(max_size=4), st.integers()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
STRUCTURES = st.one_of(
    VALUES,
    st.dictionaries(st.sampled_from(SECTIONS),
                    st.one_of(VALUES, st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5)), max_size=6),
)


def valid_layer(layer: dict[str, Any]) -> None:
    from pytest_loops.defaults import validate_guard_values

    guards = {k: layer[k] for k in ("max_iter", "budget_seconds", "no_progress_k", "escalate_after") if k in layer}
    assert validate_guard_values(**guards) == []
    for key in ("state_paths", "verify", "protect", "scope"):
        if key in layer:
            assert isinstance(layer[key], list) and all(isinstance(v, str) for v in layer[key])
    for key in ("revise", "lessons_page", "log_path"):
        if key in layer:
            assert isinstance(layer[key], str) and layer[key].strip()
    if "lessons" in layer:
        assert isinstance(layer["lessons"], bool)


@settings(max_examples=200, **FUZZ)
@given(structure=STRUCTURES)
def test_read_runner_config_on_random_structures(tmp_path, structure):
    try:
        layer = read_runner_config(tmp_path / "c.yaml", data=structure)
    except LoopUsageError as exc:
        assert "\n" not in str(exc) and str(tmp_path / "c.yaml") in str(exc)
    else:
        valid_layer(layer)


YAMLISH = st.lists(st.one_of(
    st.sampled_from([f"{s}:" for s in SECTIONS] + [f"  {k}: " for k in KEYS]
                    + ["  - ", "- ", "[", "]", "{", "}", ": ", "\t", "  ", "\n", "'", '"', "&a ", "*a",
                       "!!python/name:os.system", "---", "...", "%YAML 1.2", "#", "~", "1e3", "-1", ".inf",
                       "yes", "on"]),
    st.text(max_size=5)), max_size=30).map("".join)


@settings(max_examples=200, **FUZZ)
@given(text=YAMLISH)
def test_read_runner_config_on_yaml_ish_text(tmp_path, text):
    path = tmp_path / "loop-runner.config.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        layer = read_runner_config(path)
    except LoopUsageError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        valid_layer(layer)


def test_yaml_ish_text_reaches_the_readers_value_checks():
    """The text strategy is not all syntax errors: it produces mappings too."""
    examples = ["guards:\n  max_iter: 2", "guards:\n  max_iter: -1", "verify:\n  cmd: [1]"]
    assert all(isinstance(yaml.safe_load(text), dict) for text in examples)


# --------------------------------------------------------------------------- settings: flags, env, markers

RAW = st.one_of(st.text(max_size=8), st.sampled_from(["1", " 2 ", "0", "-1", "1.0", "1e3", "nan", "inf", "-0",
                                                      "0x10", "1_000", "\u0661", "state", " both "]),
                st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, **FUZZ)
@given(name=st.sampled_from(GUARD_KEYS), raw=RAW)
def test_parse_guard_on_any_value(name, raw):
    """The one parser behind --max-iter, --loop-max-iter, ini, env and YAML values."""
    from pytest_loops.defaults import validate_guard_values

    try:
        value = parse_guard(name, raw, "--flag")
    except LoopUsageError as exc:
        assert "--flag" in str(exc) and "\n" not in str(exc)
    else:
        if raw is None:  # None is "not set" in every layer
            assert value is None
            return
        assert validate_guard_values(**{name: value}) == []
        expected = float if name in ("budget_seconds", "max_cost") else int
        assert isinstance(value, expected) and not isinstance(value, bool)


@settings(max_examples=100, **FUZZ)
@given(raw=RAW)
def test_parse_signal_on_any_value(raw):
    try:
        assert parse_signal(raw, "--flag") in ("state", "failure", "both")
    except LoopUsageError as exc:
        assert "--flag" in str(exc)


@settings(max_examples=200, **FUZZ)
@given(env=st.dictionaries(st.sampled_from(sorted(ENV_NAMES.values())), st.text(max_size=6), max_size=5))
def test_env_layer_on_any_environment(env):
    try:
        layer = env_layer(env)
    except LoopUsageError as exc:
        assert "environment variable PYTEST_LOOPS_" in str(exc) and "\n" not in str(exc)
    else:
        assert set(layer) <= set(ENV_NAMES)


@settings(max_examples=200, **FUZZ)
@given(args=st.lists(RAW, max_size=2),
       kwargs=st.dictionaries(st.sampled_from([*MARKER_KEYS, "max_iters", "revise_with"]), RAW, max_size=4))
def test_marker_layer_on_any_arguments(args, kwargs):
    """`@pytest.mark.loop(...)` is read before anything runs: a usage error or a valid layer."""
    mark = pytest.mark.loop(*args, **kwargs).mark
    try:
        layer = marker_layer(mark, "test_x.py::test_x")
    except LoopUsageError as exc:
        assert "test_x.py::test_x" in str(exc) and "\n" not in str(exc)
    else:
        assert not args
        assert set(layer) <= {*GUARD_KEYS, "no_progress_signal", "revise", "state_paths"}


# --------------------------------------------------------------------------- the command line


SUBCOMMANDS = ["run", "show", "diff", "verify", "report"]
FLAGS = ["--verify", "--revise", "--state", "--protect", "--scope", "--max-iter", "--budget-seconds",
         "--no-progress-k", "--no-progress-signal", "--escalate-after", "--log", "--episodic",
         "--no-reflexion", "--lessons", "--lessons-page", "--config", "--cwd", "--name", "--goal", "--artifacts",
         "-p", "--resume", "--tine", "--no-tine", "--sign-key-env", "--sign-key-file", "--quiet", "-q", "-v",
         "--key-env", "--pubkey",
         "-o", "--output", "--help", "--version", "--bogus", "-x", "--"]
VALUES_CLI = ["true", "false", "exit 3", "", " ", "0", "1", "2", "3", "-1", "1.5", "abc", "nan", "inf", "1e3",
              "0.0001", "state", "failure", "both", "sideways", "*.txt", "out.html", "log.json", "run.json",
              "missing.json", "junk.json", "config.yaml", "bad.yaml", "dir", "file.txt", "x.loop", "run.tine",
              "NO_SUCH_VAR", "HOME", "no_such_module", "os", "\u00e9", "a b", "-", "--"]


@pytest.fixture
def argv_files(corpus) -> Corpus:
    """Files the argument values may name, copied into each example's directory."""
    return Corpus({
        "run.json": corpus["finished_text"].encode(),
        "junk.json": b"{not json",
        "config.yaml": b"guards:\n  max_iter: 2\nverify:\n  cmd: 'false'\n",
        "bad.yaml": b"guards: [1\n",
        "file.txt": b"hello\n",
        "x.loop": b'loop "x":\n  done when "true" passes\n',
        "run.tine": corpus["tine"],
    })


@settings(max_examples=150, **FUZZ)
@given(argv=st.tuples(st.sampled_from(SUBCOMMANDS + ["", "bogus"]),
                      st.lists(st.one_of(st.sampled_from(FLAGS), st.sampled_from(VALUES_CLI)), max_size=10)))
@pytest.mark.slow
def test_random_command_lines_exit_with_a_documented_code(tmp_path, argv_files, argv):
    command, rest = argv
    args = ([command] if command else []) + rest
    with scratch(tmp_path) as work:
        for name, blob in argv_files.items():
            (work / name).write_bytes(blob)
        (work / "dir").mkdir()
        code, _, err = run_main(args)
        if args[:1] == ["verify"] and code == 1:  # verify's own "tampered or unreadable"
            assert "internal error" not in err
            return
        assert_clean_exit(code, err, args)


@pytest.mark.parametrize("argv, expect", [
    (["run"], "no check to run"),
    (["run", "--verify", "true", "--max-iter", "0"], "--max-iter"),
    (["run", "--verify", "true", "--budget-seconds", "nan"], "--budget-seconds"),
    (["run", "--verify", "true", "--no-progress-signal", "sideways"], "--no-progress-signal"),
    (["run", "--verify", "true", "--bogus"], "unrecognized arguments"),
    (["run", "--resume", "junk.json"], "junk.json"),
    (["run", "--resume", "missing.json"], "no such run log"),
    (["show", "missing.json"], "no such file"),
    (["verify", "run.json", "--key-env", "NO_SUCH_VAR"], "NO_SUCH_VAR"),
    (["report", "file.txt"], "not a directory"),
    (["bogus"], "invalid choice"),
    ([], "a command is required"),
])
def test_bad_command_lines_name_the_problem_in_one_line(tmp_path, argv_files, argv, expect):
    with scratch(tmp_path) as work:
        for name, blob in argv_files.items():
            (work / name).write_bytes(blob)
        code, _, err = run_main(argv)
    assert code == 64, err
    assert_clean_exit(code, err, argv)
    assert expect in [line for line in err.splitlines() if line.startswith("pytest-loops: error:")][0]


def test_fuzz_floats_are_real_json_edge_cases():
    """NaN and infinities reach the readers: json writes them and reads them back."""
    assert math.isnan(json.loads(dump({"x": float("nan")}))["x"])
    assert json.loads(dump([float("inf")])) == [float("inf")]


# --------------------------------------------------------------------------- limits: YAML, JSON, output paths


@st.composite
def yaml_with_aliases(draw) -> str:
    """Anchored lists whose items alias earlier anchors, nested lists, merge keys: a
    small file that may expand to many nodes or nest deeply."""
    lines = []
    for n in range(draw(st.integers(1, 8))):
        width = draw(st.integers(1, 12))
        items = [f"*a{draw(st.integers(0, n - 1))}" if n and draw(st.booleans()) else "x" for _ in range(width)]
        lines.append(f"a{n}: &a{n} [" + ", ".join(items) + "]")
    depth = draw(st.integers(0, 150))
    lines.append("deep: " + "[" * depth + "]" * depth)
    if draw(st.booleans()):
        lines.append("m: &m {k: 1}\nguards:\n  <<: *m")
    return "\n".join(lines) + "\n"


def expanded_size(value: Any, limit: int) -> int:
    """Nodes in ``value`` with shared objects counted each time (stops past ``limit``)."""
    count, stack = 0, [value]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


@settings(max_examples=60, **FUZZ)
@given(text=yaml_with_aliases())
def test_the_yaml_loader_returns_small_data_or_refuses_in_one_line(text):
    from pytest_loops.errors import LoopFileError
    from pytest_loops.limits import MAX_ALIAS_NODES, load_yaml

    literal = text.count("x") + text.count("[") + 64
    try:
        data = load_yaml(text, "fuzz.yaml")
    except LoopFileError as exc:
        assert str(exc).startswith("fuzz.yaml:") and "\n" not in str(exc) and len(str(exc)) < 300
    else:
        assert expanded_size(data, literal + MAX_ALIAS_NODES) <= literal + MAX_ALIAS_NODES


@settings(max_examples=60, **FUZZ)
@given(depth=st.integers(0, 5000), events=st.booleans(), inner=st.sampled_from(["[]", "{}", '"x"', "1"]))
def test_load_runlog_on_deep_json(tmp_path, depth, events, inner):
    nested = "[" * depth + inner + "]" * depth
    path = tmp_path / "deep.json"
    if events:
        path.write_text('{"event": "start", "spec": {}, "x": ' + nested + "}\n", encoding="utf-8")
    else:
        path.write_text('{"schema": "pytest-loops.runlog/1", "iterations": [], "lessons": ' + nested + "}",
                        encoding="utf-8")
    data = loads_or_refuses(path)
    if depth > 64:
        assert data is None


PATH_PARTS = st.lists(st.sampled_from(["afile", "dir", "new", "x.json", "/proc", "/proc/self/status"]),
                      min_size=1, max_size=4)


@settings(max_examples=60, **FUZZ)
@given(parts=PATH_PARTS, directory=st.booleans())
def test_an_output_path_that_passes_the_check_can_be_written(tmp_path, parts, directory):
    from pytest_loops.runtime.outpaths import check_output_path

    with scratch(tmp_path) as work:
        (work / "afile").write_text("x")
        (work / "dir").mkdir()
        target = Path(*parts)
        before = sorted(p.name for p in work.iterdir())
        try:
            check_output_path(target, "--flag", base=work, directory=directory)
        except LoopUsageError as exc:
            assert str(exc).startswith("--flag: cannot write ") and "\n" not in str(exc)
            assert sorted(p.name for p in work.iterdir()) == before  # no probe left
            return
        assert sorted(p.name for p in work.iterdir()) == before
        path = work / target
        if directory:
            path.mkdir(parents=True, exist_ok=True)
            (path / "run.json").write_text("{}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write("")

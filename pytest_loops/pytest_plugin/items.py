"""Loop files as pytest collectors, loops as collectors, checks as items.

Node ids read ``fix.loop::fix checkout::done when "pytest -q" passes``. Running
any item of a loop drives that loop once; each check item then reports its own
final result and carries the loop's verdict. The loop's result is shared through
a file under a lock, so items of one loop spread over xdist workers still run
the loop once. The file is named by a sha256 of the loop's full identity and
authenticated with an HMAC under the session's in-memory key: a revise step can
write into the sessions directory, but not a result the items would trust.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.state import SESSION_KEY, SessionState
from pytest_loops.pytest_plugin.terminal import failure_text, loop_properties
from pytest_loops.redact import make_redactor, name_slug, redact, redact_obj
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, Guards, LoopSpec, Pipeline
from pytest_loops.verdict import Verdict


class LoopFileError(Exception):
    """A loop file that cannot be read: reported as one line, not a traceback."""


class LoopCheckFailed(Exception):
    """A check item whose check did not pass when its loop ended."""


class SharedResultUntrusted(Exception):
    """A stored loop result that failed authentication and could not be replaced
    by running the loop: reported as one line."""


class LoopFileCollector(pytest.File):
    """A `.loop`, `*.loop.yaml` or `*.loop.yml` file."""

    def collect(self):
        from pytest_loops.sources import load_any

        try:
            loop_file = load_any(self.path)
        except LoopUsageError as exc:
            raise LoopFileError(str(exc)) from None
        session: SessionState = self.config.stash[SESSION_KEY]
        not_acted_on(loop_file, session.ignored_lines)
        message = revise_cannot_start(loop_file, session.rootdir, self.path)
        if message:  # a usage error, raised once collection is done (as a bad marker's)
            session.collect_usage_errors.append(message)
            return
        for spec in loop_file.loops:
            # node names are in node ids, the terminal, JUnit XML and stored results: masked
            yield LoopCollector.from_parent(self, name=redact(spec.name), spec=file_spec(spec, session.settings))
        for pipeline in loop_file.pipelines:
            stages = tuple(file_spec(stage, session.settings) for stage in pipeline.stages)
            yield PipelineCollector.from_parent(self, name=redact(pipeline.name),
                                                pipeline=Pipeline(pipeline.name, stages, pipeline.source))

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(LoopFileError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


def not_acted_on(loop_file: Any, found: dict[str, list[Any]]) -> None:
    """Remember a loop file's lines this project keeps but does not act on (shown with -v)."""
    lines = [*loop_file.config, *loop_file.ignored]
    for spec in loop_file.all_loops():
        lines += spec.ignored
    if lines:
        found[loop_file.path] = sorted(lines, key=lambda i: i.line)


def file_spec(spec: LoopSpec, settings: Any) -> LoopSpec:
    """A loop from a file with the session's settings filling its gaps."""
    spec = merge_file_spec(spec, settings)
    from pytest_loops.settings import given_grants

    grants = given_grants(settings)  # given to the session: they replace the file's line
    if grants is not None:
        spec = spec.replace(grants=grants, origin={**spec.origin, "grants": settings.origin.get("grants", "")})
    if not spec.state_paths:
        spec = spec.replace(state_paths=(".",))
    return spec


def revise_cannot_start(loop_file: Any, rootdir: Path, path: Path) -> str | None:
    """The usage error of the first loop of this file whose own revise step cannot start."""
    from pytest_loops.agents import program_to_check
    from pytest_loops.runtime.preflight import check_revise

    for spec in loop_file.all_loops():
        try:
            check_revise(program_to_check(spec.revise), spec.cwd or rootdir, f"{path}: loop {spec.name!r}: revise with")
        except LoopUsageError as exc:
            return str(exc)
    return None


class PipelineCollector(pytest.Collector):
    """A pipeline: its stages run in order; a stage that does not succeed stops the rest."""

    def __init__(self, *, pipeline: Pipeline, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def collect(self):
        previous: LoopCollector | None = None
        for stage in self.pipeline.stages:
            label = stage.name.split(" / ", 1)[-1]
            collector = LoopCollector.from_parent(self, name=redact(label), spec=stage, after=previous)
            previous = collector
            yield collector


class LoopCollector(pytest.Collector):
    """One loop; its children are its checks."""

    def __init__(self, *, spec: LoopSpec, after: LoopCollector | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.after = after
        self._result: LoopResult | None = None

    def collect(self):
        for check in self.spec.checks:
            yield CheckItem.from_parent(self, name=redact(check.name), check=check)

    def result(self) -> LoopResult:
        """Run the loop once per session (across xdist workers too) and return its result."""
        if self._result is None:
            if self.after is not None:
                before = self.after.result()
                if not before.succeeded:
                    pytest.skip(f"pipeline stopped: stage {self.after.spec.name!r} ended "
                                f"{before.verdict.value}: {before.reason}")
            session: SessionState = self.config.stash[SESSION_KEY]
            self._result = shared_result(session.artifacts_dir / "sessions" / session.testrunuid, self.nodeid,
                                         self.spec, session.run_loop, key=session.session_key,
                                         loop_file=str(self.path))
        return self._result


class CheckItem(pytest.Item):
    """One `done when` check of a loop."""

    def __init__(self, *, check: Check, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    @property
    def loop(self) -> LoopCollector:
        assert isinstance(self.parent, LoopCollector)
        return self.parent

    def runtest(self) -> None:
        result = self.loop.result()
        self.user_properties.extend(loop_properties(result))
        final = last_result(result, self.check.name)
        if final is not None and final.passed:
            return
        raise LoopCheckFailed(result, final)

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(LoopCheckFailed):
            result, final = excinfo.value.args
            if final is None:
                head = f"check not reached: the loop ended {result.verdict.value} before running it"
            else:
                head = f"check failed: {final.reason}"
            return f"{head}\n{failure_text(result)}"
        if excinfo.errisinstance(SharedResultUntrusted):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        line = None
        if self.check.source and ":" in self.check.source:
            tail = self.check.source.rsplit(":", 1)[-1]
            line = int(tail) - 1 if tail.isdigit() else None
        return self.path, line, redact(f"{self.loop.spec.name}: {self.check.name}")


def loop_unit(item: pytest.Item) -> tuple[str, tuple[str, ...]] | None:
    """The shard unit a loop file's check item belongs to: (its pipeline's or loop's
    node id, the names of the loops it runs); None for any other item."""
    if not isinstance(item, CheckItem):
        return None
    node: Any = item.loop
    pipeline = node.parent if isinstance(node.parent, PipelineCollector) else None
    if pipeline is not None:
        names = tuple(stage.name for stage in pipeline.pipeline.stages)
        node = pipeline
    else:
        assert isinstance(node, LoopCollector)
        names = (node.spec.name,)
    return node.nodeid, names

def last_result(result: LoopResult, check_name: str) -> CheckResult | None:
    """The check's result in the last iteration that ran it (names compared masked:
    a result stored for the other items of the loop holds them masked)."""
    scrub = make_redactor()
    wanted = scrub(check_name)
    for record in reversed(result.iterations):
        for check in record.checks:
            if check.name == check_name or scrub(check.name) == wanted:
                return check
    return None


def result_from_summary(spec: LoopSpec, data: dict[str, Any]) -> LoopResult:
    """Rebuild a LoopResult from a run-log summary (another worker ran the loop)."""
    return LoopResult(
        spec=spec, verdict=Verdict(data["verdict"]), reason=data.get("reason", ""),
        iterations=[IterationRecord.from_dict(r) for r in data.get("iterations", [])],
        started_at=data.get("started_at", ""), ended_at=data.get("ended_at", ""),
        elapsed_s=float(data.get("elapsed_s", 0.0)), log_path=data.get("artifacts", {}).get("log"),
        run_dir=data.get("run_dir"), memory_page=data.get("memory_page"),
        artifacts=dict(data.get("artifacts", {})),
    )


SHARED_SCHEMA = "pytest-loops.shared-result/1"


def shared_identity(nodeid: str, spec: LoopSpec, loop_file: str | None = None) -> dict[str, str]:
    """What tells one loop of a session from every other: its file, name and node id
    (masked: it is stored, and names the stored file)."""
    return redact_obj({"loop_file": str(loop_file or ""), "loop": spec.name, "nodeid": nodeid})


def shared_result_path(session_dir: Path, identity: dict[str, str]) -> Path:
    """``<readable slug>-<sha256 of the whole identity>.json``: the hash decides, the
    slug (cut short) is only for people listing the directory."""
    from pytest_loops.runtime.trust import identity_digest

    return session_dir / f"{name_slug(identity['nodeid'], max_chars=40)}-{identity_digest(**identity)}.json"


def _summary_of(result: LoopResult) -> dict[str, Any]:
    summary = {"verdict": result.verdict.value, "reason": result.reason,
               "iterations": [r.to_dict() for r in result.iterations],
               "started_at": result.started_at, "ended_at": result.ended_at,
               "elapsed_s": result.elapsed_s, "run_dir": result.run_dir,
               "memory_page": result.memory_page, "artifacts": result.artifacts}
    # what a reader will see, secrets masked: the file outlives the session
    return redact_obj(json.loads(json.dumps(summary, default=str)))


def _read_trusted(stored: Path, identity: dict[str, str], key: bytes) -> dict[str, Any] | None:
    """The stored summary when its MAC holds for this identity under ``key``, else None."""
    from pytest_loops.runtime.trust import json_mac, mac_matches

    try:
        data = json.loads(stored.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SHARED_SCHEMA or data.get("identity") != identity:
        return None
    summary = data.get("result")
    expected = json_mac(key, SHARED_SCHEMA, {"identity": identity, "result": summary})
    if expected is None or not mac_matches(expected, data.get("mac")) or not isinstance(summary, dict):
        return None
    return summary


def shared_result(session_dir: Path, nodeid: str, spec: LoopSpec, run, *, key: bytes,
                  loop_file: str | None = None) -> LoopResult:
    """Run `run(spec)` once per `session_dir`; later callers read the stored result.

    The stored result is trusted only when its HMAC under ``key`` (the session's,
    never in a file or the environment) holds for this loop's identity. One that
    does not (forged, or another loop's) is removed and the loop is run; when it
    cannot be removed the item fails with one line.
    """
    from filelock import FileLock

    from pytest_loops.artifacts.runlog import atomic_write_text
    from pytest_loops.runtime.trust import json_mac

    session_dir.mkdir(parents=True, exist_ok=True)
    identity = shared_identity(nodeid, spec, loop_file)
    stored = shared_result_path(session_dir, identity)
    with FileLock(str(stored.with_suffix(".lock"))):
        if stored.exists() or stored.is_symlink():
            summary = _read_trusted(stored, identity, key)
            if summary is not None:
                try:
                    return result_from_summary(spec, summary)
                except (KeyError, TypeError, ValueError, AttributeError):
                    pass  # authentic but unreadable: run the loop again
            try:
                stored.unlink()
            except OSError:
                raise SharedResultUntrusted(
                    f"stored result {stored} failed authentication; not trusted (and it cannot be "
                    "removed to run the loop again)") from None
        result = run(spec)
        summary = _summary_of(result)
        value = json_mac(key, SHARED_SCHEMA, {"identity": identity, "result": summary})
        if value is not None:
            payload = {"schema": SHARED_SCHEMA, "identity": identity, "result": summary, "mac": value}
            try:
                atomic_write_text(stored, json.dumps(payload))
            except OSError:
                pass  # the others run the loop themselves; this result stands
        return result


def merge_file_spec(spec: LoopSpec, settings: Any) -> LoopSpec:
    """Session settings fill what the loop file left at its default.

    Precedence: defaults < config file < ini < environment < command line < loop file line.
    The settings merged are the rows of the settings table with a loop file key.
    """
    from pytest_loops.settings import BY_NAME, FILE_MERGED, file_has

    origin = dict(spec.origin)
    guards = spec.guards.to_dict()
    changes: dict[str, Any] = {}
    for name in FILE_MERGED:
        row = BY_NAME[name]
        if file_has(row, origin) or name not in settings.values:
            continue
        value = settings[name]
        if not row.guard and value in (None, [], ()):
            continue  # nothing from the session either: the file's default stands
        if row.guard:
            guards[name] = value
        else:  # the LoopSpec field (lessons_page is memory_page there)
            changes[row.record_key] = tuple(value) if row.repeatable else value
        origin[row.record_key] = settings.origin.get(name, "default")
    return spec.replace(guards=Guards(**guards), origin=origin, **changes)

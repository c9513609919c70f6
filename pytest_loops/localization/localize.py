"""Suspects for the revise step: spectrum-based fault localization between iterations.

When a failed check is a pytest run (a named test, the session's failing tests,
or a plain `pytest ...` command), its failing tests and the tests beside them
run once more under per-test coverage; lines are ranked by Ochiai and the top
ones go into LOOP_PROMPT_FILE and `suspects.json`. Anything that goes wrong here
costs the loop nothing but the hints.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_loops.limits import read_own_text, write_fresh
from pytest_loops.results import CheckResult

if TYPE_CHECKING:
    from pytest_loops.core.context import LoopContext

TOP = 10
IMPACT_MAP = "impact.json"
TIMEOUT_S = 300.0
# Spectra a check collected itself (the session fix-loop's rerun under coverage), and
# the one line on what localization cost or why it was skipped: read, never re-run.
SPECTRA_FILE = "spectra.json"
NOTE_FILE = "suspects-note.txt"
# {file: [line, ...]}: lines changed since the last green run, when a caller knows them
# (the session fix-loop, from its stored impact map); they rank first
CHANGED_FILE = "changed-lines.json"
PEERS = 50  # passing peers sampled into a spectrum (enough for Ochiai, cheap in one process)
COVERAGE_FACTOR = 2.0  # a test under per-test coverage takes about this much longer
COVERAGE_START_S = 0.15  # importing and starting coverage in the child
DEFAULT_CAP = ("fraction", 0.2)
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)")


def parse_cap(raw: Any, where: str = "suspects_cap") -> tuple[str, float]:
    """``suspects_cap`` (validated by its settings row): a fraction of a plain run (``0.2``), a
    percent (``"20%"``), seconds (``"30s"``) or 0 (no cap) -> ``("fraction", f)``,
    ``("seconds", s)`` or ``("off", 0.0)``."""
    from pytest_loops.settings import BY_NAME

    text = BY_NAME["suspects_cap"].parse(raw, where)
    if text.endswith("%"):
        kind, value = "fraction", float(text[:-1]) / 100.0
    elif text.endswith("s"):
        kind, value = "seconds", float(text[:-1])
    else:
        kind, value = "fraction", float(text)
    return ("off", 0.0) if value == 0 else (kind, value)


# A fraction of a plain run is never less than this: on a small suite a fifth of a
# second-long run is less than starting one pytest, so the first prompt would never
# name a suspect, though localizing costs a second or two.
MIN_FRACTION_CAP_S = 2.0


def cap_seconds(cap: tuple[str, float], plain_run_s: float) -> float | None:
    """The cap in seconds for a session whose plain run took ``plain_run_s``; None = no cap.
    A fraction's cap is at least :data:`MIN_FRACTION_CAP_S`."""
    kind, value = cap
    if kind == "off":
        return None
    if kind == "seconds":
        return value
    return max(value * max(0.0, plain_run_s), MIN_FRACTION_CAP_S)


def sample_peers(failing: Sequence[str], known: Sequence[str], *, limit: int = PEERS,
                 durations: Mapping[str, float] | None = None) -> list[str]:
    """Passing peers for a spectrum: the failing tests' own files first (the quickest
    of them, by ``durations``, when there are more than ``limit``), then an even sample
    of the rest, ``limit`` in all (every known test when there are no more)."""
    failing_set = set(failing)
    rest = [t for t in known if t not in failing_set]
    if len(rest) <= limit:
        return rest
    files = {t.split("::", 1)[0] for t in failing}
    near = [t for t in rest if t.split("::", 1)[0] in files]
    if len(near) > limit:
        quickest = set(sorted(near, key=lambda t: (durations or {}).get(t, 0.0))[:limit])
        near = [t for t in near if t in quickest]
    far = [t for t in rest if t.split("::", 1)[0] not in files]
    room = limit - len(near)
    if room > 0 and far:
        step = len(far) / room
        near += [far[int(i * step)] for i in range(min(room, len(far)))]
    return near


def estimate_cost(durations: Mapping[str, float], failing: Sequence[str], peers: Sequence[str], *,
                  start_s: float = 0.0, alone: bool = False) -> float:
    """Seconds localization adds: ``start_s`` (pytest's start-up and collection), coverage's
    start and the peers under coverage, and the failing tests: all of their time under
    coverage in a run of its own (``alone``), else only their slowdown inside a rerun that
    runs them anyway."""
    peer_s = sum(durations.get(t, 0.0) for t in peers)
    failing_s = sum(durations.get(t, 0.0) for t in failing)
    return (start_s + COVERAGE_START_S + COVERAGE_FACTOR * peer_s
            + (COVERAGE_FACTOR if alone else COVERAGE_FACTOR - 1.0) * failing_s)


def failing_tests(failed: list[CheckResult]) -> list[str]:
    """Pytest node ids the failed checks name or print (`FAILED nodeid` lines)."""
    ids: dict[str, None] = {}
    for check in failed:
        for nodeid in check.failing_tests:
            ids.setdefault(nodeid, None)
        if check.failing_tests or not check.command or "pytest" not in check.command:
            continue
        from pytest_loops.localization.narrow import narrow_pytest_command

        if narrow_pytest_command(check.command) is None:
            continue
        from pytest_loops.runtime.capture import output_lines

        for line in output_lines(check.output_file, check.output_tail):
            match = _FAILED_LINE.match(line)
            if match:
                ids.setdefault(match.group(1), None)
    return list(ids)


def affected_tests(context: LoopContext) -> list[str]:
    """Tests whose executed code blocks changed since the impact map was made (from
    the last localization run); [] when there is no map or it cannot vouch for a
    subset (the confirm run before SUCCESS covers everything else)."""
    from pytest_loops.localization.impact import ImpactMap

    impact = ImpactMap.load(context.run_dir / IMPACT_MAP)
    if impact is None:
        return []
    selection = impact.affected(context.workdir, all_tests=list(impact.tests))
    return [] if selection.run_all else selection.tests


def narrowed_command(command: str, last: CheckResult, context: LoopContext) -> tuple[str, int] | None:
    """Affected reruns: ``command`` (a plain `pytest ...` check that failed last iteration
    as ``last``) cut down to its failing tests and the tests whose executed code changed,
    as a shell command and the number of tests; None when it cannot be narrowed."""
    from pytest_loops.localization.narrow import narrow_pytest_command

    narrowed = narrow_pytest_command(command)
    failing = failing_tests([last])
    if narrowed is None or not failing:
        return None
    subset = list(dict.fromkeys([*failing, *affected_tests(context)]))
    return shlex.join(narrowed.with_targets(subset)), len(subset)


def suspect_functions(suspects: list[dict], limit: int) -> list[str]:
    """The functions (scopes) of ranked suspects (``suspects.json`` entries), best first."""
    from pytest_loops.localization.suspects import Suspect, group_suspects

    ranked = [Suspect(file=d["file"], line=d["line"], score=float(d.get("score") or 0.0),
                      source=str(d.get("source", "")), scope=str(d.get("scope") or ""))
              for d in suspects]
    return [group.describe(len(ranked)) for group in group_suspects(ranked)[:limit]]


class Localizer:
    """This module as the object the loop's checks and revise step use
    (:class:`pytest_loops.core.context.Localizer`); the layer above hands it to the engine."""

    def failing_tests(self, failed: list[CheckResult]) -> list[str]:
        return failing_tests(failed)

    def narrowed_command(self, command: str, last: CheckResult, context: LoopContext) -> tuple[str, int] | None:
        return narrowed_command(command, last, context)

    def localize(self, context: LoopContext, failed: list[CheckResult]) -> Path | None:
        return localize(context, failed)

    def suspect_functions(self, suspects: list[dict], limit: int) -> list[str]:
        return suspect_functions(suspects, limit)


def localize(context: LoopContext, failed: list[CheckResult]) -> Path | None:
    """Rank suspect lines for this iteration; sets ``context.suspects`` and writes
    ``suspects.json`` in the iteration directory (and the run directory's latest
    copy). Returns the file, or None when there was nothing to localize."""
    note = _read_note(context)
    if note:
        context.suspects_note = note
    precollected = context.iteration_dir / SPECTRA_FILE
    if note and not precollected.is_file():
        ranked = context.iteration_dir / "suspects.json"  # the check ranked them itself (from a map)
        return ranked if context.suspects and ranked.is_file() else None
    tests = failing_tests(failed)
    if not tests:
        return None
    if precollected.is_file():
        return _rank(context, precollected)
    from pytest_loops.localization.impact import peer_tests
    from pytest_loops.localization.spectra import SpectraError, collect_spectra

    left = context.time_left()
    timeout = TIMEOUT_S if left is None else min(TIMEOUT_S, left)
    if timeout <= 0:
        return None
    data_file = context.iteration_dir / "spectra.json"
    try:
        spectra = collect_spectra(context.workdir, peer_tests(tests), data_file=data_file,
                                  timeout=timeout, env=context.base_env, runner=context.confined_runner())
    except (SpectraError, OSError):
        return None
    finally:  # the re-run's output may echo secrets, like any check's
        _scrub_files(context, data_file, data_file.with_name(data_file.name + ".out"))
    try:  # the same run maps each test to the code blocks it ran: affected reruns use it
        from pytest_loops.localization.impact import ImpactMap

        # the last iteration's map (a hint only: it chooses what a narrowed rerun runs
        # beside the failing tests, never what SUCCESS needs) lends its digests
        previous = ImpactMap.load(context.run_dir / IMPACT_MAP)
        ImpactMap.from_spectra(spectra, context.workdir, previous=previous,
                              covered_only=True).save(context.run_dir / IMPACT_MAP)
    except (OSError, ValueError):
        pass
    return _publish(context, spectra)


def _publish(context: LoopContext, spectra: Any) -> Path:
    """The top suspects of these spectra: for the prompt, in the iteration's and the run's
    ``suspects.json``."""
    from pytest_loops.localization.suspects import format_suspects, rank_suspects

    suspects = rank_suspects(spectra, top=TOP, changed=_read_changed(context))
    context.suspects = format_suspects(suspects, limit=TOP)
    payload = json.dumps([s.to_dict() for s in suspects], indent=2)
    target = context.iteration_dir / "suspects.json"
    write_fresh(target, payload)  # never through a link a check left in the run directory
    write_fresh(context.run_dir / "suspects.json", payload)
    return target


def publish_blocks(context: LoopContext, blocks: Sequence[tuple[str, float]]) -> int:
    """Suspects named by function (``("file::name", score)``, from an impact map) rather
    than by line: each one's ``def`` line, for the prompt and ``suspects.json``. Returns
    how many could be placed in the current files."""
    import ast

    from pytest_loops.localization.suspects import Suspect, format_suspects

    trees: dict[str, Any] = {}
    suspects: list[Suspect] = []
    for block, score in blocks[:TOP]:
        path, name = block.rsplit("::", 1)
        if path not in trees:
            try:
                text = (Path(context.workdir) / path).read_text(encoding="utf-8")
                trees[path] = (ast.parse(text), text.splitlines())
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                trees[path] = None
        if trees[path] is None:
            continue
        tree, lines = trees[path]
        node = _find_def(tree, name.split("#", 1)[0].split("."))
        if node is None:
            continue
        suspects.append(Suspect(file=path, line=node.lineno, score=round(score, 4),
                                source=lines[node.lineno - 1].strip(), scope=f"{name.split('#', 1)[0]}()"))
    if not suspects:
        return 0
    context.suspects = format_suspects(suspects, limit=TOP)
    payload = json.dumps([s.to_dict() for s in suspects], indent=2)
    write_fresh(context.iteration_dir / "suspects.json", payload)
    write_fresh(context.run_dir / "suspects.json", payload)
    return len(suspects)


def _find_def(tree: Any, names: list[str]) -> Any:
    import ast

    body = tree.body
    node = None
    for part in names:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if not isinstance(node, ast.ClassDef) else None


def changed_lines(impact: Any, workdir: str | Path, failing: Sequence[str]) -> dict[str, list[int]]:
    """The lines of the functions that changed since ``impact`` (a map of the last green
    run) was made and that the ``failing`` tests ran then (``{file: [line, ...]}``);
    {} when the map cannot say."""
    import ast

    changed: dict[str, list[int]] = {}
    trees: dict[str, Any] = {}
    for block, _ in impact.changed_suspects(workdir, failing):
        path, name = block.rsplit("::", 1)
        if path not in trees:
            try:
                trees[path] = ast.parse((Path(workdir) / path).read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                trees[path] = None
        node = _find_def(trees[path], name.split("#", 1)[0].split(".")) if trees[path] is not None else None
        if node is not None:
            changed.setdefault(path, []).extend(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return changed


def write_changed(context: LoopContext, changed: Mapping[str, Sequence[int]]) -> None:
    """Hand :func:`changed_lines` to this iteration's ranking (nothing when there are none)."""
    if changed:
        try:
            (context.iteration_dir / CHANGED_FILE).write_text(json.dumps(changed), encoding="utf-8")
        except OSError:
            pass


def _read_changed(context: LoopContext) -> dict[str, set[int]] | None:
    try:
        raw = json.loads((context.iteration_dir / CHANGED_FILE).read_text(encoding="utf-8"))
        return {str(f): {int(n) for n in lines} for f, lines in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _read_note(context: LoopContext) -> str:
    try:
        return read_own_text(context.iteration_dir / NOTE_FILE, errors="replace").strip()[:300]
    except OSError:
        return ""


def _rank(context: LoopContext, data_file: Path) -> Path | None:
    """Suspects from spectra a check already collected (no run of its own)."""
    from pytest_loops.localization.spectra import SpectraError, read_spectra

    try:
        spectra = read_spectra(data_file)
    except SpectraError:
        return None
    if not spectra.failed:
        return None
    return _publish(context, spectra)


def _scrub_files(context: LoopContext, *paths: Path) -> None:
    """Mask secret values in files this module leaves in the iteration directory."""
    if context.scrub is None:
        return
    for path in paths:
        try:
            text = read_own_text(path, errors="surrogateescape")
            clean = context.scrub(text)
            if clean != text:
                write_fresh(path, clean, errors="surrogateescape")
        except OSError:
            pass

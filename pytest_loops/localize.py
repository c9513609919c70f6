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
from pathlib import Path
from typing import TYPE_CHECKING

from .results import CheckResult

if TYPE_CHECKING:
    from .engine import LoopContext

TOP = 10
IMPACT_MAP = "impact.json"
TIMEOUT_S = 300.0
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)")


def failing_tests(failed: list[CheckResult]) -> list[str]:
    """Pytest node ids the failed checks name or print (`FAILED nodeid` lines)."""
    ids: dict[str, None] = {}
    for check in failed:
        for nodeid in check.failing_tests:
            ids.setdefault(nodeid, None)
        if check.failing_tests or not check.command or "pytest" not in check.command:
            continue
        from .coverage_intel import narrow_pytest_command

        if narrow_pytest_command(check.command) is None:
            continue
        from .output import output_lines

        for line in output_lines(check.output_file, check.output_tail):
            match = _FAILED_LINE.match(line)
            if match:
                ids.setdefault(match.group(1), None)
    return list(ids)


def affected_tests(context: LoopContext) -> list[str]:
    """Tests whose executed code blocks changed since the impact map was made (from
    the last localization run); [] when there is no map or it cannot vouch for a
    subset (the confirm run before SUCCESS covers everything else)."""
    from .coverage_intel import ImpactMap

    impact = ImpactMap.load(context.run_dir / IMPACT_MAP)
    if impact is None:
        return []
    selection = impact.affected(context.workdir, all_tests=list(impact.tests))
    return [] if selection.run_all else selection.tests


def localize(context: LoopContext, failed: list[CheckResult]) -> Path | None:
    """Rank suspect lines for this iteration; sets ``context.suspects`` and writes
    ``suspects.json`` in the iteration directory (and the run directory's latest
    copy). Returns the file, or None when there was nothing to localize."""
    tests = failing_tests(failed)
    if not tests:
        return None
    from .coverage_intel import (
        SpectraError,
        collect_spectra,
        format_suspects,
        peer_tests,
        rank_suspects,
    )

    left = context.time_left()
    timeout = TIMEOUT_S if left is None else min(TIMEOUT_S, left)
    if timeout <= 0:
        return None
    data_file = context.iteration_dir / "spectra.json"
    try:
        spectra = collect_spectra(context.workdir, peer_tests(tests), data_file=data_file,
                                  timeout=timeout, env=context.base_env, runner=context.runner)
    except (SpectraError, OSError):
        return None
    finally:  # the re-run's output may echo secrets, like any check's
        _scrub_files(context, data_file, data_file.with_name(data_file.name + ".out"))
    try:  # the same run maps each test to the code blocks it ran: affected reruns use it
        from .coverage_intel import ImpactMap

        ImpactMap.from_spectra(spectra, context.workdir).save(context.run_dir / IMPACT_MAP)
    except (OSError, ValueError):
        pass
    suspects = rank_suspects(spectra, top=TOP)
    context.suspects = format_suspects(suspects, limit=TOP)
    payload = json.dumps([s.to_dict() for s in suspects], indent=2)
    target = context.iteration_dir / "suspects.json"
    target.write_text(payload, encoding="utf-8")
    (context.run_dir / "suspects.json").write_text(payload, encoding="utf-8")
    return target


def _scrub_files(context: LoopContext, *paths: Path) -> None:
    """Mask secret values in files this module leaves in the iteration directory."""
    if context.scrub is None:
        return
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
            clean = context.scrub(text)
            if clean != text:
                path.write_text(clean, encoding="utf-8", errors="surrogateescape")
        except OSError:
            pass

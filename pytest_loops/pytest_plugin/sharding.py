"""``--loop-shard=I/N`` in a session: which loops this job runs, and its record.

The split itself is :mod:`pytest_loops.artifacts.shard`. Here: the session's units
(a loop file's loop or pipeline, a test with a loop marker), the loops of other
shards deselected through pytest's own ``pytest_deselected`` hook, the session
fix-loop's failing tests kept when their failure site is this shard's, and
``shard.json`` at the end. Ordinary tests always run: every job sees every failure,
so every job computes the same failure groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_loops.artifacts.shard import Unit, assign, failure_site, failure_units, read_durations, write_record
from pytest_loops.settings import parse_shard

# workerinput key: the durations the controller read, so every xdist worker splits alike
DURATIONS_KEY = "loop_shard_durations"
# workeroutput key: the units a worker ran
UNITS_KEY = "loop_shard_units"
FILE_KIND, MARKER_KIND, FAILURES_KIND = "loop file", "marker loop", "fix-loop"
# a loop file's item -> (its unit's node id, the loops the unit runs), None for other items
FileUnit = Callable[[pytest.Item], "tuple[str, tuple[str, ...]] | None"]


class Sharding:
    """One session's shard: ``index`` of ``total``."""

    def __init__(self, text: str, session: Any) -> None:  # a state.SessionState
        self.text = text
        self.index, self.total = parse_shard(text)
        self.session = session
        self.units: set[tuple[str, str]] = set()  # (kind, identity) this job ran
        self.sites: dict[str, str] = {}  # failing test -> where it fails
        self.elsewhere: list[str] = []  # failing tests another shard's fix-loop owns
        self.deselected = 0  # items of other shards' loops
        self._durations: dict[str, float] | None = None

    def durations(self) -> dict[str, float]:
        """The last known durations (read once, on the controller; a worker's come from it)."""
        if self._durations is None:
            workerinput = getattr(self.session.config, "workerinput", None)
            if workerinput is not None and isinstance(workerinput.get(DURATIONS_KEY), dict):
                self._durations = dict(workerinput[DURATIONS_KEY])
            else:
                self._durations = read_durations(self.session.artifacts_dir / "index.jsonl")
        return self._durations

    # -- loops: deselected when they are another shard's -------------------------------------

    def select(self, config: pytest.Config, items: list[pytest.Item], marked: list[pytest.Item],
               file_unit: FileUnit | None) -> list[pytest.Item]:
        """Deselect the loops of the other shards; return the marked items kept.

        ``file_unit`` tells a loop file's item's unit (``items.loop_unit``); None when
        the session collected no loop file."""
        unit_of: dict[int, tuple[str, Unit]] = {}
        units: dict[str, Unit] = {}
        marked_ids = {id(item) for item in marked}
        if file_unit is not None:
            for item in items:
                identified = file_unit(item)
                if identified is None:
                    continue
                nodeid, names = identified
                unit = units.setdefault(nodeid, Unit(nodeid, names))
                unit_of[id(item)] = (FILE_KIND, unit)
        for item in items:
            if id(item) in marked_ids and id(item) not in unit_of:
                unit = units.setdefault(item.nodeid, Unit(item.nodeid, (item.nodeid,)))
                unit_of[id(item)] = (MARKER_KIND, unit)
        if not units:
            return marked
        chosen = assign(list(units.values()), self.total, self.durations())
        kept, dropped = [], []
        for item in items:
            found = unit_of.get(id(item))
            if found is None or chosen[found[1].identity] == self.index:
                kept.append(item)
                if found is not None:
                    self.units.add((found[0], found[1].identity))
            else:
                dropped.append(item)
        if dropped:
            self.deselected += len(dropped)
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
        mine = {id(item) for item in kept}
        return [item for item in marked if id(item) in mine]

    # -- the session fix-loop: failing tests by where they fail ------------------------------

    def note_failure(self, report: pytest.TestReport) -> None:
        if report.nodeid in self.sites:
            return
        from pytest_loops.localization.spectra import is_test_file

        self.sites[report.nodeid] = failure_site(report, self.session.rootdir, is_test_file)

    def split_failures(self, failing: list[str]) -> tuple[list[str], list[str]]:
        """(this shard's failing tests, the other shards'): whole failure groups."""
        sites = {nodeid: self.sites.get(nodeid, nodeid.split("::", 1)[0]) for nodeid in failing}
        units = failure_units(sites)
        weighted = [Unit(u.identity, tuple(n for n in failing if f"failing tests in {sites[n]}" == u.identity))
                    for u in units]
        chosen = assign(weighted, self.total, dict.fromkeys(failing, 1.0))
        here = [n for n in failing if chosen[f"failing tests in {sites[n]}"] == self.index]
        for nodeid in here:
            self.units.add((FAILURES_KIND, f"failing tests in {sites[nodeid]}"))
        return here, [n for n in failing if n not in set(here)]

    # -- xdist and the record -------------------------------------------------------------------

    def configure_node(self, node: Any) -> None:
        node.workerinput[DURATIONS_KEY] = self.durations()

    def worker_done(self, config: pytest.Config) -> None:
        config.workeroutput[UNITS_KEY] = sorted(self.units)  # type: ignore[attr-defined]  # xdist

    def node_down(self, node: Any) -> None:
        output = getattr(node, "workeroutput", None) or {}
        for kind, identity in output.get(UNITS_KEY, ()):
            self.units.add((str(kind), str(identity)))

    def write(self) -> str | None:
        """``shard.json`` in the artifacts directory; an OSError is the caller's artifact error."""
        logs = [str(row["artifact_log"]) for row in self.session.rows if row.get("artifact_log")]
        return str(write_record(self.session.artifacts_dir, self.text, self.units, self.session.testrunuid, logs))

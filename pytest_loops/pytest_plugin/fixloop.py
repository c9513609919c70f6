"""`pytest --loop --loop-revise CMD`: the session's failing tests become one fix-loop.

Each iteration re-runs only the tests still failing (a fresh pytest process,
under per-test coverage with a sample of passing peers when that fits the
``suspects_cap``: the suspects come from it); when they all pass, the clean-room
judged run is the confirm run that decides SUCCESS: every test the session ran,
or with ``confirm = affected`` and an impact map made before the first revise,
the tests the changes can reach plus the failing ones. A test that was green in
the session and fails there is a regression: the loop goes on, and if it ends
before a revise repairs it, the reason names it.

The map is made in iteration 1 (localization that covered every test) or comes
from an earlier loop on the tree: after a SUCCESS whose judged run covered every
test, the tests run once more under per-test coverage in a detached process
(``impact_map = background``, :mod:`pytest_loops.localization.recorder`), or the
judged run itself runs under it (``inline``); the map is stored, signed, outside
the tree (:mod:`pytest_loops.localization.mapstore`); it is read before the first revise.
With such a stored map fresh, the first suspects come from it, and from
iteration 2 the judged run is the rerun (none in the working tree).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from pytest_loops.artifacts.junit import passed_nodeids, seconds_by_nodeid
from pytest_loops.core.checks import CHILD_ENV, digest_file, pytest_command
from pytest_loops.core.context import LoopContext
from pytest_loops.core.revise import name_list
from pytest_loops.limits import write_fresh
from pytest_loops.pytest_plugin.options import SUSPECTS_CHOICES, choice_value, fixloop_settings
from pytest_loops.pytest_plugin.state import SESSION_LOOP_NAME, SessionState
from pytest_loops.pytest_plugin.terminal import shown
from pytest_loops.redact import redact, scrub_file, strip_control
from pytest_loops.results import CheckResult, CommandResult, LoopResult
from pytest_loops.spec import Check, CheckKind

hookimpl = pluggy.HookimplMarker("pytest")

CHECK_NAME = "the failing tests pass"
CI_VARIABLES = ("CI", "BUILD_NUMBER")
"""Set (non-empty) in a CI job, as pytest reads them: no impact map is recorded there."""


def passed_ids(output_file: str | None, tail: str) -> set[str]:
    """Node ids that passed, from pytest's `-rA` short summary (`PASSED nodeid`).

    The whole rest of the line is the node id (parametrize ids may hold spaces);
    colour codes (PY_COLORS / FORCE_COLOR in the environment) are ignored.
    """
    from pytest_loops.runtime.capture import output_lines

    passed: set[str] = set()
    for line in output_lines(output_file, tail):
        line = strip_control(line).rstrip()
        if line.startswith("PASSED "):
            passed.add(line[len("PASSED "):])
    return passed


@dataclass(frozen=True)
class _Mapping:
    """A judged run measured under per-test coverage: its plugin, environment, data file,
    root in the clean room, and the room's files just before it ran."""

    plugin: str
    env: dict[str, str]
    data: Path
    root: Path
    before: tuple[dict[str, list[Any]], int]


class SessionFixCheck:
    """Answers `pytest_loop_run_check` for the session fix-loop's one check.

    Iteration 1 is the session itself (plus, within the cap, one run under coverage
    for suspects); from iteration 2 the failing tests re-run in one process under
    per-test coverage with a sample of passing peers (suspects come from that run);
    once they pass, the clean-room run (the judge's) is the confirm run.
    """

    def __init__(self, failing: list[str], green: list[str], first_output: str, pytest_args: list[str], *,
                 rootdir: Path | None = None, durations: dict[str, float] | None = None,
                 report_s: dict[str, float] | None = None,
                 plain_run_s: float = 0.0, startup_s: float = 0.0, collect_s: float = 0.0, test_files: int = 0,
                 cap: tuple[str, float] | None = None,
                 localize: bool = False, confirm: str = "full", impact_map: str = "inline", workers: Any = None,
                 store: Any = None) -> None:
        from pytest_loops.localization.localize import DEFAULT_CAP

        self.original_failing = list(failing)
        self.green = list(green)
        self.failing = list(failing)
        self.first_output = first_output
        self.pytest_args = pytest_args
        self.regressions: list[str] = []
        self.rootdir = rootdir
        self.durations = dict(durations or {})
        self.report_s = dict(report_s or {})  # making each failing test's reports, in the session
        self.plain_run_s = plain_run_s
        self.startup_s = startup_s
        self.collect_s = collect_s
        self.test_files = test_files
        self.cap = cap or DEFAULT_CAP
        self.localize = localize
        self.confirm = confirm
        self.workers = workers
        self._times: dict[str, float] = {}  # the last rerun's JUnit times (by node id)
        # the impact map: the stored one (read before any revise), or one made in iteration 1
        self.store: Any = store
        self.impact: Any = None
        self.map_note = ""
        self.unrecorded = ""  # why a green judged run of every test stored no map, when it says
        self.impact_map = impact_map
        # after a green judged run of every test (impact_map=background): what to record
        self.background: list[str] = []
        self.workdir: Path | None = None  # the loop's working directory (not the clean room's)
        self.tier = ("none", True)  # the loop's isolation tier and network, for the recorder
        if store is not None and confirm == "affected":
            self.impact = store.load()
            self.map_note = store.note or self._recording_note()
        self.stored: Any = self.impact

    def _recording_note(self) -> str:
        """Why there is no stored map, when a background recording says."""
        from pytest_loops.localization import recorder

        if recorder.running(self.store.status_path):
            return "it is being recorded in the background: not used this time"
        result = str(recorder.status(self.store.status_path).get("result") or "")
        return f"the last background recording: {result}" if result.startswith("no impact map") else ""

    def _run(self, ids: list[str], context: LoopContext, label: str, spectra: Path | None = None,
             peers: list[str] | None = None, record: bool = True) -> tuple[CommandResult, set[str]]:
        args_file = context.iteration_dir / f"{label}.ids"
        write_fresh(args_file, "\n".join(ids) + "\n")
        targets = [f"@{args_file}"]
        if peers:  # passing peers for the spectrum, in a file of their own
            peers_file = context.iteration_dir / f"{label}.peers.ids"
            write_fresh(peers_file, "\n".join(peers) + "\n")
            targets.append(f"@{peers_file}")
            ids = [*ids, *peers]
        junit = context.iteration_dir / f"{label}.junit.xml"
        junit.unlink(missing_ok=True)  # pytest writes it anew, not through a link left there
        extra_env = {CHILD_ENV: "1"}
        args = [*map(context.moved, self.pytest_args), "-rA", "-p", "no:randomly"]
        if spectra is not None:  # one process: the rerun and the spectra
            from pytest_loops.localization.spectra import PLUGIN, spectra_command

            spectra.unlink(missing_ok=True)
            _, env = spectra_command(context.workdir, [], data_file=spectra, base_env=context.base_env)
            extra_env.update(env)
            args = ["-p", PLUGIN, *args]
        command = pytest_command(targets, str(junit), args)
        result = context.run_command(command, label=label, extra_env=extra_env)
        passed = passed_nodeids(junit, ids)  # preferred to the text summary, which options can change
        if record:  # a candidate's rerun is not this loop's
            self._times = seconds_by_nodeid(junit, ids)
        if context.scrub is not None:  # read: now mask what the child wrote (failure messages)
            for path in (junit, args_file):
                scrub_file(path, context.scrub)
        return result, passed if passed is not None else passed_ids(result.output_file, result.tail)

    def _result(self, check: Check, cmd: CommandResult, passed: bool, reason: str) -> CheckResult:
        return CheckResult(name=check.name, kind=check.kind.value, passed=passed, exit_code=cmd.exit_code,
                           duration_s=cmd.duration_s, output_tail=cmd.tail, output_file=cmd.output_file,
                           reason=reason, timed_out=cmd.timed_out,
                           output_digest=digest_file(cmd.output_file, cmd.tail), command=cmd.command,
                           failing_tests=() if passed else tuple(self.failing))

    def _everything(self) -> list[str]:
        return self.original_failing + [n for n in self.green if n not in self.original_failing]

    # -- what the clean-room run covers ---------------------------------------------------

    def confirm_selection(self) -> tuple[list[str], str]:
        """The tests the judged run covers, and why: with confirm=affected and a fresh
        impact map (made before the first revise, knowing every test of the session),
        the tests the changes since can reach plus every test that failed; else all.

        The map is held in memory: the one this object made, or the signed one stored by
        an earlier loop's green judged run and read before the first revise; never one
        read back from the artifacts directory (a revise step can write there), nor one
        updated from spectra a process running the revised code wrote."""
        everything = self._everything()
        if self.confirm == "full":
            return everything, "full (confirm=full)"
        from pytest_loops.localization.impact import _snapshot
        from pytest_loops.localization.spectra import is_test_file

        impact = self.impact
        if impact is None or self.rootdir is None:
            return everything, f"full (no impact map: {self.map_note})" if self.map_note else "full (no impact map)"
        current = _snapshot(impact.root, impact.exclude, impact.files, impact.snapshot_at)
        for path in sorted(set(current) | set(impact.files)):
            now, then = current.get(path), impact.files.get(path)
            if (now is None or then is None or now[0] != then[0]) and is_test_file(path):
                return everything, f"full ({path} changed: a test file or conftest.py)"
        selection = impact.affected(self.rootdir, all_tests=everything)
        if selection.run_all:
            return everything, f"full ({selection.reason})"
        chosen = set(selection.tests) | set(self.original_failing) | set(self.failing)
        ids = [t for t in everything if t in chosen]
        return ids, f"affected: {selection.reason}"

    def _judged(self, check: Check, context: LoopContext) -> CheckResult:
        """In the clean room, witnessed by the harness's plugin: the confirm run."""
        room = context.clean_room
        assert room is not None
        ids, scope = self.confirm_selection()
        args_file = Path(room.parent) / "session-ids.txt"
        args_file.write_text("\n".join(ids) + "\n", encoding="utf-8")
        channel = room.channel()
        try:
            extra = list(self.pytest_args)
            if self.workers:
                extra += ["-n", str(self.workers)]
            extra_env = {**channel.extra_env(), "PYTHONSAFEPATH": "1"}
            mapping = self._mapping(room, ids) if self.impact_map == "inline" else None
            if mapping is not None:  # every test, one process: measured for the next loop's map
                extra = ["-p", mapping.plugin, *extra]
                extra_env.update(mapping.env)
            argv = room.pytest_command([f"@{args_file}"], extra, channel)
            cmd = context.run_command(shlex.join(argv), label="confirm", extra_env=extra_env,
                                      pass_fds=channel.pass_fds)
            record = channel.read()
        finally:
            channel.close()
        if context.budget_hit:
            return self._result(check, cmd, False, "killed during the clean-room run: the budget ran out")
        disagreement = record.disagreement(cmd.exit_code)
        if disagreement:
            return self._result(check, cmd, False,
                                f"the harness's witness disagrees with the exit code: {disagreement}")
        failing = [node for node in ids if node not in record.passed]
        if failing or cmd.exit_code != 0:
            self.failing = failing or self.failing
            if self.localize:  # with a fresh map, the next prompt's suspects come from it
                self._map_suspects(context, self.failing)
            self.regressions = [node for node in failing if node in self.green]
            what = (f"{len(failing)} failing: " + ", ".join(failing[:5]) if failing
                    else f"pytest exited {cmd.exit_code}")
            return self._result(check, cmd, False, self._reason(f"clean room, {scope}: {what}"))
        if mapping is not None:
            recorded = self._record_map(mapping, ids, record.passed)
        elif self.impact_map != "inline" and self._map_root(room, ids, measured=False) is not None:
            self.background = list(ids)
            self._keep_tier(context)
            recorded = "; its impact map is recorded in the background after the verdict"
        else:
            recorded = self.unrecorded
        return self._result(check, cmd, True,
                            f"clean room: all {len(ids)} test(s) passed (witnessed); {scope}{recorded}")

    # -- the impact map of the next loop ------------------------------------------------------

    def _map_root(self, room: Any, ids: list[str], *, measured: bool) -> Path | None:
        """The rootdir in the room when the judged run of ``ids`` (every test, no map chose
        them) should leave a map for a later loop, so that it judges only what its changes
        reach; None (and :attr:`unrecorded` saying why, where it says) when not.
        ``measured``: the judged run itself is measured (not under xdist); else the
        recorder measures the same tests after the verdict."""
        if self.impact_map == "off" and self.store is not None and self.confirm == "affected":
            self.unrecorded = "; no impact map recorded (impact_map=off)"
            return None
        if (self.store is None or self.confirm != "affected" or (self.workers and measured)
                or self.rootdir is None or ids != self._everything()):
            return None
        if any(os.environ.get(name) for name in CI_VARIABLES):
            # a CI job's state directory does not outlive it: measuring would cost its
            # judged run (up to twice the time under coverage) for a map no loop reads
            self.unrecorded = "; no impact map recorded: a CI job (CI or BUILD_NUMBER is set)"
            return None
        from pytest_loops.runtime.cleanroom import relative_to_room

        root = relative_to_room(os.path.realpath(self.rootdir), room)
        if not str(root).startswith(room.root + os.sep) and str(root) != room.root:
            return None  # the rootdir is outside the tree the clean room copies
        if not measured:
            from pytest_loops.localization import recorder

            if recorder.running(self.store.status_path):
                self.unrecorded = "; no impact map recorded: one is being recorded in the background already"
                return None
        return root

    def _mapping(self, room: Any, ids: list[str]) -> _Mapping | None:
        """How the judged run is measured to record the map itself (``impact_map=inline``)."""
        root = self._map_root(room, ids, measured=True)
        if root is None or self.rootdir is None:  # (a root is only given with a rootdir)
            return None
        from pytest_loops.localization.impact import snapshot
        from pytest_loops.localization.spectra import PLUGIN, spectra_command

        data = Path(room.parent) / "judged-spectra.json"
        # the judged run sees the room at the project's own path when it is mounted there
        seen_at = os.path.realpath(self.rootdir) if room.mounted_at else root
        _, env = spectra_command(seen_at, [], data_file=data, base_env=room.env)
        env.pop(CHILD_ENV, None)
        return _Mapping(PLUGIN, env, data, root, snapshot(root))

    def _keep_tier(self, context: LoopContext) -> None:
        confine = context.confine
        choice = getattr(confine, "choice", None)
        if choice is not None:
            self.tier = (str(choice.tier.value), bool(getattr(confine, "network", True)))

    def record_in_background(self, verdict: Any) -> str:
        """After the loop: start the recorder of the map its judged run left unmeasured
        (a SUCCESS whose judged run covered every test); the note ("" when none)."""
        from pytest_loops.verdict import Verdict

        if not self.background or verdict is not Verdict.SUCCESS or self.store is None:
            return ""
        from pytest_loops.localization import recorder
        from pytest_loops.runtime.reaper import TAG_VARIABLE

        env = {k: v for k, v in os.environ.items() if k != TAG_VARIABLE and not k.startswith("PYTEST_XDIST_")}
        env.pop("PYTEST_CURRENT_TEST", None)
        tier, network = self.tier
        return recorder.launch(self.store, workdir=str(self.workdir or self.rootdir), args=self.pytest_args,
                               ids=self.background, tier=tier, network=network, env=env)

    def _record_map(self, mapping: _Mapping, ids: list[str], witnessed: set[str]) -> str:
        """Store the map of a green judged run of every test; the note for its reason."""
        from pytest_loops.localization.impact import ImpactMap, snapshot
        from pytest_loops.localization.spectra import SpectraError, read_spectra

        try:
            spectra = read_spectra(mapping.data)
        except SpectraError:
            return "; no impact map: the run's coverage was unusable"
        # the coverage must agree with the witness: every test ran, passed, and ran some code
        if not set(ids) <= set(spectra.passed) or not set(ids) <= witnessed:
            return "; no impact map: the coverage and the witness disagree"
        before, _ = mapping.before
        after, _ = snapshot(mapping.root)
        if any(p.endswith(".py") and after.get(p, [None])[0] != entry[0] for p, entry in before.items()):
            return "; no impact map: the run changed Python files of the tree"
        impact = ImpactMap.from_spectra(spectra, mapping.root, before=mapping.before)
        if impact.incomplete or any(not impact.tests[t].deps for t in ids if t in impact.tests):
            return "; no impact map: not every test was measured"
        impact.root = os.path.realpath(str(self.rootdir))
        if not self.store.save(impact):
            return "; no impact map: it could not be signed and stored"
        return f"; impact map of {len(ids)} test(s) stored for the next loop"

    # -- localization within its cap ------------------------------------------------------

    def _cap_s(self) -> float | None:
        from pytest_loops.localization.localize import cap_seconds

        return cap_seconds(self.cap, self.plain_run_s)

    def _cap_text(self, cap: float) -> str:
        kind, value = self.cap
        if kind == "fraction":
            return f"{cap:.2f}s ({value * 100:g}% of the {self.plain_run_s:.2f}s plain run)"
        return f"{cap:.2f}s"

    def _note(self, context: LoopContext, text: str) -> None:
        from pytest_loops.localization.localize import NOTE_FILE

        try:
            write_fresh(context.iteration_dir / NOTE_FILE, text + "\n")
        except OSError:
            pass

    def _collect_share(self, tests: list[str]) -> float:
        """The session's collection time, pro rata for the files of ``tests``."""
        files = {t.split("::", 1)[0] for t in tests}
        return self.collect_s * len(files) / self.test_files if self.test_files else 0.0

    def _peers(self, exclude: list[str]) -> list[str]:
        from pytest_loops.localization.localize import sample_peers

        known = [t for t in self.green if t not in exclude]
        return sample_peers(self.failing, known, durations=self.durations)

    def _first_spectra(self, context: LoopContext) -> None:
        """Iteration 1: one run under coverage of the failing tests and a sample of peers,
        if its estimate fits the cap; a fresh impact map when it covered every test."""
        from pytest_loops.localization.localize import SPECTRA_FILE, estimate_cost

        if self._map_suspects(context):
            return
        peers = self._peers(self.failing)
        # a run of its own makes the failing tests' reports again (coverage pauses there,
        # so a rerun that runs anyway pays them with or without it)
        reports = sum(self.report_s.get(t, 0.0) for t in self.failing)
        estimate = estimate_cost(self.durations, self.failing, peers, alone=True,
                                 start_s=self.startup_s + self._collect_share([*self.failing, *peers]) + reports)
        cap = self._cap_s()
        if cap is not None and estimate > cap:
            self._note(context, f"suspects skipped: a run under coverage would take about {estimate:.2f}s, "
                                f"over the cap of {self._cap_text(cap)}; the next rerun collects them")
            return
        spectra = context.iteration_dir / SPECTRA_FILE
        ids = [*self.failing, *peers]
        self._changed(context)
        cmd, _ = self._run(self.failing, context, "suspects", spectra=spectra, peers=peers)
        if context.budget_hit:
            self._note(context, "suspects skipped: the budget ran out during their run")
            return
        self._note(context, f"suspects: {len(ids)} test(s) under coverage, {cmd.duration_s:.2f}s")
        covered = set(ids) >= set(self._everything())
        if covered and self.rootdir is not None:  # made before any revise: the loop-start baseline
            try:
                from pytest_loops.localization.impact import ImpactMap
                from pytest_loops.localization.localize import IMPACT_MAP
                from pytest_loops.localization.spectra import SpectraError, read_spectra

                self.impact = ImpactMap.from_spectra(read_spectra(spectra), self.rootdir)
                self.impact.save(context.run_dir / IMPACT_MAP)  # an artifact: never read back here
            except (SpectraError, OSError, ValueError):
                pass

    def _map_fresh(self) -> bool:
        """Whether the stored impact map (a green judged run's, read before the first revise)
        can vouch for the changes since it was made (see confirm_selection). A map this loop
        made in iteration 1 does not count here: the loop then measures the rerun itself."""
        if self.impact is None or self.impact is not self.stored or self.rootdir is None:
            return False
        if self.confirm != "affected":
            return False
        return not self.confirm_selection()[1].startswith("full")

    def _map_suspects(self, context: LoopContext, failing: list[str] | None = None) -> bool:
        """Suspects without a run under coverage: the functions the failing tests ran in the
        last green run that changed since (a fresh impact map). False when there are none."""
        if not self._map_fresh():
            return False
        from pytest_loops.localization.localize import publish_blocks

        blocks = self.impact.changed_suspects(self.rootdir, failing or self.failing)
        placed = publish_blocks(context, blocks) if blocks else 0
        if not placed:
            return False
        self._note(context, f"suspects: {placed} function(s) the failing tests ran that changed since the "
                            "last green run (the impact map); no run under coverage")
        return True

    def _rerun_spectra(self, context: LoopContext, ids: list[str]) -> tuple[list[str], Path | None, str]:
        """Iteration >= 2: peers to add to the rerun and where its spectra go (None: the
        rerun runs plain), or the reason localization is skipped."""
        from pytest_loops.localization.localize import SPECTRA_FILE, estimate_cost

        if not self.localize:
            return [], None, ""
        if self._map_fresh():  # a failing rerun's suspects come from the map: it runs plain
            return [], None, ""
        peers = self._peers(ids)
        rerun_files = {t.split("::", 1)[0] for t in ids}
        estimate = estimate_cost(self.durations, self.failing, peers,
                                 start_s=self._collect_share([t for t in peers
                                                              if t.split("::", 1)[0] not in rerun_files]))
        cap = self._cap_s()
        if cap is not None and estimate > cap:
            return [], None, (f"suspects skipped: under coverage the rerun would take about {estimate:.2f}s "
                              f"more, over the cap of {self._cap_text(cap)}")
        self._changed(context)
        return peers, context.iteration_dir / SPECTRA_FILE, ""

    def _changed(self, context: LoopContext) -> None:
        """The lines changed since the last green run, for the ranking of this iteration's
        spectra: from the stored impact map, when it can name them."""
        if self.stored is None or self.rootdir is None:
            return
        from pytest_loops.localization.localize import changed_lines, write_changed

        write_changed(context, changed_lines(self.stored, self.rootdir, self.failing))

    def _after_rerun(self, context: LoopContext, spectra: Path, peers: list[str]) -> None:
        """The cost note of the spectra the rerun collected."""
        try:
            raw = json.loads(spectra.read_text(encoding="utf-8"))
            start_s = float(raw.get("start_s") or 0.0)
        except (OSError, ValueError, AttributeError, TypeError):
            self._note(context, "suspects: the rerun under coverage wrote no usable spectra")
            return
        cost = start_s + sum(self._times.get(t, 0.0) for t in peers)
        # the impact map is not updated from these spectra: the revised code ran in the
        # process that wrote them, and the judged run's selection must not rest on it
        self._note(context, f"suspects: from the rerun, {len(peers)} peer(s), {cost:.2f}s")

    @hookimpl
    def pytest_loop_run_check(self, check: Check, context: LoopContext) -> CheckResult | None:
        if check.name != CHECK_NAME or check.kind is not CheckKind.HOOK:
            return None
        if context.clean_room is not None:
            return self._judged(check, context)
        if self.workdir is None and context.branch is None:
            self.workdir = Path(context.workdir)
        if context.branch is not None:
            return self._candidate(check, context)
        if context.iteration == 1:  # the session itself was iteration 1
            if self.localize:
                self._first_spectra(context)
            return CheckResult(name=check.name, kind=check.kind.value, passed=False, exit_code=1,
                               duration_s=0.0, output_tail=self.first_output[-4000:],
                               reason=f"{len(self.failing)} test(s) failed in the session: "
                                      + ", ".join(self.failing[:5]), failing_tests=tuple(self.failing))
        deferred = self._deferred(check, context)
        if deferred is not None:
            return deferred
        from pytest_loops.localization.localize import affected_tests

        # the failing tests, plus green ones whose executed code the revise changed
        affected = [t for t in affected_tests(context) if t not in self.failing]
        ids = [*self.failing, *affected]
        peers, spectra, skipped = self._rerun_spectra(context, ids)
        cmd, passed = self._run(ids, context, "failing", spectra=spectra, peers=peers)
        if context.budget_hit:
            return self._result(check, cmd, False, "killed: the budget ran out")
        if skipped:
            self._note(context, skipped)
        elif spectra is not None:
            self._after_rerun(context, spectra, peers)
        still = [node for node in [*ids, *peers] if node not in passed]
        if still and self.localize and spectra is None and not skipped:
            self._map_suspects(context, still)
        if still:
            self.failing = still
            self.regressions = [node for node in still if node in self.green]
            return self._result(check, cmd, False, self._reason(f"{len(still)} still failing: " + ", ".join(still[:5])))
        self.regressions = []
        return self._result(check, cmd, True, f"rerun: {len(ids) + len(peers)} test(s) passed; "
                                              "the clean-room run confirms")

    def _candidate(self, check: Check, context: LoopContext) -> CheckResult:
        """A fan-out candidate: the failing tests rerun in its own copy of the tree. It
        only ranks the candidate, so nothing of this loop's state changes."""
        ids = list(self.failing)
        cmd, passed = self._run(ids, context, f"{context.label_prefix}failing", record=False)
        if context.budget_hit:
            return self._result(check, cmd, False, "killed: the budget ran out")
        still = [node for node in ids if node not in passed]
        result = self._result(check, cmd, not still, f"{len(still)} still failing in the candidate's copy"
                              if still else f"{len(ids)} test(s) passed in the candidate's copy")
        return dataclasses.replace(result, failing_tests=tuple(still))

    def _deferred(self, check: Check, context: LoopContext) -> CheckResult | None:
        """With a fresh impact map, no rerun in the working tree: the clean-room judged run,
        which must pass before SUCCESS anyway, runs the failing tests and the affected ones
        (one pytest process instead of two). Only where the engine judges in a clean room
        (real processes); None: rerun here."""
        from pytest_loops.runtime.process import ProcessRunner

        if not isinstance(context.runner, ProcessRunner) or not self._map_fresh():
            return None
        ids, scope = self.confirm_selection()
        return CheckResult(name=check.name, kind=check.kind.value, passed=True, exit_code=0, duration_s=0.0,
                           output_tail="", reason=f"no rerun here: the clean-room run judges {len(ids)} "
                                                  f"test(s) ({scope})")

    def _reason(self, text: str) -> str:
        if self.regressions:
            return (f"regression: {', '.join(self.regressions[:5])} passed before the loop and fail now; "
                    + text)
        return text


def run_session_loop(session: SessionState) -> LoopResult:
    """Run the session fix-loop over the tests that failed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    first_output = _failure_texts(reporter, session.failed_nodeids)
    values = session.settings
    check = Check(CheckKind.HOOK, CHECK_NAME, options={"session_fix": True})
    spec = session.spec_for(SESSION_LOOP_NAME, "make the failing tests pass: " + name_list(session.failed_nodeids),
                            (check,), values, anonymous=True)
    from pytest_loops.localization.mapstore import MapStore
    from pytest_loops.pytest_plugin.state import MAP_STORE_KEY
    from pytest_loops.pytest_plugin.terminal import live_write

    inipath = session.config.inipath
    # read before the session ran any test (plugin.py), else now: before any revise
    store = session.config.stash.get(MAP_STORE_KEY, None) or MapStore(session.rootdir,
                                                                       str(inipath) if inipath else None)
    fixer = SessionFixCheck(session.failed_nodeids, session.passed_nodeids, first_output, session.child_args(),
                            store=store, **fixloop_options(session))
    pm = session.config.pluginmanager
    pm.register(fixer, "loop-session-fix")
    try:
        if reporter is not None:
            banner = shown(f"loop: {len(session.failed_nodeids)} failing test(s), revise: {spec.revise}")
            live_write(session.config, lambda reporter: reporter.write_sep("=", banner))
        from pytest_loops.pytest_plugin.closure import session_observed

        result = session.run_loop(spec, observed=session_observed(str(session.rootdir)))
    finally:
        pm.unregister(fixer)
        note = store.settle()
        if note and reporter is not None:
            live_write(session.config, lambda reporter: reporter.write_line(shown(f"loop: {note}")))
    started = fixer.record_in_background(result.verdict)
    if started and reporter is not None:
        live_write(session.config, lambda reporter: reporter.write_line(shown(f"loop: {started}")))
    return result


def fixloop_options(session: SessionState) -> dict[str, Any]:
    """The session's cost model and the settings of its fix-loop."""
    cap, confirm, impact_map = fixloop_settings(session.settings)
    config = session.config
    workers = None
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        workers = config.option.numprocesses
    return {"rootdir": session.rootdir, "durations": session.durations, "report_s": session.report_s,
            "plain_run_s": session.plain_run_s, "startup_s": session.startup_s, "collect_s": session.collect_s,
            "test_files": session.test_files, "cap": cap, "confirm": confirm, "impact_map": impact_map,
            "workers": workers,
            "localize": choice_value(config, "suspects", SUSPECTS_CHOICES) == "on"}


def _failure_texts(reporter: Any, nodeids: list[str]) -> str:
    if reporter is None:
        return ""
    wanted = set(nodeids)
    parts = []
    for key in ("failed", "error"):
        for rep in reporter.stats.get(key, []):
            if getattr(rep, "nodeid", None) in wanted:
                parts.append(f"___ {rep.nodeid} ___\n{rep.longreprtext[-3000:]}")
    return redact("\n".join(parts))  # the first iteration's output: failure file, prompt, lessons

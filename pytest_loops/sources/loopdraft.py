"""A ``.loop`` file as read, before defaults apply, and how its drafts become LoopSpecs.

The parser (loopfile.py) fills a :class:`FileDraft` line by line; :meth:`FileDraft.finish`
applies the file's defaults, ``rigor:`` and ``target:`` and builds the LoopSpecs, checks
and pipelines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from pytest_loops.errors import LoopFileError, LoopUsageError
from pytest_loops.sources import phrases
from pytest_loops.sources.model import Flow, LoopFile
from pytest_loops.sources.phrases import Predicate
from pytest_loops.spec import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_MAX_ITER,
    DEFAULT_NO_PROGRESS_K,
    Check,
    CheckKind,
    Guards,
    IgnoredLine,
    LoopSpec,
    Pipeline,
)

RIGOR_MAX_ITER = 8  # LoopFlow's thrash guard under `rigor: structured ai-assisted | agentic engineering`
RIGOR_MESSAGE = "thrashing"


# -- lines ----------------------------------------------------------------------------

@dataclass(slots=True)
class Line:
    no: int  # 1-based line number
    indent: int  # leading whitespace characters (a tab counts as one, as in LoopFlow)
    text: str  # the line without comment and surrounding whitespace

    def col(self, offset: int = 0) -> int:
        """1-based column of ``offset`` into ``text``."""
        return self.indent + offset + 1


# -- drafts: what a definition says, before defaults are applied --------------------

@dataclass
class Setting:
    value: Any
    where: str  # "file:line", or "file:line (note)"


@dataclass
class Body:
    """One loop or stage body as read; turned into a LoopSpec once the file is read."""

    header: Line
    name: str | None
    name_col: int
    is_stage: bool = False
    goal: str | None = None
    checks: list[tuple[Predicate, str, Line]] = field(default_factory=list)
    gates: list[tuple[str, Line]] = field(default_factory=list)
    look: list[str] = field(default_factory=list)
    look_line: Line | None = None
    hints: list[str] = field(default_factory=list)  # examples:, knowledge:
    settings: dict[str, Setting] = field(default_factory=dict)
    protect: list[str] = field(default_factory=list)
    protect_where: list[str] = field(default_factory=list)
    ignored: list[IgnoredLine] = field(default_factory=list)
    human_review: bool = False
    has_fail: bool = False
    has_after: bool = False


@dataclass
class PipelineDraft:
    header: Line
    name: str | None
    name_col: int
    stages: list[Body] = field(default_factory=list)


# -- a file's drafts ---------------------------------------------------------------------

class FileDraft:
    """What a ``.loop`` file says, gathered by the parser; :meth:`finish` builds its LoopFile."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.filedir = os.path.dirname(os.path.abspath(path))
        self.cwd = self.filedir
        self.cwd_where: str | None = None
        base = os.path.basename(path)
        self.stem = (base[: -len(".loop")] if base.lower().endswith(".loop") else base).strip()
        if not self.stem or self.stem.startswith("<"):
            self.stem = "loop"
        self.config: list[IgnoredLine] = []
        self.ignored: list[IgnoredLine] = []
        self.defaults = Body(header=Line(0, 0, ""), name=None, name_col=1)
        self.rigor: str | None = None
        self.loops: list[Body] = []
        self.pipelines: list[PipelineDraft] = []
        self.flows: list[Flow] = []
        self.names: dict[str, int] = {}  # top-level definition name -> line
        self.slugs: dict[str, int] = {}  # its file-name form -> line

    # -- errors and bookkeeping ---------------------------------------------------------

    def error(self, message: str, line: Line | None, column: int | None = None,
              fix: str | None = None) -> LoopFileError:
        if line is None:
            return LoopFileError(message, self.path, fix=fix)
        return LoopFileError(message, self.path, line.no, column if column is not None else line.col(),
                             fix=fix)

    def where(self, line: Line, note: str | None = None) -> str:
        return f"{self.path}:{line.no}" + (f" ({note})" if note else "")

    # -- from drafts to LoopSpecs -------------------------------------------------------

    def finish(self) -> LoopFile:
        taken = set(self.names)
        loops = [self.build(body, self.unnamed(body, taken)) for body in self.loops]
        pipelines = []
        for draft in self.pipelines:
            pname = self.unnamed(draft, taken)
            stages = [self.build(stage, f"{pname} / {stage.name}") for stage in draft.stages]
            pipelines.append(Pipeline(pname, tuple(stages), self.where(draft.header)))
        seen: dict[str, str] = {}
        for spec in loops + [s for p in pipelines for s in p.stages]:
            if spec.name in seen:  # e.g. a loop named "p / s" next to pipeline "p", stage "s"
                raise LoopFileError(f"duplicate loop name {spec.name!r} (also at {seen[spec.name]})",
                                    self.path, int((spec.source or "0").rsplit(":", 1)[-1]), 1,
                                    fix="give each loop and stage its own name")
            seen[spec.name] = spec.source or ""
        return LoopFile(self.path, tuple(loops), tuple(pipelines), tuple(self.flows),
                        tuple(self.config), tuple(self.ignored))

    def unnamed(self, draft: Body | PipelineDraft, taken: set[str]) -> str:
        if draft.name is not None:
            return draft.name
        name, n = self.stem, 1
        while name in taken:
            n += 1
            name = f"{self.stem} {n}"
        taken.add(name)
        return name

    def build(self, body: Body, name: str) -> LoopSpec:
        origin: dict[str, str] = {}
        defaults = self.defaults.settings

        def pick(key: str, default: Any, origin_key: str | None = None) -> Any:
            setting = body.settings.get(key) or defaults.get(key)
            origin[origin_key or key] = setting.where if setting else "default"
            return setting.value if setting else default

        max_iter = pick("max_iter", DEFAULT_MAX_ITER, "guards.max_iter")
        stop_message = pick("stop_message", None)
        if "max_iter" not in body.settings and not body.has_after and self.rigor and (
                body.checks or body.has_fail):
            max_iter, origin["guards.max_iter"] = RIGOR_MAX_ITER, self.rigor
            stop_message, origin["stop_message"] = RIGOR_MESSAGE, self.rigor
        guard_values = {
            "max_iter": max_iter,
            "budget_seconds": pick("budget_seconds", DEFAULT_BUDGET_SECONDS, "guards.budget_seconds"),
            "no_progress_k": pick("no_progress_k", DEFAULT_NO_PROGRESS_K, "guards.no_progress_k"),
            "escalate_after": pick("escalate_after", DEFAULT_ESCALATE_AFTER, "guards.escalate_after"),
            "max_cost": pick("max_cost", 0.0, "guards.max_cost"),
            "max_tokens": pick("max_tokens", 0, "guards.max_tokens"),
        }
        revise = pick("revise", None)
        context_adapter = pick("context_adapter", None)
        memory_page = pick("lessons_page", None, "memory_page")
        escalate_when_blocked = pick("escalate_when_blocked", False)
        scope = pick("scope", [])
        no_progress_signal = pick("no_progress_signal", "state")
        counts = {key: pick(key, default) for key, default in (("branches", 1), ("max_parallel", 0))}
        granted = body.settings.get("grants") or defaults.get("grants")  # origin only when given
        grants = granted.value if granted else []
        if granted:
            origin["grants"] = granted.where

        look_items, look_line = body.look, body.look_line
        watch = body.settings.get("state_paths") or defaults.get("state_paths")
        if watch:
            state_paths, origin["state_paths"] = watch.value, watch.where
        elif look_line is not None and any(phrases.is_path(it) for it in look_items):
            state_paths = [it for it in look_items if phrases.is_path(it)]
            origin["state_paths"] = self.where(look_line, "look at")
        else:
            state_paths, origin["state_paths"] = [], "default"
        look_at = list(dict.fromkeys(look_items + body.hints))
        if look_at:
            origin["look_at"] = self.where(look_line) if look_line else self.where(body.header)
        protect = list(dict.fromkeys(self.defaults.protect + body.protect))
        if protect:
            origin["protect"] = ", ".join(self.defaults.protect_where + body.protect_where)
        if self.cwd_where:
            origin["cwd"] = self.cwd_where

        watch_conf = {}
        for key in ("watch_poll", "watch_interval", "silence"):  # `pytest-loops watch` reads them
            setting = body.settings.get(key) or defaults.get(key)
            if setting:
                watch_conf[key.removeprefix("watch_")] = setting.value
                origin[key] = setting.where

        checks = self.checks(body, name)
        try:
            return LoopSpec(
                name=name, checks=tuple(checks), goal=body.goal or "", revise=revise,
                guards=Guards(**guard_values), state_paths=tuple(state_paths),
                memory_page=memory_page, cwd=self.cwd, stop_message=stop_message,
                escalate_when_blocked=bool(escalate_when_blocked), look_at=tuple(look_at),
                protect=tuple(protect), scope=tuple(scope), grants=tuple(grants), ignored=tuple(body.ignored),
                no_progress_signal=no_progress_signal, context_adapter=context_adapter, **counts,
                origin=origin, source=self.where(body.header), watch=watch_conf,
            )
        except LoopUsageError as exc:  # values are validated above; this is a last line of defence
            raise LoopFileError(exc.message, self.path, body.header.no, 1, exc.fix) from None

    def checks(self, body: Body, name: str) -> list[Check]:
        entries: list[tuple[Predicate, str, Line]] = [
            (Predicate(CheckKind.HUMAN, text=text), f"a human approves {text[len('approve '):]}", line)
            for text, line in body.gates
        ]
        entries += body.checks
        if not entries:
            # LoopFlow accepts a loop without `done when`: it never passes by machine.
            goal = body.goal or name
            entries = [(Predicate(CheckKind.HUMAN, text=f"no done when: a human must confirm the goal: {goal}"),
                        "no done when: a human confirms the goal", body.header)]
        names = phrases.unique_names([phrases.check_name(phrase) for _, phrase, _ in entries])
        out = []
        for (pred, _, line), check_name in zip(entries, names, strict=True):
            try:
                out.append(pred.to_check(check_name, self.where(line)))
            except LoopUsageError as exc:
                raise LoopFileError(exc.message, self.path, line.no, line.col(), exc.fix) from None
        return out

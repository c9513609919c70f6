"""The ``.loop`` parser: LoopFlow files, plus a few lines of our own, into LoopSpecs.

Every file LoopFlow accepts parses here; lines pytest-loops does not act on are
kept as :class:`~pytest_loops.spec.IgnoredLine` (with the reason), never an error.
Real syntax errors raise :class:`~pytest_loops.errors.LoopFileError` naming
file:line:column and the fix. The grammar, and what each line maps to, is
documented in docs/loop-language.md. The line patterns themselves, comments and
near-miss suggestions are :mod:`pytest_loops.sources.loopsyntax`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from pytest_loops.defaults import NO_PROGRESS_SIGNALS
from pytest_loops.errors import LoopFileError
from pytest_loops.sources import loopsyntax as syntax
from pytest_loops.sources import phrases
from pytest_loops.sources.loopdraft import (
    RIGOR_MAX_ITER,
    Body,
    FileDraft,
    Line,
    PipelineDraft,
    Setting,
)
from pytest_loops.sources.model import Flow, LoopFile
from pytest_loops.sources.phrases import Predicate, Problem
from pytest_loops.sources.reading import read_text
from pytest_loops.spec import CheckKind, IgnoredLine, slugify

# Why a line is kept but not acted on. Shown by `pytest-loops show`.
WHY_CONFIG = "config tier: kept as written, not acted on"
WHY_TARGET = "config tier: the working directory of every loop in this file"
WHY_RIGOR = f"config tier: a loop without `after N tries` stops after {RIGOR_MAX_ITER} tries"
WHY_PARALLEL = "stages run one after another here (fail-fast), never in parallel"
WHY_UNKNOWN = "not a line pytest-loops knows; kept, not acted on"
WHY_FLOW = "flows are not run as a unit: each .loop file is collected on its own"
_WHY = {
    "policy": "action policy is for an agent: the revise command decides what it edits "
              "(see `protect:` and `scope:`)",
    "cycle": "each iteration here is verify, guards, reflect, revise",
    "also": "finishing passes are not run: a loop ends when its checks pass",
    "skills": "skills, tools and plans belong to the revise step, not the harness",
    "models": "model choice belongs to the revise step",
    "human_plan": "plan approval belongs to the revise step; the harness never waits for input",
    "human_review": "the result is reviewed afterwards (run log, report, pull request); "
                    "the harness never waits for input",
    "gate_loop": "LoopFlow acts on a gate only in a stage",
    "git": "git policy is not applied: commit what the loop leaves yourself",
    "hooks": "lifecycle hooks are not run: make a command a `done when` check if it must pass",
    "when_pass": "the loop ends with SUCCESS when every check passes",
    "when_fail": "a failed iteration always reflects (a lesson) and revises here",
    "when_blocked": "only `ask a human` is acted on when blocked",
    "when_other": "unknown `when` condition",
    "after_other": "only `stop` and `ask a human` are acted on after N tries",
    "bar": "`the bar:` belongs under a skill check",
    "unknown": WHY_UNKNOWN,
}


# -- the parser -------------------------------------------------------------------------


def _ignore(why: str) -> Callable[..., None]:
    """A handler that keeps the line, not acted on, with the reason ``_WHY[why]``."""
    def handler(parser: _Parser, body: Body, line: Line, m: re.Match[str]) -> None:
        body.ignored.append(IgnoredLine(line.no, line.text, _WHY[why]))
    return handler


class _Parser(FileDraft):
    """Reads the lines of a ``.loop`` file into its drafts."""

    def __init__(self, text: str, path: str) -> None:
        super().__init__(path)
        self.lines = syntax.tokenize(text)

    # -- errors and bookkeeping ---------------------------------------------------------

    def problem(self, exc: Problem, line: Line, start: int) -> LoopFileError:
        return self.error(exc.message, line, line.col(start + exc.offset), exc.fix)

    def children(self, start: int, indent: int, lines: list[Line] | None = None) -> int:
        """Index just past the lines after ``start`` indented deeper than ``indent``."""
        lines = self.lines if lines is None else lines
        end = start + 1
        while end < len(lines) and lines[end].indent > indent:
            end += 1
        return end

    def header_name(self, line: Line, rest_start: int) -> tuple[str | None, int]:
        """The quoted (or bare) name of a loop/pipeline/flow/stage header, and its column."""
        try:
            phrases.check_quotes(line.text)
        except Problem as exc:
            raise self.problem(exc, line, 0) from None
        q = line.text.find('"')
        if q >= 0:
            end = line.text.index('"', q + 1)
            name = line.text[q + 1:end].strip()
            return (name or None), line.col(q)
        bare = line.text[rest_start:].strip()
        if bare.endswith(":"):
            bare = bare[:-1].strip()
        return (bare or None), line.col(rest_start)

    def claim(self, name: str, line: Line, column: int, what: str = "loop") -> None:
        """Record a top-level definition name; a second use is an error."""
        slug = slugify(name)
        for same, table, key in (("name", self.names, name), ("file-name form", self.slugs, slug)):
            if key in table:
                raise self.error(f"duplicate {what} name {name!r} (same {same} as line {table[key]})",
                                 line, column, "give each loop and pipeline in a file its own name")
        self.names[name] = line.no
        self.slugs[slug] = line.no

    # -- the top level ------------------------------------------------------------------

    def parse(self) -> LoopFile:
        lines = self.lines
        i = 0
        while i < len(lines):
            line = lines[i]
            text = line.text
            if line.indent:
                raise self.error("unexpected indentation at the top level", line, fix=(
                    "start `loop`, `pipeline`, `flow` and config lines in column 1; "
                    "indent only the lines inside a definition"))
            m = syntax.LOOP.match(text)
            if m:
                i = self.parse_loop(i, m.start(1))
                continue
            m = syntax.PIPELINE.match(text)
            if m:
                i = self.parse_pipeline(i, m.start(1))
                continue
            m = syntax.FLOW.match(text)
            if m:
                i = self.parse_flow(i, m.start(1))
                continue
            if syntax.STAGE.match(text):
                raise self.error("a `stage` outside a pipeline", line,
                                 fix='put stages under a `pipeline "name":` line, indented by two spaces')
            if syntax.CONFIG_BLOCK.match(text):
                end = self.children(i, 0)
                self.config.extend(IgnoredLine(ln.no, ln.text, WHY_CONFIG) for ln in lines[i:end])
                i = end
                continue
            i = self.top_line(i)
        return self.finish()

    def top_line(self, i: int) -> int:
        """A config-tier line, one of our own lines as a file default, or an unknown line."""
        line = self.lines[i]
        text = line.text
        end = self.children(i, 0)
        known = True
        if m := syntax.TARGET.match(text):
            target = m.group(1).strip().strip('"').strip()
            if target:
                self.cwd = os.path.normpath(os.path.join(self.filedir, target))
                self.cwd_where = self.where(line)
            self.config.append(IgnoredLine(line.no, text, WHY_TARGET))
        elif m := syntax.RIGOR.match(text):
            if " ".join(m.group(1).split()).lower() in syntax.RIGOR_ON:
                self.rigor = self.where(line, "rigor")
                self.config.append(IgnoredLine(line.no, text, WHY_RIGOR))
            else:
                self.config.append(IgnoredLine(line.no, text, WHY_CONFIG))
        elif syntax.CONFIG_LINE.match(text):
            self.config.append(IgnoredLine(line.no, text, WHY_CONFIG))
        elif self.own_line(self.defaults, line):
            pass
        else:
            known = False
            if syntax.BODY_AT_TOP.match(text):
                raise self.error("a loop line at the top level", line,
                                 fix="indent it under its `loop` or `stage` line (two spaces deeper)")
            self.ignored.extend(IgnoredLine(ln.no, ln.text, WHY_UNKNOWN) for ln in self.lines[i:end])
        if known and end > i + 1:
            raise self.error("unexpected indentation", self.lines[i + 1], fix=(
                f"line {line.no} is not a block: start the next line in column 1, "
                "or indent it under a `loop`/`stage`"))
        return end

    # -- loops, pipelines, stages ---------------------------------------------------------

    def parse_loop(self, i: int, rest: int) -> int:
        header = self.lines[i]
        name, col = self.header_name(header, rest)
        end = self.children(i, header.indent)
        if name is not None:
            self.claim(name, header, col)
        body = Body(header=header, name=name, name_col=col)
        self.parse_body(body, self.lines[i + 1:end])
        self.loops.append(body)
        return end

    def parse_pipeline(self, i: int, rest: int) -> int:
        header = self.lines[i]
        name, col = self.header_name(header, rest)
        if name is not None:
            self.claim(name, header, col, "pipeline")
        draft = PipelineDraft(header, name, col)
        end = self.children(i, header.indent)
        body = self.lines[i + 1:end]
        label = f"pipeline {name!r}" if name else "the pipeline"
        j = 0
        while j < len(body):
            line = body[j]
            if syntax.PARALLEL.match(line.text):
                self.ignored.append(IgnoredLine(line.no, line.text, WHY_PARALLEL))
                group_end = self.children(j, line.indent, body)
                k = j + 1
                while k < group_end:
                    k = self.parse_stage(draft, body, k, label, group_end)
                j = group_end
                continue
            j = self.parse_stage(draft, body, j, label, len(body))
        if not draft.stages:
            raise self.error(f"{label} has no stages", header,
                             fix='add `stage "name":` lines indented under it, each with its own body')
        self.pipelines.append(draft)
        return end

    def parse_stage(self, draft: PipelineDraft, body: list[Line], j: int, label: str, limit: int) -> int:
        line = body[j]
        if not syntax.STAGE.match(line.text):
            raise self.error(f"expected a `stage` line inside {label}, got {line.text!r}", line,
                             fix='indent it under its stage, or start a stage with `stage "name":`')
        m = syntax.STAGE_HEADER.match(line.text)
        if not m:
            try:
                phrases.check_quotes(line.text)
            except Problem as exc:
                raise self.problem(exc, line, 0) from None
            raise self.error("a stage line needs a name and a colon", line, fix='write `stage "name":`')
        name, col = self.header_name(line, m.start(1))
        if name is None:
            name = f"stage {len(draft.stages) + 1}"
        for other in draft.stages:
            if other.name == name or slugify(other.name or "") == slugify(name):
                raise self.error(f"duplicate stage name {name!r} in {label} (line {other.header.no})",
                                 line, col, "give each stage of a pipeline its own name")
        end = min(self.children(j, line.indent, body), limit)
        if end == j + 1:
            raise self.error(f"stage {name!r} has no body", line, fix=(
                "indent the stage's lines (goal:, done when ...) deeper than the `stage` line"))
        stage = Body(header=line, name=name, name_col=col, is_stage=True)
        self.parse_body(stage, body[j + 1:end])
        draft.stages.append(stage)
        return end

    # -- flows ------------------------------------------------------------------------

    def parse_flow(self, i: int, rest: int) -> int:
        header = self.lines[i]
        name, _ = self.header_name(header, rest)
        end = self.children(i, header.indent)
        steps: list[str] = []
        notes: list[IgnoredLine] = []
        for line in self.lines[i + 1:end]:
            if syntax.FLOW_STEP.match(line.text):
                try:
                    phrases.check_quotes(line.text)
                except Problem as exc:
                    raise self.problem(exc, line, 0) from None
            m = syntax.FLOW_RUN.match(line.text)
            if m:
                steps.append(m.group(1))
                if not m.group(2).strip().rstrip(":").strip():
                    continue
            notes.append(IgnoredLine(line.no, line.text, WHY_FLOW))
        self.flows.append(Flow(name or self.stem, tuple(steps), self.where(header), tuple(notes)))
        return end

    # -- a loop or stage body -------------------------------------------------------------

    def parse_body(self, body: Body, lines: list[Line]) -> None:
        what = ("stage" if body.is_stage else "loop") + (f" {body.name!r}" if body.name else "")
        if not lines:
            raise self.error(f"{what} has no body", body.header, fix=(
                "indent its lines (goal:, done when ...) two spaces under the header"))
        i = 0
        while i < len(lines):
            line = lines[i]
            m = syntax.BLOCK.match(line.text)
            if m:
                end = self.children(i, line.indent, lines)
                why = _WHY["git" if m.group(1).lower() == "git" else "hooks"]
                body.ignored.extend(IgnoredLine(ln.no, ln.text, why) for ln in lines[i:end])
                i = end
                continue
            m = syntax.DONE.match(line.text)
            if m:
                pred = self.predicate(line, m.group(1), m.start(1))
                body.checks.append((pred, "done when " + m.group(1).strip(), line))
                nxt = lines[i + 1] if i + 1 < len(lines) else None
                bar = syntax.BAR.match(nxt.text) if nxt is not None and nxt.indent > line.indent else None
                if bar:
                    if pred.kind is CheckKind.HOOK:
                        pred.options["bar"] = bar.group(1).strip() or None
                    else:
                        body.ignored.append(IgnoredLine(nxt.no, nxt.text, _WHY["bar"]))  # type: ignore[union-attr]
                    i += 1
                i += 1
                continue
            self.body_line(body, line)
            i += 1
        if body.goal is None:
            raise self.error(f"{what} has no goal", body.header,
                             fix="add a `goal: <what done means>` line to its body")

    def predicate(self, line: Line, text: str, start: int) -> Predicate:
        try:
            return phrases.parse_predicate(text)
        except Problem as exc:
            raise self.problem(exc, line, start) from None

    def body_line(self, body: Body, line: Line) -> None:
        text = line.text
        head = syntax.HEAD.match(text)
        for pattern, handler in _DISPATCH.get(head.group(0).lower() if head else "", ()):
            m = pattern.match(text)
            if m:
                handler(self, body, line, m)
                return
        if self.own_line(body, line):
            return
        hint = syntax.near_miss(text)
        if hint:
            raise self.error(f"unknown line {text!r}", line, fix=f"did you mean `{hint}`?")
        body.ignored.append(IgnoredLine(line.no, text, WHY_UNKNOWN))

    def on_goal(self, body: Body, line: Line, m: re.Match[str]) -> None:
        goal = m.group(1).strip()
        if not goal:
            raise self.error("`goal:` has no text", line,
                             fix="say what done means, e.g. `goal: the cart total includes tax`")
        body.goal = goal

    def on_look(self, body: Body, line: Line, m: re.Match[str]) -> None:
        # LoopFlow keeps only the last `look at:` line; as hints and state paths, several add up
        body.look.extend(it for it in phrases.split_items(m.group(1)) if it.lower() != "the last failure")
        body.look_line = body.look_line or line

    def on_check(self, body: Body, line: Line, m: re.Match[str]) -> None:
        key, value = m.group(1).lower(), m.group(2)
        if not value.strip():
            raise self.error(f"`{key}:` has no command", line, line.col(m.start(2)),
                             fix=f"write the command, e.g. `{key}: pytest -q`")
        try:
            pred = phrases.parse_check_value(value)
        except Problem as exc:
            raise self.problem(exc, line, m.start(2)) from None
        body.checks.append((pred, f"{key}: {value.strip()}", line))

    def on_hints(self, body: Body, line: Line, m: re.Match[str]) -> None:
        body.hints.extend(phrases.split_items(m.group(1)))

    def on_knowledge(self, body: Body, line: Line, m: re.Match[str]) -> None:
        items = phrases.split_items(m.group(1))
        body.hints.extend(items)
        paths = [it for it in items if phrases.is_path(it)]
        if paths:  # read-only reference: the same as `protect:`
            body.protect.extend(paths)
            body.protect_where.append(self.where(line, "knowledge"))

    def on_memory(self, body: Body, line: Line, m: re.Match[str]) -> None:
        raw = m.group(1)
        value = self.quoted_or_bare(line, raw, m.start(1))
        if not value:
            raise self.error("`remember in` names no file", line,
                             fix='write `remember in "lessons.md"`')
        body.settings["lessons_page"] = Setting(os.path.normpath(os.path.join(self.filedir, value)),
                                                self.where(line))

    def on_human_review(self, body: Body, line: Line, m: re.Match[str]) -> None:
        body.human_review = True
        body.ignored.append(IgnoredLine(line.no, line.text, _WHY["human_review"]))

    def on_gate(self, body: Body, line: Line, m: re.Match[str]) -> None:
        if body.is_stage:
            body.gates.append((f"approve before {m.group(1).strip()}", line))
        else:
            body.ignored.append(IgnoredLine(line.no, line.text, _WHY["gate_loop"]))

    def on_when(self, body: Body, line: Line, m: re.Match[str]) -> None:
        cond = " ".join(m.group(1).split())
        actions = m.group(2)
        try:
            phrases.check_quotes(actions)
        except Problem as exc:
            raise self.problem(exc, line, m.start(2)) from None
        if syntax.PASS_COND.match(cond):
            why = "when_pass"
        elif syntax.FAIL_COND.match(cond):
            body.has_fail = True
            why = "when_fail"
        elif syntax.BLOCKED_COND.match(cond):
            if syntax.ASK_HUMAN.search(actions):
                body.settings["escalate_when_blocked"] = Setting(True, self.where(line))
                return
            why = "when_blocked"
        else:
            why = "when_other"
        body.ignored.append(IgnoredLine(line.no, line.text, _WHY[why]))

    def on_after(self, body: Body, line: Line, m: re.Match[str]) -> None:
        n = self.count(line, m.group(1), m.start(1), "after 6 tries: stop")
        actions = m.group(2)
        body.has_after = True
        if not actions.strip():
            raise self.error("`after N tries:` needs an action", line,
                             fix='e.g. `after 6 tries: stop and warn "stuck"`')
        try:
            phrases.check_quotes(actions)
        except Problem as exc:
            raise self.problem(exc, line, m.start(2)) from None
        stop, ask = syntax.STOP.search(actions), syntax.ASK_HUMAN.search(actions)
        if stop:
            body.settings["max_iter"] = Setting(n, self.where(line))
            warn = syntax.WARN.search(actions)
            if warn:
                message = (warn.group(1) if warn.group(1) is not None else warn.group(2)).strip()
                if message:
                    body.settings["stop_message"] = Setting(message, self.where(line))
        if ask:
            body.settings["escalate_after"] = Setting(n, self.where(line))
        if not stop and not ask:
            body.ignored.append(IgnoredLine(line.no, line.text, _WHY["after_other"]))

    # (pattern, handler) in order; `_DISPATCH` picks the candidates by a line's first word
    handlers: list[tuple[re.Pattern[str], Callable[..., None]]] = [
        (syntax.GOAL, on_goal),
        (syntax.LOOK, on_look),
        (syntax.CHECK, on_check),
        (syntax.POLICY, _ignore("policy")),
        (syntax.CYCLE, _ignore("cycle")),
        (syntax.ALSO, _ignore("also")),
        (syntax.SKILLS, _ignore("skills")),
        (syntax.EXAMPLES, on_hints),
        (syntax.KNOWLEDGE, on_knowledge),
        (syntax.MEMORY, on_memory),
        (syntax.HUMAN_PLAN, _ignore("human_plan")),
        (syntax.HUMAN_REVIEW, on_human_review),
        (syntax.HUMAN_GATE, on_gate),
        (syntax.MODELS, _ignore("models")),
        (syntax.WHEN, on_when),
        (syntax.AFTER, on_after),
        (syntax.BAR, _ignore("bar")),
    ]

    # -- our own lines (loop bodies and file defaults) --------------------------------

    def count(self, line: Line, raw: str, start: int, example: str) -> int:
        try:
            return phrases.positive_int(raw, 0, example)
        except Problem as exc:
            raise self.problem(exc, line, start) from None

    def quoted_or_bare(self, line: Line, raw: str, start: int) -> str:
        """A value written bare or in double quotes; inside quotes, `\\"` is a quote.

        Text after the closing quote is an error, never silently dropped.
        """
        value = raw.strip()
        if not value.startswith('"'):
            try:
                phrases.check_quotes(raw)
            except Problem as exc:
                raise self.problem(exc, line, start) from None
            return value
        offset = start + (len(raw) - len(raw.lstrip()))
        i, out = 1, []
        while i < len(value):
            char = value[i]
            if char == "\\" and i + 1 < len(value) and value[i + 1] in '"\\':
                out.append(value[i + 1])
                i += 2
                continue
            if char == '"':
                rest = value[i + 1:].strip()
                if rest:
                    raise self.error(f"text after the closing quote: {rest!r}", line,
                                     column=line.col(offset + i + 1),
                                     fix='quote the whole value (write \\" for a quote inside it) '
                                         "or leave it unquoted")
                return "".join(out).strip()
            out.append(char)
            i += 1
        raise self.problem(Problem("unterminated quote", 0, 'close it with a matching `"`'), line, offset)

    def own_line(self, body: Body, line: Line) -> bool:
        """budget / stop when nothing changes / escalate after / revise with / protect / scope / watch / grants."""
        text = line.text
        try:  # grants: / grant ctx: / branches: / max parallel: / watch: poll / silence:
            found = phrases.setting_line(text)
        except Problem as exc:
            raise self.problem(exc, line, 0) from None
        if found is not None:
            body.settings.update((key, Setting(value, self.where(line))) for key, value in found)
            return True
        m = syntax.BUDGET.match(text)
        if m:
            try:
                seconds = phrases.duration_seconds(m.group(1))
            except Problem as exc:
                raise self.problem(exc, line, m.start(1) + len(m.group(1)) - len(m.group(1).lstrip())) from None
            body.settings["budget_seconds"] = Setting(seconds, self.where(line))
            return True
        m = syntax.SIGNAL.match(text)
        if m:
            value = m.group(1).strip().lower()
            if value not in NO_PROGRESS_SIGNALS:
                raise self.error(f"{value!r} is not a no progress signal", line, line.col(m.start(1)),
                                 fix=f"write one of: {', '.join(NO_PROGRESS_SIGNALS)}")
            body.settings["no_progress_signal"] = Setting(value, self.where(line))
            return True
        for pattern, key, example in ((syntax.NO_PROGRESS, "no_progress_k", "stop when nothing changes for 2 tries"),
                                      (syntax.SAME_FAILURE, "no_progress_k",
                                       "stop when the same failure repeats for 2 tries"),
                                      (syntax.ESCALATE, "escalate_after", "escalate after 4 tries")):
            m = pattern.match(text)
            if m:
                tail = syntax.COUNT_TRIES.match(m.group(1))
                if not tail:
                    raise self.error(f"could not read {text!r}", line, fix=f"write `{example}`")
                n = self.count(line, tail.group(1), m.start(1) + tail.start(1), example)
                body.settings[key] = Setting(n, self.where(line))
                if key == "no_progress_k":  # which signal: the state, the failure, or both lines
                    signal = "failure" if pattern is syntax.SAME_FAILURE else "state"
                    old = body.settings.get("no_progress_signal")
                    if old is not None and old.value != signal:
                        signal = "both"
                    body.settings["no_progress_signal"] = Setting(signal, self.where(line))
                return True
        m = syntax.REVISE.match(text)
        if m:
            command = self.quoted_or_bare(line, m.group(1), m.start(1))
            if not command:
                raise self.error("`revise with` has no command", line,
                                 fix='write `revise with "python fix.py"`')
            body.settings["revise"] = Setting(command, self.where(line))
            return True
        m = syntax.ADAPTER.match(text)
        if m:
            command = self.quoted_or_bare(line, m.group(1), m.start(1))
            if not command:
                raise self.error("`context adapter:` has no command", line,
                                 fix='write `context adapter: "python -m ctx.adapters.loopflow"`')
            body.settings["context_adapter"] = Setting(command, self.where(line))
            return True
        m = syntax.LISTS.match(text)
        if m:
            key = m.group(1).lower()
            items = phrases.split_items(m.group(2))
            if not items:
                raise self.error(f"`{key}:` lists nothing", line,
                                 fix=f"list paths or globs, e.g. `{key}: src/**`")
            if key == "protect":
                body.protect.extend(items)
                body.protect_where.append(self.where(line))
            else:
                name = "state_paths" if key == "watch" else "scope"
                old = body.settings.get(name)
                merged = (list(old.value) if old else []) + items
                where = self.where(line) if not old else f"{old.where}, {self.where(line)}"
                body.settings[name] = Setting(merged, where)
            return True
        return False


# the handlers a loop-body line may match, by its first word
_DISPATCH: dict[str, list[tuple[re.Pattern[str], Callable[..., None]]]] = {}
for _pattern, _handler in _Parser.handlers:
    for _word in syntax.FIRST_WORDS[_pattern]:
        _DISPATCH.setdefault(_word, []).append((_pattern, _handler))


def parse_loop_text(text: str, path: str = "<string>") -> LoopFile:
    """Parse ``.loop`` text. ``path`` names the file in errors and sources; its
    directory (absolute) is every loop's ``cwd`` unless the file sets ``target:``."""
    return _Parser(text, os.fspath(path)).parse()


def load_loop_file(path: str | os.PathLike) -> LoopFile:
    """Read and parse a ``.loop`` file (UTF-8; anything else is a LoopFileError)."""
    return parse_loop_text(read_text(path), os.fspath(path))

"""Every setting once: its type, default, validation and every spelling.

A setting is one :class:`Setting` row of :data:`SETTINGS`. The ``pytest-loops run``
flags, pytest's ``--loop-*`` options and ini keys, the ``PYTEST_LOOPS_*``
environment variables, the marker keywords, the YAML loop file keys and the
report header's reproduce command are generated from the table, and
:func:`resolve` applies the one precedence, lowest first:

    built-in defaults < config file < ini < environment < command line
    < marker / loop file line

A value of ``None`` in a layer means "not set here". A loop file's own line wins
over every session setting; the session fills what the file left at its default
(:func:`file_has`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_loops.defaults import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_MAX_ITER,
    DEFAULT_NO_PROGRESS_K,
    DEFAULT_OUTPUT_CAP,
    NO_PROGRESS_SIGNALS,
    validate_guard_values,
)
from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import short_repr

ON_OFF = ("on", "off")
REVISE_OUTPUTS = ("status", "stream", "quiet")
MAX_BRANCHES = 32
TAKES_VALUE = object()  # an alias flag that takes the setting's value (not a constant)


def number_text(value: Any) -> str:
    """A number as text that parses back to the same value (`:g` keeps only 6 digits)."""
    return format(value, ".15g") if isinstance(value, float) else str(value)


MAX_SHARDS = 4096


def parse_shard(raw: Any) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)`` with 1 <= I <= N <= MAX_SHARDS; ValueError otherwise."""
    if not isinstance(raw, str):
        raise ValueError(raw)
    head, sep, tail = raw.strip().partition("/")
    if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
        raise ValueError(raw)
    index, total = int(head), int(tail)
    if not 1 <= index <= total <= MAX_SHARDS:
        raise ValueError(raw)
    return index, total


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass(frozen=True)
class Setting:
    """One setting and every spelling of it; ``None`` means "not on that surface".

    kind: ``int`` / ``number`` (guards, validated by the guard rules), ``choice``,
    ``switch`` (on|off, a bool after parsing), ``size`` (bytes, K/M/G), ``seconds``
    (a number >= 0, ``30s`` allowed), ``command`` (a non-empty shell command),
    ``path``, ``text``, ``list`` (repeatable).
    """

    name: str  # the key in resolved values
    help: str
    kind: str
    default: Any = None
    choices: tuple[str, ...] = ()
    valid: str = ""  # what is valid, for the error line
    run_flag: str | None = None
    run_aliases: tuple[tuple[str, Any], ...] = ()  # (flag, TAKES_VALUE or the constant it stores)
    run_accepts_path: bool = False  # `--tine on|off|PATH`: any other value is a path (runner only)
    option: str | None = None  # pytest's --loop-...
    option_aliases: tuple[str, ...] = ()  # old spellings of the option; the new one wins over them
    ini: str | None = None
    ini_aliases: tuple[str, ...] = ()  # old ini keys, still read; the new key wins
    env: str | None = None
    env_aliases: tuple[str, ...] = ()  # old variable names, still read; the new name wins
    env_read_here: bool = True  # False: another module reads the variable (PYTEST_LOOPS_MASK)
    marker: str | None = None
    yaml_key: str | None = None  # in a YAML loop file: "guards.max_iter", "revise"
    yaml_aliases: tuple[str, ...] = ()  # old keys, still read; the new key wins
    config_key: str | None = None  # in a loop-runner config file
    loop_line: str | None = None  # the .loop file line that sets it
    metavar: str = "VALUE"
    sample: str = ""  # a valid value as text, for tests
    reproduce: str = "changed"  # in the reproduce command: "always", "changed" or "never"
    origin_key: str = ""  # the LoopSpec field and origin key, when not the name (guards.*, the run log's)
    guard: bool = False
    bounds: tuple[int, int] = (0, 1 << 31)  # a "count": the smallest and largest value
    bare: bool = False  # a switch whose pytest option is a flag alone, standing for "on" (--loop-watch)

    # -- spellings ------------------------------------------------------------------

    @property
    def dest(self) -> str:
        """The pytest option's dest (``config.getoption``) and its ini key."""
        assert self.option is not None
        return self.option[2:].replace("-", "_")

    def option_dest(self, option: str) -> str:
        """The dest of one spelling of the pytest option (the option or an old alias)."""
        return option[2:].replace("-", "_")

    @property
    def options(self) -> tuple[str, ...]:
        """The pytest option and its old spellings, the one that wins first."""
        return (self.option, *self.option_aliases) if self.option else ()

    @property
    def inis(self) -> tuple[str, ...]:
        return (self.ini, *self.ini_aliases) if self.ini else ()

    @property
    def envs(self) -> tuple[str, ...]:
        return (self.env, *self.env_aliases) if self.env else ()

    @property
    def repeatable(self) -> bool:
        return self.kind == "list"

    @property
    def shown_metavar(self) -> str:
        """The metavar in --help: the choices themselves when there are any."""
        if self.bare:
            return ""
        return "{" + ",".join(self.choices) + "}" if self.choices else self.metavar

    @property
    def record_key(self) -> str:
        return self.origin_key or self.name

    def spellings(self) -> list[str]:
        """Every way to write this setting (flags, ini key, variable, keys), for the docs."""
        names = [self.run_flag, *(a for a, _ in self.run_aliases), *self.options, *self.inis,
                 *self.envs, self.config_key]
        if self.marker:
            names.append(f"{self.marker}=")
        if self.yaml_key and self.yaml_key != self.config_key:
            names.append(self.yaml_key)
        names += [k for k in self.yaml_aliases if not self.guard]  # guards.budget: a second key, not a spelling
        return [n for n in names if n]

    # -- values ---------------------------------------------------------------------

    def fail(self, raw: Any, where: str) -> LoopUsageError:
        return LoopUsageError(f"{short_repr(raw)} is not a valid {self.name}; valid: {self.valid}",
                              location=where)

    def parse(self, raw: Any, where: str) -> Any:
        """Validate a raw value (text from a flag, ini or environment; a YAML or marker
        value) and return it typed. Bad input raises one LoopUsageError line naming
        ``where``, the value and what is valid."""
        kind = self.kind
        if kind in ("int", "number"):
            return self._guard(raw, where)
        if kind == "size":
            return self._size(raw, where)
        if kind == "cap":
            return self._cap(raw, where)
        if kind == "count":
            return self._count(raw, where)
        if kind == "shard":
            return self._shard(raw, where)
        if kind == "seconds":
            return self._seconds(raw, where)
        if kind == "choice":
            if not isinstance(raw, str) or raw.strip() not in self.choices:
                raise self.fail(raw, where)
            return raw.strip()
        if kind == "switch":
            if isinstance(raw, bool):
                return raw
            if not isinstance(raw, str) or raw.strip().lower() not in ON_OFF:
                raise self.fail(raw, where)
            return raw.strip().lower() == "on"
        if kind == "list":
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) and p.strip() for p in items):
                raise self.fail(raw, where)
            return list(items)
        if not isinstance(raw, str) or not raw.strip():  # command, path, text
            raise self.fail(raw, where)
        return raw

    def parse_env(self, raw: str, where: str) -> Any:
        if self.kind == "list":
            return self.parse([p for p in raw.split(os.pathsep) if p], where)
        return self.parse(raw, where)

    def text(self, value: Any) -> list[str]:
        """The value as command-line text that parses back to it (one per item of a list)."""
        if self.kind == "list":
            return [str(v) for v in value]
        if self.kind == "switch":
            return ["on" if value else "off"]
        return [number_text(value)]

    def _guard(self, raw: Any, where: str) -> Any:
        value = raw
        if isinstance(raw, str):
            try:
                value = float(raw.strip()) if self.kind == "number" else int(raw.strip())
            except ValueError:
                raise self.fail(raw, where) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(raw, where)
        if self.kind == "number":
            value = float(value)
        elif isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise self.fail(raw, where)
            value = int(value)
        if validate_guard_values(**{self.name: value}):
            raise self.fail(raw, where)
        return value

    def _count(self, raw: Any, where: str) -> int:
        """A whole number within ``bounds`` (text, or an int from a marker or YAML)."""
        value = raw
        if isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                raise self.fail(raw, where) from None
        if isinstance(value, bool) or not isinstance(value, int) or not self.bounds[0] <= value <= self.bounds[1]:
            raise self.fail(raw, where)
        return value

    def _shard(self, raw: Any, where: str) -> str:
        """``I/N``: this job's shard of N, 1 <= I <= N (kept as text, ``2/4``)."""
        try:
            index, total = parse_shard(raw)
        except ValueError:
            raise self.fail(raw, where) from None
        return f"{index}/{total}"

    def _cap(self, raw: Any, where: str) -> str:
        """A time cap as text: a fraction (0.2), a percent (20%), seconds (30s) or 0."""
        text = str(raw).strip().lower()
        number = text[:-1] if text.endswith(("%", "s")) else text
        try:
            value = float(number)
        except ValueError:
            raise self.fail(raw, where) from None
        if isinstance(raw, bool) or not math.isfinite(value) or value < 0 \
                or (not text.endswith(("%", "s")) and value > 100):
            raise self.fail(raw, where)
        return text

    def _seconds(self, raw: Any, where: str) -> float:
        """Seconds: a number >= 0, optionally written with an ``s`` (``0.5``, ``30s``)."""
        text = raw.strip().lower().removesuffix("s").strip() if isinstance(raw, str) else raw
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise self.fail(raw, where) from None
        if isinstance(raw, bool) or not math.isfinite(value) or value < 0:
            raise self.fail(raw, where)
        return value

    def _size(self, raw: Any, where: str) -> int:
        text = str(raw).strip().lower().removesuffix("b").removesuffix("i")
        unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
        try:
            value = int(text[:len(text) - len(unit)].strip()) * _SIZE_UNITS[unit]
        except ValueError:
            value = -1
        if isinstance(raw, bool) or value < 0:
            raise self.fail(raw, where)
        return value


def _guard_row(name: str, help_text: str, kind: str, default: Any, valid: str, metavar: str,
               sample: str, loop_line: str, config_key: str | None = None,
               aliases: tuple[str, ...] = (), reproduce: str = "always") -> Setting:
    flag = name.replace("_", "-")
    return Setting(
        name=name, help=help_text, kind=kind, default=default, valid=valid, metavar=metavar,
        run_flag=f"--{flag}", option=f"--loop-{flag}", ini=f"loop_{name}",
        env=f"PYTEST_LOOPS_{name.upper()}", marker=name, yaml_key=f"guards.{name}", yaml_aliases=aliases,
        config_key=config_key or f"guards.{name}", loop_line=loop_line, sample=sample,
        reproduce=reproduce, origin_key=f"guards.{name}", guard=True)


SETTINGS: tuple[Setting, ...] = (
    Setting("revise", "shell command that revises the code after a failed iteration; with --loop, failing "
            "tests become a fix-loop", "command", None, valid="a non-empty shell command",
            run_flag="--revise", option="--loop-revise", ini="loop_revise", env="PYTEST_LOOPS_REVISE",
            marker="revise", yaml_key="revise", config_key="revise.cmd", loop_line='revise with "CMD"',
            metavar="CMD", sample="python fix.py"),
    _guard_row("max_iter", "iteration cap of every loop, >= 1 (default 6)", "int", DEFAULT_MAX_ITER,
               "an integer >= 1 (the cap is always on)", "N", "3", "after 6 tries: stop"),
    _guard_row("budget_seconds", "wall-clock budget per loop in seconds, enforced during commands; "
               "0 = off (default 900)", "number", DEFAULT_BUDGET_SECONDS,
               "a number of seconds >= 0 (0 turns the budget off)", "S", "60.5", "budget: 15 minutes",
               aliases=("guards.budget",)),
    _guard_row("no_progress_k", "stop a loop after K iterations with unchanged state; 0 = off (default 2)",
               "int", DEFAULT_NO_PROGRESS_K, "an integer >= 0 (0 turns it off)", "K", "4",
               "stop when nothing changes for 2 tries"),
    _guard_row("escalate_after", "hand a loop to a human after N failed iterations; 0 = off (default)",
               "int", DEFAULT_ESCALATE_AFTER, "an integer >= 0 (0 turns it off)", "N", "5",
               "escalate after 4 tries", config_key="guards.escalate_after_iter"),
    Setting("context_adapter", "a command run before each revise step (the loop, its checks, the last failure "
            "file and the granted permissions as JSON on stdin) whose JSON answer is kept verbatim under "
            "'adapter' in the context file (LOOP_CONTEXT_FILE); LoopFlow's ctx adapter contract", "command", None,
            valid="a non-empty shell command", run_flag="--context-adapter", option="--loop-context-adapter",
            ini="loop_context_adapter", env="PYTEST_LOOPS_CONTEXT_ADAPTER", yaml_key="context_adapter",
            loop_line='context adapter: "python -m ctx.adapters.loopflow"', metavar="CMD",
            sample="python ctx_adapter.py"),
    Setting("context_adapter_failure", "what a bad answer of the context adapter (not JSON, a non-zero exit, "
            "its timeout) does: 'skip' (default) prints one line and the revise step runs without it; 'stop' "
            "ends the run as bad input (exit 64)", "choice", "skip", choices=("skip", "stop"),
            valid="skip, stop", run_flag="--context-adapter-failure", option="--loop-context-adapter-failure",
            ini="loop_context_adapter_failure", env="PYTEST_LOOPS_CONTEXT_ADAPTER_FAILURE", sample="stop"),
    Setting("context_adapter_timeout", "seconds the context adapter may take before its answer counts as bad "
            "(default 60; never past the loop's budget)", "seconds", 60.0,
            valid="a number of seconds > 0, e.g. 60 or 0.5s", run_flag="--context-adapter-timeout",
            option="--loop-context-adapter-timeout", ini="loop_context_adapter_timeout",
            env="PYTEST_LOOPS_CONTEXT_ADAPTER_TIMEOUT", metavar="S", sample="30"),
    Setting("grants", "the capability groups granted to the revise step and the context adapter, comma-separated "
            "(skills, agents, mcps, harnesses, or none); given here, they replace the loop file's grants line",
            "text", None, valid="a comma-separated list of skills, agents, mcps, harnesses, or none",
            run_flag="--grants", option="--loop-grants", ini="loop_grants", env="PYTEST_LOOPS_GRANTS",
            metavar="LIST", sample="skills,mcps"),
    Setting("own_model", "'on': the user consents that the loop runs on their own model (a local or API model "
            "they pay for), so the harnesses grant is passed on; 'off' (default) withholds harnesses",
            "switch", False, choices=ON_OFF, valid="on or off", run_flag="--own-model",
            option="--loop-own-model", ini="loop_own_model", env="PYTEST_LOOPS_OWN_MODEL", sample="on"),
    Setting("context_mcp", "'on': offer the revise step this harness's own read-only MCP server (its loop's "
            "history) in the MCP client config file named by LOOP_MCP_CONFIG; 'off' (default) does not",
            "switch", False, choices=ON_OFF, valid="on or off", run_flag="--context-mcp",
            option="--loop-context-mcp", ini="loop_context_mcp", env="PYTEST_LOOPS_CONTEXT_MCP", sample="on"),
    _guard_row("max_cost", "stop a loop TIMEOUT once its revise steps have spent this many US dollars, as they "
               "report it (agent presets, LOOP_USAGE_FILE); checked after every revise step; 0 = off (default)",
               "number", 0.0, "an amount in US dollars >= 0 (0 turns it off)", "USD", "2.5", "max cost: $5",
               reproduce="changed"),
    _guard_row("max_tokens", "stop a loop TIMEOUT once its revise steps have used this many tokens (input + "
               "output), as they report it; checked after every revise step; 0 = off (default)", "int", 0,
               "an integer >= 0 (0 turns it off)", "N", "200000", "max tokens: 200000", reproduce="changed"),
    Setting("revise_output", "what the terminal shows while a revise step runs: 'status' (default: a line that "
            "updates on a terminal, else a heartbeat line every 10 seconds, with the time, files changed, the "
            "agent's last line and cost so far), 'stream' (the agent's output as it comes, masked) or 'quiet'",
            "choice", "status", choices=REVISE_OUTPUTS, valid=", ".join(REVISE_OUTPUTS),
            run_flag="--revise-output", option="--loop-revise-output", ini="loop_revise_output",
            env="PYTEST_LOOPS_REVISE_OUTPUT", sample="stream"),
    Setting("no_progress_signal", "what no-progress watches: 'state' (default: the state paths), 'failure' "
            "(the same failure K times in a row, even when files changed) or 'both'", "choice", "state",
            choices=NO_PROGRESS_SIGNALS, valid=", ".join(NO_PROGRESS_SIGNALS),
            run_flag="--no-progress-signal", option="--loop-no-progress-signal", ini="loop_no_progress_signal",
            env="PYTEST_LOOPS_NO_PROGRESS_SIGNAL", marker="no_progress_signal",
            yaml_key="guards.no_progress_signal", config_key="guards.no_progress_signal",
            loop_line="no progress signal: both", sample="failure"),
    Setting("branches", "revise candidates per iteration, each run in its own copy of the working tree; the "
            "best one's changes are kept (default 1: no fan-out)", "count", 1, bounds=(1, MAX_BRANCHES),
            valid=f"an integer from 1 to {MAX_BRANCHES}", run_flag="--branches", option="--loop-branches",
            ini="loop_branches", env="PYTEST_LOOPS_BRANCHES", marker="branches", yaml_key="branches",
            config_key="revise.branches", loop_line="branches: 3", metavar="N", sample="3"),
    Setting("max_parallel", "revise candidates and their checks run at once, across pytest-xdist workers "
            "too (default 0: the CPU count)", "count", 0, bounds=(0, 4096),
            valid="an integer >= 0 (0: the CPU count)", run_flag="--max-parallel", option="--loop-max-parallel",
            ini="loop_max_parallel", env="PYTEST_LOOPS_MAX_PARALLEL", yaml_key="max_parallel",
            config_key="revise.max_parallel", loop_line="max parallel: 4", metavar="N", sample="2"),
    Setting("state_paths", "state paths (globs) the no-progress guard fingerprints (pytest default: the "
            "rootdir)", "list", [], valid="a glob or a list of globs", run_flag="--state",
            option="--loop-state", ini="loop_state", env="PYTEST_LOOPS_STATE", marker="state",
            yaml_key="state_paths", config_key="progress.state_paths", loop_line="watch: src/**",
            metavar="GLOB", sample="src/**"),
    Setting("state_unmatched", "a state path (glob) that matches no file when the loop starts: 'warn' "
            "(default) prints one warning line and the loop runs; 'error' makes it bad input (exit 64)",
            "choice", "warn", choices=("warn", "error"), valid="warn, error", run_flag="--state-unmatched",
            option="--loop-state-unmatched", ini="loop_state_unmatched", env="PYTEST_LOOPS_STATE_UNMATCHED",
            sample="error"),
    Setting("lessons_page", "the lessons page: one lesson per failed iteration is appended to it and read back "
            "into the next prompt (markdown)", "path", None, valid="a file path", run_flag="--lessons-page",
            run_aliases=(("--memory", TAKES_VALUE), ("--episodic", TAKES_VALUE)), option="--loop-lessons-page",
            option_aliases=("--loop-memory",), ini="loop_lessons_page", ini_aliases=("loop_memory",),
            env="PYTEST_LOOPS_LESSONS_PAGE", env_aliases=("PYTEST_LOOPS_MEMORY",), yaml_key="lessons_page",
            yaml_aliases=("memory_page",), config_key="reflexion.episodic_memory_page",
            loop_line='remember in "lessons.md"', metavar="PATH", sample="lessons.md", origin_key="memory_page"),
    Setting("lessons", "'on' (default): write one lesson per failed iteration and read them back; "
            "'off' writes and reads none", "switch", True, choices=ON_OFF, valid="on or off",
            run_flag="--lessons", run_aliases=(("--reflexion", TAKES_VALUE), ("--no-reflexion", False)),
            option="--loop-lessons", option_aliases=("--loop-reflexion",), ini="loop_lessons",
            ini_aliases=("loop_reflexion",), env="PYTEST_LOOPS_LESSONS", yaml_key="lessons",
            yaml_aliases=("reflexion",), config_key="reflexion.enabled", sample="off", origin_key="reflexion"),
    Setting("artifacts", "directory for run logs, lessons and provenance (default: .pytest-loops under the "
            "working directory; pytest: the rootdir)", "path", None, valid="a directory path",
            run_flag="--artifacts", option="--loop-artifacts", ini="loop_artifacts",
            env="PYTEST_LOOPS_ARTIFACTS", metavar="DIR", sample="out"),
    Setting("output_cap", "bytes of each command's output kept (first and last halves), e.g. 16M; 0 = all "
            "(default 16M)", "size", DEFAULT_OUTPUT_CAP,
            valid="a number of bytes >= 0 with an optional K, M or G suffix, e.g. 16M (0 keeps all output)",
            run_flag="--output-cap", option="--loop-output-cap", ini="loop_output_cap",
            env="PYTEST_LOOPS_OUTPUT_CAP", metavar="SIZE", sample="4096"),
    Setting("tine", "'on' (default) writes one .tine provenance file per loop beside its run log; 'off' "
            "none", "switch", True, choices=ON_OFF, valid="on or off", run_flag="--tine",
            run_aliases=(("--no-tine", False),), run_accepts_path=True, option="--loop-tine",
            ini="loop_tine", sample="off"),
    Setting("private_artifacts", "'on': create run logs, .tine files and hand-off pages 0600 (only you can read "
            "them); 'off' (default): with your umask, as any file you create", "switch", False, choices=ON_OFF,
            valid="on or off", run_flag="--private-artifacts", option="--loop-private-artifacts",
            ini="loop_private_artifacts", env="PYTEST_LOOPS_PRIVATE_ARTIFACTS", sample="on"),
    Setting("suspects", "'on' (default): when a pytest check fails, re-run its tests under coverage and hand "
            "the top suspect lines to the revise step (prompt and suspects.json); 'off' skips it", "switch",
            True, choices=ON_OFF, valid="on or off", run_flag="--suspects",
            run_aliases=(("--no-suspects", False),), option="--loop-suspects", ini="loop_suspects",
            sample="off"),
    Setting("suspects_cap", "time cap of fault localization in the session fix-loop: a fraction of the "
            "session's plain run (0.2, or 20 percent written 20%%; never under 2 seconds), seconds (30s), or 0 = "
            "no cap (default 20%%)",
            "cap", "20%", valid="a fraction (0.2), a percent (20%), seconds (30s) or 0 for no cap",
            option="--loop-suspects-cap", ini="loop_suspects_cap", env="PYTEST_LOOPS_SUSPECTS_CAP",
            metavar="CAP", sample="30s"),
    Setting("confirm", "what the clean-room run before SUCCESS covers in the session fix-loop: 'affected' "
            "(default: the tests a fresh impact map says the changes can reach, plus the failing ones; every "
            "test when there is no map) or 'full' (every test the session ran)", "choice", "affected",
            choices=("affected", "full"), valid="affected, full", option="--loop-confirm", ini="loop_confirm",
            env="PYTEST_LOOPS_CONFIRM", sample="full"),
    Setting("impact_map", "how the session fix-loop records the impact map a later loop's clean-room run "
            "selects its tests by: 'background' (default: after a SUCCESS whose judged run covered every test, "
            "one run under per-test coverage in a detached process; the judged run itself "
            "runs plain), 'inline' (the judged run itself runs under coverage: slower, nothing left running) or "
            "'off'", "choice", "background", choices=("background", "inline", "off"),
            valid="background, inline, off", option="--loop-impact-map", ini="loop_impact_map",
            env="PYTEST_LOOPS_IMPACT_MAP", sample="inline"),
    Setting("audit", "the diff audit of a revise step's in-scope changes (hard-coded failing inputs, constant "
            "__eq__, pytest, the clock, the environment or sys.path in library code, added exits, files that are "
            "not text): 'error' (default) ends the loop ESCALATE, "
            "'warn' records the findings, 'off' skips it", "choice", "error", choices=("error", "warn", "off"),
            valid="error, warn, off", run_flag="--audit", option="--loop-audit", ini="loop_audit",
            sample="warn"),
    Setting("audit_allow", "a glob of in-scope files the revise step may add or change although they are not "
            "text (compiled modules, archives, images): without one, such a file is a finding of the diff audit",
            "list", [], valid="a glob", run_flag="--audit-allow", option="--loop-audit-allow",
            ini="loop_audit_allow", metavar="GLOB", sample="assets/*.png"),
    Setting("sandbox", "how the kernel keeps the revise step and the judge apart: 'auto' (default: the "
            "strongest available), 'namespaces' (bubblewrap), 'landlock' or 'none' (detection only); a tier "
            "asked for by name and not available here is an error", "choice", "auto",
            choices=("auto", "namespaces", "landlock", "none"), valid="auto, namespaces, landlock, none",
            run_flag="--sandbox", option="--loop-sandbox", ini="loop_sandbox", env="PYTEST_LOOPS_SANDBOX",
            sample="none"),
    Setting("sandbox_writable", "a path the sandboxed revise step may write besides the working tree and the "
            "agents' own state directories (repeatable)", "list", [], valid="a path",
            run_flag="--sandbox-writable", option="--loop-sandbox-writable", ini="loop_sandbox_writable",
            env="PYTEST_LOOPS_SANDBOX_WRITABLE", metavar="PATH", sample="~/.myagent"),
    Setting("sandbox_network", "'on' (default): sandboxed commands reach the network (agents call their "
            "model); 'off' gives them none (namespaces tier)", "switch", True, choices=ON_OFF,
            valid="on or off", run_flag="--sandbox-network", option="--loop-sandbox-network",
            ini="loop_sandbox_network", env="PYTEST_LOOPS_SANDBOX_NETWORK", sample="off"),
    Setting("exitcode", "'pytest' (default): exit 1 when a loop fails; 'verdict': exit with the highest loop "
            "verdict code (5 ESCALATE > 4 NO_PROGRESS > 3 TIMEOUT > 2 MAX_ITER)", "choice", "pytest",
            choices=("pytest", "verdict"), valid="pytest, verdict", option="--loop-exitcode",
            ini="loop_exitcode", sample="verdict"),
    Setting("config", "a loop-runner config file (guards, progress, reflexion, revise) as a settings layer",
            "path", None, valid="a loop-runner yaml file", run_flag="--config", option="--loop-config",
            ini="loop_config", metavar="FILE", reproduce="never", sample="runner.yaml"),
    Setting("log_path", "run log path (default .pytest-loops/runs/NAME-TIME.json)", "path", None,
            valid="a file path", run_flag="--log", config_key="run_log.path", metavar="PATH", sample="run.json"),
    Setting("report", "write a self-contained HTML report of this session's loops to this file", "path", None,
            valid="a file path", option="--loop-report", ini="loop_report", metavar="FILE",
            sample="report.html"),
    Setting("mask", "a value masked in everything the loops write or print, like a secret-named environment "
            "variable's", "list", [], valid="a value to mask", run_flag="--mask", option="--loop-mask",
            ini="loop_mask", env="PYTEST_LOOPS_MASK", env_read_here=False, metavar="VALUE",
            reproduce="never", sample="hunter22"),
    Setting("sign_key_env", "sign .tine files with the HMAC key in this environment variable (>= 16 bytes)",
            "text", None, valid="an environment variable name", run_flag="--sign-key-env",
            option="--loop-sign-key-env", ini="loop_sign_key_env", metavar="VAR", sample="LOOP_KEY"),
    Setting("watch", "'on' (the flag alone): rerun the failing tests in fresh subprocesses on each change, then "
            "the whole selection once they pass, until Ctrl-C or the silence window; the tests are never imported "
            "in this process", "switch", False, choices=ON_OFF, valid="on or off", option="--loop-watch",
            ini="loop_watch", env="PYTEST_LOOPS_WATCH", sample="on", reproduce="never", bare=True),
    Setting("watch_poll", "a watch's poll command, run every watch interval instead of watching files; "
            "it prints {\"ready\": bool, \"state_digest\": \"...\", \"payload\": ...}", "command", None,
            valid="a non-empty shell command", option="--loop-watch-poll", ini="loop_watch_poll",
            env="PYTEST_LOOPS_WATCH_POLL", loop_line='watch: poll "python poll.py" every 30s', metavar="CMD",
            sample="python poll.py"),
    Setting("watch_interval", "seconds between a watch's polls, or scans of its watched files (default 0.5)",
            "seconds", 0.5, valid="a number of seconds >= 0, e.g. 30 or 0.5s", option="--loop-watch-interval",
            ini="loop_watch_interval", env="PYTEST_LOOPS_WATCH_INTERVAL",
            loop_line='watch: poll "python poll.py" every 30s', metavar="S", sample="30"),
    Setting("silence", "end a watch NO_PROGRESS (reason watch_source_silence) when no tick with new state "
            "arrives for this many seconds; 0 = off (default)", "seconds", 0.0,
            valid="a number of seconds >= 0, e.g. 600 or 0.5s (0 turns it off)", option="--loop-silence",
            ini="loop_silence", env="PYTEST_LOOPS_SILENCE", loop_line="silence: 10 minutes", metavar="S",
            sample="600"),
    Setting("shard", "run only shard I of N of the loops (loop files, marker loops, the session fix-loop's "
            "failing tests grouped by where they fail): a deterministic split balanced by the loops' last "
            "durations in index.jsonl; the other loops are deselected", "shard", None,
            valid=f"I/N with whole numbers 1 <= I <= N <= {MAX_SHARDS}, e.g. 2/4", option="--loop-shard",
            ini="loop_shard", env="PYTEST_LOOPS_SHARD", metavar="I/N", sample="2/4"),
    Setting("annotations", "'on' (default): under GitHub Actions (GITHUB_ACTIONS=true) print workflow-command "
            "annotations (::error file=...,line=...::) for failing checks and top suspects; 'off' prints none",
            "switch", True, choices=ON_OFF, valid="on or off", option="--loop-annotations",
            ini="loop_annotations", env="PYTEST_LOOPS_ANNOTATIONS", sample="off"),
    Setting("sign_key_file", "sign .tine files with this Ed25519 private key file", "path", None,
            valid="a key file path", run_flag="--sign-key-file", option="--loop-sign-key-file",
            ini="loop_sign_key_file", metavar="FILE", sample="key.pem"),
)

BY_NAME: dict[str, Setting] = {row.name: row for row in SETTINGS}
GUARD_KEYS: tuple[str, ...] = tuple(row.name for row in SETTINGS if row.guard)
MARKER_KEYS: tuple[str, ...] = tuple(row.marker for row in SETTINGS if row.marker)
ENV_NAMES: dict[str, str] = {row.name: row.env for row in SETTINGS if row.env and row.env_read_here}
# setting -> every variable that sets it, the one that wins first (the new name, then old ones)
ENV_SPELLINGS: dict[str, tuple[str, ...]] = {row.name: row.envs for row in SETTINGS
                                             if row.env and row.env_read_here}
# settings a loop file line overrides and the session fills otherwise (merge_file_spec)
FILE_MERGED: tuple[str, ...] = tuple(row.name for row in SETTINGS if row.yaml_key)
# the settings a loop's spec records the origin of: the runner's (the config-file rows, the
# output cap and the runner-only lists) and pytest's (the same, with the artifacts directory)
DEFAULTS: dict[str, Any] = {row.name: row.default for row in SETTINGS if row.config_key}
DEFAULTS.update(output_cap=DEFAULT_OUTPUT_CAP, verify=[], protect=[], scope=[])
PYTEST_DEFAULTS: dict[str, Any] = {key: value for key, value in DEFAULTS.items()
                                   if key not in ("verify", "protect", "scope", "log_path")}
PYTEST_DEFAULTS["artifacts"] = None


def option_rows() -> list[Setting]:
    """Rows with a pytest option (and its ini twin)."""
    return [row for row in SETTINGS if row.option]


def run_rows() -> list[Setting]:
    """Rows with a ``pytest-loops run`` flag."""
    return [row for row in SETTINGS if row.run_flag]


def by_marker(keyword: str) -> Setting:
    return next(row for row in SETTINGS if row.marker == keyword)


def yaml_keys(section: str = "") -> tuple[str, ...]:
    """The YAML loop file keys of settings: top-level (``""``) or in ``guards``."""
    keys = []
    for row in SETTINGS:
        for key in (row.yaml_key, *row.yaml_aliases):
            if not key:
                continue
            head, _, tail = key.rpartition(".")
            if head == section:
                keys.append(tail)
    return tuple(dict.fromkeys(keys))


def runner_guard_keys() -> dict[str, tuple[str, ...]]:
    """Guard -> the loop-runner config-file keys under ``guards:`` that set it."""
    return {row.name: tuple(dict.fromkeys(k.removeprefix("guards.") for k in (row.config_key, row.yaml_key) if k))
            for row in SETTINGS if row.guard}


def runner_keys() -> list[tuple[str, str]]:
    """(origin key, config-file key) of the loop settings a loop-runner config sets besides guards."""
    return [(row.record_key, row.config_key) for row in SETTINGS
            if row.config_key and row.yaml_key and not row.yaml_key.startswith("guards.")]


# -- resolution ----------------------------------------------------------------------

@dataclass(frozen=True)
class Resolved:
    """Values after precedence, and where each came from ("default", a file, a flag...)."""

    values: dict[str, Any]
    origin: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def with_layer(self, name: str, layer: Mapping[str, Any]) -> Resolved:
        """These values with one more layer on top (a marker, a loop file line)."""
        return resolve([(name, layer)], defaults=self.values, origin=self.origin)


def resolve(layers: Sequence[tuple[str, Mapping[str, Any]]], defaults: Mapping[str, Any] = DEFAULTS,
            origin: Mapping[str, str] | None = None) -> Resolved:
    """Apply ``layers`` lowest first over ``defaults``; a None value means "not set here".

    Every entry point builds its layers in the one order (config file, ini,
    environment, command line; then a marker or a loop file line) and calls this.
    """
    values = dict(defaults)
    where = dict(origin) if origin is not None else dict.fromkeys(defaults, "default")
    for name, layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            values[key] = value
            where[key] = name
    return Resolved(values, where)


def record_origin(origin: Mapping[str, str]) -> dict[str, str]:
    """Origins keyed as a LoopSpec records them: a renamed setting under its spec field
    (``lessons_page`` as ``memory_page``, the run log's key); guards stay by name here."""
    return {BY_NAME[key].record_key if key in BY_NAME and not BY_NAME[key].guard else key: where
            for key, where in origin.items()}


def spec_origin(values: Resolved) -> dict[str, str]:
    """Where each of a pytest loop's settings came from (the others are the session's)."""
    return record_origin({key: where for key, where in values.origin.items() if key in PYTEST_DEFAULTS})


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings from PYTEST_LOOPS_* environment variables (validated)."""
    environ = os.environ if environ is None else environ
    layer: dict[str, Any] = {}
    for name, names in ENV_SPELLINGS.items():
        var = next((v for v in names if environ.get(v)), None)  # the new name wins over an old one
        if var is not None:
            layer[name] = BY_NAME[name].parse_env(environ[var], f"environment variable {var}")
    return layer


def marker_layer(kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A marker's keywords (already checked to be marker keywords) as a settings layer."""
    layer: dict[str, Any] = {}
    for keyword, value in kwargs.items():
        if value is None:
            continue
        row = by_marker(keyword)
        if row.kind in ("int", "number", "count") and isinstance(value, str):
            raise LoopUsageError(f"{value!r} is not a valid {row.name}; give a number",
                                 location=f"{where}({keyword}=...)")
        layer[row.name] = row.parse(value, f"{where}({keyword}=...)")
    return layer


def given_grants(values: Resolved) -> tuple[str, ...] | None:
    """The grants the session gave (``--grants``, ``--loop-grants``, ini, environment), which
    replace a loop file's line; None: none given, the loop's own stand. Bad names: LoopUsageError."""
    from pytest_loops.spec import parse_grants

    raw = values.values.get("grants")
    if raw is None:
        return None
    row = BY_NAME["grants"]
    where = {"command line": f"{row.run_flag} / {row.option}", "environment": str(row.env),
             "ini": f"ini {row.ini}"}.get(values.origin.get("grants", ""), "grants")
    return parse_grants(str(raw), where)


def file_has(row: Setting, spec_origin: Mapping[str, str]) -> bool:
    """Whether a loop file set this setting itself (its line wins over the session)."""
    return spec_origin.get(row.record_key, "default") != "default"


def reproduce_pairs(values: Resolved) -> list[tuple[str, str]]:
    """The ``--loop-*`` flags and values that reproduce these settings (``=`` form)."""
    pairs: list[tuple[str, str]] = []
    for row in option_rows():
        if row.reproduce == "never" or row.name not in values.values:
            continue
        value = values[row.name]
        if row.reproduce == "changed" and (value in (None, [], ()) or value == row.default
                                           or values.origin.get(row.name, "default") == "default"):
            continue
        pairs += [(row.option, text) for text in row.text(value) if row.option]
    return pairs


def own_options() -> set[str]:
    """The pytest options whose values the reproduce command writes itself (or drops)."""
    return {"--loop", *(option for row in option_rows() for option in row.options)}

"""YAML loop definitions (``*.loop.yaml``, ``*.loop.yml``) and the loop-runner config as a loop.

A loop definition file::

    loops:
      - name: fix the parser
        goal: the parser tests pass
        checks:
          - pytest -q tests/test_parser.py        # a string: the command passes
          - {command: pytest -q tests/test_flaky.py, times: 3}
          - {finds_nothing: ruff check src}
          - {test: "tests/test_parser.py::test_quotes"}
          - {human: the error messages read well}
          - {skill: code-review, min_score: 8, judges: 3, on: trajectory, bar: no test weakened}
        revise: python tools/fix.py
        guards: {max_iter: 6, budget: 15 minutes, no_progress_k: 2, escalate_after: 4}
        state_paths: [src/**/*.py]
        lessons_page: lessons.md
        protect: [tests/**]
        scope: [src/**]
    pipelines:
      - name: release
        stages: [ ...loops... ]

Every problem is a LoopFileError naming file:line:column and the key path, e.g.
``loops[0].checks[2].command: expected a string``. A loop-runner config (top-level
``guards``, ``progress``, ``reflexion``, ``run_log``, ``revise``, ``verify``) is read
by :func:`pytest_loops.sources.config.read_runner_config` and becomes one loop named after
the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable
from typing import Any

import yaml

from pytest_loops.errors import LoopFileError, LoopUsageError
from pytest_loops.limits import MAX_YAML_BYTES, check_size, load_yaml, safe_loader, short_repr
from pytest_loops.settings import BY_NAME, runner_guard_keys, runner_keys, yaml_keys
from pytest_loops.sources import phrases
from pytest_loops.sources.model import LoopFile
from pytest_loops.sources.phrases import Problem
from pytest_loops.sources.reading import read_text, runner_project_root
from pytest_loops.spec import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_MAX_ITER,
    DEFAULT_NO_PROGRESS_K,
    GRANT_NAMES,
    NO_PROGRESS_SIGNALS,
    Check,
    CheckKind,
    Guards,
    IgnoredLine,
    LoopSpec,
    Pipeline,
    validate_guard_values,
)

TOP_KEYS = ("loops", "pipelines")
# a loop's own keys, then the settings table's (revise, state_paths, lessons_page, lessons and
# their old spellings memory_page, reflexion)
LOOP_KEYS = ("name", "goal", "checks", "guards", "protect", "scope", "look_at", "stop_message",
             "escalate_when_blocked", "grants", *yaml_keys())
PIPELINE_KEYS = ("name", "stages")
GUARD_KEYS = yaml_keys("guards")  # max_iter, budget_seconds, budget, no_progress_k, ...
CHECK_KINDS = ("command", "finds_nothing", "test", "human", "skill")
CHECK_EXTRAS = {
    "command": ("name", "times", "timeout", "hidden"),
    "finds_nothing": ("name", "times", "timeout", "hidden"),
    "test": ("name", "times", "timeout", "hidden"),
    "human": ("name",),
    "skill": ("name", "min_score", "judges", "on", "bar", "timeout"),
}
RUNNER_SECTIONS = ("guards", "progress", "reflexion", "run_log", "revise", "verify")


# -- YAML with positions ------------------------------------------------------------

class _Map(dict[Any, Any]):
    """A mapping that remembers where each value starts."""

    start: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[Any, Any] = {}
        self.key_marks: dict[Any, Any] = {}


class _Seq(list[Any]):
    """A sequence that remembers where each item starts."""

    start: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[Any] = []


class _Loader(safe_loader()):  # type: ignore[misc]  # libyaml when present
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.start = node.start_mark
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, bool) and key_node.value.lower() not in ("true", "false"):
            key = key_node.value  # YAML 1.1 reads a key `on:` as True; keep the word
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                    "found an unhashable key", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"found duplicate key {key!r}",
                                                    key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.marks[key] = value_node.start_mark
        out.key_marks[key] = key_node.start_mark
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _Seq:
    out = _Seq()
    out.start = node.start_mark
    for item in node.value:
        out.append(loader.construct_object(item, deep=True))
        out.marks.append(item.start_mark)
    return out


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def _load_yaml(text: str, path: str) -> Any:
    return load_yaml(text, path, _Loader)


# -- validation ---------------------------------------------------------------------

def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    for kind, name in ((dict, "a mapping"), (list, "a list"), (str, "a string"), (int, "a number"),
                       (float, "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


class _Reader:
    """Walks the loaded YAML, naming key paths and positions in every error."""

    def __init__(self, path: str):
        self.path = path
        self.filedir = os.path.dirname(os.path.abspath(path))

    def fail(self, keypath: str, message: str, mark: Any, fix: str | None = None) -> LoopFileError:
        text = f"{keypath}: {message}" if keypath else message
        if mark is None:
            return LoopFileError(text, self.path, fix=fix)
        return LoopFileError(text, self.path, mark.line + 1, mark.column + 1, fix=fix)

    def where(self, mark: Any) -> str:
        return f"{self.path}:{mark.line + 1}" if mark is not None else self.path

    @staticmethod
    def mark(container: Any, key: Any) -> Any:
        marks = getattr(container, "marks", None)
        if isinstance(marks, dict):
            return marks.get(key, getattr(container, "start", None))
        if isinstance(marks, list) and isinstance(key, int) and key < len(marks):
            return marks[key]
        return getattr(container, "start", None)

    def mapping(self, value: Any, keypath: str, mark: Any, allowed: tuple[str, ...]) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise self.fail(keypath, f"expected a mapping, got {_type_name(value)}", mark)
        for key in value:
            if key not in allowed:
                sub = f"{keypath}.{key}" if keypath else str(key)
                raise self.fail(sub, "unknown key", getattr(value, "key_marks", {}).get(key),
                                fix="valid keys: " + ", ".join(allowed))
        return value

    def string(self, container: Any, key: Any, keypath: str, required: bool = False) -> str | None:
        if key not in container or container[key] is None:
            if required:
                raise self.fail(keypath, "missing", getattr(container, "start", None),
                                fix=f"add `{keypath.rsplit('.', 1)[-1]}:` with a text value")
            return None
        value = container[key]
        if not isinstance(value, str):
            raise self.fail(keypath, f"expected a string, got {_type_name(value)}", self.mark(container, key))
        if not value.strip():
            raise self.fail(keypath, "expected a non-empty string", self.mark(container, key))
        return value

    def strings(self, container: Any, key: Any, keypath: str) -> list[str]:
        value = container.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise self.fail(keypath, f"expected a list of strings, got {_type_name(value)}",
                            self.mark(container, key))
        for n, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise self.fail(f"{keypath}[{n}]", f"expected a non-empty string, got {_type_name(item)}",
                                self.mark(value, n))
        return list(value)

    def grants(self, body: Any, keypath: str) -> list[str]:
        """``grants: [skills, mcps]``: each one of GRANT_NAMES (an unknown one is bad input)."""
        names = [n.strip().lower() for n in self.strings(body, "grants", keypath)]
        for n, name in enumerate(names):
            if name not in GRANT_NAMES:
                where = self.mark(body["grants"], n) if isinstance(body["grants"], list) else self.mark(body, "grants")
                raise self.fail(f"{keypath}[{n}]" if isinstance(body["grants"], list) else keypath,
                                f"{name!r} is not a grant", where,
                                fix=f"grant only {', '.join(GRANT_NAMES)} (or leave grants out)")
        return names

    @staticmethod
    def spelling(container: Any, name: str) -> str:
        """The key a setting is given under: its YAML key, else an old spelling of it."""
        row = BY_NAME[name]
        assert row.yaml_key is not None
        keys = (row.yaml_key, *row.yaml_aliases)
        return next((k for k in keys if container.get(k) is not None), row.yaml_key)

    def boolean(self, container: Any, key: Any, keypath: str, default: bool) -> bool:
        value = container.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(keypath, f"expected true or false, got {_type_name(value)}", self.mark(container, key))
        return value

    def integer(self, container: Any, key: Any, keypath: str, minimum: int) -> int | None:
        value = container.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(keypath, f"expected an integer >= {minimum}, got {short_repr(value)}",
                            self.mark(container, key))
        return value

    # -- loops -----------------------------------------------------------------------

    def document(self, data: Any) -> LoopFile:
        if data is None:
            raise LoopFileError("no loops in this file", self.path,
                                fix="add a `loops:` list (see docs/loop-language.md)")
        if isinstance(data, dict) and not any(k in data for k in TOP_KEYS) and any(
                k in data for k in RUNNER_SECTIONS):
            return self.runner_config(data)
        top = self.mapping(data, "", getattr(data, "start", None), TOP_KEYS)
        loops: list[LoopSpec] = []
        pipelines: list[Pipeline] = []
        names: dict[str, str] = {}
        for n, item in enumerate(self.items(top, "loops")):
            spec = self.loop(item, f"loops[{n}]", self.mark(top["loops"], n))
            self.claim(names, spec, f"loops[{n}].name", item)
            loops.append(spec)
        for n, item in enumerate(self.items(top, "pipelines")):
            keypath = f"pipelines[{n}]"
            mark = self.mark(top["pipelines"], n)
            body = self.mapping(item, keypath, mark, PIPELINE_KEYS)
            pname = self.string(body, "name", f"{keypath}.name", required=True)
            assert pname is not None
            if pname in names:
                raise self.fail(f"{keypath}.name", f"duplicate name {pname!r} (also {names[pname]})",
                                self.mark(body, "name"), fix="give each loop and pipeline its own name")
            names[pname] = keypath
            stages = []
            for k, stage in enumerate(self.items(body, "stages", required=True, keypath=keypath)):
                spath = f"{keypath}.stages[{k}]"
                spec = self.loop(stage, spath, self.mark(body["stages"], k), prefix=f"{pname} / ")
                self.claim(names, spec, f"{spath}.name", stage)
                stages.append(spec)
            pipelines.append(Pipeline(pname, tuple(stages), self.where(mark)))
        if not loops and not pipelines:
            raise LoopFileError("no loops in this file", self.path,
                                fix="add a `loops:` list (see docs/loop-language.md)")
        return LoopFile(self.path, tuple(loops), tuple(pipelines))

    def items(self, container: dict[Any, Any], key: str, required: bool = False,
              keypath: str = "") -> list[Any]:
        path = f"{keypath}.{key}" if keypath else key
        value = container.get(key)
        if value is None:
            if required:
                raise self.fail(path, "missing", getattr(container, "start", None),
                                fix=f"add `{key}:` with a list")
            return []
        if not isinstance(value, list) or (required and not value):
            raise self.fail(path, f"expected a non-empty list, got {_type_name(value) if value else 'an empty list'}",
                            self.mark(container, key))
        return value

    def claim(self, names: dict[str, str], spec: LoopSpec, keypath: str, item: Any) -> None:
        if spec.name in names:
            raise self.fail(keypath, f"duplicate name {spec.name!r} (also {names[spec.name]})",
                            self.mark(item, "name"), fix="give each loop and stage its own name")
        names[spec.name] = keypath.rsplit(".", 1)[0]

    def loop(self, item: Any, keypath: str, mark: Any, prefix: str = "") -> LoopSpec:
        body = self.mapping(item, keypath, mark, LOOP_KEYS)
        name = self.string(body, "name", f"{keypath}.name", required=True)
        goal = self.string(body, "goal", f"{keypath}.goal", required=True)
        origin: dict[str, str] = {}

        def note(key: str, origin_key: str | None = None, container: Any = body) -> None:
            origin[origin_key or key] = self.where(self.mark(container, key)) if key in container \
                and container[key] is not None else "default"

        self.signal = ("state", "default")
        guards = self.guards(body, keypath, origin)
        origin["no_progress_signal"] = self.signal[1]
        checks = self.checks(body, keypath)
        revise = self.string(body, "revise", f"{keypath}.revise")
        note("revise")
        context_adapter = self.string(body, "context_adapter", f"{keypath}.context_adapter")
        note("context_adapter")
        page_key = self.spelling(body, "lessons_page")  # the new key wins
        memory = self.string(body, page_key, f"{keypath}.{page_key}")
        note(page_key, "memory_page")
        state_paths = self.strings(body, "state_paths", f"{keypath}.state_paths")
        note("state_paths")
        stop_message = self.string(body, "stop_message", f"{keypath}.stop_message")
        note("stop_message")
        blocked = self.boolean(body, "escalate_when_blocked", f"{keypath}.escalate_when_blocked", False)
        note("escalate_when_blocked")
        lessons_key = self.spelling(body, "lessons")
        lessons = self.boolean(body, lessons_key, f"{keypath}.{lessons_key}", True)
        note(lessons_key, "reflexion")
        lists = {key: self.strings(body, key, f"{keypath}.{key}") for key in ("protect", "scope", "look_at")}
        for key in lists:
            if lists[key]:
                note(key)
        counts = {}
        for key in ("branches", "max_parallel"):
            low, high = BY_NAME[key].bounds
            value = self.integer(body, key, f"{keypath}.{key}", low)
            if value is not None:
                if value > high:
                    raise self.fail(f"{keypath}.{key}", f"expected an integer from {low} to {high}, got {value}",
                                    self.mark(body, key))
                counts[key] = value
                note(key)
        grants = self.grants(body, f"{keypath}.grants")
        if grants:
            note("grants")
        return LoopSpec(
            name=prefix + (name or ""), checks=tuple(checks), goal=goal or "", revise=revise,
            guards=guards, state_paths=tuple(state_paths),
            memory_page=os.path.normpath(os.path.join(self.filedir, memory)) if memory else None,
            reflexion=lessons, cwd=self.filedir, stop_message=stop_message,
            no_progress_signal=self.signal[0],
            escalate_when_blocked=blocked, look_at=tuple(lists["look_at"]),
            protect=tuple(lists["protect"]), scope=tuple(lists["scope"]), grants=tuple(grants), origin=origin,
            source=self.where(mark), branches=counts.get("branches", 1),
            max_parallel=counts.get("max_parallel", 0), context_adapter=context_adapter,
        )

    def guards(self, body: dict[Any, Any], keypath: str, origin: dict[str, str]) -> Guards:
        values: dict[str, Any] = {"max_iter": DEFAULT_MAX_ITER, "budget_seconds": DEFAULT_BUDGET_SECONDS,
                                  "no_progress_k": DEFAULT_NO_PROGRESS_K, "escalate_after": DEFAULT_ESCALATE_AFTER,
                                  "max_cost": 0.0, "max_tokens": 0}
        for key in values:
            origin[f"guards.{key}"] = "default"
        raw = body.get("guards")
        if raw is None:
            return Guards(**values)
        gpath = f"{keypath}.guards"
        g = self.mapping(raw, gpath, self.mark(body, "guards"), GUARD_KEYS)
        if "budget" in g and "budget_seconds" in g:
            raise self.fail(f"{gpath}.budget", "give either budget or budget_seconds, not both",
                            self.mark(g, "budget"))
        for key, value in g.items():
            kpath = f"{gpath}.{key}"
            kmark = self.mark(g, key)
            if value is None:
                continue
            if key == "no_progress_signal":
                if value not in NO_PROGRESS_SIGNALS:
                    raise self.fail(kpath, f"expected one of {', '.join(NO_PROGRESS_SIGNALS)}, got {short_repr(value)}",
                                    kmark)
                self.signal = (value, self.where(kmark))
                continue
            name = "budget_seconds" if key == "budget" else key
            if key == "budget":
                if not isinstance(value, str):
                    raise self.fail(kpath, f"expected a duration like \"15 minutes\", got {_type_name(value)}",
                                    kmark, fix="or give budget_seconds: a number")
                try:
                    value = phrases.duration_seconds(value)
                except Problem as exc:
                    raise self.fail(kpath, exc.message, kmark, exc.fix) from None
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(kpath, f"expected a number, got {_type_name(value)}", kmark)
            elif name not in ("budget_seconds", "max_cost") and isinstance(value, float):
                if not (math.isfinite(value) and value == int(value)):
                    raise self.fail(kpath, f"expected an integer, got {short_repr(value)}", kmark)
                value = int(value)
            problems = validate_guard_values(**{name: value})
            if problems:
                raise self.fail(kpath, problems[0][1], kmark)
            values[name] = value
            origin[f"guards.{name}"] = self.where(kmark)
        return Guards(**values)

    def checks(self, body: dict[Any, Any], keypath: str) -> list[Check]:
        items = self.items(body, "checks", required=True, keypath=keypath)
        built: list[tuple[dict[str, Any], str, Any]] = []
        for n, item in enumerate(items):
            cpath = f"{keypath}.checks[{n}]"
            mark = self.mark(body["checks"], n)
            if isinstance(item, str):
                item = {"command": item}
                if not item["command"].strip():
                    raise self.fail(cpath, "expected a non-empty command", mark)
            elif not isinstance(item, dict):
                raise self.fail(cpath, f"expected a command string or a mapping, got {_type_name(item)}", mark,
                                fix="e.g. `- pytest -q` or `- {test: tests/test_x.py::test_y}`")
            kinds = [k for k in CHECK_KINDS if k in item]
            if len(kinds) != 1:
                raise self.fail(cpath, "expected exactly one of " + ", ".join(CHECK_KINDS)
                                + (f", got {', '.join(kinds)}" if kinds else ""), mark)
            kind = kinds[0]
            self.mapping(item, cpath, mark, (kind, *CHECK_EXTRAS[kind]))
            kw, phrase = self.check(item, kind, cpath)
            built.append((kw, phrase, mark))
        names = phrases.unique_names([phrases.check_name(phrase) for _, phrase, _ in built])
        out = []
        for (kw, _, mark), name in zip(built, names, strict=True):
            try:
                out.append(Check(name=name, source=self.where(mark), **kw))
            except LoopUsageError as exc:  # pragma: no cover - values are validated above
                raise self.fail(keypath, exc.message, mark) from None
        return out

    def check(self, item: dict[str, Any], kind: str, cpath: str) -> tuple[dict[str, Any], str]:
        value = self.string(item, kind, f"{cpath}.{kind}", required=True)
        assert value is not None
        times = self.integer(item, "times", f"{cpath}.times", 1) or 1
        timeout = item.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise self.fail(f"{cpath}.timeout", f"expected a positive number of seconds, got {short_repr(timeout)}",
                            self.mark(item, "timeout"))
        kw: dict[str, Any] = {"timeout": float(timeout) if timeout is not None else None}
        hidden = item.get("hidden", False)
        if not isinstance(hidden, bool):
            raise self.fail(f"{cpath}.hidden", f"expected true or false, got {short_repr(hidden)}",
                            self.mark(item, "hidden"))
        if hidden:
            kw["hidden"] = True
        name = self.string(item, "name", f"{cpath}.name")
        more = f" {times} times" if times > 1 else ""
        if kind == "command":
            kw.update(kind=CheckKind.COMMAND, command=value, times=times)
            phrase = f'"{value}" passes{more}'
        elif kind == "finds_nothing":
            kw.update(kind=CheckKind.FINDS_NOTHING, command=value, times=times)
            phrase = f'"{value}" finds nothing{more}'
        elif kind == "test":
            kw.update(kind=CheckKind.PYTEST, node_id=value.strip(), times=times)
            phrase = f'the test "{value.strip()}" passes{more}'
        elif kind == "human":
            kw.update(kind=CheckKind.HUMAN, text=value)
            phrase = f'a human confirms "{value}"'
        else:
            min_score = self.integer(item, "min_score", f"{cpath}.min_score", 1)
            judges = self.integer(item, "judges", f"{cpath}.judges", 1) or 1
            on = item.get("on", "output")
            if on not in ("output", "trajectory"):
                raise self.fail(f"{cpath}.on", f"expected output or trajectory, got {short_repr(on)}",
                                self.mark(item, "on"))
            bar = self.string(item, "bar", f"{cpath}.bar")
            mode = "scores" if min_score is not None else ("judges" if judges > 1 else "approves")
            kw.update(kind=CheckKind.HOOK, options={"skill": value, "mode": mode, "min_score": min_score,
                                                    "judges": judges, "on": on, "bar": bar})
            phrase = f'the skill "{value}" ' + (f"scores {min_score} or more" if min_score else "approves")
            phrase += " on the trajectory" if on == "trajectory" else ""
            phrase += f" by {judges} judges" if judges > 1 else ""
        return kw, name or phrase

    # -- the loop-runner config ----------------------------------------------------------

    def runner_config(self, data: dict[Any, Any]) -> LoopFile:
        from pytest_loops.sources.config import read_runner_config

        try:
            layer = read_runner_config(self.path, data=_plain(data))
        except LoopUsageError as exc:
            keypath = ""
            if exc.location and exc.location.startswith(f"{self.path}: "):
                keypath = exc.location[len(self.path) + 2:]
            raise self.fail(keypath, exc.message, self.keypath_mark(data, keypath), exc.fix) from None
        verify = layer.get("verify") or []
        notes = []
        if "verified" in layer:
            key = "verified" if self.has(data, "verified") else "revise.verified"
            notes.append(IgnoredLine(
                self.keypath_mark(data, key).line + 1, f"{key}: {str(layer['verified']).lower()}",
                "loop-runner's mark that the config's values are " + ("proven" if layer["verified"] else
                                                                       "not yet proven") +
                " in this project; read, nothing changes: the loop is fail-safe either way (every check must "
                "pass, every guard is on)"))
        if not verify:  # the skill's config: settings for `run --config FILE --verify CMD`, no loop by itself
            notes.append(IgnoredLine(self.keypath_mark(data, "").line + 1,
                                     "no verify: settings, not a loop by itself",
                                     "no verify command: settings for `pytest-loops run --config "
                                     f"{self.path} --verify CMD`; add `verify: {{cmd: \"pytest -q\"}}` to "
                                     "make it a loop"))
            return LoopFile(self.path, (), config=tuple(notes))
        origin: dict[str, str] = {}
        guard_keys = runner_guard_keys()  # setting -> its config-file keys, from the settings table
        for name, keys in guard_keys.items():
            origin[f"guards.{name}"] = next((self.where(self.keypath_mark(data, f"guards.{k}"))
                                             for k in keys if self.has(data, f"guards.{k}")), "default")
        for name, key in runner_keys():
            origin[name] = self.where(self.keypath_mark(data, key)) if self.has(data, key) else "default"
        ignored = [IgnoredLine(self.keypath_mark(data, key).line + 1, key, "not a loop-runner key; ignored")
                   for key in layer.get("unknown_keys", [])]
        if layer.get("log_path"):
            ignored.append(IgnoredLine(self.keypath_mark(data, "run_log.path").line + 1,
                                       f"run_log.path: {layer['log_path']}",
                                       "a runner setting (pytest-loops run --log); not part of a loop"))
        memory = layer.get("lessons_page")
        names = phrases.unique_names([phrases.check_name(f'"{cmd}" passes') for cmd in verify])
        verify_mark = self.keypath_mark(data, "verify")
        checks = tuple(Check(CheckKind.COMMAND, name, command=cmd, source=self.where(verify_mark))
                       for cmd, name in zip(verify, names, strict=True))
        base = os.path.basename(self.path)
        stem = base.rsplit(".", 1)[0] if base.lower().endswith((".yaml", ".yml")) else base
        stem = stem.removesuffix(".config")  # loop-runner.config.yaml: the loop "loop-runner", as `run` names it
        guards = Guards(**{k: layer[k] for k in guard_keys if k in layer})
        root = runner_project_root(self.filedir)  # run from the project root, as the skill runs it
        origin["cwd"] = "the project root (the parent of harness/)" if root != os.path.abspath(self.filedir) \
            else "the file's directory"
        spec = LoopSpec(
            name=stem or "loop", checks=checks, goal="every verify command passes", revise=layer.get("revise"),
            guards=guards, state_paths=tuple(layer.get("state_paths", ())),
            memory_page=os.path.normpath(os.path.join(root, memory)) if memory else None,
            reflexion=layer.get("lessons", True), cwd=root, ignored=tuple(ignored),
            no_progress_signal=layer.get("no_progress_signal", "state"),
            origin=origin, source=self.where(getattr(data, "start", None)),
        )
        return LoopFile(self.path, (spec,), config=tuple(notes))

    def has(self, data: Any, keypath: str) -> bool:
        node = data
        for part in keypath.split("."):
            if not isinstance(node, dict) or node.get(part) is None:
                return False
            node = node[part]
        return True

    def keypath_mark(self, data: Any, keypath: str) -> Any:
        """The position of ``a.b`` in the loaded YAML (the nearest known one)."""
        node, mark = data, getattr(data, "start", None)
        for part in keypath.split(".") if keypath else ():
            if not isinstance(node, dict) or part not in node:
                break
            mark = self.mark(node, part)
            node = node[part]
        if mark is None:
            mark = yaml.Mark(self.path, 0, 0, 0, None, None)  # type: ignore[arg-type]  # no buffer
        return mark


def _plain(value: Any) -> Any:
    """Plain dicts and lists (no positions) for code that reports type names."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def load_yaml_text(text: str, path: str = "<string>") -> LoopFile:
    """Parse YAML loop definitions (or a loop-runner config) from text."""
    path = os.fspath(path)
    return _Reader(path).document(_load_yaml(text, path))


def load_yaml_loops(path: str | os.PathLike) -> LoopFile:
    """Read a ``*.loop.yaml`` / ``*.loop.yml`` file, or a loop-runner YAML config, as loops."""
    check_size(path, "a YAML loop file", MAX_YAML_BYTES)
    return load_yaml_text(read_text(path), os.fspath(path))

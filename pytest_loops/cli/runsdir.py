"""Read-only answers about the runs in one directory: the MCP server's tools.

Every reference a caller passes (a run id, a file name, a lessons page) is
resolved inside the directory: no absolute path, no ``..``, no symlink that
leads out; only regular files, each size-checked before it is read. Answers
are plain JSON data, cut to :data:`MAX_RESPONSE_CHARS` when they would be
longer (``"truncated": true`` says so). Nothing here writes a file or starts a
process: the functions read run logs, `.tine` files and lessons pages only.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_loops.errors import LoopUsageError
from pytest_loops.limits import MiB

MAX_FILE_BYTES = 16 * MiB
"""A run log, `.tine` or lessons page bigger than this is refused, unread."""
MAX_RESPONSE_CHARS = 200_000
"""An answer's JSON text is cut to about this many characters."""
MAX_REF_CHARS = 512
MAX_RUNS_LISTED = 500
RUN_SUFFIXES = (".json", ".tine")
_LONG_TEXT = 2_000  # strings cut to this first when an answer is too long


class RunsDir:
    """One directory of run artifacts: ``.pytest-loops`` (with ``runs/`` and
    ``lessons/``) or a directory of run logs itself."""

    def __init__(self, directory: str | os.PathLike, *, key_env: str | None = None,
                 pubkey: str | None = None, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        given = Path(directory)
        if not given.is_dir():
            raise LoopUsageError("not a directory", location=str(given),
                                 fix="pass --runs-dir an artifacts directory (e.g. .pytest-loops)")
        self.root = given.resolve()
        runs = self.root / "runs"
        self.runs = runs if runs.is_dir() and not runs.is_symlink() else self.root
        self.lessons = self.root / "lessons"
        self.key_env = key_env
        self.pubkey = pubkey
        self.max_file_bytes = max_file_bytes

    # ------------------------------------------------------------------ references

    def resolve(self, ref: Any, *, suffixes: tuple[str, ...] = RUN_SUFFIXES, base: Path | None = None) -> Path:
        """The regular file ``ref`` names inside the directory, or LoopUsageError.

        A bare id (``loop-…-123``) is looked up in the runs directory with each of
        ``suffixes``; anything else is a path relative to the directory."""
        if not isinstance(ref, str) or not ref.strip():
            raise LoopUsageError("a run reference must be a non-empty string", location=repr(ref)[:80],
                                 fix="pass an id from list_runs")
        if len(ref) > MAX_REF_CHARS or "\0" in ref:
            raise LoopUsageError("not a usable reference (too long or holds a NUL)", location=ref[:80],
                                 fix="pass an id from list_runs")
        if os.path.isabs(ref) or ref.startswith("~"):
            raise LoopUsageError("absolute paths are refused", location=ref,
                                 fix="pass an id from list_runs or a path relative to the runs directory")
        if ".." in Path(ref).parts:
            raise LoopUsageError("'..' is refused: references stay inside the runs directory", location=ref,
                                 fix="pass an id from list_runs")
        where = base or self.runs
        if "/" not in ref and not ref.endswith(suffixes):
            candidates = [where / (ref + suffix) for suffix in suffixes]
        else:
            candidates = [self.root / ref]
        for candidate in candidates:
            if os.path.lexists(candidate):
                return self._inside(candidate, ref)
        raise LoopUsageError("no such run", location=ref, fix="pass an id from list_runs")

    def _inside(self, candidate: Path, ref: str) -> Path:
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            raise LoopUsageError("cannot be resolved (a dangling or looping link)", location=ref) from None
        if not real.is_relative_to(self.root):
            raise LoopUsageError("leads outside the runs directory and is refused", location=ref,
                                 fix="pass an id from list_runs")
        try:
            info = os.stat(real)
        except OSError as exc:
            raise LoopUsageError(f"cannot be read: {exc.strerror or exc}", location=ref) from None
        if not stat.S_ISREG(info.st_mode):
            raise LoopUsageError("not a regular file", location=ref, fix="pass an id from list_runs")
        if info.st_size > self.max_file_bytes:
            raise LoopUsageError(f"{info.st_size} bytes: larger than the {self.max_file_bytes // MiB} MiB "
                                 "this server reads", location=ref)
        return real

    def _load(self, path: Path) -> dict[str, Any]:
        from pytest_loops.cli.runview import load_run

        run = load_run(path)
        run["source_path"] = self.relative(path)
        return run

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def run(self, ref: Any) -> dict[str, Any]:
        return self._load(self.resolve(ref))

    # ------------------------------------------------------------------ tools

    def list_runs(self, limit: int = 50) -> dict[str, Any]:
        """The runs, newest first: id, loop, verdict, iterations, files; a log that
        cannot be read is listed with its one-line error, not left out."""
        limit = _bounded(limit, "limit", 1, MAX_RUNS_LISTED)
        found: dict[str, dict[str, str]] = {}
        for entry in sorted(os.scandir(self.runs), key=lambda e: e.name):
            if not entry.name.endswith(RUN_SUFFIXES) or entry.name.startswith("."):
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            stem, suffix = os.path.splitext(entry.name)
            found.setdefault(stem, {})[suffix[1:]] = entry.path
        runs = []
        for stem, files in found.items():
            item: dict[str, Any] = {"id": stem, "files": {k: self.relative(Path(v)) for k, v in sorted(files.items())}}
            source = files.get("json") or files["tine"]
            try:
                run = self._load(self.resolve(self.relative(Path(source))))
            except LoopUsageError as exc:
                item["error"] = str(exc)
                item["started_at"] = None
            else:
                if not str(run.get("schema") or "pytest-loops").startswith("pytest-loops"):
                    continue
                item.update({k: run.get(k) for k in ("loop", "verdict", "exit_code", "started_at")})
                item["iterations"] = len(run.get("iterations") or [])
                item["verified"] = bool(run.get("verified"))
                item.update(_usage_of(run))
            runs.append(item)
        runs.sort(key=lambda r: (str(r.get("started_at") or ""), r["id"]), reverse=True)
        return fit({"runs_dir": str(self.root), "count": len(runs), "runs": runs[:limit],
                    "more": max(0, len(runs) - limit)})

    def show_run(self, ref: Any) -> dict[str, Any]:
        """A run's summary and the iteration table a human reads."""
        from pytest_loops.cli.runview import branch_summary, branches_of, format_run, iterations_of

        run = self.run(ref)
        keys = ("loop", "goal", "verdict", "exit_code", "reason", "iterations_run", "started_at", "ended_at",
                "elapsed_s", "spec_digest", "verified", "unverified_why", "lessons", "source_path")
        summary = {k: run.get(k) for k in keys if k in run}
        summary.update(_usage_of(run))
        summary["artifacts"] = {k: os.path.basename(str(v)) for k, v in (run.get("artifacts") or {}).items()
                                if isinstance(v, str)}
        summary["branches"] = [{"iteration": it.get("iter", index), "candidates": [branch_summary(b)
                                                                                 for b in branches_of(it)]}
                               for index, it in enumerate(iterations_of(run), 1) if branches_of(it)]
        summary["text"] = format_run(run)
        return fit(summary)

    def show_trajectory(self, ref: Any, start: int = 1, limit: int = 100) -> dict[str, Any]:
        """Per iteration: each check's result, state, streak, revise exit, guard."""
        from pytest_loops.cli.compare import check_status
        from pytest_loops.cli.runview import branch_summary, branches_of, checks_of, iterations_of

        start = _bounded(start, "start", 1, 10**9)
        limit = _bounded(limit, "limit", 1, 1000)
        run = self.run(ref)
        iterations = iterations_of(run)
        rows = []
        for index, it in enumerate(iterations[start - 1:start - 1 + limit], start):
            rows.append({
                "iteration": it.get("iter", index),
                "checks": [{"name": c.get("name"), "status": check_status(c), "exit_code": c.get("exit_code"),
                            "reason": c.get("reason") or ""} for c in checks_of(it)],
                "state_changed": it.get("state_changed"),
                "unchanged_streak": it.get("unchanged_streak"),
                "revise_exit": it.get("revise_exit"),
                "guard": it.get("guard"),
                "duration_s": it.get("duration_s"),
                "branches": [branch_summary(b) for b in branches_of(it)],
                **{k: it[k] for k in ("cost_usd", "input_tokens", "output_tokens", "session_id")
                   if it.get(k) is not None},
            })
        return fit({"run": run.get("source_path"), "loop": run.get("loop"), "verdict": run.get("verdict"),
                    "iterations": len(iterations), "start": start, "trajectory": rows,
                    "more": max(0, len(iterations) - (start - 1 + len(rows)))})

    def compare_runs(self, a: Any, b: Any) -> dict[str, Any]:
        from pytest_loops.cli.compare import compare_runs

        run_a, run_b = self.run(a), self.run(b)
        return fit(compare_runs(run_a, run_b, labels=(run_a["source_path"], run_b["source_path"])))

    def verify_run(self, ref: Any) -> dict[str, Any]:
        """A run log's MAC chain, and whether its `.tine` is intact and authenticated:
        signed with the server's key when it was given one, else vouched by this
        machine's key."""
        from pytest_loops.cli.runview import verify_command

        path = self.resolve(ref)
        stem = path.with_suffix("")
        answer: dict[str, Any] = {"run": self.relative(path)}
        log = stem.with_suffix(".json")
        tine = stem.with_suffix(".tine")
        if log.exists():
            try:
                run = self._load(self._inside(log, self.relative(log)))
            except LoopUsageError as exc:
                answer["log"] = {"file": self.relative(log), "verified": False, "why": str(exc)}
            else:
                answer["log"] = {"file": self.relative(log), "verified": bool(run.get("verified")),
                                 "why": run.get("unverified_why") or ""}
                recorded = (run.get("artifacts") or {}).get("tine")
                if isinstance(recorded, str) and not tine.exists():
                    candidate = log.parent / os.path.basename(recorded)
                    tine = candidate if candidate.suffix == ".tine" else tine
        if tine.exists():
            try:
                checked = self._inside(tine, self.relative(tine))
            except LoopUsageError as exc:
                answer["tine"] = {"file": self.relative(tine), "ok": False, "why": str(exc)}
            else:
                code, message = verify_command(checked, key_env=self.key_env, pubkey=self.pubkey)
                answer["tine"] = {"file": self.relative(tine), "ok": code == 0, "authenticated": code == 0,
                                  "why": message, "signature_checked": bool(self.key_env or self.pubkey)}
        parts = [part for part in (answer.get("log"), answer.get("tine")) if part]
        answer["ok"] = bool(parts) and all(p.get("verified", p.get("ok")) for p in parts)
        return fit(answer)

    def show_lessons(self, page: str | None = None) -> dict[str, Any]:
        """Without ``page``, the lessons pages (id, loop, size); with it, its text."""
        if not self.lessons.is_dir() or self.lessons.is_symlink():
            return {"pages": [], "note": "no lessons directory"}
        if page is None:
            pages = []
            for entry in sorted(os.scandir(self.lessons), key=lambda e: e.name):
                if entry.name.endswith(".md") and entry.is_file(follow_symlinks=False):
                    pages.append({"id": entry.name[:-3], "loop": _page_loop(Path(entry.path)),
                                  "bytes": entry.stat(follow_symlinks=False).st_size})
            return fit({"pages": pages})
        path = self.resolve(page, suffixes=(".md",), base=self.lessons)
        if path.parent != self.lessons.resolve():
            raise LoopUsageError("not a lessons page", location=str(page), fix="pass an id from show_lessons")
        text = path.read_text(encoding="utf-8", errors="replace")
        return fit({"id": path.stem, "loop": _page_loop(path), "text": text})


def _page_loop(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(2048)
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith("loop:"):
            return line.split(":", 1)[1].strip().strip("'\"") or None
    return None


def _bounded(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LoopUsageError(f"{name} must be a whole number from {low} to {high}", location=repr(value)[:40])
    return value


def fit(answer: Mapping[str, Any], limit: int = MAX_RESPONSE_CHARS) -> dict[str, Any]:
    """``answer`` as it is when its JSON is short enough; else long strings cut,
    then the longest lists halved, until it fits, with ``truncated: true``."""
    data = dict(answer)
    if _size(data) <= limit:
        return data
    data = _cut_strings(data)
    while _size(data) > limit:
        if not _halve_longest_list(data):
            return {"truncated": True, "error": "the answer is too long to send; ask for less"}
    data["truncated"] = True
    return data


def _size(data: Any) -> int:
    return len(json.dumps(data, ensure_ascii=False, default=str))


def _cut_strings(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _LONG_TEXT:
        return value[:_LONG_TEXT] + f"… [{len(value) - _LONG_TEXT} more characters]"
    if isinstance(value, dict):
        return {k: _cut_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_strings(v) for v in value]
    return value


def _halve_longest_list(data: Any) -> bool:
    best: tuple[int, list[Any]] | None = None
    todo = [data]
    while todo:
        item = todo.pop()
        values = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if isinstance(item, list) and len(item) > 1 and (best is None or len(item) > best[0]):
            best = (len(item), item)
        todo.extend(v for v in values if isinstance(v, (dict, list)))
    if best is None:
        return False
    del best[1][len(best[1]) // 2:]
    return True


def _usage_of(run: dict[str, Any]) -> dict[str, Any]:
    """``{"usage": {...}}``: what the run's revise steps reported spending, {} if nothing."""
    from pytest_loops.core.usage import usage_summary

    return usage_summary(run.get("iterations") or [])

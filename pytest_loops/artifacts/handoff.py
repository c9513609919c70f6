"""The hand-off file: what a human (or the next agent) needs when a loop stops short.

Written as markdown beside the run log when a loop ends in anything but SUCCESS:
the goal, verdict and reason, the last iteration's failing checks with their
output, the working tree's diff, the lessons, the artifacts and the exact
command that continues the loop. Every piece of text is redacted first.

A loop from a file (a `.loop` file, a config file) names that file and the
sha256 it had when the run started (recorded in the run log's start event). If
the file changed since, the hand-off says so instead of offering to continue:
the continue command (`--resume`) refuses an edited loop file.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_loops.artifacts.provenance import file_tail
from pytest_loops.artifacts.runlog import atomic_write_text, recorded_source_file
from pytest_loops.redact import make_redactor, strip_control
from pytest_loops.results import CheckResult, LoopResult
from pytest_loops.runtime.safegit import run_git

DIFF_MAX_CHARS = 200_000
UNTRACKED_MAX = 50
GIT_TIMEOUT_S = 20.0
_TAIL_LINES = 40
_TAIL_CHARS = 4000
_BACKTICKS = re.compile(r"`+")


def write_handoff(result: LoopResult, path: str | os.PathLike, *, resume_command: str,
                  git_diff: bool = True, private: bool = False) -> str:
    """Write the hand-off markdown for ``result`` to ``path`` and return the path.

    ``resume_command`` is the exact command that continues the loop. With
    ``git_diff``, the working tree's ``git diff HEAD`` (and untracked files) is
    included when the loop's cwd is inside a git work tree; otherwise, or if git
    fails in any way, that section is left out. Never fails because of git.
    """
    redact = make_redactor()

    def scrub(text: str) -> str:  # secrets masked, no escape sequence reaches a reader's terminal
        return strip_control(redact(text))

    source = loop_file_state(result)
    sections = [
        _head(result, scrub, source),
        _failing(result, scrub),
        _diff_section(result.spec.cwd, _own_paths(result, path), scrub) if git_diff else "",
        _lessons(result, scrub),
        _artifacts(result, path, scrub),
        _continue(resume_command, source, scrub),
    ]
    target = Path(path)
    atomic_write_text(target, "\n\n".join(s for s in sections if s).rstrip() + "\n", private=private)
    return str(target)


def loop_file_state(result: LoopResult) -> dict[str, str | None] | None:
    """The loop's file: ``path``, ``recorded`` (its sha256 when the run started, from
    the run log; None when the log holds no authentic record) and ``now`` (None when
    it is gone). None for a loop that did not come from a file."""
    from pytest_loops.runtime.trust import sha256_file, source_file_record

    record = recorded_source_file(result.log_path)
    if record is None:
        # no authentic record from the start: the digest now, which cannot show an
        # edit made during the run
        current = source_file_record(result.spec.source, result.spec.cwd)
        if current is None:
            return None
        return {"path": current["path"], "recorded": None, "now": current["sha256"]}
    try:
        now: str | None = sha256_file(record["path"])
    except OSError:
        now = None
    return {"path": record["path"], "recorded": record["sha256"], "now": now}


def _continue(command: str, source: dict[str, str | None] | None, scrub: Callable[[str], str]) -> str:
    title = "## Continue the loop\n\n"
    if source and source["recorded"] and source["now"] != source["recorded"]:
        how = "is gone" if source["now"] is None else "changed"
        return (title + f"{_inline(scrub(str(source['path'])))} {how} since the run started "
                f"(it was {source['recorded']}); review it and start a new run. Continuing would "
                "run a loop nobody reviewed, so the continue command refuses it.")
    return title + _fenced(scrub(command.strip()), "sh")


def _head(result: LoopResult, scrub: Callable[[str], str],
          source: dict[str, str | None] | None = None) -> str:
    spec = result.spec
    lines = [
        f"# Hand-off: loop {_inline(scrub(spec.name))} stopped with {result.verdict.value}",
        "",
        f"- **Verdict:** {result.verdict.value} (exit {result.exit_code})",
        f"- **Reason:** {_line(scrub(result.reason))}",
        f"- **Goal:** {_line(scrub(spec.goal)) or '(none given)'}",
        f"- **Iterations:** {result.iterations_run} of at most {spec.guards.max_iter}, "
        f"{_seconds(result.elapsed_s)} (started {result.started_at}, ended {result.ended_at})",
    ]
    if spec.source:
        label = "Source" if spec.source in ("command line",) or ":" not in spec.source else "Loop file"
        lines.append(f"- **{label}:** {_inline(scrub(spec.source))}")
    if source:
        digest = source["recorded"] or source["now"]
        when = "when the run started" if source["recorded"] else "when the run ended"
        lines.append(f"- **Loop file digest:** {_inline(scrub(str(source['path'])))} {digest} ({when})")
    if spec.stop_message:
        lines.append(f"- **Message:** {_line(scrub(spec.stop_message))}")
    return "\n".join(lines)


def _failing(result: LoopResult, scrub: Callable[[str], str]) -> str:
    if not result.iterations:
        return "## Failing checks\n\nNo iteration finished, so no check ran."
    last = result.iterations[-1]
    failed = [c for c in last.checks if not c.passed]
    title = f"## Failing checks (iteration {last.iter})"
    if not failed:
        return f"{title}\n\nNone: every check that ran in the last iteration passed."
    return title + "\n\n" + "\n\n".join(_check(c, scrub) for c in failed)


def _check(check: CheckResult, scrub: Callable[[str], str]) -> str:
    notes = [f"exit {check.exit_code}" if check.exit_code is not None else "did not start"]
    if check.timed_out:
        notes.append("timed out")
    if check.needs_human:
        notes.append("needs a human")
    lines = [f"### {_line(scrub(check.name))} ({', '.join(notes)})", ""]
    if check.reason:
        lines += [_line(scrub(check.reason)), ""]
    if check.command:
        lines += [f"Command: {_inline(scrub(check.command))}", ""]
    tail = file_tail(check.output_file, check.output_tail, max_lines=_TAIL_LINES,
                     max_chars=_TAIL_CHARS, scrub=scrub)
    lines.append(_fenced(tail, "text") if tail.strip() else "(no output)")
    if check.output_file:
        lines += ["", f"Full output: {_inline(scrub(check.output_file))}"]
    return "\n".join(lines)


def _own_paths(result: LoopResult, handoff_path: str | os.PathLike) -> list[Path]:
    """Files this loop wrote itself: not news in the hand-off's untracked list."""
    named = [result.log_path, result.run_dir, result.memory_page, str(handoff_path),
             *result.artifacts.values()]
    return [Path(p).resolve() for p in named if p]


def _diff_section(cwd: str, own: list[Path], scrub: Callable[[str], str]) -> str:
    found = git_diff(cwd, exclude=own)
    if found is None:
        return ""
    diff, untracked = found
    lines = [f"## Last diff\n\n`git diff HEAD` of the working tree in {_inline(scrub(str(Path(cwd).resolve())))}:", ""]
    if diff.strip():
        if len(diff) > DIFF_MAX_CHARS:
            cut = len(diff) - DIFF_MAX_CHARS
            diff = diff[:DIFF_MAX_CHARS] + f"\n... ({cut} more characters: run `git diff HEAD`)\n"
        lines.append(_fenced(scrub(diff.rstrip("\n")), "diff"))
    else:
        lines.append("No changes to tracked files.")
    if untracked:
        more = len(untracked) - UNTRACKED_MAX
        lines += ["", "Untracked files:", ""]
        lines += [f"- {_inline(scrub(name))}" for name in untracked[:UNTRACKED_MAX]]
        if more > 0:
            lines.append(f"- ... and {more} more")
    return "\n".join(lines)


def git_diff(cwd: str | os.PathLike, exclude: Sequence[Path] = ()) -> tuple[str, list[str]] | None:
    """``(diff against HEAD, untracked files)`` of the git work tree holding ``cwd``,
    or None when there is none or git fails. Never raises, never prompts.

    Untracked directories are listed once (``dir/``); entries holding or inside
    an ``exclude`` path (the loop's own artifacts) are left out.
    """
    def git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
        try:  # hardened: no program the repository's config, hooks or attributes name runs
            return run_git(args, cwd, timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None

    inside = git("rev-parse", "--is-inside-work-tree")
    if inside is None or inside.returncode != 0 or inside.stdout.strip() != b"true":
        return None
    diff = git("diff", "--no-color", "HEAD", "--")
    if diff is None or diff.returncode != 0:  # a repository without commits has no HEAD
        diff = git("diff", "--no-color", "--")
    if diff is None or diff.returncode != 0:
        return None
    others = git("ls-files", "--others", "--exclude-standard", "--directory", "-z")
    untracked = []
    if others is not None and others.returncode == 0:
        names = [n.decode("utf-8", "replace") for n in others.stdout.split(b"\0") if n]
        untracked = [n for n in names if not _overlaps(Path(cwd, n).resolve(), exclude)]
    return diff.stdout.decode("utf-8", "replace"), untracked


def _overlaps(path: Path, others: Sequence[Path]) -> bool:
    return any(path == o or path in o.parents or o in path.parents for o in others)


def _lessons(result: LoopResult, scrub: Callable[[str], str]) -> str:
    # A lesson line from the lessons page is already a list item: "- ...".
    lessons = [r.lesson.removeprefix("- ") for r in result.iterations if r.lesson]
    if not lessons:
        return ""
    body = "\n".join(f"- {_line(scrub(x))}" for x in lessons)
    where = f" (also in {_inline(scrub(result.memory_page))})" if result.memory_page else ""
    return f"## Lessons{where}\n\n{body}"


def _artifacts(result: LoopResult, path: str | os.PathLike, scrub: Callable[[str], str]) -> str:
    labels = {"log": "Run log", "run_dir": "Run directory", "tine": "Provenance (.tine)",
              "memory": "Lessons page", "handoff": "This hand-off"}
    paths = dict(result.artifacts)
    paths.setdefault("log", result.log_path or "")
    paths.setdefault("run_dir", result.run_dir or "")
    paths.setdefault("memory", result.memory_page or "")
    paths.setdefault("handoff", str(path))
    ordered = [*labels, *sorted(k for k in paths if k not in labels)]
    lines = [f"- {labels.get(k, k)}: {_inline(scrub(str(paths[k])))}" for k in ordered if paths.get(k)]
    return "## Artifacts\n\n" + "\n".join(lines)


def _fenced(text: str, info: str = "") -> str:
    """A code block no backtick run inside ``text`` can close early."""
    longest = max((len(m.group()) for m in _BACKTICKS.finditer(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _inline(text: str) -> str:
    """Inline code that survives backticks and newlines in ``text``."""
    text = _line(text)
    longest = max((len(m.group()) for m in _BACKTICKS.finditer(text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _line(text: str | None) -> str:
    return " ".join((text or "").split())


def _seconds(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        return "?"
    return f"{value:.1f}s" if value < 60 else f"{int(value // 60)}m {int(value % 60):02d}s"

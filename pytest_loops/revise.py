"""The revise step: the environment contract, the prompt and failure files, the built-in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

from .redact import strip_control
from .results import CheckResult, CommandResult
from .spec import LoopSpec

if TYPE_CHECKING:
    from .engine import LoopContext

hookimpl = pluggy.HookimplMarker("pytest")

# A shell answers 126 (found, not executable) and 127 (not found) for a command it
# cannot start. A revise step that cannot start will not start next time either.
CANNOT_START_EXIT_CODES = (126, 127)

PROMPT_TAIL_CHARS = 3000


def loop_env(spec: LoopSpec, context: LoopContext) -> dict[str, str]:
    """LOOP_* variables every command of the loop gets (see docs: the env contract)."""
    return {
        "LOOP_NAME": spec.name,
        "LOOP_GOAL": spec.goal,
        "LOOP_ITERATION": str(context.iteration),
        "LOOP_MAX_ITER": str(spec.guards.max_iter),
        "LOOP_WORKDIR": str(context.workdir),
        "LOOP_RUN_DIR": str(context.run_dir),
    }


def write_failure_file(path: Path, failed: list[CheckResult],
                       scrub: Callable[[str], str] | None = None) -> None:
    """The full output of this iteration's failing checks, one section each (secrets masked)."""
    from .output import output_lines

    mask = scrub if scrub is not None else (lambda text: text)
    with open(path, "w", encoding="utf-8") as out:  # streamed: an output may be up to the output cap
        for i, check in enumerate(failed):
            out.write(mask(("\n" if i else "") + f"===== {check.name} ({check.reason}) =====\n"))
            out.writelines(mask(line) for line in output_lines(check.output_file, check.output_tail))


def build_prompt(spec: LoopSpec, context: LoopContext, failed: list[CheckResult]) -> str:
    """A ready prompt for an agent CLI: goal, failing checks, files, lessons."""
    lines = [f"# Loop: {spec.name}", ""]
    if spec.goal:
        lines += [f"Goal: {spec.goal}", ""]
    lines += [
        f"Iteration {context.iteration} of at most {spec.guards.max_iter} failed. "
        "Change the code so that every check below passes.",
        "Do not edit the tests, the checks or the loop's configuration: "
        "those edits are detected and undone.",
        "",
        "## Failing checks",
        "",
    ]
    for check in failed:
        lines.append(f"### {check.name}: {check.reason}")
        if check.command:
            lines.append(f"Command: `{check.command}`")
        tail = check.output_tail[-PROMPT_TAIL_CHARS:]
        if tail.strip():
            lines += ["", "```", tail.rstrip(), "```"]
        lines.append("")
    look = list(spec.look_at) or list(spec.state_paths)
    if look:
        lines += ["## Files to look at", ""] + [f"- {p}" for p in look] + [""]
    if context.suspects:
        lines += ["## Suspicious lines", ""]
        lines += [f"- {s}" for s in context.suspects] + [""]
    if context.lessons:
        lines += ["## Lessons from earlier iterations and runs", ""]
        lines += [f"- {lesson.removeprefix('- ')}" for lesson in context.lessons[-20:]] + [""]
    lines += [f"The full output of the failing checks is in {context.failure_file}."]
    text = strip_control("\n".join(lines) + "\n")  # an agent's terminal may show it
    return context.scrub(text) if context.scrub is not None else text


class BuiltinRevise:
    """The built-in `pytest_loop_revise`: run the loop's shell command. `trylast`."""

    @hookimpl(trylast=True)
    def pytest_loop_revise(self, spec: LoopSpec, iteration: int, context: LoopContext) -> CommandResult | None:
        if not spec.revise:
            return None
        env = {
            "LOOP_FAILURE_FILE": str(context.failure_file),
            "LOOP_PROMPT_FILE": str(context.prompt_file),
        }
        return context.run_command(spec.revise, label="revise", extra_env=env)

#!/usr/bin/env python3
"""The loop-runner skill's entry point, run by pytest-loops' engine.

A drop-in for ``harness/scripts/loop-runner.py``: the skill's documented command
lines work unchanged, run from the project root::

    python3 harness/scripts/loop-runner.py selftest
    python3 harness/scripts/loop-runner.py run --config harness/loop-runner.config.yaml \\
        --verify "pytest -q" --revise "<shell cmd>" --state "src/**" --log harness/out/loop-runner-run.json

``run`` takes every flag of ``pytest-loops run`` (``--max-iter``, ``--budget-seconds``,
``--no-progress-k``, ``--escalate-after``, ``--episodic PAGE``, ...); flags override
the config. Exit codes: 0 SUCCESS, 2 MAX_ITER, 3 TIMEOUT, 4 NO_PROGRESS,
5 ESCALATE, 64 bad input (also: pytest-loops is not installed), 70 internal error.
See docs/options.md#the-loop-runner-skills-entry-point.
"""

from __future__ import annotations

import sys

EXIT_USAGE = 64


def main(argv: list[str]) -> int:
    try:
        from pytest_loops.cli.main import main as run
    except ImportError as exc:
        python = sys.executable or "python3"
        missing = getattr(exc, "name", None) or "pytest_loops"
        print(f"loop-runner.py: error: pytest-loops is not importable by {python} (no module {missing!r}); "
              f"install it with `{python} -m pip install pytest-loops`", file=sys.stderr)
        return EXIT_USAGE
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

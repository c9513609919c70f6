"""A deterministically flaky test: it fails on every 3rd run.

Each run bumps a counter in `.flaky-count` beside this file, the way a test that
depends on leftover state, ordering or timing passes most of the time. One run
passes; the loop in `flaky.loop` runs it 5 times and catches the 3rd.
"""

from pathlib import Path

COUNTER = Path(__file__).with_name(".flaky-count")


def next_run() -> int:
    run = int(COUNTER.read_text() or 0) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(run))
    return run


def test_upload_retries():
    run = next_run()
    assert run % 3 != 0, f"run {run}: the upload raced its own retry"

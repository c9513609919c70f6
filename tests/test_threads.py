"""Helper threads block the termination signals, so the kernel hands them to the main
thread, whose wait (fan-out waiting for its candidates) they interrupt at once."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pytest_loops.core import fanout, live
from pytest_loops.pytest_plugin import livefeed
from pytest_loops.runtime.threads import TERMINATION_SIGNALS, leave_signals_to_the_main_thread


def blocked_here() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_helper_thread_blocks_the_termination_signals() -> None:
    seen: list[set[int]] = []

    def helper() -> None:
        leave_signals_to_the_main_thread()
        seen.append(blocked_here())

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert TERMINATION_SIGNALS <= seen[0]


def test_the_main_thread_keeps_them() -> None:
    before = blocked_here()
    leave_signals_to_the_main_thread()
    assert blocked_here() == before
    assert not TERMINATION_SIGNALS & before


def test_fan_outs_pool_threads_block_them() -> None:
    with ThreadPoolExecutor(max_workers=1, **fanout.POOL_OPTIONS) as pool:
        assert TERMINATION_SIGNALS <= pool.submit(blocked_here).result()


def from_a_helper(seen: list[set[int]]):
    """A callback that records the blocked signals of the helper thread calling it."""
    def record(*_args: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            seen.append(blocked_here())
    return record


def wait_until(what, limit: float = 30.0) -> None:
    end = time.monotonic() + limit  # a hard limit, never a timed assertion
    while not what():
        assert time.monotonic() < end, "the helper thread never reported"
        time.sleep(0.01)


def test_the_revise_progress_thread_blocks_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(live, "TICK_SECONDS", 0.01)
    seen: list[set[int]] = []
    with live.ReviseWatcher(from_a_helper(seen), iteration=1, iteration_dir=tmp_path, workdir=tmp_path,
                            exclude=[], usage_dir=None, prior=[], scrub=None):
        wait_until(lambda: seen)
    assert TERMINATION_SIGNALS <= seen[0]


def test_the_live_feed_thread_blocks_them(tmp_path: Path) -> None:
    seen: list[set[int]] = []
    feed = livefeed.Feed(from_a_helper(seen), poll=0.01)
    try:
        livefeed.WorkerFeed(str(feed.path), "gw0").line("a line")
        wait_until(lambda: seen)
    finally:
        feed.close()
    assert TERMINATION_SIGNALS <= seen[0]

"""Live lines of loops that run in pytest-xdist workers, shown by the controller.

A worker's terminal is not the user's: what a loop prints while it runs (its checks'
result before the revise step, the revise step's heartbeat or streamed output, each
iteration's line) would show only in the final report. So each worker appends those
lines to a file of its own in a directory the controller made for the session (its
path reaches the workers through ``workerinput``), and a thread of the controller
reads the new lines about once a second and prints them, prefixed with the worker.
The lines are the ones a run without xdist prints, masked alike.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_loops.runtime.threads import leave_signals_to_the_main_thread

WORKER_KEY = "loop_live_feed"
POLL_SECONDS = 1.0
_MAX_LINE = 2000  # characters of one line shown


class Feed:
    """The controller's side: the directory, and the thread that prints what workers wrote."""

    def __init__(self, say: Callable[[str], None], poll: float = POLL_SECONDS) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="loop-live-"))
        self._say = say
        self._poll = poll
        self._offsets: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="loop-live-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        leave_signals_to_the_main_thread()
        while not self._stop.wait(self._poll):
            self.drain()

    def drain(self) -> None:
        """Print every line written since the last call."""
        with self._lock:
            try:
                names = sorted(os.listdir(self.path))
            except OSError:
                return
            for name in names:
                try:
                    with open(self.path / name, "rb") as f:
                        f.seek(self._offsets.get(name, 0))
                        data = f.read()
                except OSError:
                    continue
                complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits
                if not complete:
                    continue
                self._offsets[name] = self._offsets.get(name, 0) + len(complete)
                worker = name.removesuffix(".log")
                for raw in complete.decode("utf-8", "replace").splitlines():
                    try:
                        self._say(f"[{worker}] {raw[:_MAX_LINE]}")
                    except Exception:  # noqa: BLE001 - a terminal gone: the feed is best effort
                        return

    def close(self) -> None:
        """Stop the thread, print what is left, remove the directory."""
        self._stop.set()
        self._thread.join(5)
        self.drain()
        shutil.rmtree(self.path, ignore_errors=True)


class WorkerFeed:
    """A worker's side: appends its live lines to its own file in the controller's directory."""

    def __init__(self, directory: str, worker: str) -> None:
        name = "".join(ch for ch in worker if ch.isalnum() or ch in "-_") or "worker"
        self.path = os.path.join(directory, name + ".log")

    def line(self, text: str) -> None:
        data = (" ".join(text.splitlines()) + "\n").encode("utf-8", "replace")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError:
            return  # the controller is gone, or its directory: nothing to show it to
        try:
            os.write(fd, data)
        except OSError:
            pass
        finally:
            os.close(fd)


def worker_feed(config: Any) -> WorkerFeed | None:
    """This xdist worker's feed, when its controller runs one."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return None
    directory = workerinput.get(WORKER_KEY)
    if not isinstance(directory, str) or not os.path.isdir(directory):
        return None
    return WorkerFeed(directory, str(workerinput.get("workerid", "worker")))

"""Helper threads leave the termination signals to the main thread.

The kernel hands a process-directed signal (Ctrl-C's SIGINT, a CI runner's SIGTERM,
a closed terminal's SIGHUP) to any thread that does not block it. Python runs its
handler in the main thread only, and only once that thread gets back to its own
code: when the signal lands on a helper thread while the main thread waits on a
lock (fan-out waiting for its candidates), nothing wakes the main thread, and the
handler that stops every command waits as long as the slowest candidate, for an
agent minutes. A helper thread that blocks these signals makes the kernel deliver
them to the main thread, whose wait is interrupted at once.
"""

from __future__ import annotations

import signal
import threading

TERMINATION_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def leave_signals_to_the_main_thread() -> None:
    """Block the termination signals in the calling thread; call it first in a helper
    thread. Nothing happens in the main thread or where the platform has no
    ``pthread_sigmask``."""
    if threading.current_thread() is threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION_SIGNALS)

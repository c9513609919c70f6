"""The loop's budget inside long waits and long hashes.

Work that can outlast a budget (waiting for the working tree's lock, hashing a
large state tree, copying the tree guard's loop-start store) takes a
``should_stop`` callable from the engine's clock and asks it between files and
between chunks of one big file. When it answers true the work raises
:class:`DeadlineReached`; the engine turns that into a TIMEOUT verdict whose
reason is ``"budget of Ns ran out " + str(exc)``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DeadlineReached", "ShouldStop", "check"]

ShouldStop = Callable[[], bool]


class DeadlineReached(Exception):
    """The loop's budget ran out during a wait or a hash; ``str(exc)`` says where
    (``"while waiting for ..."``), so the engine's reason reads as one sentence."""


def check(should_stop: ShouldStop | None, where: Callable[[], str]) -> None:
    """Raise :class:`DeadlineReached` (its text from ``where()``) if ``should_stop()`` says so."""
    if should_stop is not None and should_stop():
        raise DeadlineReached(where())

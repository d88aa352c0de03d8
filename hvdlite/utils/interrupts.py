"""Holding Ctrl-C back while the calling thread runs one of the engine's cycles.

A cycle is a sequence of collectives every rank runs in the same order. A ``KeyboardInterrupt``
raised halfway through would leave this rank's side of a collective unfinished and its peers
waiting, so while a caller runs a cycle (see :meth:`hvdlite.engine.Engine.drive`) the first
SIGINT is recorded and handed to the previous handler once the cycle is over; a cycle is bounded
by the communication timeout. A second SIGINT within the same cycle is handed over at once (the
user insists): the engine then ends the job, as for any failure in the middle of a cycle.
"""

from __future__ import annotations

import _signal  # the C functions behind ``signal``: its wrappers convert to enums, ~10 us a call here
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


def run_deferring_sigint(fn: Callable[[], T]) -> T:
    """Call ``fn``; a SIGINT arriving meanwhile reaches its handler when ``fn`` returns."""
    if threading.current_thread() is not threading.main_thread():
        return fn()  # Python runs signal handlers in the main thread only: nothing to hold back here
    previous = _signal.getsignal(_signal.SIGINT)
    if not callable(previous):  # SIG_IGN or SIG_DFL: no Python-level handler would run anyway
        return fn()
    held: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if held:
            previous(signum, frame)
        held.append((signum, frame))

    _signal.signal(_signal.SIGINT, hold)
    try:
        result = fn()
    finally:
        _signal.signal(_signal.SIGINT, previous)
    if held:
        previous(*held[0])
    return result

"""Python bytecodes a call executes: the host-independent measure of a small operation's cost.

Timings on a shared 2-core machine drift by tens of percent from minute to minute; the bytecodes a
call executes do not (they change with Python's version: 3.12 executes fewer for the same code).
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from typing import Any

# The wait for peers: how long it spins depends on when they arrive, not on this rank's work.
WAITS = {"wait_until"}


def bytecodes_per_call(fn: Callable[[], Any], calls: int = 1000, skip_waits: bool = True) -> float:
    """Python bytecodes executed per call of ``fn`` (sys.settrace's opcode events), this thread only.

    ``skip_waits``: leave out the bytecodes run inside :func:`hvdlite.utils.polling.wait_until` (a
    rank waiting for a peer polls a number of times that depends on the peer, not on this call).
    Counted in a second traced pass: on Python 3.12 the first pass after ``sys.settrace`` reports no
    opcode events for code that already ran (measured: 0, then 1583 a call).
    """
    count = collections.Counter()

    def waiting(frame: Any) -> bool:
        while frame is not None:
            if frame.f_code.co_name in WAITS:
                return True
            frame = frame.f_back
        return False

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if skip_waits and event == "call" and waiting(frame):
            return None  # no local events for this frame: nothing inside a wait is counted
        frame.f_trace_opcodes = True
        if event == "opcode":
            count[0] += 1
        return tracer

    for _ in range(2):
        count.clear()
        sys.settrace(tracer)
        try:
            for _ in range(calls):
                fn()
        finally:
            sys.settrace(None)
    return count[0] / calls

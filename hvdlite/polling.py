"""Waiting on nonblocking communication without burning a core.

A blocking MPICH wait spins a whole core, so the engine polls instead: it spins for a short
window (most small operations finish inside it, and a transfer that is moving data needs its
progress calls), then sleeps with exponential backoff capped at the configured poll time.
While spinning it yields the CPU between polls: with more threads than cores (two cores, two
ranks, each with a training thread and an engine thread) a plain spin starves the very peer it
is waiting for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

_FIRST_SLEEP = 20e-6


def wait_until(done: Callable[[], bool], spin_seconds: float, max_sleep: float) -> None:
    """Return once ``done()`` is true: spin ``spin_seconds``, then back off up to ``max_sleep``."""
    if done():
        return
    start = time.perf_counter()
    while time.perf_counter() - start < spin_seconds:
        os.sched_yield()
        if done():
            return
    sleep = _FIRST_SLEEP
    while not done():
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)

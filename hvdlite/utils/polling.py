"""Waiting on nonblocking communication without burning a core.

A blocking MPICH wait spins a whole core, so the engine polls instead: it spins for a short
window (most small operations finish inside it, and a transfer that is moving data needs its
progress calls), then sleeps with exponential backoff capped at the configured poll time.
While spinning it yields the CPU between polls: with more threads than cores (two cores, two
ranks, each with a training thread and an engine thread) a plain spin starves the very peer it
is waiting for.

A wait can carry a deadline: MPI over TCP never fails a transfer to a peer behind a dead link
(the kernel retries for ~15 minutes), so hvdlite's own deadline is what bounds a network fault.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

_FIRST_SLEEP = 20e-6


class WaitTimeout(Exception):
    """A wait made no progress within its deadline (peers unreachable, or stopped answering).

    ``peer``: the rank whose own wait timed out first and ended this one early (see
    :class:`hvdlite.core.transport.mpi.PeerTimeoutWatch`); None when this wait's deadline passed.
    """

    def __init__(self, seconds: float, peer: int | None = None) -> None:
        super().__init__(f"no progress for {seconds:g} s" + (f" on rank {peer}" if peer is not None else ""))
        self.seconds = seconds
        self.peer = peer


def wait_until(done: Callable[[], bool], spin_seconds: float, max_sleep: float,
               timeout: float | None = None, probe: Callable[[], None] | None = None) -> None:
    """Return once ``done()`` is true: spin ``spin_seconds``, then back off up to ``max_sleep``.

    Raises :class:`WaitTimeout` if ``done()`` is still false after ``timeout`` seconds. ``probe``
    (elastic mode: is a peer dead?) is called between sleeps and may raise.
    """
    if done():
        return
    start = time.perf_counter()
    while time.perf_counter() - start < spin_seconds:
        os.sched_yield()
        if done():
            return
    sleep = _FIRST_SLEEP
    while not done():
        if timeout is not None and time.perf_counter() - start > timeout:
            raise WaitTimeout(timeout)
        if probe is not None:
            probe()
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)

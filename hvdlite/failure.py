"""Ending the whole job when one rank dies of an uncaught exception (as ``mpi4py.run`` does).

Without this, peers of a crashed rank wait in their next collective until the stall deadline.
The hook prints the traceback first, then says which rank failed, then aborts every rank.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType

_FORWARD_SECONDS = 0.5
_ABORT_GRACE_SECONDS = 5.0
_previous_hook = None


def abort_job(code: int) -> None:
    """``MPI_Abort``: the launcher kills every rank it can reach. Never returns.

    Bounded: MPICH's abort asks the launcher to kill the job and then waits to be killed. On a
    host cut off from the launcher that order never comes (seen: ranks blocked for good), so
    the rank exits by itself after a grace period.
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    aborting = threading.Thread(target=MPI.COMM_WORLD.Abort, args=(code,), daemon=True)
    aborting.start()
    aborting.join(_ABORT_GRACE_SECONDS)
    os._exit(code)


def install(rank: int, abort) -> None:
    """Route uncaught exceptions on the main thread through ``abort(1)`` after printing them."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _previous_hook(kind, value, tb)
        sys.stderr.write(f"hvdlite: rank {rank} failed with an uncaught {kind.__name__}; aborting all ranks\n")
        sys.stderr.flush()
        sys.stdout.flush()
        # MPI's output forwarding reads our pipes asynchronously and the abort tears it down: give
        # it a moment, or the traceback the user needs most can be cut short (seen in CI).
        time.sleep(_FORWARD_SECONDS)
        abort(1)

    sys.excepthook = hook


def uninstall() -> None:
    global _previous_hook
    if _previous_hook is not None:
        sys.excepthook = _previous_hook
        _previous_hook = None

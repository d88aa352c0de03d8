"""Ending the whole job when one rank dies of an uncaught exception (as ``mpi4py.run`` does).

Without this, peers of a crashed rank wait in their next collective until the stall deadline.
The hook prints the traceback first, then says which rank failed, then aborts every rank.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

_FORWARD_SECONDS = 0.5
_ABORT_GRACE_SECONDS = 5.0


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


def exit_rank(code: int) -> None:
    """Elastic mode: end this rank alone (its peers re-form the job without it). Never returns.

    ``os._exit``: ``MPI_Finalize`` would wait for peers that are not finalizing.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class AbortOnUncaught:
    """Routes uncaught exceptions on the main thread through ``abort(1)`` after printing them.

    Held by the runtime: :meth:`install` at ``init()``, :meth:`uninstall` at ``shutdown()``.
    """

    def __init__(self, rank: int, abort: Callable[[int], None], previous: Callable[..., None],
                 what: str = "aborting all ranks") -> None:
        self._rank = rank
        self._abort = abort
        self._previous = previous
        self._what = what

    @classmethod
    def install(cls, rank: int, abort: Callable[[int], None], what: str = "aborting all ranks") -> AbortOnUncaught:
        hook = cls(rank, abort, sys.excepthook, what)
        sys.excepthook = hook
        return hook

    def uninstall(self) -> None:
        if sys.excepthook is self:  # else someone installed a hook over ours: leave theirs in place
            sys.excepthook = self._previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        # To the process's own stderr: a hook installed over ours may have swapped sys.stderr for a
        # buffer it writes out after we return (torch.distributed's does), and we never return.
        sys.stderr = sys.__stderr__ or sys.stderr
        self._previous(kind, value, tb)
        sys.stderr.write(f"hvdlite: rank {self._rank} failed with an uncaught {kind.__name__}; {self._what}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        # MPI's output forwarding reads our pipes asynchronously and the abort tears it down: give
        # it a moment, or the traceback the user needs most can be cut short (seen in CI).
        time.sleep(_FORWARD_SECONDS)
        self._abort(1)

"""Which processes of the job have died, as MPICH's process manager knows it.

MPICH's ``MPIX_Comm_get_failed`` returns the processes that Hydra reported dead (its
``PMI_dead_processes``), within milliseconds of the death (measured 4-27 ms,
``docs/elastic-probe/FINDINGS.md``). mpi4py's MPICH build does not bind the MPIX functions (its
``Comm.Get_failed`` is a fallback that always returns an empty group), so it is called here through
ctypes, from the libmpi that mpi4py loaded. It knows the processes of the original
``COMM_WORLD`` only.
"""

from __future__ import annotations

import ctypes
import functools
import time
from typing import Any


@functools.cache
def _libmpi() -> ctypes.CDLL:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libmpi.so" in path or "libmpi_abi.so" in path:
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    raise RuntimeError("libmpi is not loaded: import mpi4py's MPI first")


def failed_world_ranks(world: Any) -> list[int]:
    """The ranks of ``world`` (mpi4py's ``COMM_WORLD``) whose processes have died, sorted."""
    from mpi4py import MPI

    handle_type = ctypes.c_uint if world.handle < 2**32 else ctypes.c_void_p
    group = handle_type()
    error = _libmpi().MPIX_Comm_get_failed(handle_type(world.handle), ctypes.byref(group))
    if error:
        raise RuntimeError(f"MPIX_Comm_get_failed failed with MPI error {error}")
    failed = MPI.Group.fromhandle(group.value)
    count = failed.Get_size()
    ranks = MPI.Group.Translate_ranks(failed, list(range(count)), world.Get_group()) if count else []
    failed.Free()
    return sorted(ranks)


class DeathWatch:
    """Raises :class:`~hvdlite.errors.PeerFailedError` from waits once a process of ``comm`` has died.

    Called by every wait of the engine (``wait_until``'s probe); asks MPI at most every ``every``
    seconds, so a wait that spins stays cheap. Processes that died before ``comm`` was formed
    without them (a re-formed job) stay in MPI's list, and do not count.
    """

    def __init__(self, world: Any, comm: Any, every: float = 0.02) -> None:
        from mpi4py import MPI

        self._world = world
        self._members = set(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                                       world.Get_group()))
        self._every = every
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        dead = [rank for rank in failed_world_ranks(self._world) if rank in self._members]
        if dead:
            from ..errors import PeerFailedError

            raise PeerFailedError(dead)

"""Which processes of the job have died, as MPICH's process manager knows it.

MPICH's ``MPIX_Comm_get_failed`` returns the processes that Hydra reported dead (its
``PMI_dead_processes``), within milliseconds of the death (measured 4-27 ms,
``docs/design/elastic-mpi.md``). mpi4py's MPICH build does not bind the MPIX functions (its
``Comm.Get_failed`` is a fallback that always returns an empty group), so it is called here through
ctypes, from the libmpi that mpi4py loaded. It knows the processes of the original
``COMM_WORLD`` only.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any


@functools.cache
def _libmpi() -> ctypes.CDLL:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libmpi.so" in path or "libmpi_abi.so" in path:
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    raise RuntimeError("libmpi is not loaded: import mpi4py's MPI first")


_spawns = {"in_flight": 0, "last": []}  # see spawning()
_spawns_lock = threading.Lock()


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Around an ``MPI_Comm_spawn`` in this process: meanwhile :func:`failed_world_ranks` answers with
    the last list it read instead of asking MPI. MPICH reads its list of the dead through its PMI
    client, which the spawn uses too, and the two calls from two threads mixed up: the spawn failed
    ("PMI_Spawn_multiple returned -1") or the list named a live rank 0 (seen in elastic jobs that
    spawned ranks or warm spares while the engine looked for dead peers every 5 ms)."""
    with _spawns_lock:
        _spawns["in_flight"] += 1
    try:
        yield
    finally:
        with _spawns_lock:
            _spawns["in_flight"] -= 1


def failed_world_ranks(world: Any) -> list[int]:
    """The ranks of ``world`` (mpi4py's ``COMM_WORLD``) whose processes have died, sorted (the last
    list read while a spawn runs: see :func:`spawning`)."""
    with _spawns_lock:
        if _spawns["in_flight"]:
            return list(_spawns["last"])
        _spawns["last"] = _read_failed_world_ranks(world)
        return list(_spawns["last"])


def _read_failed_world_ranks(world: Any) -> list[int]:
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


def status_file(run_dir: str, process_id: str) -> str:
    """Where the rank wrapper records the exit status of process ``process_id`` (see ``hvdlite.elastic.wrapper``)."""
    return os.path.join(run_dir, f"rank.{process_id}.status")


def dead_members(world: Any, prefix: str, member_ids: list[str], run_dir: str) -> list[str]:
    """The ids of ``member_ids`` whose processes died: in MPI's list (this process's own world, its
    ids ``prefix`` + world rank) or, for any member on this host, in a nonzero status file.

    MPI's list is fast and crosses hosts but covers only this process's ``COMM_WORLD``; spawned
    processes are in another one, and are seen by their wrapper's status file.
    """
    dead = {prefix + str(rank) for rank in failed_world_ranks(world)} | failed_statuses(run_dir, member_ids)
    return [process_id for process_id in member_ids if process_id in dead]


def exited_members(run_dir: str, member_ids: Iterable[str]) -> set[str]:
    """The members with a status file, whatever their status: one directory listing (a rank's file
    appears once it exited; waits call this every few milliseconds)."""
    try:
        names = set(os.listdir(run_dir)) if run_dir else set()
    except OSError:
        return set()
    return {process_id for process_id in member_ids if os.path.basename(status_file(run_dir, process_id)) in names}


def failed_statuses(run_dir: str, member_ids: list[str]) -> set[str]:
    """The members whose status file records a failure (no MPI call: safe beside an ``MPI_Comm_spawn``)."""
    return {process_id for process_id in exited_members(run_dir, member_ids) if _failed_status(run_dir, process_id)}


def _failed_status(run_dir: str, process_id: str) -> bool:
    try:
        with open(status_file(run_dir, process_id)) as handle:
            return handle.read().strip() not in ("", "0")
    except OSError:
        return False


class DeathWatch:
    """Raises :class:`~hvdlite.errors.PeerFailedError` from waits once a member of a communicator has died.

    Called by every wait of the engine (``wait_until``'s probe); looks at most every ``every``
    seconds, so a wait that spins stays cheap. ``member_ids``: the process ids of the
    communicator's ranks; processes that died before it was formed without them do not count.
    """

    def __init__(self, world: Any, prefix: str, member_ids: list[str], run_dir: str, every: float = 0.005) -> None:
        self._world, self._prefix, self._members, self._run_dir = world, prefix, member_ids, run_dir
        self._every = every
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        dead = dead_members(self._world, self._prefix, self._members, self._run_dir)
        if dead:
            from ..errors import PeerFailedError

            raise PeerFailedError(dead)

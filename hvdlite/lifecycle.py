"""Starting hvdlite and registering process sets: the public ``init`` and ``add_process_set``.

These sit above :mod:`hvdlite.core.runtime` and :mod:`hvdlite.elastic`, which they combine: a rank that
an elastic job spawned joins the job's world (:func:`hvdlite.elastic.joining.join_parent`), and
every process tells hvdliterun that it runs. Lower layers never import this module.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from .core import runtime
from .elastic.channel import ChannelError, request
from .elastic.joining import join_parent, watched_join
from .errors import ProcessSetError
from .process_sets import ProcessSet
from .settings.config import Config

log = logging.getLogger("hvdlite")


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Start hvdlite on ``comm`` (default COMM_WORLD; or an mpi4py communicator, or a list of ranks).

    ``process_sets``: the :class:`~hvdlite.process_sets.ProcessSet` objects to register now (the
    same on every rank), or ``"dynamic"`` to allow :func:`add_process_set` and
    :func:`remove_process_set` later. Calling it again while initialized does nothing, as in Horovod,
    except that sets it was given which are not registered are an error (they would stay unusable).
    """
    if runtime.is_initialized():
        _check_sets_of_a_repeated_init(process_sets)
        return
    with watched_join():
        runtime.start(comm, process_sets, join=join_parent if comm is None else None)
    world = runtime.current()
    _announce(world.config, world.process_ids[world.topology.rank])
    if world.topology.rank == 0:  # once per job: a re-formed world starts the runtime, not init
        for note in world.config.notes:
            log.warning("%s", note)


def _check_sets_of_a_repeated_init(process_sets: Sequence[ProcessSet] | str | None) -> None:
    """``init`` on a running hvdlite registers nothing. Horovod's said nothing either, and a set given
    to it failed only at its first collective; here the call itself says so, on every rank alike
    (no communication: it depends only on what each rank passed and holds)."""
    if process_sets is None or isinstance(process_sets, str):
        if process_sets == "dynamic" and not runtime.current().communicators.dynamic:
            raise ProcessSetError("hvd.init(process_sets='dynamic') while hvdlite runs without dynamic process "
                                  "sets changes nothing: call hvd.shutdown() first")
        return
    unregistered = [_named(process_set) for process_set in process_sets if process_set.process_set_id is None]
    if unregistered:
        raise ProcessSetError(f"hvd.init(process_sets=...) while hvdlite runs registers nothing, so process set(s) "
                              f"{unregistered} would stay unusable: call hvd.shutdown() first, or start with "
                              "init(process_sets='dynamic') and add them with hvd.add_process_set()")


def _named(process_set: ProcessSet) -> Any:
    """A set's ranks, or for one given as a communicator (ranks known only once registered) its size."""
    if process_set.ranks is None:
        return f"<mpi4py communicator of {process_set.mpi_comm.Get_size()} processes>"
    return process_set.ranks


def shutdown() -> None:
    """Stop hvdlite on every rank (all ranks must call it; atexit does) and free its resources."""
    runtime.shutdown()


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a new process set (every rank of the job calls it, with the same ranks); returns it.

    Needs ``init(process_sets="dynamic")`` (or ``HVDLITE_DYNAMIC_PROCESS_SETS=1``).
    """
    chosen = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    runtime.current().communicators.add(chosen, dynamic=True)
    return chosen


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank calls it); its collectives must be finished.

    Returns False, as Horovod's does, for the global set and for a set that is not registered.
    Needs ``init(process_sets="dynamic")``. The set can be registered again later.
    """
    return runtime.current().communicators.remove(process_set)


def _announce(config: Config, process_id: str) -> None:
    """Tell hvdliterun this process runs (once per process): a pid file in its run directory, and in
    elastic mode its control channel too, which reaches a launcher on another host."""
    global _announced
    if _announced:
        return
    _announced = True
    if config.run_dir:
        _write_pid_file(config.run_dir, process_id)
    if config.elastic_service:
        try:
            request(config.elastic_service, config.elastic_token,
                    {"op": "started", "id": process_id, "pid": os.getpid(), "host": socket.gethostname()})
        except ChannelError as exc:
            log.warning("could not tell hvdliterun that rank %s started: %s", process_id, exc)


_announced = False  # this process told hvdliterun it runs (a re-formed world starts the runtime again, not init)


def _write_pid_file(run_dir: str, process_id: str) -> None:
    """Lets hvdliterun name the rank behind a PID that MPI reports as killed, and reap its host's ranks."""
    try:
        with open(os.path.join(run_dir, f"rank.{process_id}.pid"), "w") as handle:
            handle.write(f"{os.getpid()} {socket.gethostname()}")
    except OSError as exc:
        log.debug("could not write pid file in %s: %s", run_dir, exc)

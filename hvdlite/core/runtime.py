"""The one runtime object: created by :func:`init`, torn down by :func:`shutdown`.

Everything global lives in a single :class:`Runtime`, so ``init -> shutdown -> init`` works and
tests can reset it. mpi4py's MPI is imported in :func:`start` (see :mod:`hvdlite.core.mpi_start`):
importing hvdlite never starts MPI. The public ``init`` (:mod:`hvdlite.lifecycle`) calls
:func:`start`; an elastic job's re-formed world calls it again (:mod:`hvdlite.elastic.reform`).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import CommTimeoutError, HvdliteError, NotInitializedError, ProcessSetError
from ..process_sets import ProcessSet
from ..settings.config import Config, environ, load_config
from ..utils import buffers, failure
from .communicators import Communicators
from .describe import Descriptions
from .engine import Engine
from .mpi_start import start_mpi
from .pipeline.timeline import Timeline
from .topology import Topology, topology_from_hosts
from .work.naming import NameGenerator
from .work.scope import JOB, Scope

log = logging.getLogger("hvdlite")


@dataclasses.dataclass
class Runtime:
    """Everything hvdlite holds between ``init()`` and ``shutdown()``; nothing outlives it.

    One :class:`Engine` cycles one communicator's :class:`~hvdlite.core.pipeline.communicator.Pipeline`
    (its own queue, negotiation, response cache and fusion); :attr:`communicators` holds the global
    one and one per process set this rank is in (a rebuilt elastic world will replace them).
    """

    config: Config
    topology: Topology
    engine: Engine  # the global set's (every rank of the job)
    names: NameGenerator  # the global set's generated names
    comm: Any  # the mpi4py communicator the job runs on
    private_comms: tuple[Any, ...]
    communicators: Communicators  # the global one and every process set this rank is in
    descriptions: Descriptions = dataclasses.field(default_factory=Descriptions)  # checked reduction descriptions
    caller: threading.local = dataclasses.field(default_factory=threading.local)  # .waits: see api.blocking
    exception_hook: failure.AbortOnUncaught | None = None  # ends the job when a rank dies of an exception
    adapter_state: dict[str, Any] = dataclasses.field(default_factory=dict)  # framework adapters' caches, by name
    hosts: tuple[str, ...] = ()  # every rank's host name, by rank
    # ... as the launcher's host list names it (elastic plans): the host name, or the host alias of
    # a remote job's task (many Spark tasks or Ray actors share a host; each has its own slot).
    slot_hosts: tuple[str, ...] = ()
    process_ids: tuple[str, ...] = ()  # every rank's process id: launch rank "2", or "g1.0" if spawned
    book: Any = None  # elastic: the job's HostBook (hvdlite.elastic.hosts), kept across world changes
    # A TCP port that was free on rank 0's host at start, for a framework's own rendezvous (torch's
    # env://): agreed in start's one exchange, so that using it needs no collective of its own.
    rendezvous_port: int = 0


_runtime: Runtime | None = None
_last_rank: int | None = None  # this process's rank in the last world it started, kept after shutdown
_atexit_registered = False


def current() -> Runtime:
    """The live runtime, or a clear error if ``init()`` has not been called."""
    if _runtime is None:
        raise NotInitializedError("hvdlite has not been initialized; call hvdlite.init() first")
    return _runtime


def is_initialized() -> bool:
    return _runtime is not None


def last_rank() -> int | None:
    """This process's rank in the last world it was part of (after ``shutdown`` too); None before any."""
    return _last_rank


def caller_waits() -> bool:
    """True on a thread inside :func:`hvdlite.api.blocking`: it waits on what it submits at once
    (an adapter's device tensors then need no ready event; see :mod:`hvdlite.gpu.arrays`)."""
    return _runtime is not None and getattr(_runtime.caller, "waits", False)


def _resolve_comm(MPI: Any, comm: Any) -> Any:
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    if isinstance(comm, Sequence) and all(isinstance(r, int) for r in comm):
        world = MPI.COMM_WORLD
        ranks = sorted(set(comm))
        if world.Get_rank() not in ranks:
            raise HvdliteError(f"rank {world.Get_rank()} called init(comm={list(comm)}) but is not in that list")
        bad = [r for r in ranks if not 0 <= r < world.Get_size()]
        if bad:
            raise HvdliteError(f"init(comm=...) names ranks {bad} outside COMM_WORLD of size {world.Get_size()}")
        return world.Create_group(world.Get_group().Incl(ranks))
    raise TypeError(f"init(comm=...) takes an mpi4py communicator or a list of ranks, got {type(comm).__name__}")


def _configure_logging(config: Config, rank: int) -> None:
    logger = logging.getLogger("hvdlite")
    logger.setLevel(config.python_log_level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"[hvdlite rank {rank}] %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None, *, book: Any = None,
          join: Callable[[], tuple[Any, Any] | None] | None = None) -> None:
    """Start hvdlite on ``comm`` (see :func:`hvdlite.lifecycle.init`, the public ``init``); nothing
    if it runs already.

    ``book``: an elastic job's host book, kept across world changes. ``join``: in an elastic job's
    spawned rank, returns the world it joins and the job's host book (called once MPI runs).
    """
    global _runtime, _atexit_registered, _last_rank
    if _runtime is not None:
        return
    config = load_config()
    MPI, mpi_variables = start_mpi(environ())
    joined = join() if join is not None and config.elastic_min_np and config.elastic_spawn_prefix else None
    base = joined[0] if joined else _resolve_comm(MPI, comm)
    rank = base.Get_rank()
    _configure_logging(config, rank)
    if mpi_variables:
        log.info("set %s before MPI started (Slurm's PMI, or more ranks than cores: see hvdlite.core.mpi_start)",
                 mpi_variables)
    process_id = config.elastic_spawn_prefix + str(MPI.COMM_WORLD.Get_rank())
    name = MPI.Get_processor_name()
    hosts, slot_hosts, ids, ports = zip(*base.allgather((name, config.host_alias or name, process_id,
                                                         _free_port() if rank == 0 else 0)), strict=True)
    topology = topology_from_hosts(list(hosts), rank)
    _last_rank = rank

    def make_engine(set_comm: Any, ranks: list[int], process_set_id: int) -> tuple[Engine, tuple[Any, ...]]:
        scope = Scope(process_set_id, tuple(ranks)) if process_set_id else JOB
        return _start_engine(config, set_comm, [hosts[r] for r in ranks], topology.local_rank, scope,
                             [ids[r] for r in ranks])

    engine, private = make_engine(base, list(range(topology.size)), 0)
    dynamic = process_sets == "dynamic" or config.dynamic_process_sets
    communicators = Communicators(base, engine, make_engine, dynamic)
    _runtime = Runtime(config, topology, engine, communicators.global_.names, base, private, communicators,
                       hosts=hosts, slot_hosts=slot_hosts, process_ids=ids, book=joined[1] if joined else book,
                       rendezvous_port=ports[0])
    try:
        for process_set in () if isinstance(process_sets, str) or process_sets is None else process_sets:
            communicators.add(process_set, dynamic=False)
    except ProcessSetError:
        shutdown()  # every rank refused the same set (the checks follow one exchange): none stays initialized
        raise
    if config.timeline:
        start_timeline(config.timeline, config.timeline_mark_cycles)
    _runtime.exception_hook = _exception_hook(config, topology)
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True


def _exception_hook(config: Config, topology: Topology) -> failure.AbortOnUncaught | None:
    """What an uncaught exception does to the job: ends it, or in elastic mode ends only this rank."""
    if topology.size == 1:
        return None
    if config.elastic_min_np:  # elastic: the others re-form the job without this rank
        return failure.AbortOnUncaught.install(topology.rank, failure.exit_rank,
                                               "ending this rank; the others go on without it")
    return failure.AbortOnUncaught.install(topology.rank, failure.abort_job)


def _start_engine(config: Config, comm: Any, hosts: list[str], local_rank: int,
                  scope: Scope, ids: list[str]) -> tuple[Engine, tuple[Any, ...]]:
    """A started engine on private duplicates of ``comm`` (collective over ``comm``), and those duplicates."""
    from mpi4py import MPI

    from ..utils.failed_peers import DeathWatch
    from .pipeline.execute import Executor
    from .transport.mpi import MpiControlChannel, MpiTransport, PeerTimeoutWatch

    control, data = comm.Dup(), comm.Dup()
    poll_seconds = config.poll_time_ms / 1000
    # elastic: a dead peer ends waits
    probe = DeathWatch(MPI.COMM_WORLD, config.elastic_spawn_prefix, ids, config.run_dir) if config.elastic_min_np else None
    if config.comm_timeout is not None:  # a peer that timed out ends this rank's waits too: they probe together
        probe = PeerTimeoutWatch(control, config.comm_timeout, probe)
    # MPICH cannot share memory between processes of different launches (a job that spawned ranks):
    # Win_allocate_shared fails with "not in the same shared memory domain".
    shm = config.shm and len({process_id.rpartition(".")[0] for process_id in ids}) == 1
    engine = Engine(
        config,
        MpiControlChannel(control, poll_seconds, config.comm_timeout, shm, probe),
        Executor(MpiTransport(data, config.chunk_bytes, poll_seconds, config.comm_timeout, config.pipeline_depth,
                                config.shm_min_bytes if shm else None, probe),
                 comm.Get_rank(), comm.Get_size(),
                 choose_gpu_plane=_gpu_plane_chooser(config, data, hosts, local_rank)),
        abort=failure.abort_job,
        scope=scope,
    )
    engine.start()
    return engine, (control, data)


def _gpu_plane_chooser(config: Config, data_comm: Any, hosts: list[str], local_rank: int):
    """What chooses the GPU data plane, called on the first device tensor (cupy is imported then)."""
    def choose(executor: Any, item: Any, local: Any) -> Any:
        from .planes.device import GpuChooser

        return GpuChooser(executor, config, data_comm, hosts, local_rank).choose(item, local)
    return choose


def stop_without_communicating(runtime: Runtime, error: Exception) -> None:
    """Elastic: a peer died. Stop the engines without a word to the others and forget the runtime.

    Their MPI resources are left behind: freeing them is collective, and the dead never join.
    """
    global _runtime
    runtime.communicators.abandon(error)
    _close_timeline(runtime.communicators)
    if runtime.exception_hook is not None:
        runtime.exception_hook.uninstall()
    runtime.adapter_state.clear()
    _runtime = None


_BEFORE_SHUTDOWN: list[Callable[[], None]] = []


def before_shutdown(callback: Callable[[], None]) -> None:
    """Call ``callback`` first in every :func:`shutdown` (an adapter's work still queued: JAX runs a
    jitted step's collectives after the Python call returned, so a script's last step may not have
    submitted them yet when it ends and atexit shuts hvdlite down)."""
    if callback not in _BEFORE_SHUTDOWN:
        _BEFORE_SHUTDOWN.append(callback)


def shutdown() -> None:
    """Stop the engine on every rank (all ranks must call it; atexit does) and free resources."""
    global _runtime
    runtime = _runtime
    if runtime is None:
        return
    for callback in _BEFORE_SHUTDOWN:
        try:
            callback()
        except Exception as error:  # noqa: BLE001 - its own error was reported where it happened; shut down anyway
            log.warning("before shutting down: %s", error)
    runtime.communicators.close()  # the process sets' engines first, in the same order on every rank
    runtime.engine.shutdown()  # waits for every rank; a dead peer ends the job through MPI instead
    _close_timeline(runtime.communicators)
    if isinstance(runtime.engine.fatal, CommTimeoutError):
        # Peers are unreachable: MPI_Finalize could wait on them for the kernel's TCP timeout.
        log.error("ending the job after a communication timeout (see the error above)")
        failure.abort_job(1)
    _runtime = None
    if runtime.exception_hook is not None:
        runtime.exception_hook.uninstall()
    for private in runtime.private_comms:
        private.Free()
    runtime.adapter_state.clear()  # adapters' buffers go back to the cache first ...
    buffers.release_cached()  # ... which is then emptied: init -> shutdown -> init starts from nothing


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing the timeline (Chrome trace JSON) to ``file_path``; rank 0 writes it, as in Horovod.

    Call it on every rank. A timeline already being written is closed first. ``mark_cycles``
    adds an event per engine cycle that did work.
    """
    runtime = current()
    _close_timeline(runtime.communicators)
    if runtime.topology.rank == 0:
        runtime.communicators.use_timeline(Timeline(file_path, 0, mark_cycles))


def stop_timeline() -> None:
    """Stop writing the timeline and close its file (a no-op if none is being written)."""
    _close_timeline(current().communicators)


def _close_timeline(communicators: Communicators) -> None:
    timeline = communicators.use_timeline(None)
    if timeline is not None:
        timeline.close()


def mpi_threads_supported() -> bool:
    """True if MPI runs with MPI_THREAD_MULTIPLE (hvdlite's engine thread needs at least SERIALIZED)."""
    current()
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE

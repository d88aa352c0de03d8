"""The communicators this rank runs: the global one, and one per registered process set it is in.

Each :class:`Communicator` is an MPI communicator of its own with an :class:`~hvdlite.core.engine.Engine`
(queue, negotiation, response cache, fusion, shared-memory plane) and its own generated names, so
sets never share a cycle, a cache bit or an unnamed-collective counter. Registering and removing a
set is collective over the whole job: every rank calls it with the same set, checked here, and
only the set's members build (or tear down) its engine.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ..errors import ProcessSetError
from ..ops import Collective
from ..process_sets import ProcessSet, global_process_set
from .engine import Engine
from .pipeline.timeline import Timeline
from .work.naming import NameGenerator
from .work.scope import Scope

log = logging.getLogger("hvdlite")

# Builds the engine of a communicator: (communicator, its members' global ranks) -> (the engine,
# started; the private communicators it runs on, to free once it stopped).
EngineFactory = Callable[[Any, list[int], int], tuple[Engine, tuple[Any, ...]]]  # (comm, job ranks, set id)


@dataclasses.dataclass
class Communicator:
    """This rank's part in one process set."""

    process_set: ProcessSet
    engine: Engine
    names: NameGenerator
    rank: int  # this rank's place in the set
    size: int
    comms: tuple[Any, ...] = ()  # the set's communicators, freed once its engine stopped (none for the global one)


class Communicators:
    """The global communicator and the process sets this rank is in, by set id."""

    def __init__(self, world: Any, engine: Engine, make_engine: EngineFactory, dynamic: bool) -> None:
        """``world``: the job's communicator (registration collectives go over a duplicate of it)."""
        self._registry = world.Dup()  # set registration's own collectives, apart from the engines'
        self._local_registry = world.Dup()  # members-only registration (add_on_members), apart from the job's
        self._rank, self._size = world.Get_rank(), world.Get_size()
        self._make_engine = make_engine
        self.dynamic = dynamic
        global_process_set._registered(0, list(range(self._size)), self._rank)
        self.global_ = Communicator(global_process_set, engine, NameGenerator(), self._rank, self._size)
        self._members: dict[int, Communicator] = {0: self.global_}
        self._sets: dict[int, ProcessSet] = {0: global_process_set}  # every registered set, member or not
        self._timeline: Timeline | None = None  # rank 0's, while one is written: sets record into it too

    def of(self, process_set: ProcessSet | None, collective: Collective, name: str | None) -> Communicator:
        """The communicator a ``collective`` of tensor ``name`` on ``process_set`` runs on; a clear
        error if it cannot run here."""
        if process_set is None or process_set is global_process_set:
            return self.global_
        member = self._members.get(getattr(process_set, "process_set_id", None))
        if member is not None and member.process_set is process_set:
            return member
        what = f"{collective.name.lower()} of {'an unnamed tensor' if name is None else repr(name)}"
        if not isinstance(process_set, ProcessSet):
            raise ProcessSetError(f"{what}: process_set must be a hvd.ProcessSet, got {process_set!r}")
        if self._sets.get(process_set.process_set_id) is not process_set:
            raise ProcessSetError(f"{what}: {process_set!r} is not registered (never added, or removed); register "
                                  "it with hvd.init(process_sets=[...]) or hvd.add_process_set()")
        raise ProcessSetError(f"{what}: rank {self._rank} is not in process set {process_set.process_set_id} "
                              f"{process_set.ranks}, so it cannot take part in its collectives")

    def bound_calls(self, process_set: ProcessSet, seconds: float | None) -> None:
        """Give the unnamed calls of a torch group over ``process_set`` its timeout (see
        :meth:`~hvdlite.core.pipeline.negotiate.Negotiator.bound_calls`); this rank must be a member."""
        self.of(process_set, Collective.ALLREDUCE, None).engine.pipeline.negotiator.bound_calls(seconds)

    def includes(self, process_set: ProcessSet | None, collective: Collective, name: str | None) -> bool:
        """Whether this rank is in ``process_set`` (None: the global set), for callers that act alone
        outside it (an optimizer whose gradients then stay local, as Horovod's torch optimizer's do).

        A set that is not registered, or not a ProcessSet, raises :meth:`of`'s error for a
        ``collective`` of ``name``.
        """
        if isinstance(process_set, ProcessSet) and process_set.included() is False:
            return False  # registered, and this rank is not a member
        self.of(process_set, collective, name)
        return True

    @property
    def sets(self) -> list[ProcessSet]:
        """Every registered set, the global one first."""
        return [self._sets[i] for i in sorted(self._sets)]

    def add(self, process_set: ProcessSet, dynamic: bool) -> None:
        """Register ``process_set`` (collective over the job; ``dynamic``: after init)."""
        if dynamic and not self.dynamic:
            raise ProcessSetError("add_process_set needs hvd.init(process_sets='dynamic') "
                                  "(or HVDLITE_DYNAMIC_PROCESS_SETS=1, hvdliterun --process-sets-dynamic)")
        groups, mine = self._agreed_groups(process_set)
        color = next((index for index, ranks in enumerate(groups) if self._rank in ranks), _undefined())
        comm = self._registry.Split(color, self._rank)  # one communicator per group, on its members
        for index, ranks in enumerate(groups):
            self._register(process_set if index == mine else ProcessSet(ranks), ranks,
                           comm if self._rank in ranks else None)

    def add_on_members(self, ranks: list[int]) -> ProcessSet:
        """The set of job ranks ``ranks``, registered by its members alone (collective over them, in
        the same order on each): torch.distributed creates a sub-group's backend on its members only.

        The whole job returns the global set; the ranks of a set registered already (job-wide or
        members-only) return that set. A new set takes an id from a range of its own (2**20 up,
        agreed by its members), so the job-wide sets' ids stay the same on every rank.
        """
        if self._rank not in ranks:
            raise ProcessSetError(f"rank {self._rank} cannot register process set {ranks} on its members: "
                                  "it is not one of them")
        if ranks == list(range(self._size)):
            return global_process_set
        for known in self._sets.values():
            if known.ranks == ranks:
                return known
        group = self._local_registry.Get_group().Incl(ranks)
        comm = self._local_registry.Create_group(group)
        group.Free()
        proposal = max([_FIRST_MEMBERS_ONLY_ID - 1, *self._sets]) + 1  # above every id this rank knows
        process_set_id = comm.allreduce(proposal, op=_max_op())
        process_set = ProcessSet(ranks)
        process_set._registered(process_set_id, ranks, self._rank)
        self._sets[process_set_id] = process_set
        engine, private = self._make_engine(comm, ranks, process_set_id)
        self._members[process_set_id] = Communicator(process_set, engine, NameGenerator(), ranks.index(self._rank),
                                                     len(ranks), (*private, comm))
        if self._timeline is not None:
            engine.use_timeline(self._timeline.scoped(Scope(process_set_id, tuple(ranks))))
        log.debug("registered %s on its members", process_set)
        return process_set

    def _register(self, process_set: ProcessSet, ranks: list[int], comm: Any) -> None:
        """Give ``process_set`` the lowest free id (a freed id is reused, as in Horovod) and, on its
        members (``comm`` not None), an engine."""
        process_set_id = min(set(range(1, len(self._sets) + 1)) - set(self._sets))
        process_set._registered(process_set_id, ranks, self._rank)
        self._sets[process_set_id] = process_set
        if comm is not None:
            engine, private = self._make_engine(comm, ranks, process_set_id)
            self._members[process_set_id] = Communicator(process_set, engine, NameGenerator(),
                                                         ranks.index(self._rank), len(ranks), (*private, comm))
            if self._timeline is not None:
                engine.use_timeline(self._timeline.scoped(Scope(process_set_id, tuple(ranks))))
        log.debug("registered %s", process_set)

    def remove(self, process_set: ProcessSet) -> bool:
        """Unregister ``process_set`` (collective over the job); members stop its engine first.

        False for the global set and for one that is not registered (nothing happens then)."""
        if not self.dynamic:
            raise ProcessSetError("remove_process_set needs hvd.init(process_sets='dynamic') "
                                  "(or HVDLITE_DYNAMIC_PROCESS_SETS=1, hvdliterun --process-sets-dynamic)")
        process_set_id = process_set.process_set_id
        ids = self._registry.allgather(process_set_id)  # every check after it: a bad call fails on every rank
        if len(set(ids)) != 1:
            raise ProcessSetError(f"ranks removed different process sets: {_per_rank(ids)}")
        if process_set is global_process_set or self._sets.get(process_set_id) is not process_set:
            return False
        member = self._members.pop(process_set_id, None)
        if member is not None:
            _stop(member)
        del self._sets[process_set_id]
        process_set._removed()
        return True

    def use_timeline(self, timeline: Timeline | None) -> Timeline | None:
        """Record every communicator's cycles into ``timeline`` (None stops); returns the one replaced."""
        previous, self._timeline = self._timeline, timeline
        for process_set_id, member in self._members.items():
            scope = Scope(process_set_id, tuple(member.process_set.ranks))
            member.engine.use_timeline(timeline if timeline is None or not process_set_id else timeline.scoped(scope))
        return previous

    def abandon(self, error: Any) -> None:
        """Stop every engine, the global one too, without communicating (elastic: a peer died)."""
        for member in self._members.values():
            member.engine.abandon(error)
        for process_set in self._sets.values():
            process_set._removed()
        self._members, self._sets = {}, {}

    def close(self) -> None:
        """Stop every set's engine but the global one's (collective: every rank shuts down)."""
        for process_set_id in sorted(self._members, reverse=True):
            if process_set_id:
                _stop(self._members.pop(process_set_id))
        for process_set in self._sets.values():
            process_set._removed()
        self._sets = {}
        self._registry.Free()
        self._local_registry.Free()

    def _agreed_groups(self, process_set: ProcessSet) -> tuple[list[list[int]], int]:
        """The sets to register for ``process_set`` and which of them it is, checked on every rank alike.

        From a list of ranks: that one set, the same on every rank. From an mpi4py communicator, as
        in Horovod: every distinct group of ranks the ranks' communicators hold (a split gives each
        rank its own part), and ``process_set`` is this rank's. Every check comes after the
        collective exchange, so a bad set fails on every rank alike.
        """
        if process_set.mpi_comm is None:
            return [self._agreed_ranks(process_set.ranks, process_set.process_set_id)], 0
        every = self._registry.allgather((_comm_ranks(process_set.mpi_comm, self._registry),
                                          process_set.process_set_id))
        groups = sorted({tuple(ranks) for ranks, _ in every if ranks})
        if any(not ranks for ranks, _ in every) and len(groups) != 1:
            raise ProcessSetError(f"ranks gave communicators of different groups and some none: {_per_rank(every)}")
        registered = [r for r, (_, known) in enumerate(every) if known is not None]
        checked = [self._agreed_ranks(list(ranks), None, registered) for ranks in groups]
        mine = every[self._rank][0]
        return checked, checked.index(mine) if mine else 0

    def _agreed_ranks(self, ranks: list[int], known_id: int | None, registered: list[int] | None = None) -> list[int]:
        """``ranks``, checked to be the same on every rank, in range, unique and not yet registered."""
        if registered is None:
            every = self._registry.allgather((ranks, known_id))
            if any(other[0] != ranks for other in every):
                raise ProcessSetError(f"ranks asked for different process sets: {_per_rank([e[0] for e in every])}")
            registered = [r for r, (_, known) in enumerate(every) if known is not None]
        if registered:
            raise ProcessSetError(f"process set {ranks} is registered already (on rank(s) {registered})")
        bad = [r for r in ranks if not 0 <= r < self._size]
        if bad or not ranks:
            raise ProcessSetError(f"process set {ranks}: ranks {bad} are outside the job's 0..{self._size - 1}"
                                  if bad else "a process set needs at least one rank")
        if len(set(ranks)) != len(ranks):
            raise ProcessSetError(f"process set {ranks} names a rank more than once")
        for known in self._sets.values():  # members-only sets are known to some ranks only: not checked
            if known.ranks == ranks and known.process_set_id < _FIRST_MEMBERS_ONLY_ID:
                raise ProcessSetError(f"process set {ranks} exists already as id {known.process_set_id}")
        return ranks


_FIRST_MEMBERS_ONLY_ID = 1 << 20  # ids of sets registered by their members alone (add_on_members)


def _max_op() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _undefined() -> int:
    from mpi4py import MPI

    return MPI.UNDEFINED


def _comm_ranks(comm: Any, job: Any) -> list[int]:
    """The job ranks of ``comm``'s members, sorted ([] for COMM_NULL: a rank outside the communicator)."""
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        return []
    return sorted(comm.Get_group().Translate_ranks(list(range(comm.Get_size())), job.Get_group()))


def _per_rank(values: list) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))


def _stop(member: Communicator) -> None:
    """Shut a set's engine down (collective over the set) and free its communicators."""
    member.engine.shutdown()
    for comm in member.comms:
        comm.Free()

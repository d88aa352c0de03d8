"""Process sets: subsets of the job's ranks that run collectives among themselves (Horovod >= 0.23).

A set is registered on every rank at once, by ``hvd.init(process_sets=[...])`` or, after
``hvd.init(process_sets="dynamic")``, by :func:`~hvdlite.lifecycle.add_process_set`; registration
gives it an id (the global set, every rank of the job, is 0). Each registered set runs on its own
MPI communicator with its own engine (queue, negotiation, response cache, fusion and shared-memory
plane; see :mod:`hvdlite.core.communicators`), so collectives on disjoint sets run at the same time and
never wait for a rank outside their set. Ranks are always the job's (global) ranks; a set orders its members
by global rank, and ``ps.rank()`` is this rank's place in that order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import ProcessSetError


class ProcessSet:
    """A set of the job's ranks, from a list of ranks or an mpi4py communicator (its ranks in the job).

    Pass it to ``init(process_sets=[...])`` or :func:`~hvdlite.lifecycle.add_process_set` to register it, then as
    ``process_set=`` to any collective. Before registration ``size()``, ``rank()`` and
    ``included()`` return None, as Horovod's do.
    """

    def __init__(self, ranks_or_comm: Iterable[int] | Any) -> None:
        self.process_set_id: int | None = None
        self.mpi_comm: Any = None
        self.ranks: list[int] | None = None
        self._rank: int | None = None  # this process's place among the ranks (-1: not a member), once registered
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator: its ranks are known at registration
            self.mpi_comm = ranks_or_comm
            return
        ranks = list(ranks_or_comm)
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int)]
        if bad:
            raise ProcessSetError(f"a process set's ranks must be ints, got {bad!r} in {ranks!r}")
        self.ranks = sorted(ranks)

    def size(self) -> int | None:
        """How many ranks the set has (None before registration)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None before registration; an error on a non-member)."""
        if self.process_set_id is None:
            return None
        if self._rank < 0:
            raise ProcessSetError(f"this process is not part of process set {self.process_set_id} {self.ranks}")
        return self._rank

    def included(self) -> bool | None:
        """True if this process is a member (None before registration)."""
        return None if self.process_set_id is None else self._rank >= 0

    def _registered(self, process_set_id: int, ranks: list[int], own_rank: int) -> None:
        """Called by the registry on every rank once the set is registered (``own_rank``: global)."""
        self.process_set_id = process_set_id
        self.ranks = ranks
        self._rank = ranks.index(own_rank) if own_rank in ranks else -1

    def _removed(self) -> None:
        self.process_set_id = None
        self._rank = None

    def __copy__(self) -> ProcessSet:
        return self  # a set is the registry's entry: a copy would be a set nobody registered

    def __deepcopy__(self, memo: dict) -> ProcessSet:
        return self  # copy.deepcopy(model) of a model holding a SyncBatchNorm keeps using the same set

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __str__ = __repr__


global_process_set = ProcessSet([])  # id 0 and every rank of the job, from init() to shutdown()

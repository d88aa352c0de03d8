"""hvdlite as a torch.distributed backend: ``dist.init_process_group("hvdlite")`` after ``hvd.init()``.

Importing :mod:`hvdlite.torch` registers the backend; ``hvd.init()`` sets the rendezvous variables
torch reads (:mod:`.rendezvous`). Then torch's own DDP, FSDP2, DTensor, DCP and functional
collectives run their collectives on hvdlite's core, with its failure handling::

    import torch.distributed as dist
    import hvdlite.torch as hvd

    hvd.init()
    dist.init_process_group("hvdlite")
    model = torch.nn.parallel.DistributedDataParallel(model)

Sub-groups (``dist.new_group``, device meshes) become process sets of their members.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ...core.runtime import current
from ...core.work.naming import CallNames
from ...errors import ProcessSetError
from ...ops import Collective
from . import accelerate_state, lightning_strategy
from .p2p import PointToPoint
from .process_group import BACKEND_NAME, ProcessGroupHvdlite
from .work import HvdliteWork

__all__ = ["BACKEND_NAME", "CollectivesOnly", "ProcessGroupHvdlite", "HvdliteWork", "make_default", "register"]


class CollectivesOnly:
    """``pg_options`` for a group without send/recv, whose creation involves no other rank: the
    groups of ``fully_shard``'s device meshes (a rank joining an elastic job makes its own while the
    others are busy; point-to-point needs a duplicate communicator, which all ranks make together)."""


def _create(options: Any, backend_options: Any = None) -> ProcessGroupHvdlite:
    """torch's backend constructor (called on the group's members only): the group's process set."""
    runtime = current()  # the clear "call hvd.init() first" error
    communicators = runtime.communicators
    ranks = list(options.global_ranks_in_group) or list(range(runtime.topology.size))
    if not options.global_ranks_in_group and (options.group_size, options.group_rank) != (
            runtime.topology.size, runtime.topology.rank):
        raise ProcessSetError(f"dist.init_process_group('{BACKEND_NAME}'): torch's world is rank {options.group_rank} "
                              f"of {options.group_size}, hvdlite's rank {runtime.topology.rank} of "
                              f"{runtime.topology.size}; leave RANK and WORLD_SIZE to hvd.init(), or start hvdlite "
                              "on the same processes")
    process_set = communicators.add_on_members(ranks)
    member = communicators.of(process_set, Collective.ALLREDUCE, None)
    base = member.comms[-1] if member.comms else runtime.comm
    names = runtime.adapter_state.setdefault(("torch.distributed call names", process_set.process_set_id),
                                             CallNames())
    timeout = getattr(options, "timeout", None)
    seconds = timeout.total_seconds() if timeout else None
    communicators.bound_calls(process_set, seconds)  # a call waiting longer for late ranks fails, naming them
    label = f"the hvdlite group of job ranks {ranks}"
    p2p = None if isinstance(backend_options, CollectivesOnly) else PointToPoint(
        base.Dup(), earliest(seconds, runtime.config.comm_timeout), label)
    return ProcessGroupHvdlite(process_set, ranks, ranks.index(runtime.topology.rank), p2p, names, seconds)


def earliest(*deadlines: float | None) -> float | None:
    """The shortest of ``deadlines`` in seconds (None or 0: none), or None. A receive's wait cannot
    tell a late peer from a stopped one: the group's timeout and HVDLITE_COMM_TIMEOUT_SECONDS both bound it."""
    seconds = [s for s in deadlines if s]
    return min(seconds) if seconds else None


def _monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """torch's ``monitored_barrier``, which refuses every backend but gloo by name, for hvdlite
    groups too (any other group goes to torch's own)."""
    if group is not dist.GroupMember.NON_GROUP_MEMBER and dist.is_initialized() and \
            dist.get_backend(group) == BACKEND_NAME:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        backend = pg if isinstance(pg, ProcessGroupHvdlite) else pg._get_backend(torch.device("cpu"))
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        return backend.monitored_barrier(timeout, wait_all_ranks)
    return _TORCH_MONITORED_BARRIER(group, timeout, wait_all_ranks)


_TORCH_MONITORED_BARRIER = dist.monitored_barrier


def make_default() -> None:
    """After ``hvd.init()``: torch's ``init_process_group()`` without a backend (which
    ``init_device_mesh`` calls when no group exists) starts this backend, for CPU and CUDA tensors."""
    for device in ("cpu", "cuda"):
        dist.Backend.default_device_backend_map[device] = BACKEND_NAME


def register() -> None:
    """Make ``"hvdlite"`` a torch.distributed backend name (once per process; for CPU and CUDA), and
    one Accelerate picks (:mod:`.accelerate_state`) and Lightning knows (:mod:`.lightning_strategy`)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    accelerate_state.install()  # Accelerate's choice of backend, corrected where hvdlite is in play
    lightning_strategy.install()  # Lightning's strategy="hvdlite"
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    dist.monitored_barrier = dist.distributed_c10d.monitored_barrier = _monitored_barrier

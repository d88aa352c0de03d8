"""``ProcessGroupHvdlite``: a c10d process group whose collectives run on hvdlite's core.

torch calls a process group's collectives with its own calling convention (lists of tensors,
option structs, outputs passed in); the calls (:mod:`.reduction_calls`, :mod:`.gather_calls`) turn
that into the core's collective on the group's process set (``hvdlite.torch``'s ``_async`` forms:
fusion, the response cache, shared memory, NCCL for CUDA tensors) and return an
:class:`~.work.HvdliteWork` that writes torch's outputs when the core delivers. This module adds
the group's identity, its barriers and its point-to-point calls.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ...core.work.naming import CallNames
from ...process_sets import ProcessSet
from ..collectives.async_ops import allreduce_async
from .gather_calls import GatherCalls
from .monitored import monitored_barrier
from .p2p import ANY_SOURCE, PointToPoint
from .reduction_calls import ReductionCalls
from .work import HvdliteWork

BACKEND_NAME = "hvdlite"


class ProcessGroupHvdlite(ReductionCalls, GatherCalls, dist.ProcessGroup):
    """The ranks of ``process_set`` as a torch process group (``rank``: this rank's place in it)."""

    def __init__(self, process_set: ProcessSet, members: list[int], rank: int, p2p: PointToPoint | None,
                 names: CallNames, timeout: float | None = None) -> None:
        """``members``: the job's ranks of the group, in order; ``names``: the call names of
        ``process_set``, shared by every group over it (one sequence); ``timeout``: the group's, in
        seconds (``init_process_group`` / ``new_group``'s ``timeout``)."""
        super().__init__(rank, len(members))
        self.process_set = process_set
        self.members = list(members)
        self.timeout = timeout
        self._p2p = p2p
        self._names = names
        self._in_place_names = {}
        self._group_name = ""
        self._monitored = 0  # monitored barriers made: each is numbered

    # ---- identity ------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802 - functional collectives look the group up by it
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices whose tensors this group takes (torch's broadcast of a state dict asks): the
        CPU, and CUDA where torch has it."""
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])

    def __repr__(self) -> str:
        return f"ProcessGroupHvdlite(rank={self.rank()}, size={self.size()}, process_set={self.process_set!r})"

    # ---- barrier and point-to-point ------------------------------------------------------------
    def barrier(self, opts: Any = None) -> HvdliteWork:
        """A call like the others (a one-element sum, named in the group's sequence of calls): a rank
        that calls another collective instead is named at once, and the group's timeout bounds it."""
        flag = torch.zeros(1)
        handle = self._start("barrier", [flag], lambda name: allreduce_async(
            flag, name=name, process_set=self.process_set))
        return HvdliteWork([handle], lambda results: None)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        return self._point_to_point("send").send(tensors, dst_rank, tag)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work:
        return self._point_to_point("recv").recv(tensors, src_rank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """``recv`` / ``irecv`` with ``src=None``: the work's ``_source_rank()`` names the sender."""
        return self._point_to_point("recv").recv(tensors, ANY_SOURCE, tag)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """torch's ``monitored_barrier``: rank 0 waits for every rank's arrival up to ``timeout`` (the
        group's by default); a rank that did not arrive is named on every rank that did."""
        seconds = timeout.total_seconds() if timeout is not None else self.timeout
        self._monitored += 1
        monitored_barrier(self._point_to_point("monitored_barrier").comm, self._monitored, seconds, wait_all_ranks,
                          repr(self))

    def _point_to_point(self, call: str) -> PointToPoint:
        if self._p2p is None:
            raise RuntimeError(f"{call} on the group of {self.process_set}: hvd.fully_shard made this group for its "
                               "DTensor parameters, with collectives only; for send/recv call "
                               f"dist.init_process_group('{BACKEND_NAME}') yourself before fully_shard")
        return self._p2p

"""The GPU data plane: device work items, on the plane (NCCL or host-staged) the whole job chose
when the first one arrived.

Setting up is collective, and safe to do inside an item: every rank plans the same items in the
same order, so every rank reaches its first device item together. The ranks exchange one row
each (:class:`~hvdlite.gpu.selection.RankGpu`) over the host transport and all choose the same
plane; for NCCL, rank 0 makes the unique id and broadcasts it over MPI, and each rank builds the
communicator on its device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ... import errors
from ...gpu import nccl, selection, stack
from ...gpu.arrays import DEVICE, device_count
from ...settings.config import Config
from ..transport.base import Transport
from ..work.item import WorkItem, describe
from ..work.request import Request
from ..work.response import Response
from .base import Outcome, succeeded

if TYPE_CHECKING:
    from .host import HostPlane

log = logging.getLogger("hvdlite")


class ExecutorView(Protocol):
    """What the device plane uses of the executor that holds it (``core.pipeline.execute.Executor``,
    which imports this module): its host plane, flushed before device work, and this rank."""

    host: HostPlane
    rank: int


class ChosenPlane(Protocol):
    """The plane the job chose on its first device item (:class:`~.nccl.NcclPlane` or
    :class:`~.staged.HostStagedPlane`; tests pass fakes)."""

    def dispatch(self, responses: tuple[Response, ...], local: Mapping[str, Request]) -> list: ...

    def poll(self) -> None: ...

    def close(self) -> None: ...


# Builds the job's plane from the first device item (collective): executor, item, this rank's requests.
ChoosePlane = Callable[[ExecutorView, WorkItem, Mapping[str, Request]], ChosenPlane]


class DevicePlane:
    """Enabled for items whose tensors live on a GPU; the job chooses its plane on the first one.

    Chosen lazily because the choice is collective and needs cupy, which a CPU-only job never
    imports. Afterwards every item goes straight to the chosen plane.
    """

    name = "gpu"

    def __init__(self, executor: ExecutorView, choose: ChoosePlane | None) -> None:
        self._executor = executor
        self._choose = choose
        self._plane: ChosenPlane | None = None

    @property
    def chosen(self) -> ChosenPlane | None:
        """The plane the job chose on its first device item; None before it."""
        return self._plane

    def enabled_for(self, item: WorkItem) -> bool:
        return item.responses[0].meta.device != "cpu"

    def run(self, item: WorkItem, local: Mapping[str, Request]) -> list:
        plane = self._plane
        if plane is None or item.responses[0].meta.device != DEVICE:
            plane = self._checked_plane(item, local)
        return plane.dispatch(item.responses, local)

    def _checked_plane(self, item: WorkItem, local: Mapping[str, Request]) -> ChosenPlane:
        """The job's plane for ``item``, chosen now if this is the first device item; an error for
        tensors no GPU plane runs."""
        device = item.responses[0].meta.device
        if device != DEVICE:  # a mixed group (arguments.one_device) that no peer contradicted: its peers had joined
            raise errors.UnsupportedOperationError(f"{describe(item)}: tensors on {device}")
        if self._choose is None:
            raise errors.DeviceError("a device tensor reached an executor built without a GPU data plane")
        if self._plane is None:
            self._plane = self._choose(self._executor, item, local)
        return self._plane

    def start(self, item: WorkItem, local: Mapping[str, Request], on_done: Callable[[Outcome], None]) -> None:
        self._executor.host.flush()  # device work never overtakes host reductions still in flight
        on_done(succeeded(item.responses, self.run(item, local)))

    def finish(self) -> None:
        # A device item completes within start(); work it left on the GPU is watched here, every
        # cycle (idle ones included), so a collective that can never finish ends in an error.
        if self._plane is not None:
            self._plane.poll()

    def close(self) -> None:
        if self._plane is not None:
            self._plane.close()


def exchange_unique_id(transport: Transport, rank: int) -> bytes:
    """Rank 0's fresh NCCL unique id, on every rank (broadcast over the host transport)."""
    buffer = np.frombuffer(nccl.unique_id(), dtype=np.uint8).copy() if rank == 0 else \
        np.zeros(nccl.UNIQUE_ID_BYTES, dtype=np.uint8)
    transport.broadcast(buffer, 0)
    return buffer.tobytes()


def exchange_rows(transport: Transport, mine: selection.RankGpu, size: int) -> list[selection.RankGpu]:
    """Every rank's :class:`RankGpu` row, in rank order."""
    row_bytes = selection.ROW_FIELDS * 8
    table = np.empty(size * selection.ROW_FIELDS, dtype=np.int64)
    transport.allgatherv(mine.encode().view(np.uint8), table.view(np.uint8), [row_bytes] * size)
    return [selection.RankGpu.decode(row) for row in table.reshape(size, selection.ROW_FIELDS)]


class GpuChooser:
    """Chooses the job's GPU plane on the first device item (see the module docstring): :meth:`choose`.

    The lambdas of the plane it builds keep it, for the hierarchical groups they make later.
    """

    def __init__(self, executor: ExecutorView, config: Config, data_comm: Any, hosts: list[str], local_rank: int) -> None:
        self._host = executor.host
        self._config = config
        self._data_comm = data_comm  # the engine's MPI data communicator, for the hierarchical groups
        self._hosts = hosts  # every rank's host name, index = rank
        self._host_name = hosts[executor.rank]
        self._local_rank = local_rank

    def choose(self, item: WorkItem, local: Mapping[str, Request]) -> ChosenPlane:
        """Exchange every rank's row, choose the same plane on every rank and build it (collective)."""
        if self._local_rank == 0:  # once a host: wheels for another CUDA fail later, and obscurely
            for problem in stack.mismatches(stack.installed(stack.CUPY_WHEELS), stack.installed(stack.NCCL_WHEELS),
                                            stack.loaded_torch_cuda()):
                log.warning("CUDA stack: %s", problem)
        return self._set_up(item, local)

    def _device_id(self, item: WorkItem, local: Mapping[str, Request]) -> int:
        for response in item.responses:
            request = local.get(response.meta.name)
            if request is not None:
                return request.tensor.device_id
        count = device_count()  # a rank that joined holds no tensor: Horovod's convention
        return self._local_rank % count if count else 0

    def _set_up(self, item: WorkItem, local: Mapping[str, Request]) -> Any:
        import cupy

        device_id = self._device_id(item, local)
        version = nccl.version() if nccl.available() else 0
        pci = cupy.cuda.Device(device_id).pci_bus_id
        mine = selection.RankGpu(version, self._config.gpu_operations == "MPI", self._config.nccl_multi_rank_gpu,
                                 selection.gpu_key(self._host_name, pci))
        transport = self._host.transport
        choice = selection.choose_plane(exchange_rows(transport, mine, self._host.size))
        if self._host.rank == 0:
            log.info("hvdlite GPU data plane: %s (%s)", choice.plane, choice.reason)
        if choice.plane == selection.PLANE_MPI:
            from .staged import HostStagedPlane

            return HostStagedPlane(self._host, device_id, self._host_groups)
        from .nccl import NcclPlane

        uid = exchange_unique_id(transport, self._host.rank)
        comm = nccl.Communicator.create(uid, self._host.size, self._host.rank, device_id, self._config.comm_timeout)
        poll_seconds = self._config.poll_time_ms / 1000
        one_host = len(set(self._hosts)) == 1
        return NcclPlane(comm, device_id, self._config.comm_timeout, poll_seconds, self._hierarchy(device_id),
                         self._config.async_completion, None if one_host else lambda: self._reducer(device_id))

    def _hierarchy(self, device_id: int) -> Any:
        """The hierarchical reducer when asked for and the job spans hosts (same answer on every rank)."""
        if not self._config.hierarchical_allreduce:
            return None
        if len(set(self._hosts)) == 1:
            if self._host.rank == 0:
                log.info("HVDLITE_HIERARCHICAL_ALLREDUCE=1 on a single host: the flat NCCL allreduce is used")
            return None
        reducer = self._reducer(device_id)
        if self._host.rank == 0:
            log.info("hvdlite hierarchical allreduce: NCCL inside each of %d hosts, MPI across them",
                     len(set(self._hosts)))
        return reducer

    def _host_groups(self) -> Any:
        """This rank's host and cross-host MPI groups (:func:`~hvdlite.core.planes.hierarchical.build_groups`). Collective."""
        from .hierarchical import build_groups

        return build_groups(self._data_comm, self._hosts, self._host.rank, self._config.chunk_bytes,
                            self._config.poll_time_ms / 1000, self._config.comm_timeout)

    def _reducer(self, device_id: int) -> Any:
        """NCCL inside this rank's host, MPI across hosts (a HierarchicalReducer). Collective."""
        from .hierarchical import HierarchicalReducer

        groups = self._host_groups()
        uid = exchange_unique_id(groups.local, groups.local_rank)
        local = nccl.Communicator.create(uid, groups.local_size, groups.local_rank, device_id,
                                         self._config.comm_timeout)
        return HierarchicalReducer(local, groups.cross)

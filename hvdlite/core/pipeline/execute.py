"""Stage 5, execute: run each work item on the first data plane enabled for it.

Horovod's operation manager is the model: the planes are asked in order (host tensors: the host
plane over MPI and shared memory; device tensors: the GPU plane, NCCL or host-staged) and the
first whose ``enabled_for`` accepts the item runs it. An error response is delivered as the
error it stands for, without touching any plane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ... import errors
from ..planes.base import DataPlane, Outcome, failed, succeeded
from ..planes.device import ChoosePlane, ChosenPlane, DevicePlane
from ..planes.host import HostPlane
from ..transport.base import Transport
from ..work.item import WorkItem
from ..work.request import Request


class Executor:
    """The data planes of one communicator, in the order they are asked."""

    def __init__(self, transport: Transport, rank: int, size: int,
                 choose_gpu_plane: ChoosePlane | None = None) -> None:
        """``choose_gpu_plane(executor, item, local)`` builds the GPU plane on the first device item
        (cupy is imported then)."""
        self.rank = rank
        self.size = size
        self.host = HostPlane(transport, rank, size)
        self._planes: tuple[DataPlane, ...] = (self.host, DevicePlane(self, choose_gpu_plane))
        self._by_device: dict[str, DataPlane] = {}  # the plane each device's items go to (plane_for)

    @property
    def transport(self) -> Transport:
        return self.host.transport

    @property
    def gpu_plane(self) -> ChosenPlane | None:
        """The GPU plane the job chose on its first device item; None before it (or without a GPU)."""
        return self._planes[1].chosen

    def plane_for(self, item: WorkItem) -> DataPlane:
        """The first plane enabled for ``item``. Planes choose by where the tensors live, so the
        answer is asked once per device and remembered (this runs for every work item)."""
        device = item.responses[0].meta.device
        plane = self._by_device.get(device)
        if plane is None:
            plane = next((p for p in self._planes if p.enabled_for(item)), None)
            if plane is None:
                raise errors.HvdliteError(f"no data plane runs tensors on {device!r}")
            self._by_device[device] = plane
        return plane

    def run(self, item: WorkItem, local: Mapping[str, Request]) -> Outcome:
        """Execute ``item`` now; returns (response, result, error) for each of its responses."""
        responses = item.responses
        if responses[0].error:
            return failed(responses)
        plane = self._by_device.get(responses[0].meta.device) or self.plane_for(item)
        results = plane.run(item, local)
        return [(responses[0], results[0], None)] if len(responses) == 1 else succeeded(responses, results)

    def start(self, item: WorkItem, local: Mapping[str, Request], on_done: Callable[[Outcome], None]) -> None:
        """Execute ``item`` like :meth:`run`, but hand its outcome to ``on_done``, maybe later.

        A host allreduce may still be in flight when this returns; its ``on_done`` then runs
        inside a later :meth:`start` or :meth:`finish` on this thread.
        """
        if item.responses[0].error:
            on_done(failed(item.responses))
            return
        self.plane_for(item).start(item, local, on_done)

    def finish(self) -> None:
        """Deliver the outcome of every item :meth:`start` left in flight; return once peers are done too."""
        self.host.finish()
        self._planes[1].finish()

    def close(self) -> None:
        """Release every plane's resources (NCCL communicators, then the host's shared-memory windows)."""
        for plane in reversed(self._planes):  # the GPU plane may still use the host transport while closing
            plane.close()

"""The ``_async`` and in-place collectives on torch tensors: convert, submit to the core, convert back.

Every function returns a handle for :func:`synchronize` / :func:`poll`; synchronizing gives torch
tensors (in-place forms give back the tensor they were called on). Nothing here is differentiable;
:mod:`hvdlite.torch.collectives.differentiable` builds the autograd-aware blocking forms on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ... import api
from ...core.work.request import GroupHandle, MappedHandle
from ...gpu.arrays import DeviceArray
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from .tensors import from_numpy, is_aliased, own_device_array, plain_host_view, to_numpy

Handle = MappedHandle


def _new_tensor(like: torch.Tensor):
    return lambda array: from_numpy(array, like)


def _copy_back(tensor: torch.Tensor, array: Any = None):
    """Result conversion for in-place forms: nothing to do if the core wrote the tensor's own memory
    (``array``, what :func:`to_numpy` gave for ``tensor``, is a device array over it: no question to torch)."""
    if (array.__class__ is DeviceArray and array.owner is tensor) or is_aliased(tensor):
        return lambda result: tensor

    def finish(result: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            tensor.copy_(from_numpy(result).view(tensor.shape))
        return tensor
    return finish


# ---- allreduce -----------------------------------------------------------------------------------
def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start reducing ``tensors`` as one group; one handle for the group (it yields the list of new
    tensors), which is also the list of each member's handle."""
    arrays = [to_numpy(t, name) for t in tensors]
    handles = api.grouped_allreduce_async(arrays, average, name, op, prescale_factor, postscale_factor,
                                          process_set=process_set)
    return GroupHandle(MappedHandle(h, _new_tensor(t)) for h, t in zip(handles, tensors, strict=True))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start reducing ``tensors`` in place, as one group; the group's handle yields them, updated."""
    arrays = [to_numpy(t, name) for t in tensors]
    handles = api.grouped_allreduce_async(arrays, average, name, op, prescale_factor, postscale_factor,
                                          outputs=arrays, process_set=process_set)
    return GroupHandle(MappedHandle(h, _copy_back(t, a)) for h, t, a in zip(handles, tensors, arrays, strict=True))


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start reducing ``tensor`` across ranks (default Average); the handle yields a new tensor."""
    handle = api.allreduce_async(to_numpy(tensor, name), average, name, op, prescale_factor, postscale_factor,
                                 process_set=process_set)
    return MappedHandle(handle, _new_tensor(tensor))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start reducing ``tensor`` in place; a contiguous CPU tensor is reduced in its own memory."""
    array = to_numpy(tensor, name)
    handle = api.allreduce_async(array, average, name, op, prescale_factor, postscale_factor, output=array,
                                 process_set=process_set)
    return MappedHandle(handle, _copy_back(tensor, array))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place and return it."""
    if name is not None:  # reduced in its own memory by the core's small-op path, where it can
        if tensor.is_cuda:
            if (array := own_device_array(tensor)) is not None and api.small_allreduce_in_place(
                    array, average, name, op, prescale_factor, postscale_factor, process_set):
                return tensor
        elif (array := plain_host_view(tensor)) is not None and api.small_allreduce_host(
                array, average, name, op, prescale_factor, postscale_factor, process_set):
            return tensor
    return synchronize(api.blocking(
        lambda: allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce ``tensors`` in place as one group and return them."""
    return synchronize(api.blocking(
        lambda: grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)))


# ---- allgather, broadcast, alltoall, reducescatter -----------------------------------------------
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> GroupHandle:
    """Start gathering ``tensors`` as one group; the group's handle yields the list of results."""
    handles = api.grouped_allgather_async([to_numpy(t, name) for t in tensors], name, process_set=process_set)
    return GroupHandle(MappedHandle(h, _new_tensor(t)) for h, t in zip(handles, tensors, strict=True))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0."""
    return MappedHandle(api.allgather_async(to_numpy(tensor, name), name, process_set), _new_tensor(tensor))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank; the handle yields a new tensor."""
    return MappedHandle(api.broadcast_async(to_numpy(tensor, name), root_rank, name, process_set=process_set),
                        _new_tensor(tensor))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """Start overwriting ``tensor`` with ``root_rank``'s, in place."""
    array = to_numpy(tensor, name)
    return MappedHandle(api.broadcast_async(array, root_rank, name, output=array, process_set=process_set),
                        _copy_back(tensor, array))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s, in place, and return it."""
    return synchronize(api.blocking(lambda: broadcast_async_(tensor, root_rank, name, process_set)))


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start an alltoall; the handle yields (received tensor, rows received from each rank).

    The row counts are int32 on ``splits``'s device when ``splits`` is a tensor, else on the CPU (as
    Horovod makes them: ``splits.new()``).
    """
    where = splits.device if isinstance(splits, torch.Tensor) else None
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()

    def convert(result: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        data, received = result
        counts = torch.from_numpy(received.astype(np.int32))
        return from_numpy(data, tensor), counts if where is None else counts.to(where)

    return MappedHandle(api.alltoall_async(to_numpy(tensor, name), splits, name, process_set), convert)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: ReduceOp | None = None,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> GroupHandle:
    """Start reducescattering ``tensors`` as one group (Horovod's argument order); the group's handle
    yields the list of results."""
    arrays = [to_numpy(t, name) for t in tensors]
    handles = api.grouped_reducescatter_async(arrays, op, name, prescale_factor, postscale_factor,
                                              process_set=process_set)
    return GroupHandle(MappedHandle(h, _new_tensor(t)) for h, t in zip(handles, tensors, strict=True))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp | None = None,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start reducing ``tensor`` and keeping this rank's block of rows (Horovod's argument order)."""
    handle = api.reducescatter_async(to_numpy(tensor, name), op, name, prescale_factor, postscale_factor,
                                     process_set)
    return MappedHandle(handle, _new_tensor(tensor))


# ---- handles, barrier, join ----------------------------------------------------------------------
def poll(handle: Handle) -> bool:
    """True if the operation behind ``handle`` has finished (never blocks)."""
    return api.poll(handle)


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle`` and return its result (tensors), or raise the operation's error."""
    return api.synchronize(handle)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank (of ``process_set``) has called ``barrier()``."""
    api.barrier(process_set)


def join(device: int = -1, process_set: ProcessSet = global_process_set) -> int:
    """Declare this rank out of data (``device`` is accepted for Horovod compatibility); returns the last rank to join."""
    return api.join(process_set)


__all__ = [
    "Handle", "allreduce_async", "allreduce_async_", "allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_allreduce_", "allgather_async", "grouped_allgather_async",
    "broadcast_async", "broadcast_async_", "broadcast_", "alltoall_async", "reducescatter_async",
    "grouped_reducescatter_async", "poll", "synchronize", "barrier", "join",
]

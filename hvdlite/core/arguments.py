"""Checking a collective's arguments and describing its requests, before anything is queued.

Every check here runs on the calling rank alone, so a bad call fails there with a message naming
the tensor; :mod:`hvdlite.api` gives back a generated name when one fails (see
:meth:`hvdlite.core.work.naming.NameGenerator.undo`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedOperationError
from ..gpu.arrays import DeviceArray
from ..ops import Collective, ReduceOp
from ..utils import dtypes
from .communicators import Communicator
from .describe import device_of
from .runtime import current
from .work.request import RequestMeta

Pairs = list[tuple[RequestMeta, Any]]


def as_array(tensor: Any) -> np.ndarray | DeviceArray:
    return tensor if isinstance(tensor, (np.ndarray, DeviceArray)) else np.asarray(tensor)


def check_outputs(outputs: Sequence[np.ndarray] | None, arrays: list[np.ndarray], names: list[str]) -> None:
    """An output array receives the result in place: it must match its input and be writable."""
    if outputs is None:
        return
    if len(outputs) != len(arrays):
        raise ValueError(f"{len(outputs)} output arrays given for {len(arrays)} tensors")
    for out, array, name in zip(outputs, arrays, names, strict=True):
        if type(out) is not type(array) or out.shape != array.shape or out.dtype != array.dtype:
            raise UnsupportedOperationError(
                f"output for tensor {name!r} must be an array of shape {array.shape} and dtype {array.dtype} "
                f"in the same memory ({device_of(array)}) as the tensor")
        if isinstance(out, DeviceArray):
            if out is not array and out.overlaps(array):
                raise UnsupportedOperationError(
                    f"output for tensor {name!r} overlaps its input; pass the input array itself for in place")
            continue
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise UnsupportedOperationError(f"output for tensor {name!r} must be C-contiguous and writable")
        if out is not array and np.may_share_memory(out, array):
            # In place means the very same array object; a different view of the same memory would
            # hand MPI overlapping send and receive buffers.
            raise UnsupportedOperationError(
                f"output for tensor {name!r} overlaps its input; pass the input array itself for in place")


def reduction_meta(collective: Collective, array: np.ndarray | DeviceArray, name: str, op: ReduceOp,
                   prescale: float, postscale: float) -> RequestMeta:
    """The checked description of a reduction, remembered by the runtime (the same call repeats every step)."""
    return current().descriptions.reduction(collective, array, name, op, prescale, postscale)


def allgather_pairs(tensors: Sequence[Any], names: list[str]) -> Pairs:
    pairs = []
    for tensor, member in zip(tensors, names, strict=True):
        array = as_array(tensor)
        if array.ndim == 0:
            raise UnsupportedOperationError(f"allgather of tensor {member!r} needs at least one dimension, got a scalar")
        pairs.append((RequestMeta(member, Collective.ALLGATHER, dtypes.dtype_name(array, member), tuple(array.shape),
                                  device=device_of(array)), array))
    return pairs


def root_in(target: Communicator, root_rank: Any, what: str) -> int:
    """``root_rank`` (a rank of the job) as a rank of ``target``'s communicator, checked."""
    ranks = target.process_set.ranks
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ranks:
        where = f"[0, {target.size})" if target.process_set.process_set_id == 0 else \
            f"process set {target.process_set.process_set_id}'s ranks {ranks}"
        raise UnsupportedOperationError(f"{what}: root_rank={root_rank!r} is not in {where}")
    return ranks.index(int(root_rank))


def broadcast_meta(target: Communicator, array: np.ndarray | DeviceArray, root_rank: Any, member: str) -> RequestMeta:
    root = root_in(target, root_rank, f"broadcast of tensor {member!r}")
    return RequestMeta(member, Collective.BROADCAST, dtypes.dtype_name(array, member), tuple(array.shape),
                       root_rank=root, device=device_of(array))


def alltoall_meta(size: int, array: np.ndarray | DeviceArray, splits: Sequence[int] | None, member: str) -> RequestMeta:
    """An alltoall among ``size`` ranks, with ``splits`` checked (equal parts when None)."""
    if array.ndim == 0:
        raise UnsupportedOperationError(f"alltoall of tensor {member!r} needs at least one dimension")
    rows = array.shape[0]
    if splits is None:
        if rows % size:
            raise UnsupportedOperationError(
                f"alltoall of tensor {member!r}: first dimension {rows} does not divide by {size} ranks; pass splits")
        split_list = [rows // size] * size
    else:
        split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(split_list) != size or min(split_list) < 0 or sum(split_list) != rows:
            raise UnsupportedOperationError(
                f"alltoall of tensor {member!r}: splits {split_list} must be {size} non-negative counts "
                f"summing to the first dimension {rows}")
    return RequestMeta(member, Collective.ALLTOALL, dtypes.dtype_name(array, member), tuple(array.shape),
                       splits=tuple(split_list), device=device_of(array))


def reducescatter_pairs(tensors: Sequence[Any], names: list[str], base: str, op: ReduceOp, prescale: float,
                        postscale: float) -> Pairs:
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise UnsupportedOperationError(f"reducescatter of {base!r} supports Sum and Average, not {op.name}")
    pairs = []
    for tensor, member in zip(tensors, names, strict=True):
        array = as_array(tensor)
        if array.ndim == 0:
            raise UnsupportedOperationError(f"reducescatter of tensor {member!r} needs at least one dimension")
        pairs.append((reduction_meta(Collective.REDUCESCATTER, array, member, op, prescale, postscale), array))
    return pairs


def one_device(pairs: Pairs, target: Communicator) -> Pairs:
    """A group's tensors must share one device, as in Horovod; a group that mixes them fails on every rank.

    Raising here alone would leave a peer whose group is uniform waiting for tensors that never come,
    and a rank cannot know its peers' groups. So, with peers, every member of a mixed group goes to
    negotiation described as mixed, with this rank's number: no other rank describes it alike, so the
    ranks' descriptions disagree and every rank gets a TensorMismatchError naming each rank's devices.
    """
    first_on: dict[str, str] = {}
    for meta, _ in pairs:
        first_on.setdefault(meta.device, meta.name)
    if len(first_on) < 2:
        return pairs
    where = ", ".join(f"{name!r} on {device}" for device, name in first_on.items())
    detail = f"{where}; a group's tensors must share one device"
    if target.size == 1:
        raise UnsupportedOperationError(f"a group mixes devices ({detail})")
    marker = f"mixed ({detail}) on rank {target.process_set.ranks[target.rank]}"
    return [(meta._replace(device=marker), tensor) for meta, tensor in pairs]

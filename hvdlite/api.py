"""The core's collectives on NumPy arrays. Framework adapters convert and call these.

Each collective has a blocking form and an ``_async`` form returning a :class:`Handle`; ``poll``
and ``synchronize`` take the handle. Arguments are checked here, before anything is queued,
so a bad call fails on the calling rank with a message naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from . import dtypes
from .communicators import Communicator
from .describe import describe_reduction, device_of
from .errors import UnsupportedOperationError
from .gpu.arrays import DeviceArray
from .naming import group_member_names
from .ops import Collective, ReduceOp, resolve_op
from .process_sets import ProcessSet
from .request import Handle, MappedHandle, Request, RequestMeta
from .runtime import Runtime, current
from .segments import Segments


def _array(tensor: Any) -> np.ndarray | DeviceArray:
    return tensor if isinstance(tensor, (np.ndarray, DeviceArray)) else np.asarray(tensor)


_T = TypeVar("_T")


def blocking(start: Callable[[], _T]) -> _T:
    """Call ``start`` (an ``*_async`` call) for a caller that waits on its handles right away.

    The engine thread is then not woken: the wait runs the engine's cycle on the caller's thread
    (:meth:`hvdlite.engine.Engine.drive`), which saves two thread hand-offs per blocking call.
    Framework adapters use it for their blocking collectives.
    """
    caller = current().caller
    caller.waits = True
    try:
        return start()
    finally:
        caller.waits = False


def _target(process_set: ProcessSet | None, collective: Collective, name: str | None) -> Communicator:
    """The communicator a collective on ``process_set`` runs on (a clear error if it cannot run here)."""
    return current().communicators.of(process_set, collective, name)


def _submit(pairs: list[tuple[RequestMeta, np.ndarray | None]], target: Communicator,
            outputs: Sequence[np.ndarray | None] | None = None) -> list[Handle]:
    outputs = outputs if outputs is not None else [None] * len(pairs)
    requests = [Request(meta, tensor, Handle(meta.name), output)
                for (meta, tensor), output in zip(pairs, outputs, strict=True)]
    target.engine.submit(requests, wake=not getattr(current().caller, "waits", False))
    return [r.handle for r in requests]


def _submit_one(meta: RequestMeta, tensor: np.ndarray | None, output: np.ndarray | None,
                runtime: Runtime, target: Communicator) -> Handle:
    """:func:`_submit` for one request (most calls), without the lists."""
    request = Request(meta, tensor, Handle(meta.name), output)
    target.engine.submit([request], wake=not getattr(runtime.caller, "waits", False))
    return request.handle


def _check_outputs(outputs: Sequence[np.ndarray] | None, arrays: list[np.ndarray], names: list[str]) -> None:
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


def _reduction_meta(collective: Collective, array: np.ndarray | DeviceArray, name: str, op: ReduceOp,
                    prescale: float, postscale: float) -> RequestMeta:
    """The checked description of a reduction, remembered by the runtime (the same call repeats every step)."""
    return current().descriptions.reduction(collective, array, name, op, prescale, postscale)


# ---- allreduce -----------------------------------------------------------------------------------
def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    output: np.ndarray | None = None, process_set: ProcessSet | None = None) -> Handle:
    """Start reducing ``tensor`` across the ranks of ``process_set`` (default: every rank; default
    op: Average). Returns a handle.

    With ``output`` (which may be ``tensor`` itself) the result is written there, in place.
    """
    resolved = resolve_op(op, average)
    runtime = current()  # once: this is the small-tensor hot path
    target = runtime.communicators.of(process_set, Collective.ALLREDUCE, name)
    member = target.names.resolve(name, Collective.ALLREDUCE)
    array = _array(tensor)
    if output is not None:
        _check_outputs([output], [array], [member])
    meta = runtime.descriptions.reduction(Collective.ALLREDUCE, array, member, resolved, prescale_factor,
                                          postscale_factor)
    return _submit_one(meta, array, output, runtime, target)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``tensor`` across the ranks of ``process_set`` and return the result (a new array)."""
    return synchronize(blocking(lambda: allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                                        process_set=process_set)))


def prepare_allreduce(array: np.ndarray, name: str, op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> RequestMeta:
    """Check an allreduce once and return its description, for :func:`allreduce_prepared_async`.

    For callers that reduce the same named tensor every step (an optimizer's gradients): the
    argument checks and the description are built once instead of per step.
    """
    return describe_reduction(Collective.ALLREDUCE, _array(array), name, resolve_op(op), prescale_factor,
                              postscale_factor)


def allreduce_prepared_async(meta: RequestMeta, array: np.ndarray, process_set: ProcessSet | None = None) -> Handle:
    """Start reducing ``array`` in place, as described by ``meta`` from :func:`prepare_allreduce`.

    ``array`` must have the prepared shape and dtype (checked: two comparisons, not the full checks).
    """
    if array.shape != meta.shape or dtypes.NAME_OF.get(array.dtype) != meta.dtype or device_of(array) != meta.device:
        raise UnsupportedOperationError(
            f"tensor {meta.name!r} was prepared as {meta.dtype}{list(meta.shape)} on {meta.device}, got "
            f"{array.dtype}{list(array.shape)} on {device_of(array)}")
    if isinstance(array, np.ndarray) and not (array.flags.c_contiguous and array.flags.writeable):
        raise UnsupportedOperationError(f"tensor {meta.name!r} must be C-contiguous and writable to reduce in place")
    request = Request(meta, array, Handle(meta.name), array)
    _target(process_set, Collective.ALLREDUCE, meta.name).engine.submit([request])
    return request.handle


def prepare_segmented_allreduce(name: str, dtype: np.dtype, size: int, op: ReduceOp | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> RequestMeta:
    """Describe an in-place allreduce of ``size`` elements of ``dtype`` held in pieces
    (:class:`~hvdlite.segments.Segments`), for :func:`allreduce_segments_async`."""
    described = np.broadcast_to(np.zeros((), dtype), (size,))  # shape and dtype only: nothing allocated
    return _reduction_meta(Collective.ALLREDUCE, described, name, resolve_op(op), prescale_factor, postscale_factor)


def allreduce_segments_async(meta: RequestMeta, segments: Segments, process_set: ProcessSet | None = None) -> Handle:
    """Start reducing ``segments`` in place, as one tensor described by ``meta``.

    The pieces are resolved on the engine thread; the handle's result is ``segments``.
    """
    if segments.size != math.prod(meta.shape) or dtypes.NAME_OF.get(segments.dtype) != meta.dtype:
        raise UnsupportedOperationError(
            f"tensor {meta.name!r} was prepared as {meta.dtype}{list(meta.shape)}, got {segments!r}")
    request = Request(meta, segments, Handle(meta.name), segments)
    _target(process_set, Collective.ALLREDUCE, meta.name).engine.submit([request])
    return request.handle


def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: ReduceOp | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, outputs: Sequence[np.ndarray] | None = None,
                            process_set: ProcessSet | None = None) -> list[Handle]:
    """Start reducing several tensors as one group (negotiated together, fused where possible).

    ``outputs``, if given, are arrays (one per tensor, possibly the tensors themselves) that
    receive the results in place.
    """
    resolved = resolve_op(op, average)
    target = _target(process_set, Collective.ALLREDUCE, name)
    names = group_member_names(target.names.resolve(name, Collective.ALLREDUCE), len(tensors))
    arrays = [_array(t) for t in tensors]
    _check_outputs(outputs, arrays, names)
    return _submit([(_reduction_meta(Collective.ALLREDUCE, a, n, resolved, prescale_factor, postscale_factor), a)
                    for a, n in zip(arrays, names, strict=True)], target, outputs)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Reduce several tensors as one group and return the results in order."""
    handles = blocking(lambda: grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                                       process_set=process_set))
    return [synchronize(h) for h in handles]


# ---- allgather -----------------------------------------------------------------------------------
def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None, _single: bool = False,
                            process_set: ProcessSet | None = None) -> list[Handle]:
    """Start gathering several tensors; each may have a different first dimension on each rank."""
    target = _target(process_set, Collective.ALLGATHER, name)
    base = target.names.resolve(name, Collective.ALLGATHER)
    names = [base] if _single else group_member_names(base, len(tensors))
    pairs = []
    for tensor, member in zip(tensors, names, strict=True):
        array = _array(tensor)
        if array.ndim == 0:
            raise UnsupportedOperationError(f"allgather of tensor {member!r} needs at least one dimension, got a scalar")
        pairs.append((RequestMeta(member, Collective.ALLGATHER, dtypes.dtype_name(array, member), tuple(array.shape),
                                  device=device_of(array)), array))
    return _submit(pairs, target)


def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> Handle:
    return grouped_allgather_async([tensor], name, _single=True, process_set=process_set)[0]


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet | None = None) -> np.ndarray:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order."""
    return synchronize(blocking(lambda: allgather_async(tensor, name, process_set)))


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet | None = None) -> list[np.ndarray]:
    return [synchronize(h) for h in blocking(lambda: grouped_allgather_async(tensors, name, process_set=process_set))]


# ---- broadcast -----------------------------------------------------------------------------------
def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    output: np.ndarray | None = None, process_set: ProcessSet | None = None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank (into ``output`` if given, in place).

    ``root_rank`` is a rank of the job; with a ``process_set``, one of the set's members.
    """
    target = _target(process_set, Collective.BROADCAST, name)
    member = target.names.resolve(name, Collective.BROADCAST)
    root = root_in(target, root_rank, f"broadcast of tensor {member!r}")
    array = _array(tensor)
    meta = RequestMeta(member, Collective.BROADCAST, dtypes.dtype_name(array, member), tuple(array.shape),
                       root_rank=root, device=device_of(array))
    outputs = None if output is None else [output]
    _check_outputs(outputs, [array], [member])
    return _submit([(meta, array)], target, outputs)[0]


def root_in(target: Communicator, root_rank: Any, what: str) -> int:
    """``root_rank`` (a rank of the job) as a rank of ``target``'s communicator, checked."""
    ranks = target.process_set.ranks
    if not isinstance(root_rank, (int, np.integer)) or int(root_rank) not in ranks:
        where = f"[0, {target.size})" if target.process_set.process_set_id == 0 else \
            f"process set {target.process_set.process_set_id}'s ranks {ranks}"
        raise UnsupportedOperationError(f"{what}: root_rank={root_rank!r} is not in {where}")
    return ranks.index(int(root_rank))


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Return ``root_rank``'s ``tensor`` on every rank (a new array)."""
    return synchronize(blocking(lambda: broadcast_async(tensor, root_rank, name, process_set=process_set)))


# ---- alltoall ------------------------------------------------------------------------------------
def alltoall_async(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None,
                   process_set: ProcessSet | None = None) -> Handle:
    """Start sending ``splits[r]`` first-dimension slices to rank r (equal parts if ``splits`` is None).

    With a ``process_set``, r counts the set's members in order.
    """
    target = _target(process_set, Collective.ALLTOALL, name)
    size = target.size
    member = target.names.resolve(name, Collective.ALLTOALL)
    array = _array(tensor)
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
    meta = RequestMeta(member, Collective.ALLTOALL, dtypes.dtype_name(array, member), tuple(array.shape),
                       splits=tuple(split_list), device=device_of(array))
    return _submit([(meta, array)], target)[0]


def alltoall(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scatter slices of ``tensor`` to every rank; returns (received data, rows received per rank)."""
    return synchronize(blocking(lambda: alltoall_async(tensor, splits, name, process_set)))


# ---- reducescatter -------------------------------------------------------------------------------
def grouped_reducescatter_async(tensors: Sequence[Any], op: ReduceOp | None = None, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                _single: bool = False, process_set: ProcessSet | None = None) -> list[Handle]:
    """Start reducing each tensor and leaving rank r its r-th block of rows."""
    resolved = resolve_op(op)
    target = _target(process_set, Collective.REDUCESCATTER, name)
    base = target.names.resolve(name, Collective.REDUCESCATTER)
    names = [base] if _single else group_member_names(base, len(tensors))
    if resolved not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise UnsupportedOperationError(f"reducescatter of {base!r} supports Sum and Average, not {resolved.name}")
    pairs = []
    for tensor, member in zip(tensors, names, strict=True):
        array = _array(tensor)
        if array.ndim == 0:
            raise UnsupportedOperationError(f"reducescatter of tensor {member!r} needs at least one dimension")
        meta = _reduction_meta(Collective.REDUCESCATTER, array, member, resolved, prescale_factor, postscale_factor)
        pairs.append((meta, array))
    return _submit(pairs, target)


def reducescatter_async(tensor: Any, op: ReduceOp | None = None, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: ProcessSet | None = None) -> Handle:
    return grouped_reducescatter_async([tensor], op, name, prescale_factor, postscale_factor, _single=True,
                                       process_set=process_set)[0]


def reducescatter(tensor: Any, op: ReduceOp | None = None, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``tensor`` and return this rank's block of rows (first ranks get one extra row)."""
    return synchronize(blocking(lambda: reducescatter_async(tensor, op, name, prescale_factor, postscale_factor,
                                                            process_set)))


def grouped_reducescatter(tensors: Sequence[Any], op: ReduceOp | None = None, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet | None = None) -> list[np.ndarray]:
    handles = blocking(lambda: grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                                           process_set=process_set))
    return [synchronize(h) for h in handles]


# ---- barrier, join, handles ----------------------------------------------------------------------
def barrier(process_set: ProcessSet | None = None) -> None:
    """Return once every rank (of ``process_set``) has called ``barrier()``."""
    target = _target(process_set, Collective.BARRIER, None)
    name = target.names.next(Collective.BARRIER)
    synchronize(blocking(lambda: _submit([(RequestMeta(name, Collective.BARRIER), None)], target))[0])


def join(process_set: ProcessSet | None = None) -> int:
    """Declare this rank out of data. Until every rank joins, others' allreduces count it as zeros.

    Returns the rank that joined last (a rank of the job).
    """
    target = _target(process_set, Collective.JOIN, "join")
    last = synchronize(_submit([(RequestMeta("join", Collective.JOIN), None)], target)[0])
    return target.process_set.ranks[last]


def poll(handle: Handle | MappedHandle) -> bool:
    """True if the operation behind ``handle`` has finished (never blocks)."""
    return handle.done()


def synchronize(handle: Handle | MappedHandle) -> Any:
    """Wait for ``handle`` and return its result, or raise the operation's error."""
    return handle.wait()

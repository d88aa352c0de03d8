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

from .core import runtime as runtime_state
from .core.arguments import (
    allgather_pairs,
    alltoall_meta,
    as_array,
    broadcast_meta,
    check_outputs,
    one_device,
    reducescatter_pairs,
    reduction_meta,
)
from .core.communicators import Communicator
from .core.describe import describe_reduction, device_of
from .core.runtime import Runtime, current
from .core.work.naming import group_member_names
from .core.work.request import GroupHandle, Handle, MappedHandle, Request, RequestMeta
from .core.work.segments import Segments
from .errors import UnsupportedOperationError
from .gpu.arrays import DeviceArray
from .ops import Collective, ReduceOp, resolve_op
from .process_sets import ProcessSet, global_process_set
from .utils import dtypes

_T = TypeVar("_T")
# The collectives on NumPy arrays that ``hvdlite`` exports; the rest here serves the adapters.
__all__ = ["allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather",
           "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async",
           "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "barrier", "join", "poll", "synchronize"]


def blocking(start: Callable[[], _T]) -> _T:
    """Call ``start`` (an ``*_async`` call) for a caller that waits on its handles right away.

    The engine thread is then not woken: the wait runs the engine's cycle on the caller's thread
    (:meth:`hvdlite.core.engine.Engine.drive`), which saves two thread hand-offs per blocking call.
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


def _give_back(target: Communicator, name: str | None, collective: Collective) -> None:
    """After a call failed on this rank before reaching its peers: give back the name it generated,
    so that this rank's later unnamed collectives keep the same names as its peers'."""
    if name is None:
        target.names.undo(collective)


def _submit(pairs: list[tuple[RequestMeta, np.ndarray | None]], target: Communicator,
            outputs: Sequence[np.ndarray | None] | None = None) -> GroupHandle:
    if len(pairs) > 1:
        pairs = one_device(pairs, target)
    outputs = outputs if outputs is not None else [None] * len(pairs)
    requests = [Request(meta, tensor, Handle(meta.name), output)
                for (meta, tensor), output in zip(pairs, outputs, strict=True)]
    target.engine.submit(requests, wake=not getattr(current().caller, "waits", False))
    return GroupHandle(r.handle for r in requests)


def _submit_one(meta: RequestMeta, tensor: np.ndarray | None, output: np.ndarray | None,
                runtime: Runtime, target: Communicator) -> Handle:
    """:func:`_submit` for one request (most calls), without the lists."""
    request = Request(meta, tensor, Handle(meta.name), output)
    target.engine.submit([request], wake=not getattr(runtime.caller, "waits", False))
    return request.handle


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
    try:
        array = as_array(tensor)
        if output is not None and (output is not array or isinstance(array, np.ndarray)):
            check_outputs([output], [array], [member])  # a device array in place needs no check
        meta = runtime.descriptions.reduction(Collective.ALLREDUCE, array, member, resolved, prescale_factor,
                                              postscale_factor)
        return _submit_one(meta, array, output, runtime, target)
    except BaseException:
        _give_back(target, name, Collective.ALLREDUCE)
        raise


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = None) -> np.ndarray:
    """Reduce ``tensor`` across the ranks of ``process_set`` and return the result (a new array)."""
    if name is not None and tensor.__class__ is np.ndarray:  # the small-op path (hvdlite.core.pipeline.lone)
        runtime = runtime_state._runtime or current()  # current() raises the error when not initialized
        engine = (runtime.engine if process_set is None
                  else runtime.communicators.of(process_set, Collective.ALLREDUCE, name).engine)
        result = engine.lone_allreduce(tensor, (name, tensor.dtype, tensor.shape, op, average, prescale_factor,
                                                postscale_factor))
        if result is not None:
            return result
    return synchronize(blocking(lambda: allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                                        process_set=process_set)))


def small_allreduce_in_place(array: DeviceArray, average: bool | None, name: str | None, op: ReduceOp | None,
                             prescale_factor: float, postscale_factor: float,
                             process_set: ProcessSet | None = None) -> bool:
    """For adapters' blocking in-place calls: reduce ``array``, a device array on its caller's stream
    (no ready event: the caller waits), in place through the small-op path
    (``hvdlite.core.pipeline.lone``) and return True; False, having sent nothing, where the call must
    take the regular path (``allreduce_async`` with ``output=array``)."""
    if name is None or array.ready is not None or array.stream is None:  # not on its stream: the regular path
        return False
    runtime = runtime_state._runtime or current()  # current() raises the error when not initialized
    engine = (runtime.engine if process_set is None or process_set is global_process_set
              else runtime.communicators.of(process_set, Collective.ALLREDUCE, name).engine)
    key = (name, array.dtype, array.shape, op, average, prescale_factor, postscale_factor, array.device)
    return engine.lone_allreduce(array, key) is not None


def small_allreduce_host(array: np.ndarray, average: bool | None, name: str | None, op: ReduceOp | None,
                         prescale_factor: float, postscale_factor: float,
                         process_set: ProcessSet | None = None) -> bool:
    """:func:`small_allreduce_in_place` for a host array (a contiguous CPU tensor's own memory): its
    result, a new array on the small-op path, is copied into ``array``. A function of its own, so
    that the device path's bytecodes stay as they were."""
    if name is None:
        return False
    runtime = runtime_state._runtime or current()  # current() raises the error when not initialized
    engine = (runtime.engine if process_set is None or process_set is global_process_set
              else runtime.communicators.of(process_set, Collective.ALLREDUCE, name).engine)
    result = engine.lone_allreduce(array, (name, array.dtype, array.shape, op, average, prescale_factor,
                                           postscale_factor))
    if result is None:
        return False
    np.copyto(array, result)
    return True


def prepare_allreduce(array: np.ndarray, name: str, op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> RequestMeta:
    """Check an allreduce once and return its description, for :func:`allreduce_prepared_async`.

    For callers that reduce the same named tensor every step (an optimizer's gradients): the
    argument checks and the description are built once instead of per step.
    """
    return describe_reduction(Collective.ALLREDUCE, as_array(array), name, resolve_op(op), prescale_factor,
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
    (:class:`~hvdlite.core.work.segments.Segments`), for :func:`allreduce_segments_async`."""
    described = np.broadcast_to(np.zeros((), dtype), (size,))  # shape and dtype only: nothing allocated
    return reduction_meta(Collective.ALLREDUCE, described, name, resolve_op(op), prescale_factor, postscale_factor)


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
                            process_set: ProcessSet | None = None) -> GroupHandle:
    """Start reducing several tensors as one group (negotiated together, fused where possible).

    ``outputs``, if given, are arrays (one per tensor, possibly the tensors themselves) that
    receive the results in place.
    """
    resolved = resolve_op(op, average)
    target = _target(process_set, Collective.ALLREDUCE, name)
    names = group_member_names(target.names.resolve(name, Collective.ALLREDUCE), len(tensors))
    try:
        arrays = [as_array(t) for t in tensors]
        check_outputs(outputs, arrays, names)
        return _submit([(reduction_meta(Collective.ALLREDUCE, a, n, resolved, prescale_factor, postscale_factor), a)
                        for a, n in zip(arrays, names, strict=True)], target, outputs)
    except BaseException:
        _give_back(target, name, Collective.ALLREDUCE)
        raise


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet | None = None) -> list[np.ndarray]:
    """Reduce several tensors as one group and return the results in order."""
    handles = blocking(lambda: grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                                       process_set=process_set))
    return [synchronize(h) for h in handles]


# ---- allgather -----------------------------------------------------------------------------------
def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None, _single: bool = False,
                            process_set: ProcessSet | None = None) -> GroupHandle:
    """Start gathering several tensors; each may have a different first dimension on each rank."""
    target = _target(process_set, Collective.ALLGATHER, name)
    base = target.names.resolve(name, Collective.ALLGATHER)
    try:
        return _submit(allgather_pairs(tensors, [base] if _single else group_member_names(base, len(tensors))), target)
    except BaseException:
        _give_back(target, name, Collective.ALLGATHER)
        raise


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
    try:
        array = as_array(tensor)
        outputs = None if output is None else [output]
        check_outputs(outputs, [array], [member])
        return _submit([(broadcast_meta(target, array, root_rank, member), array)], target, outputs)[0]
    except BaseException:
        _give_back(target, name, Collective.BROADCAST)
        raise


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
    member = target.names.resolve(name, Collective.ALLTOALL)
    try:
        array = as_array(tensor)
        return _submit([(alltoall_meta(target.size, array, splits, member), array)], target)[0]
    except BaseException:
        _give_back(target, name, Collective.ALLTOALL)
        raise


def alltoall(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None,
             process_set: ProcessSet | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scatter slices of ``tensor`` to every rank; returns (received data, rows received per rank)."""
    return synchronize(blocking(lambda: alltoall_async(tensor, splits, name, process_set)))


# ---- reducescatter -------------------------------------------------------------------------------
def grouped_reducescatter_async(tensors: Sequence[Any], op: ReduceOp | None = None, name: str | None = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                _single: bool = False, process_set: ProcessSet | None = None) -> GroupHandle:
    """Start reducing each tensor and leaving rank r its r-th block of rows."""
    resolved = resolve_op(op)
    target = _target(process_set, Collective.REDUCESCATTER, name)
    base = target.names.resolve(name, Collective.REDUCESCATTER)
    names = [base] if _single else group_member_names(base, len(tensors))
    try:
        return _submit(reducescatter_pairs(tensors, names, base, resolved, prescale_factor, postscale_factor), target)
    except BaseException:
        _give_back(target, name, Collective.REDUCESCATTER)
        raise


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

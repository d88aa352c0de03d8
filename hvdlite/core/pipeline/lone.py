"""The small-op path: a blocking, named, small allreduce run by its caller in one exchange.

In steady state a blocking small allreduce (a loss, a metric, a step counter) is one cycle with
one request, which the response cache answers: every rank sends the same vector with its tensor
beside it (shared memory; see :meth:`~.negotiate.Negotiator.agree_lone`), and each reduces every
rank's copy itself. :class:`LonePath` runs exactly that on the caller's thread, and nothing else:
no request, handle or queue entry, no fusion plan, no executor. What a name's calls share (the
checked description, the tensor's place in the shared slots, the result's storage type, the
reduction and its scaling) is built once, in a :class:`LoneAllreduce`. A device tensor, reduced in
place, exchanges the vector alone and is launched on its caller's stream (:class:`LoneDeviceAllreduce`).

It sends what :meth:`~.communicator.Pipeline._cycle_lone` sends, into the same slots, so a peer
taking either path (its engine thread's idle cycle, a first call, any request) agrees with it.
Whenever the steady state does not hold, the regular path runs: before the exchange (a cache
miss, a timeline, autotune, other work queued, names waiting at the coordinator) the call takes
the regular path from the start; after it (a peer sent another vector: another request, a flag, a
join, a flush, a stall scan) the call becomes an ordinary pending request in this very cycle, and
the regular cycles finish it. Names checked across ranks, stall inspection, join, process sets and
errors instead of hangs are therefore the regular path's, unchanged; the engine lends its cycle
lock, Ctrl-C deferral and failure handling (:class:`EngineParts`).
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from ... import errors
from ...gpu.arrays import DeviceArray
from ...ops import Collective, resolve_op
from ...utils import dtypes
from ...utils.buffers import ALIGNMENT, small_storage_type
from ...utils.interrupts import SigintGuard
from ...utils.overflow import enter as _enter
from ...utils.overflow import ignoring as _ignoring
from ...utils.overflow import restore as _restore
from ..planes.host import HostPlane
from ..transport.base import Carrier, SoleRankCarrier, VectorCarrier
from ..transport.shm import UFUNCS
from ..work.request import Handle, Request, RequestMeta, checked_reduction
from ..work.response import Response

if TYPE_CHECKING:
    from .autotune import Autotuner
    from .execute import Executor
    from .negotiate import Agreement, Negotiator
    from .queue import RequestQueue
    from .timeline import Timeline

_ndarray, _addressof, _multiply = np.ndarray, ctypes.addressof, np.multiply
# (name, dtype, shape, op, average, prescale, postscale): a call's arguments, as the caller passed them;
# then the device, for a device tensor.
LoneKey = tuple


class LoneAllreduce:
    """What every call of one named small allreduce reuses (built by :meth:`LonePath.learn`).

    :attr:`finish` reduces every rank's tensor in rank order, then scales, into a fresh aligned
    array: the arithmetic of :meth:`HostPlane.reduce_carried` (the same ufunc, order and factor),
    so every rank, on either path, gets the same bits. Overflow to inf (and inf - inf) is a
    result, as in MPI, not a warning. Two ranks' floats, the common case, have a method of their
    own, chosen once: the small-op path's bytecodes are its cost, and the general method's loop,
    tests and calls were a sixth of them.
    """

    __slots__ = ("meta", "carrier", "carried", "vectors", "shape", "dtype", "storage", "ufunc", "scale", "factor",
                 "floating", "finish")
    in_place = False  # the result is a fresh array

    def __init__(self, meta: RequestMeta, carrier: Carrier, dtype: np.dtype, ufunc: np.ufunc, host: HostPlane) -> None:
        self.meta = meta
        self.carrier = carrier
        self.carried = host.size > 1  # one rank has no peer to carry to (lone_vector's choice too)
        self.vectors: dict[int, bytes] = {}
        self.shape = meta.shape
        self.dtype = dtype
        self.storage = small_storage_type(dtype.itemsize * math.prod(meta.shape))
        self.ufunc = ufunc
        self.scale = host.postscaler(meta.dtype, meta.op, meta.postscale)
        self.floating = dtype.kind == "f"
        self.factor = host.float_postscale(meta.op, meta.postscale) if self.floating else None
        # (every rank's tensor, this rank's) -> the result
        self.finish: Callable[[Sequence[np.ndarray], np.ndarray], np.ndarray] = self._general
        if self.floating and host.size == 2:
            self.finish = self._two_floats

    def _two_floats(self, tensors: Sequence[np.ndarray], tensor: np.ndarray) -> np.ndarray:
        storage = self.storage()
        result = _ndarray(self.shape, self.dtype, storage, -_addressof(storage) % ALIGNMENT)
        token = _enter(_ignoring())
        try:
            self.ufunc(tensors[0], tensors[1], out=result)
            if self.factor is not None:
                _multiply(result, self.factor, out=result)  # what HostPlane.postscaler's scale does
        finally:
            _restore(token)
        return result

    def _general(self, tensors: Sequence[np.ndarray], tensor: np.ndarray) -> np.ndarray:
        storage = self.storage()
        result = _ndarray(self.shape, self.dtype, storage, -_addressof(storage) % ALIGNMENT)
        token = _enter(_ignoring()) if self.floating else None
        try:
            if len(tensors) == 1:
                result[...] = tensors[0]
            else:
                ufunc = self.ufunc
                ufunc(tensors[0], tensors[1], out=result)
                for tensor in tensors[2:]:
                    ufunc(result, tensor, out=result)
            if self.scale is not None:
                self.scale(result)
        finally:
            if token is not None:
                _restore(token)
        return result


class LoneDeviceAllreduce:
    """What every call of one named small allreduce of a device tensor, in place, reuses: the vector
    alone is exchanged (device memory cannot ride along), and NCCL reduces the tensor on its
    caller's stream with the launch the regular path uses for the same call (``NcclPlane.lone_launch``)."""

    __slots__ = ("meta", "carrier", "carried", "vectors", "finish", "_plane", "_launch", "_responses")
    in_place = True

    def __init__(self, meta: RequestMeta, carrier: Carrier, plane: LonePlane, launch: tuple) -> None:
        self.meta = meta
        self.carrier = carrier
        self.carried = False  # as lone_vector says it for a device tensor
        self.vectors: dict[int, bytes] = {}
        self._plane, self._launch, self._responses = plane, launch, (Response(meta),)
        self.finish = self._launched

    def _launched(self, received: Sequence, array: DeviceArray) -> DeviceArray:
        self._plane.lone_launch(array.ptr, array.ptr, self._launch, array.stream, self._responses)
        return array


class LonePlane(Protocol):
    """What a GPU plane offers the small-op path (:class:`~hvdlite.core.planes.nccl.NcclPlane` does)."""

    def lone_launch_plan(self, meta: RequestMeta) -> tuple | None: ...

    def lone_launch(self, send: int, recv: int, launch: tuple, stream: int,
                    responses: tuple[Response, ...]) -> None: ...


class EngineParts(NamedTuple):
    """What the engine lends the small-op path: a call is a cycle, run as the engine runs its own."""

    cycle_lock: threading.Lock  # held for each cycle by whichever thread runs it
    drivers: set[int]  # threads running cycles in Engine.drive now
    sigint: SigintGuard  # holds Ctrl-C back during a cycle
    fail: Callable[[BaseException], None]  # a failed cycle: fail every pending request, or end the job
    drive: Callable[[Handle], None]  # runs cycles for a waiting handle (Engine.drive)


class PipelineView(Protocol):
    """What the small-op path uses of the pipeline that holds it (``communicator.Pipeline``, which
    imports this module): its queue, negotiator and executor, and whether a tuner or a timeline
    wants every cycle in full."""

    rank: int
    size: int
    queue: RequestQueue
    negotiator: Negotiator
    executor: Executor
    timeline: Timeline | None

    @property
    def tuner(self) -> Autotuner | None: ...

    def run_agreed(self, agreement: Agreement) -> None: ...


class LonePath:
    """One pipeline's small-op path: :meth:`allreduce`."""

    LIMIT = 1024  # entries kept; many names (generated ones never come here) start over

    def __init__(self, pipeline: PipelineView, control: object) -> None:
        self._pipeline = pipeline
        self._queue = pipeline.queue
        self._negotiator = pipeline.negotiator
        self._host: HostPlane = pipeline.executor.host
        self._control = control
        self.entries: dict[LoneKey, LoneAllreduce | LoneDeviceAllreduce | bool] = {}  # False: it cannot take the path
        self._lent: EngineParts | None = None

    def lend(self, parts: EngineParts) -> None:
        """What the engine lends this path (see :class:`EngineParts`); before the first call."""
        self._lent = parts
        self._cycle_lock, self._drivers, self._sigint = parts.cycle_lock, parts.drivers, parts.sigint

    def learn(self, key: LoneKey, tensor: np.ndarray | DeviceArray) -> LoneAllreduce | LoneDeviceAllreduce | bool:
        """The entry for calls with ``key`` on tensors like ``tensor``, built once; False if they
        cannot take this path (they need a conversion, scaling before the sum, or are too large)."""
        name, _, _, op, average, prescale, postscale = key[:7]
        device = tensor.device if tensor.__class__ is DeviceArray else "cpu"
        try:
            meta = checked_reduction(Collective.ALLREDUCE, tensor, name, resolve_op(op, average), prescale, postscale,
                                     device)
        except (errors.HvdliteError, ValueError, TypeError):
            return False  # the regular path raises it, naming the tensor (not remembered: it fails every time)
        if self._pipeline.tuner is not None:  # autotune: rank 0 cycles in full
            entry: LoneAllreduce | LoneDeviceAllreduce | bool = False
        elif device == "cpu":
            entry = self._host_entry(meta, tensor)
        else:
            plane = self._pipeline.executor.gpu_plane
            if plane is None:  # the job chooses its GPU plane on its first device item: ask again after it
                return False
            launch = plane.lone_launch_plan(meta) if hasattr(plane, "lone_launch_plan") else None
            # The vector alone (device memory cannot ride along); with no peer, not even that.
            carrier = SoleRankCarrier() if self._pipeline.size == 1 else VectorCarrier(self._control.band)
            entry = LoneDeviceAllreduce(meta, carrier, plane, launch) if launch else False
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        self.entries[key] = entry
        return entry

    def _host_entry(self, meta: RequestMeta, tensor: np.ndarray) -> LoneAllreduce | bool:
        if not HostPlane.can_carry(meta, tensor):
            return False
        carrier = self._control.carrier(self._negotiator.vector_bytes, tensor.dtype, tensor.shape)
        if carrier is None:
            return False
        return LoneAllreduce(meta, carrier, tensor.dtype, UFUNCS[dtypes.wire_op(meta.dtype, meta.op)], self._host)

    def allreduce(self, tensor: np.ndarray | DeviceArray, key: LoneKey) -> np.ndarray | DeviceArray | None:
        """A blocking allreduce of ``tensor`` run now, on the caller's thread; None, having sent
        nothing, when the call must take the regular path. A host tensor's result is a new array;
        a device tensor (on its caller's stream) is reduced in place and returned.

        ``key``: (name, dtype, shape, op, average, prescale, postscale) as the caller passed them,
        then the device for a device tensor.
        Taken only while the engine is idle (no cycle running, no caller driving, nothing queued)
        and the steady state holds; see the module's docstring.
        """
        entry = self.entries.get(key)
        if entry is None:
            entry = self.learn(key, tensor)
        queue = self._queue
        if not entry or self._drivers or queue.names_in_flight or queue.stopped or self._pipeline.timeline is not None:
            return None
        if not self._cycle_lock.acquire(False) and not self._after_engine_cycle():
            return None
        sigint = self._sigint
        held = sigint.hold()  # Ctrl-C waits for the end of the cycle, as in Engine.drive
        try:
            exchanged = self._negotiator.steady_exchange(entry, tensor)
            if exchanged is None:
                return None
            if exchanged[1] is not None:  # every rank sent this vector (host tensors came with it)
                return entry.finish(exchanged[1], tensor)
            request = self._adopt(entry, tensor, exchanged[0])
        except BaseException as exc:  # handled as a failed cycle: every pending request fails with it
            self._lent.fail(exc)
            fatal = queue.fatal
            raise type(fatal)(str(fatal)) from fatal
        finally:
            self._cycle_lock.release()
            if held:
                sigint.release()
        return request.handle.wait()  # a peer wanted something else: wait as for any request

    def _after_engine_cycle(self) -> bool:
        """The engine thread is running a cycle (an idle one, or the one that delivered this thread's
        previous result and still holds the lock): wait for it to end, then hold the lock; False if
        the path is closed by then.

        Not handed over: the engine thread runs at a low priority, so a call it runs waits for a
        core behind every busy thread, and the next call, finding it still finishing, would be
        handed over too. Measured at np=3 on two cores: runs of calls at 10-15 ms each instead of 35 us.
        """
        self._cycle_lock.acquire()
        queue = self._queue
        if self._drivers or queue.names_in_flight or queue.stopped:
            self._cycle_lock.release()
            return False
        return True

    def _adopt(self, entry: LoneAllreduce | LoneDeviceAllreduce, tensor: np.ndarray | DeviceArray,
               reduced: bytes) -> Request:
        """Make the call a pending request and finish this cycle as a regular one, from ``reduced``."""
        request = Request(entry.meta, tensor, Handle(entry.meta.name), tensor if entry.in_place else None)
        request.handle.driver = self._lent.drive
        if not self._queue.adopt(request):  # another thread queued this name meanwhile
            request.handle.set_error(errors.DuplicateNameError(
                f"tensor name {entry.meta.name!r} already in flight on rank {self._pipeline.rank}; wait for the "
                "earlier operation or give each operation a unique name"))
        self._pipeline.run_agreed(self._negotiator.settle_lone(reduced, self._queue.pending))
        return request

    def close(self) -> None:
        """Forget every entry (their arrays look into the control channel's shared memory)."""
        self.entries.clear()


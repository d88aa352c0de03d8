"""Runs device work items with NCCL on the GPU: no host round trip, fusion in device memory.

Ordering: the plane's own CUDA stream first waits on each input's ready event (recorded on the
framework's stream when the tensor was submitted), then packs, reduces and unpacks. The handles
complete only after an event recorded behind that work has fired, so a result is never handed
back before the collective finished, and the inputs (held by their requests) stay alive until
then. A blocking call's lone in-place allreduce runs on its caller's stream instead (the tensor is
complete there, and so is the result for the caller): one NCCL call and one event, no stream waits.
Whatever stream a launch goes to first waits for the previous launch's event if that was on
another stream, so NCCL calls on the communicator stay in the order every rank issues them.
Waiting polls the event with the job's deadline and NCCL's asynchronous error; a timeout aborts
the communicator so no kernel is left spinning on a dead peer.

With ``HVDLITE_HIERARCHICAL_ALLREDUCE=1`` on several hosts, allreduces go through
:mod:`.hierarchical` (NCCL inside each host, MPI across hosts) instead of one flat NCCL call.
Adasum is hierarchical always, as in Horovod: the average inside each host, Adasum across hosts
(on one host, the average of its ranks).

Fused allreduces whose every member has an output (the optimizer's in-place gradients) pack
into a persistent device fusion buffer and copy back out; members that want new tensors get
views into a fresh buffer, as on the host path. Scale factors and the division of an Average
go into NCCL's pre-multiplied sum; Min/Max/Product, and integers (which NCCL cannot pre-multiply),
scale with cupy before and after, as the host path does (:mod:`hvdlite.gpu.scaling`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ...gpu import completion
from ...gpu.arrays import DEVICE, DeviceArray, cupy_view, from_cupy, storage_dtype
from ...gpu.nccl import Communicator, NcclError
from ...gpu.plans import ReductionPlan, in_place_launch, member_offsets, reduction_plan
from ...gpu.scaling import scale_in_place
from ...ops import Collective, ReduceOp
from ...utils import dtypes
from ...utils.polling import WaitTimeout, wait_until
from ..work.request import Request, RequestMeta
from ..work.response import Response
from . import nccl_moves
from .hierarchical import HierarchicalReducer, supports

_MAX_REMEMBERED = 4096  # in-place launch plans kept (one per gradient of the models in use)


class NcclPlane:
    """The NCCL data plane of one rank: one communicator, one stream, one fusion buffer.

    With ``async_completion`` a dispatch returns as soon as its work is enqueued and each handle
    carries a :class:`~hvdlite.gpu.completion.Completion`; otherwise it returns once the work has
    finished on the GPU (Horovod's default). See :mod:`hvdlite.gpu.completion`.
    """

    name = "NCCL"

    def __init__(self, comm: Communicator, device_id: int, timeout: float | None, poll_seconds: float,
                 hierarchy: HierarchicalReducer | None = None, async_completion: bool = True,
                 hosts_hierarchy: Callable[[], HierarchicalReducer] | None = None) -> None:
        """``hierarchy``: the reducer every allreduce goes through, if asked for; ``hosts_hierarchy``
        makes one (collectively, on first use) for Adasum across hosts: None on a single host."""
        import cupy

        self._cp = cupy
        self._runtime = cupy.cuda.runtime
        self._comm = comm
        self._hierarchy = hierarchy
        self._hosts_hierarchy = hosts_hierarchy
        self._adasum_hierarchy: HierarchicalReducer | None = None
        self._device_id = device_id
        self._timeout = timeout
        self._poll_seconds = poll_seconds
        self._async = async_completion
        with cupy.cuda.Device(device_id):
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._stream_ptr = self._stream.ptr
        self._fusion = None  # persistent device fusion buffer (uint8), grown on demand
        self._in_flight = completion.InFlight(comm.async_error, timeout, describe)
        # The stream of the last launch and the event recorded behind it: a launch on another stream waits for it.
        self._last_stream: int | None = None
        self._last_event: Any = None
        # RequestMeta -> (count, op, factor) for allreduces the lean in-place path runs, () for the others:
        # the same gradient's meta comes back every step.
        self._in_place_launches: dict[Any, tuple] = {}
        self._callers_stream = True  # lone blocking in-place allreduces on the caller's stream (benchmarks compare)

    def close(self) -> None:
        try:
            if not self._comm.aborted:  # an aborted communicator's work never finishes
                self._in_flight.drain(self._poll_seconds)
        finally:
            for reducer in {id(r): r for r in (self._hierarchy, self._adasum_hierarchy) if r is not None}.values():
                reducer.close()
            self._comm.destroy()

    def dispatch(self, responses: tuple[Response, ...], local: Mapping[str, Request]) -> list:
        # One response is the common case (a blocking call, a large gradient): no comprehension to build.
        requests = [local.get(responses[0].meta.name)] if len(responses) == 1 else \
            [local.get(r.meta.name) for r in responses]
        launch = self._in_place_launch(responses, requests)
        if launch is not None and self._callers_stream and requests[0].tensor.on_its_stream:
            request = requests[0]
            self.lone_launch(request.tensor.ptr, request.output.ptr, launch, request.tensor.stream, responses)
            return [request.output]
        previous = self._runtime.getDevice()  # CUDA's current device is per thread: the caller's is restored
        if previous != self._device_id:
            self._runtime.setDevice(self._device_id)
        try:
            return self._on_plane_stream(responses, requests, local, launch)
        finally:
            if previous != self._device_id:
                self._runtime.setDevice(previous)

    # ---- the small-op path (hvdlite.core.pipeline.lone) ----------------------------------------
    def lone_launch_plan(self, meta: RequestMeta) -> tuple | None:
        """What :meth:`lone_launch` needs for a blocking in-place allreduce of ``meta`` (the small-op
        path); None where :meth:`dispatch` would not run it on its caller's stream."""
        if self._hierarchy is not None or not self._callers_stream:
            return None
        return in_place_launch(meta, self._comm.size) or None

    def _on_plane_stream(self, responses: tuple[Response, ...], requests: list[Request | None],
                         local: Mapping[str, Request], launch: tuple | None) -> list:
        """Run the item on the plane's stream, after its inputs' ready events and the previous launch."""
        stream = self._stream_ptr
        self._follow_last_launch(stream)
        for request in requests:
            if request is not None and (ready := request.tensor.ready_event()) is not None:
                completion.stream_waits(stream, ready)
        if launch is not None:
            results = self._launch_in_place(requests[0], launch, stream)
        else:
            with self._stream:  # cupy's own work (fusion copies, scaling) goes on the plane's stream too
                results = self._run(responses, requests, local)
        self._complete(responses, requests, stream)
        return results

    def lone_launch(self, send: int, recv: int, launch: tuple, stream: int, responses: tuple[Response, ...]) -> None:
        """A blocking call's lone in-place allreduce (``launch`` from :meth:`lone_launch_plan`), on
        ``stream``, where its tensor is complete (see the module docstring); also the small-op
        path's launch, which has no request (``hvdlite.core.pipeline.lone``).

        :meth:`_follow_last_launch`, the launch, :meth:`_event_on` and :meth:`_track`, written out:
        every blocking GPU collective runs this. Work in flight is polled once a batch of it built
        up (every cycle polls too): this launch holds nothing, and polling was a tenth of a call.
        """
        runtime, device = self._runtime, self._device_id
        previous = runtime.getDevice()  # CUDA's current device is per thread: the caller's is restored
        if previous != device:
            runtime.setDevice(device)
        try:
            if self._last_stream is not None and self._last_stream != stream:
                completion.stream_waits(stream, self._last_event)
            count, op, factor = launch
            self._comm.allreduce(send, recv, count, responses[0].meta.dtype, op, stream, factor)
            # Same stream for input, collective and caller: nothing to wait for, nothing to hold alive.
            event = completion.Event(device)
            runtime.eventRecord(event.ptr, stream)
            self._last_stream, self._last_event = stream, event
            if not self._async:
                self._wait_finished(responses, event)
            elif self._in_flight.add(event, (), responses) >= completion.REAP_BATCH:
                self.poll()
        finally:
            if previous != device:
                runtime.setDevice(previous)

    def _event_on(self, stream: int) -> Any:
        """A pooled event recorded now on ``stream``: it fires once the work enqueued there so far has."""
        event = completion.Event(self._device_id)
        self._runtime.eventRecord(event.ptr, stream)
        return event

    def _follow_last_launch(self, stream: int) -> None:
        """Order work enqueued on ``stream`` after the previous launch when that went to another stream."""
        if self._last_stream is not None and self._last_stream != stream:
            completion.stream_waits(stream, self._last_event)

    def poll(self) -> None:
        """Between cycles: release finished work's inputs; fail on NCCL's error or the deadline."""
        problem = self._in_flight.check()
        if problem:
            self._comm.abort()  # a kernel waiting on a dead peer would otherwise spin forever
            raise NcclError(problem)

    def _run(self, responses: tuple[Response, ...], requests: list[Request | None],
             local: Mapping[str, Request]) -> list:
        collective = responses[0].meta.collective
        if collective is Collective.ALLREDUCE:
            return self._allreduce(responses, requests)
        (response,) = responses
        request = local[response.meta.name]
        run = {Collective.BROADCAST: nccl_moves.broadcast, Collective.ALLGATHER: nccl_moves.allgather,
               Collective.ALLTOALL: nccl_moves.alltoall, Collective.REDUCESCATTER: nccl_moves.reducescatter}
        return [run[collective](self._comm, self._cp, self._stream_ptr, response, request)]

    def _complete(self, responses: tuple[Response, ...], requests: list[Request | None], stream: int) -> None:
        """Record the completion event on ``stream``; hand it to the handles, or wait for it here."""
        event = self._event_on(stream)
        completions = []
        for request in requests:
            if request is not None and self._async:
                tensor = request.tensor
                request.handle.completion = done = completion.Completion(
                    event, self._device_id, tensor.current_stream, self._timeout, self._poll_seconds, request.meta,
                    (tensor, request.output), tensor.stream)
                completions.append(done)
        # A joined rank's zeros and fresh results live in cupy's pool on this stream: reused only behind it.
        self._track(event, stream, responses, completions)

    def _track(self, event: Any, stream: int, responses: tuple[Response, ...], keep_alive: list) -> None:
        """``event`` marks the end of the launch on ``stream``: watched until it fires, or waited for
        here with host-synchronized completion."""
        self._last_stream, self._last_event = stream, event
        if not self._async:
            self._wait_finished(responses, event)
            return
        self._in_flight.add(event, keep_alive, responses)

    def _reduce(self, send: int, recv: Any, count: int, meta: Any, wire: str, op: ReduceOp, factor: float,
                responses: tuple[Response, ...]) -> None:
        """All-reduce ``count`` elements from ``send`` into the cupy array ``recv``: flat, or hierarchical."""
        if op is ReduceOp.ADASUM:
            self._adasum(send, recv, count, wire, responses)
        elif self._hierarchy is not None and supports(meta.dtype, meta.op):
            self._hierarchy.allreduce(send, recv, count, wire, op, factor, self._stream,
                                      lambda: self._wait_finished(responses))
        else:
            self._comm.allreduce(send, recv.data.ptr, count, wire, op, self._stream_ptr, factor)

    def _adasum(self, send: int, recv: Any, count: int, wire: str, responses: tuple[Response, ...]) -> None:
        """Adasum across hosts of each host's average (:func:`~hvdlite.core.planes.hierarchical.average_then_adasum`)."""
        if self._hosts_hierarchy is None:  # one host: its average is the result
            self._comm.allreduce(send, recv.data.ptr, count, wire, ReduceOp.SUM, self._stream_ptr, 1.0 / self._comm.size)
            return
        if self._adasum_hierarchy is None:  # collective: every rank reaches its first Adasum item together
            self._adasum_hierarchy = self._hierarchy or self._hosts_hierarchy()
        self._adasum_hierarchy.adasum(send, recv, count, wire, self._stream, lambda: self._wait_finished(responses))

    # ---- waiting -----------------------------------------------------------------------------
    def _wait_finished(self, responses: tuple[Response, ...], event: Any = None) -> None:
        """Block until the work enqueued so far finished: a short spin, then sleeps (no spinning core)."""
        if event is None:
            event = self._event_on(self._stream_ptr)

        def finished() -> bool:
            if event.done:
                return True
            failure = self._comm.async_error()
            if failure:
                self._comm.abort()
                raise NcclError(f"NCCL failed during {describe(responses)}: {failure}")
            return False

        try:
            wait_until(finished, completion.HOST_SPIN_SECONDS, self._poll_seconds, self._timeout)
        except WaitTimeout:
            self._comm.abort()  # a kernel waiting on a dead peer would otherwise spin forever
            raise

    # ---- allreduce ---------------------------------------------------------------------------
    def _allreduce(self, responses: tuple[Response, ...], requests: list[Request | None]) -> list:
        cp = self._cp
        meta = responses[0].meta
        wire = dtypes.wire_name(meta.dtype, DEVICE)
        plan = reduction_plan(meta.dtype, meta.op, meta.prescale, meta.postscale, self._comm.size)
        counts = [math.prod(r.meta.shape) for r in responses]
        first = requests[0]
        if len(responses) == 1 and wire == meta.dtype and plan.pre == 1.0:  # decided alike on every rank
            if first is None:  # this rank joined: its zeros go unpadded, as many as its peers reduce
                zeros = cp.zeros(max(counts[0], 1), storage_dtype(wire))
                self._reduce(zeros.data.ptr, zeros, counts[0], meta, wire, plan.op, plan.factor, responses)
                return [from_cupy(zeros[:counts[0]], wire, meta.shape)]
            return [self._allreduce_one(first, counts[0], wire, plan, responses)]
        storage = storage_dtype(wire)
        starts = member_offsets(counts, storage.itemsize)
        everyone_has_output = all(r is not None and r.output is not None for r in requests)
        buffer = self._fusion_buffer(starts[-1], storage) if everyone_has_output else cp.empty(starts[-1], storage)
        for request, start, end, count in zip(requests, starts, starts[1:], counts, strict=False):
            if request is None:  # this rank joined: it contributes zeros
                buffer[start:end] = 0
            else:
                buffer[start:start + count] = cupy_view(request.tensor)  # casts int16 up to int32
                buffer[start + count:end] = 0
        scale_in_place(buffer, wire, plan.pre, cp)
        self._reduce(buffer.data.ptr, buffer, starts[-1], meta, wire, plan.op, plan.factor, responses)
        scale_in_place(buffer, wire, plan.post, cp, plan.divisor)
        results = []
        for response, request, start, count in zip(responses, requests, starts, counts, strict=False):
            piece = buffer[start:start + count]
            if request is not None and request.output is not None:
                cupy_view(request.output)[...] = piece  # device-to-device; int32 back to int16
                results.append(request.output)
            elif response.meta.dtype == wire:
                results.append(from_cupy(piece, wire, response.meta.shape))
            else:
                results.append(from_cupy(piece.astype(storage_dtype(response.meta.dtype)), response.meta.dtype,
                                         response.meta.shape))
        return results

    def _in_place_launch(self, responses: tuple[Response, ...], requests: list[Request | None]) -> tuple | None:
        """(count, op, factor) for the optimizer's case, kept lean (pointers only, no array object, no
        cupy stream switch): one tensor reduced in place in its own dtype with nothing to scale
        around NCCL. None otherwise."""
        request = requests[0]
        if len(responses) != 1 or request is None or request.output is None or self._hierarchy is not None:
            return None
        meta = request.meta
        launch = self._in_place_launches.get(meta)
        if launch is None:
            launch = self._in_place_launches[meta] = in_place_launch(meta, self._comm.size)
            if len(self._in_place_launches) > _MAX_REMEMBERED:
                del self._in_place_launches[next(iter(self._in_place_launches))]
        return launch or None

    def _launch_in_place(self, request: Request, launch: tuple, stream: int) -> list:
        count, op, factor = launch
        self._comm.allreduce(request.tensor.ptr, request.output.ptr, count, request.meta.dtype, op, stream, factor)
        return [request.output]

    def _allreduce_one(self, request: Request, count: int, wire: str, plan: ReductionPlan,
                       responses: tuple[Response, ...]) -> DeviceArray:
        """One tensor in its own dtype: reduced straight from its memory, into its output or a new buffer."""
        output = request.output
        target = cupy_view(output) if output is not None else self._cp.empty(count, storage_dtype(wire))
        self._reduce(request.tensor.ptr, target, count, request.meta, wire, plan.op, plan.factor, responses)
        scale_in_place(target, wire, plan.post, self._cp, plan.divisor)
        return output if output is not None else from_cupy(target, wire, request.meta.shape)

    def _fusion_buffer(self, count: int, storage: np.dtype) -> Any:
        nbytes = count * storage.itemsize
        if self._fusion is None or self._fusion.size < nbytes:
            self._fusion = self._cp.empty(max(nbytes, 1), self._cp.uint8)
        return self._fusion[:nbytes].view(storage)


def describe(responses: tuple[Response, ...]) -> str:
    """``allreduce of ['a', 'b']``: what a device work item is, for errors."""
    return f"{responses[0].meta.collective.name.lower()} of {[r.meta.name for r in responses]}"

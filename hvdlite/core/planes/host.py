"""The host data plane: tensors in host memory, over a :class:`~hvdlite.core.transport.base.Transport`
(MPI, with the shared-memory window inside one host).

This is the only place that turns host responses into buffer operations: packing fused tensors,
widening 16-bit floats to the float32 wire type, scaling, zero contributions for joined ranks,
and handing results back. Outputs of a fused reduction are views into the fresh fusion buffer,
so nothing is copied back out; a large tensor is reduced straight from the caller's array, and
an in-place request (``Request.output`` is its own input) is reduced in the caller's memory with
no copy at all.

Host allreduces overlap: the transport may still be reducing one item when the next starts, and
the item's results are delivered once it finished (see :mod:`hvdlite.core.transport.mpi`).
:meth:`HostPlane.finish` delivers everything still outstanding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from ... import errors
from ...ops import Collective, ReduceOp
from ...utils import dtypes
from ...utils.buffers import aligned_copy, aligned_empty, padded_count
from ...utils.rows import scatter_rows
from ..transport.base import Transport
from ..transport.shm import UFUNCS
from ..work.item import WorkItem
from ..work.request import Request, RequestMeta
from ..work.response import Response
from ..work.segments import Segments
from .base import Outcome, succeeded

# Up to this size a lone allreduce rides with the negotiation's vector (shared memory, one host)
# and each rank reduces every rank's copy itself, instead of a second round through MPI. Measured
# (float32, blocking, the same calls carried / through MPI): np=2 1 KB 16.9 / 22.1 us, 4 KB 18.0 /
# 23.3, 16 KB 17.1 / 35.0, 32 KB 18.4 / 29.8; np=3 4 KB 59.6 / 83.4, 16 KB 58.9 / 123.5, 32 KB
# 63.1 / 104.0. From 32 KiB the shared-memory allreduce (HVDLITE_SHM_MIN_BYTES) takes over.
CARRY_MAX_BYTES = 32 * 1024


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class HostPlane:
    """Runs work items on host (NumPy) tensors; enabled for every item whose tensors live in host memory."""

    name = "host"

    def __init__(self, transport: Transport, rank: int, size: int) -> None:
        self.transport = transport
        self.rank = rank
        self.size = size

    def enabled_for(self, item: WorkItem) -> bool:
        return item.responses[0].meta.device == "cpu"

    def run(self, item: WorkItem, local: Mapping[str, Request]) -> list:
        """Execute ``item`` now; one result per response."""
        return self.dispatch(item.responses, local)

    def start(self, item: WorkItem, local: Mapping[str, Request], on_done: Callable[[Outcome], None]) -> None:
        """Execute ``item``; an allreduce may still be in flight on return (``on_done`` runs later,
        inside a later :meth:`start`, :meth:`flush` or :meth:`finish` on this thread)."""
        responses = item.responses
        if responses[0].meta.collective is not Collective.ALLREDUCE:
            self.flush()  # other work never overtakes host reductions still in flight
            on_done(succeeded(responses, self.dispatch(responses, local)))
            return
        self._allreduce(responses, local, lambda results: on_done(succeeded(responses, results)))

    def carriable(self, request: Request) -> memoryview | None:
        """The bytes of ``request``'s tensor if it is a small allreduce that can ride with the
        negotiation's vector and be reduced by every rank itself (:meth:`reduce_carried`), else None."""
        if self.size == 1 or not self.can_carry(request.meta, request.tensor):
            return None
        return memoryview(np.ascontiguousarray(request.tensor)).cast("B")

    @staticmethod
    def can_carry(meta: RequestMeta, tensor: object) -> bool:
        """True if ``meta``'s ``tensor`` is a small allreduce every rank can reduce itself from every
        rank's copy: a host array already in its wire type, with no scaling before the reduction.

        Only what every rank decides alike: the description (identical on every rank once the
        cache answers it) and whether the tensor is an array; the vector says which ranks carry.
        """
        return (meta.collective is Collective.ALLREDUCE and meta.device == "cpu" and meta.prescale == 1.0
                and meta.op is not ReduceOp.ADASUM and isinstance(tensor, np.ndarray)
                and tensor.dtype == dtypes.wire_dtype(meta.dtype) and 0 < tensor.nbytes <= CARRY_MAX_BYTES)

    def reduce_carried(self, response: Response, request: Request, payloads: list[memoryview]) -> np.ndarray:
        """Reduce every rank's carried bytes of ``request``'s tensor, in rank order: every rank
        computes the same values, bit for bit."""
        meta = response.meta
        wire = request.tensor.dtype
        output = request.output
        result = aligned_empty(response.count, wire).reshape(meta.shape) if output is None else output
        flat = result.reshape(-1)
        ufunc = UFUNCS[dtypes.wire_op(meta.dtype, meta.op)]
        scale = self.postscaler(meta.dtype, meta.op, meta.postscale)
        if wire.kind == "f":  # overflow to inf (and inf - inf) is a result, as in MPI, not a warning
            with np.errstate(over="ignore", invalid="ignore"):
                _reduce_in_order(ufunc, flat, payloads, scale)
        else:
            _reduce_in_order(ufunc, flat, payloads, scale)
        return result

    def flush(self) -> None:
        """Finish every host reduction still in flight (delivering their outcomes)."""
        self.transport.flush()

    def finish(self) -> None:
        """Deliver every outcome still in flight; return once peers are done with this rank too."""
        self.transport.quiesce()

    def close(self) -> None:
        self.transport.close()

    def dispatch(self, responses: tuple[Response, ...], local: Mapping[str, Request]) -> list:
        """Run host responses (all of one work item); returns one result per response."""
        collective = responses[0].meta.collective
        if collective is Collective.ALLREDUCE:
            return self._allreduce(responses, local)
        (response,) = responses
        request = local.get(response.meta.name)
        if collective is Collective.ALLGATHER:
            return [self._allgather(response, request)]
        if collective is Collective.BROADCAST:
            return [self._broadcast(response, request)]
        if collective is Collective.ALLTOALL:
            return [self._alltoall(response, request)]
        if collective is Collective.REDUCESCATTER:
            return [self._reducescatter(response, request)]
        if collective is Collective.BARRIER:
            self.transport.barrier()
            return [None]
        return [response.last_joined]  # JOIN

    @staticmethod
    def _wire_input(response: Response, request: Request | None) -> np.ndarray | Segments:
        """What this rank contributes to ``response``: its tensor, flat, or zeros once it joined."""
        if request is None:
            return np.zeros(response.count, dtype=dtypes.wire_dtype(response.meta.dtype))
        if isinstance(request.tensor, Segments):
            return request.tensor
        return request.tensor.reshape(-1)  # a view, or a contiguous copy of a strided tensor

    def _allreduce(self, responses: tuple[Response, ...], local: Mapping[str, Request],
                   deliver: Callable[[list], None] | None = None) -> list | None:
        """Reduce one work item. Returns its results, or, given ``deliver``, passes them to it once
        the transport finished (possibly after this returns) and returns None."""
        meta = responses[0].meta
        if meta.op is ReduceOp.ADASUM:  # never fused (Response.fusion_key): one tensor, one Adasum
            (response,) = responses
            return _delivered([self._adasum(response, local.get(meta.name))], deliver)
        return self._reduce_item(responses, local, deliver)

    def _reduce_item(self, responses: tuple[Response, ...], local: Mapping[str, Request],
                     deliver: Callable[[list], None] | None) -> list | None:
        """:meth:`_allreduce` with the ufunc ops: fused, carried in pieces, maybe still in flight."""
        meta = responses[0].meta
        wire = dtypes.wire_dtype(meta.dtype)
        op = dtypes.wire_op(meta.dtype, meta.op)
        scale = self.postscaler(meta.dtype, meta.op, meta.postscale)
        if len(responses) == 1:
            request = local.get(meta.name)
            tensor = None if request is None else request.tensor
            if isinstance(tensor, Segments):  # always in place (allreduce_segments_async)
                return self._reduce_segments(tensor, op, scale, deliver)
            if tensor is not None and tensor.dtype == wire and meta.prescale == 1.0:
                return self._reduce_one(request, wire, op, scale, deliver)
        requests = [local.get(r.meta.name) for r in responses]
        inputs = [self._wire_input(r, request) for r, request in zip(responses, requests, strict=True)]
        outputs = [None if r is None else r.output for r in requests]
        if len(inputs) == 1 and inputs[0].dtype == wire and meta.prescale == 1.0:
            # This rank joined: its zeros go unpadded, as many elements as its peers' reduction has.
            source, written, starts = inputs[0], False, [0]
            send, buffer = source, aligned_empty(source.size, wire)
        else:
            written = False
            # Each member starts on an aligned offset, so its result view can be adopted without a copy.
            starts = _aligned_offsets([i.size for i in inputs], wire.itemsize)
            buffer = aligned_empty(starts[-1], wire)
            for tensor, start, end in zip(inputs, starts, starts[1:], strict=False):
                # packs, and widens 16-bit floats; a segmented tensor piece by piece, with no temporary
                if isinstance(tensor, Segments):
                    at = start
                    for piece in _pieces(tensor, self.rank):
                        buffer[at : at + piece.size] = piece
                        at += piece.size
                else:
                    buffer[start : start + tensor.size] = tensor
                buffer[start + tensor.size : end] = 0  # padding: reduced along, never read
            if meta.prescale != 1.0:
                scale_in_place(buffer, meta.prescale)
            send = None

        def results() -> list:
            return self._results(responses, outputs, buffer, starts, written)

        if deliver is None:
            self.transport.allreduce(send, buffer, op, scale)
            return results()
        self.transport.allreduce(send, buffer, op, scale, done=lambda: deliver(results()))
        return None

    def _reduce_one(self, request: Request, wire: np.dtype, op: ReduceOp,
                    scale: Callable[[np.ndarray], None] | None, deliver: Callable[[list], None] | None) -> list | None:
        """One tensor already in the wire dtype (most calls): reduced into its output, in place when
        that is the tensor itself, or else into a fresh buffer; no packing, no copy."""
        source = request.tensor.reshape(-1)  # a view, or a contiguous copy of a strided tensor
        output = request.output  # checked on submit: C-contiguous, of the tensor's shape and dtype
        if output is None:
            buffer = aligned_empty(source.size, wire)
            result, send = buffer.reshape(request.meta.shape), source
        else:
            buffer, result = output.reshape(-1), output
            send = None if output is request.tensor else source
        if deliver is None:
            self.transport.allreduce(send, buffer, op, scale)
            return [result]
        self.transport.allreduce(send, buffer, op, scale, done=lambda: deliver([result]))
        return None

    @staticmethod
    def _results(responses: tuple[Response, ...], outputs: list, buffer: np.ndarray, starts: list[int],
                 written: bool) -> list:
        """Each response's result once ``buffer`` is reduced: views of it, or the callers' outputs."""
        results = []
        for response, output, start in zip(responses, outputs, starts, strict=False):
            view = buffer[start : start + response.count].reshape(response.meta.shape)
            if output is None:
                # Members may differ in dtype (float16, bfloat16 and float32 share a float32 buffer).
                own = response.meta.dtype
                results.append(view if view.dtype == dtypes.NUMPY_DTYPE[own] else aligned_copy(view, own))
            else:
                if isinstance(output, Segments):
                    output.scatter(view)
                elif not written:
                    np.copyto(output, view, casting="unsafe")  # unpacks, and rounds 16-bit floats once
                results.append(output)
        return results

    def _reduce_segments(self, segments: Segments, op: ReduceOp, scale: Callable[[np.ndarray], None] | None,
                         deliver: Callable[[list], None] | None) -> list | None:
        """Reduce each piece in its own memory, one after another; given ``deliver``, the last
        piece's completion delivers the results (pieces may still be in flight on return)."""
        arrays = _pieces(segments, self.rank)
        if deliver is None:
            for array in arrays:
                self.transport.allreduce(None, array, op, scale)
            return [segments]
        if not arrays:
            deliver([segments])
            return None
        dones = [_nothing] * (len(arrays) - 1) + [lambda: deliver([segments])]
        for array, done in zip(arrays, dones, strict=True):
            self.transport.allreduce(None, array, op, scale, done=done)
        return None

    def _adasum(self, response: Response, request: Request | None) -> np.ndarray:
        """Adasum of one tensor (:mod:`hvdlite.core.transport.adasum_math`), in a float32/float64 copy; a joined rank's
        zeros are neutral. The result goes to the request's output, or a new array."""
        meta = response.meta
        source = self._wire_input(response, request)
        if isinstance(source, Segments):
            raise errors.UnsupportedOperationError(f"{meta.name!r}: Adasum combines one tensor at a time, not a bucket")
        buffer = np.array(source, dtype=dtypes.wire_dtype(meta.dtype))  # a copy: the input stays as it was
        self.transport.adasum(buffer)
        if request is not None and request.output is not None:
            request.output.reshape(-1)[...] = buffer
            return request.output
        return buffer.astype(dtypes.NUMPY_DTYPE[meta.dtype], copy=False).reshape(meta.shape)

    def postscaler(self, dtype: str, op: ReduceOp, postscale: float) -> Callable[[np.ndarray], None] | None:
        """What to apply to reduced values: the post-scale factor, and the division of an Average."""
        if op is not ReduceOp.AVERAGE:
            return None if postscale == 1.0 else (lambda piece: scale_in_place(piece, postscale))
        if dtypes.is_floating(dtype):
            factor = self.float_postscale(op, postscale)
            return lambda piece: np.multiply(piece, factor, out=piece)
        # integer average truncates toward zero, like a C cast of the float result
        size = self.size
        return lambda piece: np.copyto(piece, np.trunc(piece * postscale / size), casting="unsafe")

    def float_postscale(self, op: ReduceOp, postscale: float) -> float | None:
        """The one factor :meth:`postscaler` multiplies reduced floats by (None: it leaves them)."""
        if op is ReduceOp.AVERAGE:
            return postscale / self.size
        return None if postscale == 1.0 else postscale

    def _allgather(self, response: Response, request: Request) -> np.ndarray:
        meta = response.meta
        row_bytes = math.prod(meta.shape[1:]) * dtypes.NUMPY_DTYPE[meta.dtype].itemsize
        output = aligned_empty((sum(response.per_rank),) + meta.shape[1:], meta.dtype)
        counts = [rows * row_bytes for rows in response.per_rank]
        self.transport.allgatherv(_as_bytes(request.tensor), output.reshape(-1).view(np.uint8), counts)
        return output

    def _broadcast(self, response: Response, request: Request) -> np.ndarray:
        meta = response.meta
        output = request.output
        is_root = self.rank == meta.root_rank
        if output is None:
            output = aligned_copy(request.tensor, meta.dtype) if is_root else aligned_empty(meta.shape, meta.dtype)
        elif is_root and output is not request.tensor:
            np.copyto(output, request.tensor)
        self.transport.broadcast(output.reshape(-1).view(np.uint8), meta.root_rank)
        return output

    def _alltoall(self, response: Response, request: Request) -> tuple[np.ndarray, np.ndarray]:
        meta = response.meta
        row_bytes = math.prod(meta.shape[1:]) * dtypes.NUMPY_DTYPE[meta.dtype].itemsize
        received = [splits[self.rank] for splits in response.per_rank]
        output = aligned_empty((sum(received),) + meta.shape[1:], meta.dtype)
        self.transport.alltoallv(
            _as_bytes(request.tensor), [s * row_bytes for s in response.per_rank[self.rank]],
            output.reshape(-1).view(np.uint8), [s * row_bytes for s in received],
        )
        return output, np.array(received, dtype=np.int64)

    def _reducescatter(self, response: Response, request: Request) -> np.ndarray:
        meta = response.meta
        wire = dtypes.wire_dtype(meta.dtype)
        rows = scatter_rows(meta.shape[0], self.size)
        row = math.prod(meta.shape[1:])
        send = np.ascontiguousarray(request.tensor).reshape(-1).astype(wire, copy=meta.prescale != 1.0)
        if meta.prescale != 1.0:
            scale_in_place(send, meta.prescale)
        recv = aligned_empty(rows[self.rank] * row, wire)
        self.transport.reduce_scatter(send, recv, [r * row for r in rows], dtypes.wire_op(meta.dtype, meta.op))
        scale = self.postscaler(meta.dtype, meta.op, meta.postscale)
        if scale is not None:
            scale(recv)
        output = recv.reshape((rows[self.rank],) + meta.shape[1:])
        return output if output.dtype == dtypes.NUMPY_DTYPE[meta.dtype] else aligned_copy(output, meta.dtype)


def _pieces(segments: Segments, rank: int) -> list[np.ndarray]:
    """The pieces of ``segments``. They are read after every rank agreed to run the reduction, so a
    rank that cannot read them must end the job (peers are already inside the collective): the
    engine aborts on anything but an hvdlite error, with this message."""
    try:
        return segments.arrays()
    except errors.HvdliteError as exc:
        raise RuntimeError(f"rank {rank} cannot read the pieces of {segments.name!r} for a reduction its peers "
                           f"have started: {exc}") from exc


def scale_in_place(array: np.ndarray, factor: float) -> None:
    """``array`` times ``factor``; an integer array in float64, truncated back toward zero (as Horovod)."""
    np.multiply(array, factor, out=array, casting="unsafe")


def _reduce_in_order(ufunc: np.ufunc, out: np.ndarray, payloads: list[memoryview],
                     scale: Callable[[np.ndarray], None] | None) -> None:
    """``out`` = every payload reduced with ``ufunc`` in rank order, then scaled."""
    out[...] = np.frombuffer(payloads[0], out.dtype)
    for payload in payloads[1:]:
        ufunc(out, np.frombuffer(payload, out.dtype), out=out)
    if scale is not None:
        scale(out)


def _delivered(results: list, deliver: Callable[[list], None] | None) -> list | None:
    """``results`` returned, or handed to ``deliver`` (then None), as :meth:`HostPlane._allreduce` does."""
    if deliver is None:
        return results
    deliver(results)
    return None


def _nothing() -> None:
    """The ``done`` of a piece whose completion needs no action (a later piece delivers the results)."""


def _aligned_offsets(sizes: list[int], itemsize: int) -> list[int]:
    """Start of each packed member in a fusion buffer, and its padded end as the last entry."""
    starts = [0]
    for count in sizes:
        starts.append(starts[-1] + padded_count(count, itemsize))
    return starts

"""What the NCCL plane runs besides allreduce: broadcast, allgather and alltoall move bytes (NCCL
broadcasts and point-to-point calls, grouped), reducescatter reduces (one rooted reduce per rank's
block, for uneven blocks). Each takes the plane's communicator, cupy and stream
(:meth:`~hvdlite.core.planes.nccl.NcclPlane._run` calls them)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...gpu.arrays import DEVICE, DeviceArray, cupy_view, from_cupy, storage_dtype
from ...gpu.nccl import Communicator, group
from ...gpu.plans import reduction_plan
from ...gpu.scaling import scale_in_place
from ...utils import dtypes
from ...utils.rows import scatter_rows
from ..work.request import Request
from ..work.response import Response


def broadcast(comm: Communicator, cp: Any, stream: int, response: Response, request: Request) -> DeviceArray:
    meta = response.meta
    output = request.output
    fresh = None if output is not None else cp.empty(request.tensor.nbytes, cp.uint8)
    target = output.ptr if output is not None else fresh.data.ptr
    comm.broadcast(request.tensor.ptr, target, request.tensor.nbytes, meta.root_rank, stream)
    return output if output is not None else from_cupy(fresh.view(storage_dtype(meta.dtype)), meta.dtype,
                                                       meta.shape)


def allgather(comm: Communicator, cp: Any, stream: int, response: Response, request: Request) -> DeviceArray:
    meta = response.meta
    row_bytes = math.prod(meta.shape[1:]) * dtypes.NUMPY_DTYPE[meta.dtype].itemsize
    counts = [rows * row_bytes for rows in response.per_rank]
    output = cp.empty(max(sum(counts), 1), cp.uint8)
    offset = 0
    with group():  # NCCL has no allgatherv: one broadcast per rank, launched together
        for root, nbytes in enumerate(counts):
            if nbytes:
                comm.broadcast(request.tensor.ptr, output.data.ptr + offset, nbytes, root, stream)
            offset += nbytes
    shape = (sum(response.per_rank),) + meta.shape[1:]
    return from_cupy(output[:sum(counts)].view(storage_dtype(meta.dtype)), meta.dtype, shape)


def alltoall(comm: Communicator, cp: Any, stream: int, response: Response, request: Request) -> tuple[DeviceArray, np.ndarray]:
    meta = response.meta
    rank = comm.rank
    row_bytes = math.prod(meta.shape[1:]) * dtypes.NUMPY_DTYPE[meta.dtype].itemsize
    sent = [s * row_bytes for s in response.per_rank[rank]]
    received_rows = [splits[rank] for splits in response.per_rank]
    received = [rows * row_bytes for rows in received_rows]
    output = cp.empty(max(sum(received), 1), cp.uint8)
    send_at, recv_at = request.tensor.ptr, output.data.ptr
    with group():
        for peer in range(comm.size):
            if sent[peer]:
                comm.send(send_at, sent[peer], peer, stream)
            if received[peer]:
                comm.recv(recv_at, received[peer], peer, stream)
            send_at += sent[peer]
            recv_at += received[peer]
    shape = (sum(received_rows),) + meta.shape[1:]
    result = from_cupy(output[:sum(received)].view(storage_dtype(meta.dtype)), meta.dtype, shape)
    return result, np.array(received_rows, dtype=np.int64)


def reducescatter(comm: Communicator, cp: Any, stream: int, response: Response, request: Request) -> DeviceArray:
    cp = cp
    meta = response.meta
    wire = dtypes.wire_name(meta.dtype, DEVICE)
    storage = storage_dtype(wire)
    plan = reduction_plan(meta.dtype, meta.op, meta.prescale, meta.postscale, comm.size)
    rows = scatter_rows(meta.shape[0], comm.size)
    row = math.prod(meta.shape[1:])
    source = cupy_view(request.tensor)
    if wire != meta.dtype or plan.pre != 1.0:
        source = source.astype(storage)  # a copy: the caller's tensor is never scaled
        scale_in_place(source, wire, plan.pre, cp)
    mine = cp.empty(max(rows[comm.rank] * row, 1), storage)
    offset = 0
    with group():  # uneven blocks: one reduce per block, rooted at the rank that keeps it
        for root, block_rows in enumerate(rows):
            count = block_rows * row
            if count:
                comm.reduce(source.data.ptr + offset * storage.itemsize, mine.data.ptr, count, wire,
                                  plan.op, root, stream, plan.factor)
            offset += count
    mine = mine[:rows[comm.rank] * row]
    scale_in_place(mine, wire, plan.post, cp, plan.divisor)
    if wire != meta.dtype:
        mine = mine.astype(storage_dtype(meta.dtype))
    return from_cupy(mine, meta.dtype, (rows[comm.rank],) + meta.shape[1:])

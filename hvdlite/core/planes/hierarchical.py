"""Hierarchical allreduce (``HVDLITE_HIERARCHICAL_ALLREDUCE=1``): NCCL inside a host, MPI across hosts;
and GPU Adasum, which is hierarchical by definition (:func:`average_then_adasum`).

Inside a host GPUs talk over NVLink or PCIe, across hosts over the network. The allreduce is three
steps: an NCCL reduce onto the host's first rank (its local root), an MPI allreduce among the local
roots on host memory, and an NCCL broadcast from the local root. Only one rank per host crosses the
network, with the whole tensor.

The MPI side (:func:`build_groups`, :func:`cross_host_allreduce`) needs no GPU and is tested on real
ranks with simulated host names; the NCCL steps are in :class:`HierarchicalReducer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ...gpu.nccl import Communicator
from ...ops import ReduceOp
from ...utils import dtypes
from ..transport.mpi import MpiTransport


@dataclasses.dataclass
class Groups:
    """This rank's place in the hierarchy: its host's ranks, and (on local roots) the roots of all hosts."""

    local: MpiTransport  # the ranks on this rank's host
    local_rank: int
    local_size: int
    cross: MpiTransport | None  # the local roots of every host; None on other ranks
    hosts: int


def build_groups(comm: Any, hosts: list[str], rank: int, chunk_bytes: int, poll_seconds: float,
                 timeout: float | None) -> Groups:
    """Split ``comm`` by host (``hosts[r]`` is rank r's host) and gather the local roots. Collective."""
    from mpi4py import MPI

    order = list(dict.fromkeys(hosts))
    local = comm.Split(color=order.index(hosts[rank]), key=rank)
    local_rank = local.Get_rank()
    cross = comm.Split(color=0 if local_rank == 0 else MPI.UNDEFINED, key=rank)
    return Groups(
        local=MpiTransport(local, chunk_bytes, poll_seconds, timeout),
        local_rank=local_rank,
        local_size=local.Get_size(),
        cross=MpiTransport(cross, chunk_bytes, poll_seconds, timeout) if cross != MPI.COMM_NULL else None,
        hosts=len(order),
    )


def cross_host_allreduce(cross: MpiTransport, values: np.ndarray, dtype: str, op: ReduceOp) -> np.ndarray:
    """Allreduce a local root's host copy (``dtype``'s storage: bfloat16 as uint16 bits) across hosts."""
    return _reduced_in_float(values, dtype, lambda buffer: cross.allreduce(None, buffer, op))


def cross_host_adasum(cross: MpiTransport, values: np.ndarray, dtype: str) -> np.ndarray:
    """Replace a local root's host copy (``dtype``'s storage) by the Adasum of every host's."""
    return _reduced_in_float(values, dtype, cross.adasum)


def _reduced_in_float(values: np.ndarray, dtype: str, reduce: Callable[[np.ndarray], None]) -> np.ndarray:
    """``values`` after ``reduce`` (in place). MPI has no 16-bit float types: those are reduced in
    float32 and rounded once, as on the host path."""
    if dtype in ("float16", "bfloat16"):
        typed = values.view(dtypes.NUMPY_DTYPE[dtype]) if dtype == "bfloat16" else values
        wide = typed.astype(np.float32)
        reduce(wide)
        return wide.astype(dtypes.NUMPY_DTYPE[dtype]).view(values.dtype)
    reduce(values)
    return values


def average_then_adasum(groups: Groups, buffer: np.ndarray) -> None:
    """GPU Adasum on host memory (the host-staged plane's): ``buffer`` (float32/float64, this rank's
    tensor) becomes the Adasum, across hosts, of each host's average, on every rank.

    Horovod's GPU Adasum averages inside a host first (NCCL) and applies Adasum only across hosts:
    a host's GPUs see one larger batch, which is why its guide scales the learning rate by the
    number of GPUs per host. Every GPU plane here gives that same result.
    """
    groups.local.allreduce(None, buffer, ReduceOp.SUM)
    buffer /= groups.local_size
    if groups.cross is not None:
        groups.cross.adasum(buffer)
    groups.local.broadcast(buffer, 0)


def supports(dtype: str, op: ReduceOp) -> bool:
    """An integer Average cannot be split into stages (ncclAvg divides by the host's size): it runs flat."""
    return not (dtypes.wire_op(dtype, op) is ReduceOp.AVERAGE and not dtypes.is_floating(dtype))


class HierarchicalReducer:
    """The three steps on one rank. ``wait`` blocks until the plane's stream finished its work."""

    def __init__(self, local: Communicator, cross: MpiTransport | None) -> None:
        self._local = local
        self._cross = cross

    def close(self) -> None:
        self._local.destroy()

    def adasum(self, send: int, recv: Any, count: int, wire: str, stream: Any, wait: Callable[[], None]) -> None:
        """``recv`` = the Adasum across hosts of each host's average of ``send`` (:func:`average_then_adasum`)."""
        self._local.reduce(send, recv.data.ptr, count, wire, ReduceOp.SUM, 0, stream.ptr, 1.0 / self._local.size)
        if self._cross is not None:
            wait()  # the host's average is complete on this local root
            host = recv.get(stream=stream)
            recv.set(cross_host_adasum(self._cross, host, wire), stream=stream)
        self._local.broadcast(recv.data.ptr, recv.data.ptr, count * recv.dtype.itemsize, 0, stream.ptr)

    def allreduce(self, send: int, recv: Any, count: int, wire: str, op: ReduceOp, factor: float, stream: Any,
                  wait: Callable[[], None]) -> None:
        """``recv`` (a cupy array of ``count`` elements) = op over every rank of ``send``, times ``factor``."""
        self._local.reduce(send, recv.data.ptr, count, wire, op, 0, stream.ptr, factor)
        if self._cross is not None:
            wait()  # the host's sum is complete on this local root
            host = recv.get(stream=stream)
            recv.set(cross_host_allreduce(self._cross, host, wire, op), stream=stream)
        self._local.broadcast(recv.data.ptr, recv.data.ptr, count * recv.dtype.itemsize, 0, stream.ptr)

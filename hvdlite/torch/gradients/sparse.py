"""Sparse tensors across ranks, as Horovod reduces them: every rank's entries (indices and values)
are allgathered, so the result holds all of them (duplicate indices add up when it is coalesced)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch

from ... import api
from ...core.runtime import current
from ...core.work.request import MappedHandle
from ...errors import UnsupportedOperationError
from ...ops import Average, Collective, ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ...training.sparse import allreduce_sparse
from ..collectives import async_ops


def start_gather(values: torch.Tensor, indices: torch.Tensor, name: str | None,
                 process_set: ProcessSet = global_process_set) -> tuple[MappedHandle, MappedHandle]:
    """Start allgathering a sparse tensor's entries: (values handle, indices handle).

    ``indices`` are (nnz, ndim), transposed from torch's layout, so that gathering concatenates entries.
    """
    gathered_indices = async_ops.allgather_async(indices, name=f"{name}.indices", process_set=process_set)
    gathered_values = async_ops.allgather_async(values, name=f"{name}.values", process_set=process_set)
    return gathered_values, gathered_indices


def gather_waiter(process_set: ProcessSet, started: list[MappedHandle] | None = None) -> Callable:
    """The ``gather`` of :func:`hvdlite.training.sparse.allreduce_sparse` on ``process_set``'s ranks;
    the handles it starts are appended to ``started``."""
    def gather(values: torch.Tensor, indices: torch.Tensor, name: str | None) -> Callable[[], tuple]:
        handles = start_gather(values, indices, name, process_set)
        if started is not None:
            started.extend(handles)
        return lambda: (handles[0].wait(), handles[1].wait())
    return gather


def empty_gradient(param: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """A sparse COO zero shaped like ``param`` with no entries: a rank's share of a sparse
    gradient it never computed (its rows are ``param``'s trailing ``ndim - sparse_dim`` dims)."""
    indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=param.device)
    values = param.new_empty((0, *param.shape[sparse_dim:]))
    return torch.sparse_coo_tensor(indices, values, param.shape, check_invariants=False)


class SparseHandle:
    """The handle of :func:`sparse_allreduce_async`: ``synchronize(handle)`` (or ``handle()``, as
    Horovod's optimizer calls it) gives the reduced sparse tensor; ``poll(handle)`` never blocks."""

    def __init__(self, name: str, started: list[MappedHandle], finish: Callable[[], torch.Tensor]) -> None:
        self.name = name
        self._started = started
        self._finish = functools.cache(finish)

    def done(self) -> bool:
        return all(handle.done() for handle in self._started)

    def join(self) -> None:
        for handle in self._started:
            handle.join()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        return self._finish()

    __call__ = wait


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                           process_set: ProcessSet = global_process_set) -> SparseHandle:
    """Start reducing a sparse COO ``tensor`` across ranks (Sum or Average) by allgathering its entries."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise UnsupportedOperationError(f"sparse_allreduce of {name!r} takes a sparse COO tensor, got "
                                        f"{type(tensor).__name__}{'' if not isinstance(tensor, torch.Tensor) else ' (dense)'}")
    target = current().communicators.of(process_set, Collective.ALLGATHER, name)
    base = name if name is not None else target.names.next(Collective.ALLGATHER) + ".sparse"
    started: list[MappedHandle] = []
    wait = allreduce_sparse(tensor._values().contiguous(), tensor._indices().t().contiguous(), base, op, 1.0, 1.0,
                            gather_waiter(process_set, started), operator.mul, size=target.size)

    def finish() -> torch.Tensor:
        values, indices = wait()
        return torch.sparse_coo_tensor(indices.t(), values, tensor.shape)
    return SparseHandle(base, started, finish)


def sparse_allreduce(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                     process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce a sparse COO ``tensor`` across ranks (Sum or Average) and return a sparse tensor."""
    return api.synchronize(api.blocking(lambda: sparse_allreduce_async(tensor, name, op, process_set)))


__all__ = ["sparse_allreduce", "sparse_allreduce_async", "SparseHandle"]

"""The blocking collectives on torch tensors, differentiable as in Horovod.

Gradients: allreduce's is an allreduce of the gradient with the same op and scale factors;
allgather's is this rank's slice of the summed gradient; broadcast's is the averaged gradient on
the root and zero elsewhere; alltoall's sends the gradient back along the received splits;
reducescatter's gathers the gradient blocks (divided by the size for Average).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import api, basics
from ..compression import Compressor, NoneCompressor
from ..ops import ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set, require_global
from . import async_ops
from .async_ops import synchronize


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                postscale: float) -> torch.Tensor:
        ctx.args = (op, prescale, postscale)
        return synchronize(api.blocking(lambda: async_ops.allreduce_async(tensor, None, name, op, prescale, postscale)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        op, prescale, postscale = ctx.args
        reduced = synchronize(api.blocking(lambda: async_ops.allreduce_async(grad, None, None, op, prescale, postscale)))
        return reduced, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale, postscale)
        handles = api.blocking(lambda: async_ops.grouped_allreduce_async(tensors, None, name, op, prescale, postscale))
        return tuple(synchronize(h) for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        op, prescale, postscale = ctx.args
        handles = api.blocking(lambda: async_ops.grouped_allreduce_async(grads, None, None, op, prescale, postscale))
        return (None, None, None, None, *(synchronize(h) for h in handles))


def _my_slice(grad: torch.Tensor, rows: int) -> torch.Tensor:
    """This rank's rows of a gathered gradient, summed over ranks."""
    summed = synchronize(api.blocking(lambda: async_ops.allreduce_async(grad, op=ReduceOp.SUM)))
    all_rows = synchronize(api.blocking(lambda: async_ops.allgather_async(torch.tensor([rows], dtype=torch.int64))))
    offset = int(all_rows[: basics.rank()].sum())
    return summed.narrow(0, offset, rows)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 0
        return synchronize(api.blocking(lambda: async_ops.allgather_async(tensor, name)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return _my_slice(grad, ctx.rows), None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows = [t.shape[0] if t.dim() else 0 for t in tensors]
        return tuple(synchronize(h) for h in api.blocking(lambda: async_ops.grouped_allgather_async(tensors, name)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, *(_my_slice(g, rows) for g, rows in zip(grads, ctx.rows, strict=True)))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None) -> torch.Tensor:
        ctx.root_rank = root_rank
        return synchronize(api.blocking(lambda: async_ops.broadcast_async(tensor, root_rank, name)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        reduced = synchronize(api.blocking(lambda: async_ops.allreduce_async(grad, op=ReduceOp.AVERAGE)))
        if basics.rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = synchronize(api.blocking(lambda: async_ops.alltoall_async(tensor, splits, name)))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _unused: Any) -> tuple:
        returned, _ = synchronize(api.blocking(lambda: async_ops.alltoall_async(grad.contiguous(), ctx.received)))
        return returned, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                postscale: float) -> torch.Tensor:
        ctx.scale = prescale * postscale / (basics.size() if op is ReduceOp.AVERAGE else 1)
        return synchronize(api.blocking(lambda: async_ops.reducescatter_async(tensor, op, name, prescale, postscale)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        gathered = synchronize(api.blocking(lambda: async_ops.allgather_async(grad.contiguous())))
        return gathered * ctx.scale, None, None, None, None


# ---- public blocking forms -----------------------------------------------------------------------
def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (default Average) and return a new tensor. Differentiable."""
    require_global(process_set, "allreduce")
    resolved = resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, resolved, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce several tensors as one group (fused where possible) and return new tensors. Differentiable."""
    require_global(process_set, "grouped_allreduce")
    resolved = resolve_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(name, resolved, prescale_factor, postscale_factor, *(t for t, _ in pairs))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs, strict=True)]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (sizes may differ). Differentiable."""
    require_global(process_set, "allgather")
    return _Allgather.apply(tensor, name)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather several tensors as one group. Differentiable."""
    require_global(process_set, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank, as a new tensor. Differentiable."""
    require_global(process_set, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[r]`` rows of ``tensor`` to rank r. Returns the received tensor, and with ``splits``
    also the rows received from each rank. Differentiable."""
    require_global(process_set, "alltoall")
    output, received = _Alltoall.apply(tensor, splits, name)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, op: ReduceOp | None = None, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` (Sum or Average) and return this rank's block of rows. Differentiable."""
    require_global(process_set, "reducescatter")
    return _Reducescatter.apply(tensor, name, resolve_op(op), prescale_factor, postscale_factor)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], op: ReduceOp | None = None, name: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reducescatter several tensors as one group (not differentiable, as in Horovod)."""
    handles = api.blocking(lambda: async_ops.grouped_reducescatter_async(tensors, op, name, prescale_factor,
                                                                         postscale_factor, process_set))
    return [synchronize(h) for h in handles]

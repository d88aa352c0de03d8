"""The blocking collectives on torch tensors, differentiable as in Horovod.

Each ``autograd.Function`` runs its collective forward and hands backward to the gradient rule in
:mod:`hvdlite.training.gradients`, with :data:`_OPS` as the torch operations the rules need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ... import api
from ...compression import Compressor, NoneCompressor
from ...ops import ReduceOp, resolve_op
from ...process_sets import ProcessSet, global_process_set
from ...training import gradients as rules
from . import async_ops
from .async_ops import synchronize
from .tensors import from_numpy, require_tensor, to_numpy


def _allreduce(tensors: list[torch.Tensor], op: ReduceOp, prescale: float, postscale: float,
               process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Blocking allreduce of one tensor, or of several as one group."""
    if len(tensors) == 1:
        return [synchronize(api.blocking(
            lambda: async_ops.allreduce_async(tensors[0], None, None, op, prescale, postscale, process_set)))]
    handles = api.blocking(
        lambda: async_ops.grouped_allreduce_async(tensors, None, None, op, prescale, postscale, process_set))
    return [synchronize(h) for h in handles]


def _allgather(tensors: list[torch.Tensor], process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Blocking allgather of one tensor, or of several as one group."""
    if len(tensors) == 1:
        return [synchronize(api.blocking(lambda: async_ops.allgather_async(tensors[0].contiguous(), None,
                                                                             process_set)))]
    handles = api.blocking(lambda: async_ops.grouped_allgather_async([t.contiguous() for t in tensors], None,
                                                                     process_set))
    return [synchronize(h) for h in handles]


def _alltoall(tensor: torch.Tensor, splits: torch.Tensor, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return synchronize(api.blocking(lambda: async_ops.alltoall_async(tensor.contiguous(), splits, None,
                                                                     process_set)))[0]


_OPS = rules.GradientOps(
    allreduce=_allreduce, allgather=_allgather, alltoall=_alltoall, zeros_like=torch.zeros_like,
    scale=lambda tensor, factor: tensor * factor, total=lambda counts: int(counts.sum()),
    rows=lambda tensor, start, stop: tensor.narrow(0, start, stop - start),
)


def _ops(process_set: ProcessSet) -> rules.GradientOps:
    """The gradient rules' torch operations, on ``process_set``'s ranks."""
    return rules.on_set(_OPS, process_set)


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() else 0


def _row_count(rows: int) -> torch.Tensor:
    """A row count as the 1-element tensor the allgather gradient rule takes (built in backward only:
    a forward without backward should not pay for it)."""
    return torch.tensor([rows], dtype=torch.int64)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                postscale: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.args, ctx.process_set = (op, prescale, postscale), process_set
        return synchronize(api.blocking(
            lambda: async_ops.allreduce_async(tensor, None, name, op, prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return rules.allreduce_grads(_ops(ctx.process_set), [grad], *ctx.args)[0], None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args, ctx.process_set = (op, prescale, postscale), process_set
        handles = api.blocking(
            lambda: async_ops.grouped_allreduce_async(tensors, None, name, op, prescale, postscale, process_set))
        return tuple(synchronize(h) for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, None, None, None, None, *rules.allreduce_grads(_ops(ctx.process_set), grads, *ctx.args))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        require_tensor(tensor, name)
        ctx.rows, ctx.process_set = _rows(tensor), process_set
        return synchronize(api.blocking(lambda: async_ops.allgather_async(tensor, name, process_set)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return rules.allgather_grad(_ops(ctx.process_set), grad, _row_count(ctx.rows)), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for tensor in tensors:
            require_tensor(tensor, name)
        ctx.rows, ctx.process_set = [_rows(t) for t in tensors], process_set
        return tuple(synchronize(h) for h in api.blocking(
            lambda: async_ops.grouped_allgather_async(tensors, name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        ops = _ops(ctx.process_set)
        return (None, None, *(rules.allgather_grad(ops, g, _row_count(rows))
                              for g, rows in zip(grads, ctx.rows, strict=True)))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(api.blocking(lambda: async_ops.broadcast_async(tensor, root_rank, name, process_set)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return rules.broadcast_grad(_ops(ctx.process_set), grad, ctx.root_rank), None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = synchronize(api.blocking(
            lambda: async_ops.alltoall_async(tensor, splits, name, process_set)))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _unused: Any) -> tuple:
        return rules.alltoall_grad(_ops(ctx.process_set), grad, ctx.received), None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp, prescale: float,
                postscale: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.args, ctx.process_set = (op, prescale, postscale), process_set
        return synchronize(api.blocking(
            lambda: async_ops.reducescatter_async(tensor, name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return rules.reducescatter_grads(_ops(ctx.process_set), [grad], *ctx.args)[0], None, None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.args, ctx.process_set = (op, prescale, postscale), process_set
        handles = api.blocking(lambda: async_ops.grouped_reducescatter_async(tensors, name, op, process_set, prescale,
                                                                             postscale))
        return tuple(synchronize(h) for h in handles)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, None, None, None, None, *rules.reducescatter_grads(_ops(ctx.process_set), grads, *ctx.args))


# ---- public blocking forms -----------------------------------------------------------------------
def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` across ranks (default Average) and return a new tensor. Differentiable."""
    require_tensor(tensor, name)
    resolved = resolve_op(op, average)
    if (name is not None and compression is NoneCompressor and not tensor.is_cuda
            and not (tensor.requires_grad and torch.is_grad_enabled())):
        # Nothing to differentiate (a metric, a count): the core's blocking call, which takes the
        # small-op path once the name is cached, without an autograd Function around it.
        array = to_numpy(tensor, name)
        return from_numpy(api.allreduce(array, None, name, resolved, prescale_factor, postscale_factor,
                                        process_set=process_set), tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, resolved, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce several tensors as one group (fused where possible) and return new tensors. Differentiable."""
    resolved = resolve_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(name, resolved, prescale_factor, postscale_factor, process_set,
                                      *(t for t, _ in pairs))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs, strict=True)]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (sizes may differ). Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather several tensors as one group. Differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank, as a new tensor. Differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[r]`` rows of ``tensor`` to rank r. Returns the received tensor, and with ``splits``
    also the rows received from each rank. Differentiable."""
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = NoneCompressor,
                  op: ReduceOp | None = None, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` (Average by default, or Sum) and return this rank's block of rows.
    Differentiable. Horovod's argument order."""
    compressed, ctx = compression.compress(tensor)
    result = _Reducescatter.apply(compressed, name, resolve_op(op), prescale_factor, postscale_factor, process_set)
    return compression.decompress(result, ctx)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter several tensors as one group (Average by default, or Sum). Differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    results = _GroupedReducescatter.apply(name, resolve_op(op), prescale_factor, postscale_factor, process_set,
                                          *(t for t, _ in pairs))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, pairs, strict=True)]

"""``hvd.SyncBatchNorm``: batch normalization with statistics over every rank's batch (Horovod's layer).

A drop-in for ``torch.nn.BatchNorm1d/2d/3d`` in data-parallel training with small per-rank batches:
in training mode each forward allgathers every rank's per-channel moments and each backward
allreduces two per-channel sums (:mod:`hvdlite.training.batch_norm` has the formulas), so every
rank normalizes with the whole batch's mean and variance, as one process on the whole batch would.
Unlike Horovod's, it also runs on CPU tensors. 16-bit inputs are normalized in float32 and rounded
once, as torch's BatchNorm does. In eval mode it is plain batch normalization with the running
statistics, and no collective runs.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention

from ..core.runtime import current
from ..ops import ReduceOp
from ..process_sets import ProcessSet, global_process_set
from ..training import batch_norm as rules
from .collectives import differentiable

_LAYERS = "torch.sync_batch_norm"  # runtime state: the counter that names each layer's collectives


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (channels, samples): the statistics are per channel (dimension 1)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _per_channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (channels,) shaped to broadcast against an input shaped like ``like``."""
    return values.view(1, -1, *([1] * (like.dim() - 2)))


def _whole_batch_moments(x: torch.Tensor, process_set: ProcessSet,
                         name: str) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The whole batch's (count, mean, biased variance) per channel, in float64 on ``x``'s device."""
    samples = _channels_last(x).double()
    local = samples.shape[1]
    mean = samples.sum(1) / max(local, 1)
    m2 = ((samples - mean[:, None]) ** 2).sum(1)
    # Built where x lives: one allgather moves the row, and torch.cat refuses to mix devices.
    count = torch.full((1,), float(local), dtype=torch.float64, device=x.device)
    packed = torch.cat([count, mean, m2]).unsqueeze(0)
    every = differentiable.allgather(packed, name=f"{name}.moments", process_set=process_set)
    channels = x.shape[1]
    total, mean, variance = rules.combine_moments(every[:, :1], every[:, 1:1 + channels], every[:, 1 + channels:],
                                                  lambda t: t.sum(0))
    return float(total), mean, variance


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """16-bit inputs are normalized in float32 and rounded once, as torch's own batch norm does."""
    return torch.promote_types(x.dtype, torch.float32)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float, momentum: float,
                process_set: ProcessSet, name: str) -> torch.Tensor:
        count, mean, variance = _whole_batch_moments(x, process_set, name)
        if running_mean is not None and momentum:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(rules.running_variance(variance, count).to(running_var.dtype),
                                                    alpha=momentum)
        compute = _compute_dtype(x)
        invstd = (variance + eps).rsqrt().to(compute)
        x_hat = (x.to(compute) - _per_channel(mean.to(compute), x)) * _per_channel(invstd, x)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.count, ctx.process_set, ctx.name = count, process_set, name
        y = x_hat if weight is None else x_hat * _per_channel(weight.to(compute), x)
        y = y if bias is None else y + _per_channel(bias.to(compute), x)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x_hat, weight, invstd = ctx.saved_tensors
        grad = dy.to(x_hat.dtype)  # 16-bit gradients are summed in float32: whole-batch sums overflow float16
        dims = [0, *range(2, grad.dim())]
        local_sum_dy, local_sum_dy_x_hat = grad.sum(dims), (grad * x_hat).sum(dims)
        sums = differentiable.allreduce(torch.stack([local_sum_dy, local_sum_dy_x_hat]), op=ReduceOp.SUM,
                                        name=f"{ctx.name}.sums", process_set=ctx.process_set)
        scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
        dx = rules.input_gradient(grad, x_hat, _per_channel(scale, grad), ctx.count, _per_channel(sums[0], grad),
                                  _per_channel(sums[1], grad))
        # The weight's and bias's gradients stay this rank's own: DistributedOptimizer averages them.
        # (autograd casts each gradient to its input's dtype.)
        dweight = None if weight is None else local_sum_dy_x_hat
        dbias = local_sum_dy if ctx.needs_input_grad[2] else None
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization whose training statistics span every rank of ``process_set`` (Horovod's API).

    Takes ``torch.nn.BatchNorm*d``'s arguments and inputs of at least 2 dimensions (N, C, ...).
    Every rank must run its forward and backward passes in the same order (the layers are
    collectives). ``momentum=None`` keeps a cumulative average, as torch's BatchNorm does.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set
        self._name: str | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expected at least 2D input (N, C, ...), got {input.dim()}D input")

    def _collective_name(self) -> str:
        """Named in first-use order, the same on every rank, so steps reuse the core's response cache."""
        if self._name is None:
            counter = current().adapter_state.setdefault(_LAYERS, itertools.count())
            self._name = f"sync_batch_norm.{next(counter)}"
        return self._name

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got {input.shape[1]} channels")
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
                                    factor, self.process_set, self._collective_name())

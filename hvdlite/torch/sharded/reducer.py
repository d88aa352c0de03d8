"""Sharded optimizer state (ZeRO stages 1 and 2) for the torch ``DistributedOptimizer``.

``DistributedOptimizer(opt, named_parameters=..., shard_optimizer_state=True)``: each rank keeps
the optimizer state only for its slice of the parameters (see :mod:`hvdlite.torch.sharded.layout`).
The user's optimizer object is kept, but its param groups hold this rank's flat shard tensors
instead of the model's parameters, so its state (Adam's moments, momentum buffers) exists for
1/N of the elements. A step is:

1. backward: as soon as all gradients of a bucket exist, they are copied into one flat vector,
   the parameters' own gradients are freed (stage 2: no rank keeps full gradients past their
   bucket), and the vector is reduce-scattered through the core: each rank receives the average
   of its slice only;
2. ``step()``: waits for the buckets, hands each slice to its shard's ``.grad`` and steps the
   shards (1/N of the elementwise work);
3. after the step the shards are all-gathered, bucket by bucket in one group, into the parameters.

Only optimizers whose step is elementwise per parameter give the same result on slices as on
whole tensors; others are refused. Checkpoints stay full and unsharded: see
:mod:`hvdlite.torch.sharded.checkpoint`.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import errors
from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ...training.options import check_passes
from ..collectives import async_ops
from ..gradients.step_control import TOO_MANY_PASSES, ZERO_GRAD_RACE, SkippableSynchronize
from .layout import ShardBucket, plan_shard_buckets

# Optimizers whose update of an element depends only on that element's gradient, state and value.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
               torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta,
               torch.optim.Rprop, torch.optim.ASGD)


def check_shardable(optimizer: torch.optim.Optimizer) -> None:
    """Refuse optimizers that need whole tensors, and optimizers that already hold state."""
    if not isinstance(optimizer, ELEMENTWISE):
        names = ", ".join(kind.__name__ for kind in ELEMENTWISE)
        raise ValueError(f"shard_optimizer_state=True needs an optimizer whose step is elementwise per parameter "
                         f"({names}); {type(optimizer).__name__}'s step uses whole tensors, so stepping slices "
                         "would change its result")
    if any(optimizer.state.values()):
        raise ValueError("shard_optimizer_state=True: wrap the optimizer before its first step (it already holds "
                         "state for the full parameters); load a checkpoint with load_state_dict after wrapping")


class ShardedReducer(SkippableSynchronize):
    """The distributed half of a sharded optimizer: hooks, reduce-scatters, all-gathers."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], passes: int,
                 scales: tuple[float, float], op: ReduceOp, process_set: ProcessSet, bucket_bytes: int) -> None:
        self._optimizer, self._op, self._scales, self._process_set = optimizer, op, scales, process_set
        trainable = [[p for p in group["params"] if p in names] for group in optimizer.param_groups]
        self.original_params = [list(group["params"]) for group in optimizer.param_groups]
        self.buckets = plan_shard_buckets(trainable, bucket_bytes, process_set.rank(), process_set.size())
        for group, buckets in zip(optimizer.param_groups, self.buckets, strict=True):
            group["params"] = [bucket.shard for bucket in buckets]
        self.backward_passes_per_step = passes
        self._bucket_of = {p: b for buckets in self.buckets for b in buckets for p in b.params}
        self._delay = {p: passes for p in self._bucket_of}
        self._waiting = {b.index: len(b.params) for b in self.all_buckets}
        self._in_flight: dict[int, Any] = {}
        self._synchronized = False  # since the last backward: a second synchronize() has nothing to do
        self._should_synchronize = True
        self._original_zero_grad = optimizer.zero_grad
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in self._bucket_of]
        self._hooks.append(optimizer.register_step_pre_hook(self._before_step))
        self._hooks.append(optimizer.register_step_post_hook(self._after_step))

    @property
    def all_buckets(self) -> list[ShardBucket]:
        return [bucket for buckets in self.buckets for bucket in buckets]

    # ---- hooks -------------------------------------------------------------------------------
    def _on_gradient(self, param: torch.Tensor) -> None:
        if self._delay[param] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        self._delay[param] -= 1
        self._synchronized = False
        if self._delay[param] == 0:
            bucket = self._bucket_of[param]
            self._waiting[bucket.index] -= 1
            if self._waiting[bucket.index] == 0:
                self._submit(bucket)

    def _submit(self, bucket: ShardBucket) -> None:
        flat = bucket.flat_gradients()
        for param in bucket.params:
            param.grad = None  # stage 2: only this rank's slice of the reduced gradient is kept
        self._in_flight[bucket.index] = async_ops.reducescatter_async(
            flat, name=f"zero.grad.{bucket.index}", op=self._op, process_set=self._process_set,
            prescale_factor=self._scales[0], postscale_factor=self._scales[1])

    def _before_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if self._should_synchronize:
            self.synchronize()

    def _after_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        # Bucket by bucket, the next one in flight while one is copied: one gathered bucket at a time
        # is held besides the parameters, not a second copy of the model.
        buckets = self.all_buckets
        start = lambda b: async_ops.allgather_async(b.shard.detach(), name=f"zero.param.{b.index}",  # noqa: E731
                                                    process_set=self._process_set)
        pending = start(buckets[0])
        for index, bucket in enumerate(buckets):
            gathered = async_ops.synchronize(pending)
            if index + 1 < len(buckets):
                pending = start(buckets[index + 1])
            bucket.copy_params_from(gathered)
            del gathered

    # ---- methods bound onto the optimizer ----------------------------------------------------
    def synchronize(self) -> None:
        """Reduce-scatter every bucket not yet sent and give each shard its slice of the average."""
        if self._synchronized and not self._in_flight:
            return  # already done since the last backward: the shards hold their averaged slices
        for bucket in self.all_buckets:
            bucket.copy_shard_from_params()  # the parameters may have been broadcast or loaded since
            if bucket.index not in self._in_flight:
                self._submit(bucket)
        try:
            for bucket in self.all_buckets:
                reduced = async_ops.synchronize(self._in_flight.pop(bucket.index))
                bucket.shard.grad = reduced.to(bucket.shard.dtype).view(-1)
        except errors.HvdliteShutdownError:
            self._in_flight.clear()
            raise
        finally:
            self._reset_counts()
        self._synchronized = True

    def _reset_counts(self) -> None:
        for param in self._delay:
            self._delay[param] = self.backward_passes_per_step
        for bucket in self.all_buckets:
            self._waiting[bucket.index] = len(bucket.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._in_flight:
            raise AssertionError(ZERO_GRAD_RACE)
        self._original_zero_grad(set_to_none)  # the shards' gradients
        for param in self._bucket_of:
            param.grad = None if set_to_none else (param.grad.zero_() if param.grad is not None else None)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = check_passes(passes)
        self._reset_counts()


__all__ = ["ELEMENTWISE", "ShardedReducer", "check_shardable"]

"""``DistributedOptimizer``: averages gradients across ranks while backward is still running.

Design: the user's optimizer object itself is returned, so ``isinstance`` and ``state_dict`` hold
without building a subclass at run time. A :class:`GradientReducer` attaches to it through torch's
own extension points: a post-accumulate-grad hook per parameter starts that gradient's allreduce
(in place, in the gradient's own memory) as soon as backward has produced it, and an optimizer
step pre-hook waits for all of them. ``synchronize``, ``skip_synchronize`` and a guarded
``zero_grad`` are bound onto the instance, as Horovod's optimizer has them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..compression import Compressor, NoneCompressor
from ..core.runtime import current
from ..ops import Average, Collective, ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set
from ..training.options import check_passes, predivide_scales, refuse_with_adasum
from ..training.powersgd import PowerSGD
from .gradients.adasum import AdasumDeltaReducer
from .gradients.grad_sync import GradientSubmitter, name_parameters
from .gradients.reducer import GradientReducer
from .slow_links.local_sgd import LocalSGD
from .slow_links.powersgd import powersgd_reducer


def DistributedOptimizer(optimizer: torch.optim.Optimizer,  # noqa: N802 (Horovod's name)
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] | PowerSGD = NoneCompressor, backward_passes_per_step: int = 1,
                         op: ReduceOp = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | list[list[torch.Tensor]] | None = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set, local_sgd_period: int | None = None,
                         local_sgd_warmup_steps: int = 0, local_sgd_average_state: bool = False,
                         shard_optimizer_state: bool = False, local_sgd_overlap: bool = False) -> torch.optim.Optimizer:
    """Make ``optimizer`` average gradients across ranks; returns the same optimizer object.

    With ``process_set``, gradients are averaged over that set's ranks only (on a rank outside the
    set the optimizer stays local, as Horovod's). Each gradient's allreduce starts as soon as
    backward has produced it (after ``backward_passes_per_step`` local accumulations); ``step()``
    waits for them. ``groups`` (an int, or lists of parameters) are negotiated together.
    ``gradient_predivide_factor`` splits the averaging into a division before the sum and the rest
    after it (only with ``op=Average``). Sparse gradients are allgathered, or with
    ``sparse_as_dense`` reduced dense and handed back sparse.

    ``local_sgd_period=K`` (local SGD): after ``local_sgd_warmup_steps`` synchronous steps, each rank
    steps on its own gradients and every K steps the parameters (with ``local_sgd_average_state``, also
    the optimizer's state) are averaged; with ``local_sgd_overlap`` each average runs during the next K
    steps and lands one period late; ``optimizer.average_parameters()`` averages now.

    ``compression=Compression.powersgd(rank=r, start_step=s)``: after ``s`` plain steps, weight matrices
    are averaged as rank-r approximations with error feedback, all in ``synchronize()``; the state is
    ``optimizer._hvdlite_reducer.powersgd.state``. ``op=Adasum``: each rank steps; the parameter
    changes are combined. Shards of a :func:`fully_shard` module are passed through (already averaged).

    ``shard_optimizer_state=True`` (ZeRO-1/2): each rank keeps the
    optimizer state for 1/N of the parameters; gradients are reduce-scattered, the shards stepped and
    all-gathered. Checkpoint with ``consolidate_state_dict(to=0)`` on every rank, then ``state_dict()``.
    """
    _check_wrappable(optimizer)
    passes = check_passes(backward_passes_per_step)
    scales = predivide_scales(op, gradient_predivide_factor)
    names = name_parameters(optimizer, named_parameters)  # argument errors first, as Horovod: even before init()
    _check_fully_sharded(optimizer, op, shard_optimizer_state, local_sgd_period, compression)
    member = current().communicators.includes(process_set, Collective.ALLREDUCE,
                                               "DistributedOptimizer's gradients")
    if resolve_op(op) is ReduceOp.ADASUM:  # each rank steps; the parameter changes are combined (torch/gradients/adasum.py)
        return _adasum(optimizer, names, member, passes, process_set, (compression is not NoneCompressor, groups or
                       num_groups, sparse_as_dense, local_sgd_period is not None, shard_optimizer_state))
    if shard_optimizer_state:
        unsupported = {"compression": compression is not NoneCompressor, "groups": bool(groups or num_groups),
                       "sparse_as_dense": sparse_as_dense, "local_sgd_period": local_sgd_period is not None}
        return _sharded(optimizer, names if member else {}, passes, scales, op, process_set, unsupported)
    local_sgd = (local_sgd_period, local_sgd_warmup_steps, local_sgd_average_state, local_sgd_overlap)
    grouping = groups if groups is not None else (num_groups or None)
    return _unsharded(optimizer, names, member, passes, (op, scales, gradient_predivide_factor), compression,
                      grouping, sparse_as_dense, process_set, local_sgd)


def _check_fully_sharded(optimizer: torch.optim.Optimizer, op: Any, shard_optimizer_state: bool,
                         local_sgd_period: int | None, compression: Any) -> None:
    """A fully sharded module's shards are already averaged: DistributedOptimizer passes them through
    (no double reduction), but options that change how gradients are combined cannot apply to them."""
    options = {"op=Adasum": resolve_op(op) is ReduceOp.ADASUM, "shard_optimizer_state": shard_optimizer_state,
               "local_sgd_period": local_sgd_period is not None, "compression": compression is not NoneCompressor}
    sharded = any(getattr(p, "_hvdlite_fully_sharded", False) for g in optimizer.param_groups for p in g["params"])
    chosen = [name for name, on in options.items() if on]
    if sharded and chosen:
        raise ValueError(f"DistributedOptimizer: {', '.join(chosen)} cannot apply to the parameters of a fully_shard "
                         "module (their gradients are reduce-scattered by the module itself); use a plain "
                         "torch.optim optimizer on them")


def _unsharded(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], member: bool, passes: int,
               reduction: tuple[ReduceOp, tuple[float, float], float], compression: Any, grouping: Any,
               sparse_as_dense: bool, process_set: ProcessSet,
               local_sgd: tuple[int | None, int, bool, bool]) -> torch.optim.Optimizer:
    """``optimizer`` with gradients reduced as they arrive; ``reduction``: (op, its scales, the predivide
    factor); ``local_sgd``: (period, warm-up steps, average state, overlap)."""
    op, scales, predivide = reduction
    period, warmup, average_state, overlap = local_sgd
    submitter = GradientSubmitter(names, compression, op, scales, grouping, sparse_as_dense,
                                  current().config.bucket_bytes, process_set)
    local = None if period is None else LocalSGD(optimizer, names, period, warmup, average_state, process_set, overlap)
    powersgd = powersgd_reducer(compression, names if member else {}, op, predivide, period, process_set)
    # As in Horovod, a rank outside the process set registers no hooks: its steps stay local.
    _bind(optimizer, GradientReducer(optimizer, names if member else {}, submitter, passes, local, powersgd), names)
    if local is not None:  # local SGD: land what is in flight and average now (e.g. after the last step)
        optimizer.average_parameters = local.average
    return optimizer


def _adasum(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], member: bool, passes: int,
            process_set: ProcessSet, unsupported: tuple) -> torch.optim.Optimizer:
    """``optimizer`` combining its parameter changes with Adasum; ``unsupported``: (compression, groups,
    sparse_as_dense, local_sgd_period, shard_optimizer_state) as given, refused if set."""
    labels = ("compression", "groups", "sparse_as_dense", "local_sgd_period", "shard_optimizer_state")
    refuse_with_adasum({label: bool(value) for label, value in zip(labels, unsupported, strict=True)})
    _bind(optimizer, AdasumDeltaReducer(optimizer, names if member else {}, passes, process_set), names)
    return optimizer


def _check_wrappable(optimizer: Any) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if getattr(optimizer, "_hvdlite_reducer", None) is not None:
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap it only once")


_REDUCER_METHODS = ("synchronize", "skip_synchronize", "zero_grad", "set_backward_passes_per_step")


def _bind(optimizer: torch.optim.Optimizer, reducer: Any, names: dict[torch.Tensor, str],
          methods: tuple[str, ...] = _REDUCER_METHODS) -> None:
    """Put ``reducer``'s ``methods`` and Horovod's attributes onto the user's optimizer object."""
    optimizer._hvdlite_reducer = reducer
    # Horovod's attribute (parameter -> its name in named_parameters); Horovod's helpers and user code read it.
    optimizer._parameter_names = {param: name.removeprefix("grad.") for param, name in names.items()}
    for method in methods:
        setattr(optimizer, method, getattr(reducer, method))


def _sharded(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], passes: int,
             scales: tuple[float, float], op: ReduceOp, process_set: ProcessSet,
             unsupported: dict[str, bool]) -> torch.optim.Optimizer:
    """``optimizer`` with sharded state (see :mod:`hvdlite.torch.sharded.reducer`); ``names`` is empty off the set.

    ``unsupported``: the options that sharding does not combine with, and whether each was given."""
    from .sharded.checkpoint import ShardedCheckpoints
    from .sharded.reducer import ShardedReducer, check_shardable

    given = [name for name, used in unsupported.items() if used]
    if given:
        raise ValueError(f"shard_optimizer_state=True cannot be combined with {', '.join(given)} (not built)")
    check_shardable(optimizer)
    optimizer._parameter_names = {param: name.removeprefix("grad.") for param, name in names.items()}
    if not names:  # outside the process set the optimizer stays local, as an unsharded one does
        return optimizer
    reducer = ShardedReducer(optimizer, names, passes, scales, op, process_set, current().config.bucket_bytes)
    checkpoints = ShardedCheckpoints(optimizer, reducer, process_set)
    _bind(optimizer, reducer, names)
    optimizer._hvdlite_checkpoints = checkpoints
    for method in ("consolidate_state_dict", "state_dict", "load_state_dict"):
        setattr(optimizer, method, getattr(checkpoints, method))
    return optimizer


__all__ = ["DistributedOptimizer", "GradientReducer"]

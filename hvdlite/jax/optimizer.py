"""``DistributedOptimizer`` for optax: average the updates (gradients) across ranks first.

The wrapper is itself an optax ``GradientTransformation``: its ``update`` reduces the incoming
updates across ranks (one request group per step, so small leaves are fused) and hands the
result to the user's transformation. It composes like any other: inside ``optax.chain``, under
``optax.MultiSteps``, and inside a ``jax.jit``-compiled train step, where the reduction becomes an
ordered ``io_callback``.

``optax.MultiSteps`` (0.2.8) runs its inner transformation on every step and discards the result
on the steps that only accumulate, so a wrapper inside it communicates every step. To accumulate
k micro-batches and communicate once, pass ``backward_passes_per_step=k`` instead: the wrapper
then keeps the sum itself and reduces only on the k-th step (a ``lax.cond`` under jit, so the
collective runs in the taken branch only).

With ``process_set=`` the updates are averaged over that set's ranks only; on a rank outside the
set the wrapper stays local (no collective: its own updates go to the wrapped transformation), as
Horovod's torch optimizer does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..core.runtime import current
from ..errors import UnsupportedOperationError
from ..ops import Adasum, Average, Collective, ReduceOp, Sum
from ..process_sets import ProcessSet, global_process_set
from ..training.options import check_passes, predivide_scales, refuse_with_adasum
from ..training.powersgd import PowerSGD, check_powersgd_options
from .collectives.arrays import is_traced
from .collectives.calls import allreduce
from .compression import Compression
from .gradients.adasum import adasum
from .sharded.transform import sharded
from .slow_links.local_sgd import local_sgd
from .slow_links.powersgd import powersgd


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    tx: optax.GradientTransformation, op: ReduceOp = Average, compression: type | PowerSGD = Compression.none,
    backward_passes_per_step: int = 1, gradient_predivide_factor: float = 1.0, name: str | None = None,
    process_set: ProcessSet = global_process_set, local_sgd_period: int | None = None,
    local_sgd_warmup_steps: int = 0, local_sgd_average_state: bool = False, shard_optimizer_state: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Wrap ``tx`` so updates are reduced across ranks (``op``: Average or Sum) before it sees them;
    ``op=Adasum``: each rank applies ``tx``, the changes are combined.

    ``compression`` (e.g. ``Compression.fp16``) casts the updates for the reduction and back.
    ``backward_passes_per_step=k`` accumulates k micro-batch gradients locally and reduces their
    mean once, on the k-th step (as ``optax.MultiSteps`` would, but communicating only then);
    the other steps return zero updates, and the state is an :class:`AccumulationState`.
    ``gradient_predivide_factor`` splits the averaging into a division before the sum and one after,
    as in Horovod. ``name`` fixes the request names; by default each wrapper gets
    ``DistributedOptimizer.<n>``, numbered in creation order among the wrappers on the same set of
    ranks, which is the same on every member and every step. ``process_set`` reduces over that
    set's ranks only; a rank outside it keeps its updates local. ``local_sgd_period=K``: local
    updates, with the parameters averaged every K (``update`` then needs ``params``). ``shard_optimizer_state``
    keeps ``tx``'s state for 1/N of the parameters on each rank (ZeRO-1; exact for elementwise ``tx``
    only). ``compression=Compression.powersgd(rank=, start_step=)``
    averages weight matrices as low-rank approximations with error feedback (state:
    :class:`hvdlite.jax.slow_links.powersgd.PowerSGDState`).
    """
    _check_op(op)
    if op is Adasum:
        return _adasum(tx, (compression, gradient_predivide_factor, local_sgd_period, shard_optimizer_state),
                       backward_passes_per_step, name, process_set)
    scales = predivide_scales(op, gradient_predivide_factor)
    passes = check_passes(backward_passes_per_step)
    inner = optax.with_extra_args_support(tx)
    member = current().communicators.includes(process_set, Collective.ALLREDUCE, "DistributedOptimizer's updates")
    base = name if name is not None else f"DistributedOptimizer.{_next_instance(process_set)}"
    reduce_updates = _updates_reducer(compression, base, op, scales, member, process_set)
    if isinstance(compression, PowerSGD):
        options = (op, gradient_predivide_factor, local_sgd_period, passes, shard_optimizer_state)
        return _powersgd(inner, compression, options, base, member, process_set)
    if shard_optimizer_state:
        return _sharded(inner, passes, local_sgd_period, op, scales, compression, base, member, process_set)
    if local_sgd_period is not None:
        schedule = (local_sgd_period, local_sgd_warmup_steps, local_sgd_average_state)
        return _local(inner, reduce_updates, passes, schedule, base, member, process_set)
    if passes > 1:
        return _accumulating(inner, reduce_updates, passes)
    return _reducing(inner, reduce_updates)


def _adasum(tx: optax.GradientTransformation, given: tuple, passes: int, name: str | None,
            process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """``tx`` stepping on each rank with its parameter changes combined by Adasum;
    ``given``: (compression, gradient_predivide_factor, local_sgd_period, shard_optimizer_state), refused if set."""
    compression, predivide, period, shard_state = given
    refuse_with_adasum({"compression": compression is not Compression.none, "gradient_predivide_factor":
                        predivide != 1.0, "local_sgd_period": period is not None, "shard_optimizer_state": shard_state})
    passes = check_passes(passes)
    member = current().communicators.includes(process_set, Collective.ALLREDUCE, "DistributedOptimizer's changes")
    base = name if name is not None else f"DistributedOptimizer.{_next_instance(process_set)}"
    combined = adasum(optax.with_extra_args_support(tx), base, member, process_set)
    return _accumulating(combined, _unchanged, passes) if passes > 1 else combined


def _reducing(inner: optax.GradientTransformationExtraArgs,
              reduce_updates: Callable[[Any], Any]) -> optax.GradientTransformationExtraArgs:
    """``inner`` fed the reduced updates of every step."""

    def update_fn(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> tuple[Any, Any]:
        return inner.update(reduce_updates(updates), state, params, **extra_args)

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def _updates_reducer(compression: Any, base: str, op: ReduceOp, scales: tuple[float, float], member: bool,
                     process_set: ProcessSet) -> Any:
    """The function that reduces a tree of updates across the set (one request group, named ``base``)."""

    def reduce_updates(updates: Any) -> Any:
        leaves, treedef = jax.tree.flatten(updates)
        if not leaves or not member:
            return updates
        packed = [compression.compress(leaf) for leaf in leaves]
        reduced = allreduce([p[0] for p in packed], name=base, op=op, prescale_factor=scales[0],
                            postscale_factor=scales[1], process_set=process_set)
        restored = [compression.decompress(r, p[1]) for r, p in zip(reduced, packed, strict=True)]
        return jax.tree.unflatten(treedef, restored)

    return reduce_updates


def _local(inner: optax.GradientTransformationExtraArgs, reduce_updates: Any, passes: int,
           schedule: tuple[int, int, bool], base: str, member: bool,
           process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """Local SGD's transformation; ``schedule``: (period, warm-up steps, average the state).

    With ``passes`` > 1 the micro-batches' mean is accumulated first and local SGD sees one update
    per ``passes`` calls, so its schedule counts optimizer steps, as torch's does.
    """
    transformation = local_sgd(inner, reduce_updates, *schedule, base, member, process_set)
    return _accumulating(transformation, _unchanged, passes) if passes > 1 else transformation


def _unchanged(updates: Any) -> Any:
    return updates


def _sharded(inner: optax.GradientTransformationExtraArgs, passes: int, local_sgd_period: int | None,
             op: ReduceOp, scales: tuple[float, float], compression: type, base: str, member: bool,
             process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """The sharded-state transformation (:mod:`hvdlite.jax.sharded.transform`), refusing the options it lacks."""
    for option, value, unset in (("local_sgd_period", local_sgd_period, None), ("backward_passes_per_step", passes, 1)):
        if value != unset:
            raise ValueError(f"shard_optimizer_state=True cannot be combined with {option}={value} in the optax "
                             "DistributedOptimizer (not built)")
    return sharded(inner, op, scales, compression, base, member, process_set)


def _powersgd(inner: optax.GradientTransformationExtraArgs, config: PowerSGD, options: tuple, base: str,
              member: bool, process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """PowerSGD's transformation (:mod:`hvdlite.jax.slow_links.powersgd`); ``options``: (op, gradient_predivide_factor,
    local_sgd_period, backward_passes_per_step, shard_optimizer_state), the ones it lacks refused."""
    op, predivide, local_sgd_period, passes, shard_state = options
    check_powersgd_options(op, predivide, local_sgd_period)
    if passes != 1 or shard_state:
        given = f"backward_passes_per_step={passes}" if passes != 1 else "shard_optimizer_state=True"
        raise ValueError(f"Compression.powersgd cannot be combined with {given} in the optax "
                         "DistributedOptimizer (not built)")
    return powersgd(inner, config, base, member, process_set)


class AccumulationState(NamedTuple):
    """State of a ``DistributedOptimizer`` with ``backward_passes_per_step`` > 1."""

    mini_step: jax.Array  # micro-batches accumulated so far in this cycle
    accumulated: Any  # their summed gradients
    inner: Any  # the wrapped transformation's state


def _accumulating(inner: optax.GradientTransformationExtraArgs, reduce_updates: Any,
                  k: int) -> optax.GradientTransformationExtraArgs:
    def init_fn(params: Any) -> AccumulationState:
        return AccumulationState(jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), inner.init(params))

    def update_fn(updates: Any, state: AccumulationState, params: Any = None,
                  **extra_args: Any) -> tuple[Any, AccumulationState]:
        accumulated = jax.tree.map(lambda a, u: a + u.astype(a.dtype), state.accumulated, updates)

        def apply(accumulated: Any, inner_state: Any) -> tuple[Any, Any, Any]:
            mean = jax.tree.map(lambda a: a / k, accumulated)
            new_updates, new_inner = inner.update(reduce_updates(mean), inner_state, params, **extra_args)
            return new_updates, new_inner, optax.tree.zeros_like(accumulated)

        def hold(accumulated: Any, inner_state: Any) -> tuple[Any, Any, Any]:
            shapes = jax.eval_shape(lambda u, s: inner.update(u, s, params, **extra_args)[0], accumulated, inner_state)
            return optax.tree.zeros_like(shapes), inner_state, accumulated

        if is_traced(state.mini_step):
            emit = state.mini_step == k - 1
            new_updates, new_inner, kept = jax.lax.cond(emit, apply, hold, accumulated, state.inner)
        else:  # eager: a Python branch, so nothing is traced
            branch = apply if int(state.mini_step) == k - 1 else hold
            new_updates, new_inner, kept = branch(accumulated, state.inner)
        return new_updates, AccumulationState((state.mini_step + 1) % k, kept, new_inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _check_op(op: ReduceOp) -> None:
    if op not in (Average, Sum, Adasum):
        raise UnsupportedOperationError(f"DistributedOptimizer reduces with Average or Sum (or Adasum), not {op!r}")


def _next_instance(process_set: ProcessSet | None) -> int:
    """Wrappers on ``process_set`` numbered in creation order since init(); the runtime keeps the counts.

    Counted per set of ranks (registration keeps them unique), so the numbers agree on every member
    even where members create different wrappers for other sets in between.
    """
    counts = current().adapter_state.setdefault("jax.optimizers", {})
    ranks = tuple((process_set or global_process_set).ranks)
    number = counts[ranks] = counts.get(ranks, -1) + 1
    return number

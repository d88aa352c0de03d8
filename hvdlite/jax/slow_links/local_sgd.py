"""Local SGD for the optax ``DistributedOptimizer``: K steps on local gradients, then an average.

The same schedule as torch's (:mod:`hvdlite.torch.slow_links.local_sgd`): the first ``warmup_steps`` updates
are synchronous (the gradients are averaged first); afterwards each rank updates from its own
gradients, and every ``period`` local steps the parameters are averaged over the process set. An
optax transformation returns updates, not parameters, so the averaging step returns
``mean(params + u) - params``: applied with ``optax.apply_updates`` it lands every rank on the
average. ``params`` must therefore be passed to ``update``. With ``average_state`` the wrapped
transformation's floating-point state is averaged at the same steps. The step counter lives in the
state, so the schedule works under ``jax.jit`` (``lax.cond``: the collective runs in the taken
branch only) and is restored with the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...ops import Average
from ...process_sets import ProcessSet
from ...training.local_sgd import LocalSGDSchedule
from ..collectives.arrays import is_traced
from ..collectives.calls import allreduce


class LocalSGDState(NamedTuple):
    """State of a ``DistributedOptimizer`` with ``local_sgd_period``."""

    step: jax.Array  # updates so far
    inner: Any  # the wrapped transformation's state


def local_sgd(inner: optax.GradientTransformationExtraArgs, reduce_updates: Callable[[Any], Any], period: int,
              warmup_steps: int, average_state: bool, name: str, member: bool,
              process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """``inner`` on averaged gradients for ``warmup_steps`` updates, then on local ones with a
    parameter average every ``period`` updates (see the module's doc)."""
    schedule = LocalSGDSchedule(period, warmup_steps)

    def average(tree: Any, label: str) -> Any:
        leaves, treedef = jax.tree.flatten(tree)
        floats = [i for i, leaf in enumerate(leaves) if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)]
        if not floats or not member:
            return tree
        reduced = allreduce([leaves[i] for i in floats], name=f"{name}.{label}", op=Average, process_set=process_set)
        for i, value in zip(floats, reduced, strict=True):
            leaves[i] = value
        return jax.tree.unflatten(treedef, leaves)

    def init_fn(params: Any) -> LocalSGDState:
        return LocalSGDState(jnp.zeros([], jnp.int32), inner.init(params))

    def update_fn(updates: Any, state: LocalSGDState, params: Any = None,
                  **extra_args: Any) -> tuple[Any, LocalSGDState]:
        if params is None:
            raise ValueError("DistributedOptimizer(local_sgd_period=...) averages parameters: pass them, "
                             "tx.update(grads, state, params)")

        def synchronous(step_state: Any) -> tuple[Any, Any]:
            return inner.update(reduce_updates(updates), step_state, params, **extra_args)

        def local(step_state: Any) -> tuple[Any, Any]:
            return inner.update(updates, step_state, params, **extra_args)

        def averaged(step_state: Any) -> tuple[Any, Any]:
            new_updates, new_state = local(step_state)
            moved = jax.tree.map(lambda p, u: p + u.astype(p.dtype), params, new_updates)
            mean = average(moved, "params")
            new_updates = jax.tree.map(lambda m, p, u: (m - p).astype(u.dtype), mean, params, new_updates)
            return new_updates, (average(new_state, "state") if average_state else new_state)

        branches = [synchronous, local, averaged]
        which = jnp.where(schedule.synchronous(state.step), 0, jnp.where(schedule.averages_after(state.step), 2, 1))
        if is_traced(which):
            new_updates, new_inner = jax.lax.switch(which, branches, state.inner)
        else:  # eager: a Python branch, so nothing is traced
            new_updates, new_inner = branches[int(which)](state.inner)
        return new_updates, LocalSGDState(state.step + 1, new_inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["LocalSGDState", "local_sgd"]

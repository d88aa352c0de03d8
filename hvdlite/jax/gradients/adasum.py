"""``DistributedOptimizer(tx, op=Adasum)`` for optax: each rank applies its own ``tx``, and the
parameter changes are combined with Adasum, as Horovod's ``_DistributedAdasumOptimizer`` does.

optax's updates *are* the parameter changes (``optax.apply_updates`` adds them), so the wrapper
runs ``tx`` on this rank's gradients with this rank's state (which stays its own, as in Horovod) and
replaces the updates it returns by their Adasum across the process set. Every leaf is its own
Adasum (the core never fuses them: each change is weighed by its own dot products). Weight decay
or clipping inside ``tx`` is part of the change. On a rank outside ``process_set`` the updates stay
local.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from ...ops import Adasum
from ...process_sets import ProcessSet
from ..collectives.calls import allreduce


def adasum(inner: optax.GradientTransformationExtraArgs, base: str, member: bool,
           process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """``inner`` whose updates (this rank's parameter changes) are combined across ``process_set``."""

    def update_fn(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> tuple[Any, Any]:
        changes, new_state = inner.update(updates, state, params, **extra_args)
        return _combined(changes, base, member, process_set), new_state

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def _combined(changes: Any, base: str, member: bool, process_set: ProcessSet) -> Any:
    """Every leaf of ``changes`` replaced by its Adasum over the set (one group named ``base``)."""
    leaves, treedef = jax.tree.flatten(changes)
    if not leaves or not member:
        return changes
    return jax.tree.unflatten(treedef, allreduce(leaves, name=f"{base}.adasum", op=Adasum, process_set=process_set))

"""Making every rank start from the root's parameters and optimizer state."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ... import objects
from ...process_sets import ProcessSet, global_process_set
from .calls import broadcast


def broadcast_parameters(params: Any, root_rank: int = 0, name: str = "broadcast_parameters",
                         process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s copy of the pytree ``params`` on every rank (of ``process_set``).

    JAX arrays are immutable, so unlike Horovod's torch function this returns the new pytree:
    ``params = hvd.broadcast_parameters(params, root_rank=0)``. Array leaves travel as one
    request group; other leaves (Python numbers, strings) are sent together as one pickled object.
    ``root_rank`` is a rank of the job (a member of ``process_set``).
    """
    leaves, treedef = jax.tree.flatten(params)
    is_array = [isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves]
    arrays = broadcast([leaf for leaf, flag in zip(leaves, is_array, strict=True) if flag], root_rank, name=name,
                       process_set=process_set)
    others = [leaf for leaf, flag in zip(leaves, is_array, strict=True) if not flag]
    if others:
        others = objects.broadcast_object(others, root_rank, name=f"{name}.objects", process_set=process_set)
    arrays_iter, others_iter = iter(arrays), iter(others)
    merged = [next(arrays_iter) if flag else next(others_iter) for flag in is_array]
    return jax.tree.unflatten(treedef, merged)


def broadcast_optimizer_state(opt_state: Any, root_rank: int = 0,
                              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s optax state (any pytree) on every rank (of ``process_set``); see
    :func:`broadcast_parameters`."""
    return broadcast_parameters(opt_state, root_rank, name="broadcast_optimizer_state", process_set=process_set)

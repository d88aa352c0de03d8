"""JAX DiLoCo's checkpoints in the layout torch's writes (:mod:`hvdlite.torch.diloco_state`).

``{"format": "hvdlite.diloco/1", "sync_every", "fragments", "delay", "inner_steps", "syncs",
"global": {name: array}, "outer_optimizer": [the outer state of each fragment], "in_flight": None or
{"fragment", "sent_at", "average": {name: array}, "anchor": {name: array}}, "residuals": {name: flat
array}, "residuals_world_size"}``, with NumPy arrays, names being the parameters' pytree paths
joined by '/'. The inner state (``state.inner``) and the parameters are saved as usual, beside it.
int8's residuals are restored at the same number of ranks only, as in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ..training.diloco import FORMAT, check_loadable

if TYPE_CHECKING:
    from .diloco import Config, DiLoCoState


def _world_size() -> int:
    from ..core.runtime import current

    return current().topology.size


def diloco_state_dict(config: Config, state: DiLoCoState) -> dict[str, Any]:
    """The checkpoint of ``state`` (see the module's doc)."""
    schedule, names = config.schedule, config.names
    step = int(state.step)
    flight = schedule.in_flight_after(step)
    in_flight = None
    if flight is not None:
        fragment, sent_at = flight
        indices = config.fragments[fragment]
        in_flight = {"fragment": fragment, "sent_at": sent_at,
                     "average": {names[i]: np.array(state.average[i]) for i in indices},
                     "anchor": {names[i]: np.array(state.anchor[i]) for i in indices}}
    return {"format": FORMAT, "sync_every": schedule.sync_every, "fragments": schedule.fragments,
            "delay": schedule.delay, "inner_steps": step, "syncs": int(state.syncs),
            "global": {name: np.array(leaf) for name, leaf in zip(names, state.global_params, strict=True)},
            "outer_optimizer": [jax.tree.map(np.array, outer) for outer in state.outer], "in_flight": in_flight,
            "residuals": {name: np.array(leaf) for name, leaf in zip(names, state.residuals, strict=False)},
            "residuals_world_size": _world_size()}


def load_diloco_state_dict(config: Config, state: DiLoCoState, checkpoint: dict[str, Any]) -> DiLoCoState:
    """``state`` with ``checkpoint``'s outer state (checked first against the schedule and the model)."""
    check_loadable(config.schedule, config.names, checkpoint)
    names = config.names
    global_params = [jnp.asarray(checkpoint["global"][name], dtype=leaf.dtype).reshape(leaf.shape)
                     for name, leaf in zip(names, state.global_params, strict=True)]
    outer = tuple(_like(saved, mine, f"outer state of fragment {index}")
                  for index, (saved, mine) in enumerate(zip(checkpoint["outer_optimizer"], state.outer, strict=True)))
    average, anchor = list(state.average), list(state.anchor)
    flight = checkpoint["in_flight"]
    if flight is not None:
        for i in config.fragments[flight["fragment"]]:
            average[i] = jnp.asarray(flight["average"][names[i]], dtype=average[i].dtype)
            anchor[i] = jnp.asarray(flight["anchor"][names[i]], dtype=anchor[i].dtype)
    residuals = [jnp.zeros_like(leaf) for leaf in state.residuals]  # error feedback from zero at another size
    if residuals and checkpoint.get("residuals_world_size") == _world_size():
        residuals = [jnp.asarray(checkpoint["residuals"][name], jnp.float32) for name in names]
    return state._replace(step=jnp.asarray(checkpoint["inner_steps"], jnp.int32),
                          syncs=jnp.asarray(checkpoint["syncs"], jnp.int32), outer=outer,
                          global_params=global_params, average=average, anchor=anchor, residuals=residuals)


def _like(saved: Any, mine: Any, what: str) -> Any:
    """``saved`` with ``mine``'s tree structure and dtypes, or a ValueError naming ``what`` differs."""
    saved_leaves = jax.tree.leaves(saved)
    my_leaves, treedef = jax.tree.flatten(mine)
    if len(saved_leaves) != len(my_leaves):
        raise ValueError(f"DiLoCo checkpoint's {what} has {len(saved_leaves)} arrays, this outer transformation's "
                         f"has {len(my_leaves)}: was it saved with another outer optimizer?")
    return jax.tree.unflatten(treedef, [jnp.asarray(value, dtype=jnp.asarray(leaf).dtype)
                                        for value, leaf in zip(saved_leaves, my_leaves, strict=True)])


__all__ = ["diloco_state_dict", "load_diloco_state_dict"]

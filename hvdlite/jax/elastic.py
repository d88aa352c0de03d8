"""``hvd.elastic`` for JAX: ``JaxState`` and ``run`` (Horovod's elastic API, for pytrees)::

    state = hvd.elastic.JaxState(params=params, opt_state=tx.init(params), step=0)

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, steps):
            state.params, state.opt_state = train_step(state.params, state.opt_state, batches[step])
            state.step = step + 1
            state.commit()

``params``, ``opt_state`` and every keyword argument holding arrays are pytrees: a commit copies
their arrays to host NumPy arrays, a restore puts copies back where they were (same sharding), and
a sync broadcasts rank 0's arrays (in one request group). JAX arrays are immutable, so assign the
new trees to the state's attributes after each step. Other keyword arguments are plain picklable
attributes (see :mod:`hvdlite.elastic`). Typed PRNG keys (``jax.random.key``) cannot be copied to
NumPy: keep ``jax.random.key_data(key)`` in the state instead.

An optax state holding a :class:`~hvdlite.jax.DiLoCoState` is DiLoCo's elastic state as it is: a
sync gives every rank rank 0's global parameters, outer state and step counters, and starts int8's
error feedback again from zero (see ``DiLoCoTransformation.regroup``).

``run`` is :func:`hvdlite.elastic.run`, and also recognises a collective that failed inside
``jax.jit`` (JAX re-raises it as ``jax.errors.JaxRuntimeError``) as ``HorovodInternalError``.
"""

from __future__ import annotations

import copy
from typing import Any

import jax
import numpy as np

from ..elastic import FrameworkState, ObjectState, State
from ..elastic.retry import translating_run
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .collectives.state import broadcast_parameters
from .slow_links.diloco import DiLoCoState

run = translating_run((jax.errors.JaxRuntimeError,))


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray))


def _has_arrays(value: Any) -> bool:
    return any(_is_array(leaf) for leaf in jax.tree.leaves(value))


def _check_leaves(name: str, tree: Any) -> None:
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            raise TypeError(f"JaxState attribute {name!r} holds a typed PRNG key ({leaf.dtype}), which has no "
                            "NumPy form: keep jax.random.key_data(key) in the state and rebuild the key with "
                            "jax.random.wrap_key_data")


class _HostTree:
    """A pytree's leaves copied to host memory, with where each JAX array lived."""

    def __init__(self, tree: Any) -> None:
        leaves, self.treedef = jax.tree.flatten(tree)
        self.leaves = [np.array(leaf, copy=True) if _is_array(leaf) else copy.deepcopy(leaf) for leaf in leaves]
        self.shardings = [leaf.sharding if isinstance(leaf, jax.Array) else None for leaf in leaves]

    def rebuild(self) -> Any:
        """A new pytree of copies: JAX arrays back on their devices, NumPy arrays and objects as saved."""
        leaves = [jax.device_put(np.array(leaf, copy=True), sharding) if sharding is not None
                  else copy.deepcopy(leaf) for leaf, sharding in zip(self.leaves, self.shardings, strict=True)]
        return jax.tree.unflatten(self.treedef, leaves)


class JaxState(FrameworkState):
    """State of a JAX training process: ``params``, ``opt_state`` and any keyword attributes.

    Keyword attributes that hold JAX or NumPy arrays are pytrees, like ``params``; the others are
    deep-copied and broadcast as Python objects.
    """

    def __init__(self, params: Any = None, opt_state: Any = None, **kwargs: Any) -> None:
        trees = {"params": params, "opt_state": opt_state}
        trees.update({name: value for name, value in kwargs.items() if _has_arrays(value)})
        for name, tree in trees.items():
            _check_leaves(name, tree)
            setattr(self, name, tree)
        self._tree_names = tuple(trees)
        super().__init__(**{name: value for name, value in kwargs.items() if name not in trees})

    def _save_values(self) -> None:
        self._saved_trees = {name: _HostTree(getattr(self, name)) for name in self._tree_names}

    def _restore_values(self) -> None:
        for name, saved in self._saved_trees.items():
            setattr(self, name, saved.rebuild())

    def _sync_values(self) -> None:
        current = {name: getattr(self, name) for name in self._tree_names}
        synced = broadcast_parameters(current, root_rank=0, name="elastic.JaxState")
        for name in self._tree_names:
            setattr(self, name, _without_residuals(synced[name]))


def _without_residuals(tree: Any) -> Any:
    """``tree`` with the int8 error feedback of every DiLoCo state in it zeroed: a sync gave each rank
    rank 0's residuals, which are what rank 0's rounding dropped, and the world may have changed."""
    def reset(node: Any) -> Any:
        if isinstance(node, DiLoCoState) and node.residuals:
            return node._replace(residuals=[jax.numpy.zeros_like(leaf) for leaf in node.residuals])
        return node

    return jax.tree.map(reset, tree, is_leaf=lambda node: isinstance(node, DiLoCoState))


__all__ = ["State", "ObjectState", "JaxState", "run", "HorovodInternalError", "HostsUpdatedInterrupt"]

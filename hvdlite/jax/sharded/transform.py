"""Sharded optimizer state (ZeRO stage 1) for the optax ``DistributedOptimizer``.

With ``shard_optimizer_state=True`` each of the N ranks of the process set keeps the wrapped
transformation's state (Adam's moments, a momentum trace) for 1/N of the parameters only:

1. the updates (gradients) are flattened into one 1-D vector per dtype, zero-padded to a multiple
   of N, and reduce-scattered (Average or Sum): rank r receives the reduced block r, of length
   padded / N;
2. the parameters are flattened the same way and sliced to the same block;
3. the wrapped transformation runs on the blocks only, so its state is 1/N of the unsharded one;
4. the new update blocks are all-gathered, the padding dropped, and the vectors cut back into the
   original tree (shapes and dtypes), so the caller sees the usual full updates.

Why flat vectors rather than a slice of every leaf: the core fuses small allreduces only, not
reducescatters or allgathers, so one vector per dtype costs two messages per step where a slice
per leaf would cost two per leaf. Why per dtype: the core reduces arrays of one dtype, and casting
mixed leaves to one dtype would change the arithmetic. Padding zeros see zero gradients and zero
parameters, so the elementwise transformations below keep them at zero; they are dropped anyway.

The wrapped transformation sees a tuple of 1-D vectors, not the parameters' tree. That is exact
only for *elementwise* transformations, whose result for an element depends on that element alone:
sgd (with momentum or Nesterov), adam, adamw, rmsprop, adagrad, lion, add_decayed_weights without
a mask, and the like. Transformations using whole-tensor or whole-tree quantities (clip_by_global_norm,
lamb and lars trust ratios, adafactor's factored moments, anything masked or labelled by the tree's
structure or shapes: masked, multi_transform, callable weight-decay masks) would silently compute
something else. Whether an optax transformation is elementwise cannot be detected reliably from the
outside, so this is not checked: apply such transformations outside the wrapper (e.g. clip before
it) or leave the state unsharded.

The state is this rank's own: it must not be broadcast with ``broadcast_optimizer_state`` (every
rank would get the root's block), and a checkpoint must keep one state per rank. It is tied to N:
after the set changes size (an elastic reset) initialise it again. A rank outside the process set
keeps a full, unsharded state and updates locally, as the unsharded wrapper does. Under
``jax.jit`` the two collectives become ordered io_callbacks (see :mod:`hvdlite.jax.collectives.calls`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ..collectives.calls import grouped_allgather, grouped_reducescatter


class ShardedState(NamedTuple):
    """State of a ``DistributedOptimizer`` with ``shard_optimizer_state=True``."""

    inner: Any  # the wrapped transformation's state for this rank's block (a tuple of 1-D vectors per dtype)


class Layout(NamedTuple):
    """How a pytree maps to flat, padded vectors: one per dtype, leaves in tree order."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # per leaf
    dtypes: tuple[np.dtype, ...]  # per leaf
    groups: tuple[tuple[int, ...], ...]  # leaf indices of each dtype, in order of first appearance
    padded: tuple[int, ...]  # each group's vector length: a positive multiple of the number of ranks


def plan_layout(tree: Any, size: int) -> Layout:
    """The layout of ``tree``'s leaves for ``size`` ranks (shapes only: works on tracers too)."""
    leaves, treedef = jax.tree.flatten(tree)
    shapes = tuple(tuple(np.shape(leaf)) for leaf in leaves)
    dtypes = tuple(np.dtype(jnp.result_type(leaf)) for leaf in leaves)
    by_dtype: dict[np.dtype, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        by_dtype.setdefault(dtype, []).append(index)
    groups = tuple(tuple(indices) for indices in by_dtype.values())
    # At least one element per rank, so no collective moves an empty block.
    padded = tuple(-(-max(sum(math.prod(shapes[i]) for i in g), 1) // size) * size for g in groups)
    return Layout(treedef, shapes, dtypes, groups, padded)


def flatten(tree: Any, layout: Layout) -> tuple[jax.Array, ...]:
    """``tree``'s leaves as one zero-padded 1-D vector per group of ``layout``.

    ``tree`` must have ``layout``'s structure (parameters for gradients' layout, say); its leaves
    are not cast, so a group's vector takes the promoted dtype of its leaves.
    """
    leaves = layout.treedef.flatten_up_to(tree)
    vectors = []
    for group, padded in zip(layout.groups, layout.padded, strict=True):
        flat = jnp.concatenate([jnp.ravel(jnp.asarray(leaves[i])) for i in group])
        vectors.append(jnp.pad(flat, (0, padded - flat.shape[0])))
    return tuple(vectors)


def take_block(vectors: Sequence[jax.Array], rank: int, size: int) -> tuple[jax.Array, ...]:
    """Block ``rank`` of ``size`` equal blocks of each vector: what a reducescatter leaves that rank."""
    blocks = []
    for vector in vectors:
        length = vector.shape[0] // size
        blocks.append(vector[rank * length:(rank + 1) * length])
    return tuple(blocks)


def unflatten(vectors: Sequence[jax.Array], layout: Layout) -> Any:
    """The tree of ``layout`` from its full (padded) vectors: padding dropped, shapes and dtypes restored."""
    leaves: list[Any] = [None] * len(layout.shapes)
    for group, vector in zip(layout.groups, vectors, strict=True):
        offset = 0
        for i in group:
            count = math.prod(layout.shapes[i])
            leaves[i] = vector[offset:offset + count].reshape(layout.shapes[i]).astype(layout.dtypes[i])
            offset += count
    return layout.treedef.unflatten(leaves)


def sharded(inner: optax.GradientTransformationExtraArgs, op: ReduceOp, scales: tuple[float, float],
            compression: Any, name: str, member: bool,
            process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """``inner`` with its state sharded over ``process_set`` (see the module's doc).

    ``scales``: the reduction's (prescale, postscale) factors; ``name``: the wrapper's base name,
    from which both collectives' names derive, so they match on every rank.
    """

    def init_fn(params: Any) -> ShardedState:
        if not member:
            return ShardedState(inner.init(params))
        rank, size = process_set.rank(), process_set.size()
        return ShardedState(inner.init(take_block(flatten(params, plan_layout(params, size)), rank, size)))

    def update_fn(updates: Any, state: ShardedState, params: Any = None,
                  **extra_args: Any) -> tuple[Any, ShardedState]:
        if not member:  # outside the set: local, unsharded, as the unsharded wrapper
            new_updates, new_inner = inner.update(updates, state.inner, params, **extra_args)
            return new_updates, ShardedState(new_inner)
        rank, size = process_set.rank(), process_set.size()
        layout = plan_layout(updates, size)
        grads = _reduce_scatter(flatten(updates, layout), op, scales, compression, name, process_set)
        param_blocks = None if params is None else take_block(flatten(params, layout), rank, size)
        blocks, new_inner = inner.update(grads, state.inner, param_blocks, **extra_args)
        # Updates are computed, not reduced, so they travel uncompressed: every rank applies the same.
        gathered = grouped_allgather(list(blocks), name=f"{name}.allgather", process_set=process_set)
        return unflatten(gathered, layout), ShardedState(new_inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _reduce_scatter(vectors: tuple[jax.Array, ...], op: ReduceOp, scales: tuple[float, float], compression: Any,
                    name: str, process_set: ProcessSet) -> tuple[jax.Array, ...]:
    """This rank's block of each vector reduced over the set, as one request group (compressed on the wire)."""
    packed = [compression.compress(vector) for vector in vectors]
    reduced = grouped_reducescatter([p[0] for p in packed], op=op, name=f"{name}.reducescatter",
                                    prescale_factor=scales[0], postscale_factor=scales[1], process_set=process_set)
    return tuple(compression.decompress(r, p[1]) for r, p in zip(reduced, packed, strict=True))


__all__ = ["Layout", "ShardedState", "flatten", "plan_layout", "sharded", "take_block", "unflatten"]

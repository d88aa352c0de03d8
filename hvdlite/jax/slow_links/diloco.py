"""DiLoCo for optax: groups train on their own and exchange pseudo-gradients every H inner steps.

The same method, schedule, merge rule and checkpoint layout as torch's :class:`hvdlite.torch.DiLoCo`
(see :mod:`hvdlite.torch.slow_links.diloco` and :mod:`hvdlite.training.diloco`), as an optax transformation::

    inner = hvd.DistributedOptimizer(optax.sgd(0.05, momentum=0.9), process_set=my_group)
    tx = hvd.DiLoCo(inner, optax.sgd(0.7, momentum=0.9, nesterov=True), sync_every=16, process_set=my_place)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)      # inside jax.jit or outside it
    params = optax.apply_updates(params, updates)

Every ``update`` is an inner step. On the schedule a fragment's pseudo-gradient ``global - local``
is averaged over ``process_set`` and the outer transformation steps on it, from the global
parameters; the returned updates move the parameters onto the result (plus, with a ``delay``, the
progress the inner steps made since the fragment was sent). The outer transformation keeps one
state per fragment, so a fragment's outer step leaves the others' momentum alone, as torch's
optimizer does for parameters without a gradient.

Everything lives in the state (:class:`DiLoCoState`), so the schedule runs under ``jax.jit`` (the
exchange is an ordered host callback in the taken ``lax.switch`` branch) and is saved with it. Unlike
torch's, the exchange runs when the fragment is sent and its result waits in the state for the
``delay`` steps: the math and the schedule are the same, but the exchange does not yet overlap the
inner steps.

Checkpoints (:meth:`DiLoCoTransformation.state_dict`) are in the layout torch's writes
(:mod:`hvdlite.torch.slow_links.diloco`): ``{"format": "hvdlite.diloco/1", "sync_every", "fragments", "delay", "inner_steps", "syncs",
"global": {name: array}, "outer_optimizer": [the outer state of each fragment], "in_flight": None or
{"fragment", "sent_at", "average": {name: array}, "anchor": {name: array}}, "residuals": {name: flat
array}, "residuals_world_size"}``, with NumPy arrays, names being the parameters' pytree paths
joined by '/'. The inner state (``state.inner``) and the parameters are saved as usual, beside it.
int8's residuals are restored at the same number of ranks only, as in torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ...core.runtime import current
from ...process_sets import ProcessSet, global_process_set
from ...training.diloco import FORMAT, DiLoCoSchedule, check_agreement, check_loadable, check_member, split_fragments
from ...training.diloco_exchange import average_deltas, check_compression
from ..collectives.arrays import is_traced
from ..collectives.calls import run_on_host


class DiLoCoState(NamedTuple):
    """State of :func:`DiLoCo` (leaves in the parameters' flattening order)."""

    step: jax.Array  # inner steps taken (the schedule's count)
    syncs: jax.Array  # fragment exchanges landed
    inner: Any  # the inner transformation's state
    outer: tuple  # the outer transformation's state, one per fragment
    global_params: list  # the global parameters
    average: list  # with a delay: the averaged pseudo-gradient in flight (its fragment's leaves), else []
    anchor: list  # with a delay: the local parameters when it was sent, else []
    residuals: list  # int8: what this rank's rounding dropped, flat float32 per leaf, else []


class Carry(NamedTuple):
    """What a sync changes, passed through ``lax.switch``."""

    local: list
    global_params: list
    outer: tuple
    average: list
    anchor: list
    residuals: list
    syncs: jax.Array


class DiLoCoTransformation(optax.GradientTransformationExtraArgs):
    """The optax transformation :func:`DiLoCo` returns, with the checkpoint methods of the shared layout."""

    def state_dict(self, state: DiLoCoState) -> dict[str, Any]:
        """``state``'s outer state in the layout torch's and Keras' DiLoCo write (``hvdlite.diloco/1``)."""
        return _state_dict(self.config, state)

    def load_state_dict(self, state: DiLoCoState, checkpoint: dict[str, Any]) -> DiLoCoState:
        """``state`` (from ``init``; its inner state is kept) with :meth:`state_dict`'s outer state."""
        return _load_state_dict(self.config, state, checkpoint)

    def regroup(self, process_set: ProcessSet, inner: optax.GradientTransformation | None = None) -> None:
        """Elastic: carry on in a re-formed job. Call it on every rank from a reset callback, with the
        new world's sets registered again (the old world's are gone): ``process_set``, the ranks the
        pseudo-gradients are averaged over now, and ``inner``, a new inner transformation (usually a
        ``DistributedOptimizer`` over the new group, of the same kind as before so that the state
        fits; None: keep the old one). The ranks of the set check that they agree, as ``init`` does
        on a joining rank. Jit the training step again afterwards: a traced step keeps the sets and
        the inner transformation it was traced with. A joining rank builds its DiLoCo over the same
        sets and calls ``init`` instead."""
        config = self.config
        check_member(process_set)
        if not config.names:
            raise ValueError("DiLoCo.regroup needs the parameters' names: call it after init or an update")
        config.process_set = process_set
        if inner is not None:
            config.inner = optax.with_extra_args_support(inner)
        _check_ranks_agree(config, config.signature)


class Config:
    """What a DiLoCo transformation was built with, and its parameters' names and fragments (from ``init``)."""

    def __init__(self, schedule: DiLoCoSchedule, inner: optax.GradientTransformationExtraArgs,
                 outer: optax.GradientTransformation, process_set: ProcessSet, compression: str | None) -> None:
        self.schedule, self.inner, self.outer = schedule, inner, outer
        self.process_set, self.compression = process_set, compression
        self.names: list[str] = []
        self.signature: list[tuple[str, tuple, str]] = []  # each parameter's name, shape and dtype
        self.fragments: list[list[int]] = []

    def describe(self, params: Any) -> None:
        """Name the parameters (their paths) and split them into fragments."""
        paths, _ = jax.tree_util.tree_flatten_with_path(params)
        if not paths:
            raise ValueError("DiLoCo was given no parameters")
        self.names = [_path_name(path) for path, _ in paths]
        self.signature = [(name, tuple(np.shape(leaf)), str(jnp.result_type(leaf)))
                          for name, (_, leaf) in zip(self.names, paths, strict=True)]
        self.fragments = split_fragments([int(np.size(leaf)) for _, leaf in paths], self.schedule.fragments,
                                         self.names)


def DiLoCo(inner: optax.GradientTransformation, outer: optax.GradientTransformation, *,  # noqa: N802 - torch's name
           sync_every: int, process_set: ProcessSet = global_process_set, fragments: int = 1, delay: int = 0,
           compression: str | None = None) -> DiLoCoTransformation:
    """DiLoCo (and streaming DiLoCo) around ``inner`` and ``outer`` optax transformations (see the module's doc).

    ``inner`` steps every update (a ``DistributedOptimizer`` over the group keeps a group's ranks
    alike); ``outer`` (DiLoCo: ``optax.sgd(0.7, momentum=0.9, nesterov=True)``) steps on the averaged
    pseudo-gradients, one fragment every ``sync_every / fragments`` updates, landing ``delay``
    updates after it is sent. ``compression``: None, ``"bf16"`` or ``"int8"`` (with error feedback).
    """
    config = Config(DiLoCoSchedule(sync_every, fragments, delay), optax.with_extra_args_support(inner), outer,
                    process_set, check_compression(compression))
    check_member(process_set)

    def init_fn(params: Any) -> DiLoCoState:
        config.describe(params)
        leaves = jax.tree.leaves(params)
        if not any(is_traced(leaf) for leaf in leaves):
            _check_ranks_agree(config, config.signature)
        with_delay = [jnp.zeros_like(leaf) for leaf in leaves] if delay else []
        return DiLoCoState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.int32), config.inner.init(params),
                           tuple(outer.init([leaves[i] for i in part]) for part in config.fragments),
                           [jnp.asarray(leaf) for leaf in leaves], with_delay, list(with_delay),
                           [jnp.zeros(np.size(leaf), jnp.float32) for leaf in leaves] if compression == "int8" else [])

    def update_fn(grads: Any, state: DiLoCoState, params: Any = None, **extra_args: Any) -> tuple[Any, DiLoCoState]:
        if params is None:
            raise ValueError("DiLoCo steps from the parameters: pass them, tx.update(grads, state, params)")
        if not config.names:  # init ran elsewhere (a restored state): name the parameters once
            config.describe(params)
        inner_updates, inner_state = config.inner.update(grads, state.inner, params, **extra_args)
        leaves, treedef = jax.tree.flatten(params)
        moved = jax.tree.leaves(optax.apply_updates(params, inner_updates))
        carry = Carry(moved, state.global_params, state.outer, state.average, state.anchor, state.residuals,
                      state.syncs)
        count = state.step + 1
        if config.schedule.delay:
            carry = _choose(_fragment_after(config.schedule, count - config.schedule.delay), carry,
                            [_land(config, p) for p in range(config.schedule.fragments)])
        carry = _choose(_fragment_after(config.schedule, count), carry,
                        [_send(config, p) for p in range(config.schedule.fragments)])
        updates = [(new - old).astype(jnp.asarray(u).dtype) for new, old, u in
                   zip(carry.local, leaves, jax.tree.leaves(inner_updates), strict=True)]
        new_state = DiLoCoState(count, carry.syncs, inner_state, carry.outer, carry.global_params, carry.average,
                                carry.anchor, carry.residuals)
        return jax.tree.unflatten(treedef, updates), new_state

    transformation = DiLoCoTransformation(init_fn, update_fn)
    transformation.config = config
    return transformation


def _fragment_after(schedule: DiLoCoSchedule, count: jax.Array) -> jax.Array:
    """1 + the fragment :meth:`DiLoCoSchedule.sent_after` ``count`` gives, or 0 for none (traceable)."""
    hit = (count >= 1) & (count % schedule.stride == 0)
    return jnp.where(hit, (count // schedule.stride - 1) % schedule.fragments + 1, 0)


def _choose(index: jax.Array, carry: Carry, branches: list[Callable[[Carry], Carry]]) -> Carry:
    """``carry`` unchanged (index 0) or through ``branches[index - 1]``: ``lax.switch`` under a trace
    (only the taken branch's exchange runs), a Python branch outside one."""
    every = [lambda unchanged: unchanged, *branches]
    if is_traced(index):
        return jax.lax.switch(index, every, carry)
    return every[int(index)](carry)


def _send(config: Config, fragment: int) -> Callable[[Carry], Carry]:
    """The branch that averages ``fragment``'s pseudo-gradients, and lands them at once without a delay."""
    indices = config.fragments[fragment]

    def send(carry: Carry) -> Carry:
        deltas = [carry.global_params[i] - carry.local[i] for i in indices]
        residuals = [carry.residuals[i] for i in indices] if carry.residuals else []
        averages, new_residuals = _exchange(config, fragment, deltas, residuals)
        if carry.residuals:
            carry = carry._replace(residuals=_put(carry.residuals, indices, new_residuals))
        if not config.schedule.delay:
            return _outer_step(config, fragment, carry, averages)
        return carry._replace(average=_put(carry.average, indices, averages),
                              anchor=_put(carry.anchor, indices, [carry.local[i] for i in indices]))

    return send


def _land(config: Config, fragment: int) -> Callable[[Carry], Carry]:
    """The branch that lands ``fragment``'s exchange in flight: the outer step, plus the local progress
    since it was sent (the merge rule)."""
    indices = config.fragments[fragment]

    def land(carry: Carry) -> Carry:
        progress = [carry.local[i] - carry.anchor[i] for i in indices]
        carry = _outer_step(config, fragment, carry, [carry.average[i] for i in indices])
        return carry._replace(local=_put(carry.local, indices, [carry.local[i] + move for i, move in
                                                                zip(indices, progress, strict=True)]))

    return land


def _outer_step(config: Config, fragment: int, carry: Carry, averages: list) -> Carry:
    """The outer transformation's step on ``fragment`` from the global parameters; the fragment's
    local parameters become the new global ones."""
    indices = config.fragments[fragment]
    global_params = [carry.global_params[i] for i in indices]
    updates, outer_state = config.outer.update(averages, carry.outer[fragment], global_params)
    stepped = optax.apply_updates(global_params, updates)
    outer = tuple(outer_state if index == fragment else state for index, state in enumerate(carry.outer))
    return carry._replace(local=_put(carry.local, indices, stepped),
                          global_params=_put(carry.global_params, indices, stepped),
                          outer=outer, syncs=carry.syncs + 1)


def _exchange(config: Config, fragment: int, deltas: list, residuals: list) -> tuple[list, list]:
    """``deltas`` averaged over the process set by the host's exchange (and int8's new residuals)."""
    count = len(deltas)

    def host(arrays: list[np.ndarray], name: str | None, _outputs: Any) -> list[np.ndarray]:
        averages, new_residuals = average_deltas(arrays[:count], arrays[count:] or None, config.compression,
                                                 config.process_set, str(name))
        return [*averages, *(new_residuals or [])]

    results = run_on_host([*deltas, *residuals], f"diloco.{fragment}", host, config.process_set)
    return results[:count], results[count:]


def _put(leaves: list, indices: list[int], values: list) -> list:
    """``leaves`` with ``leaves[indices[k]]`` replaced by ``values[k]`` (a new list)."""
    replaced = list(leaves)
    for index, value in zip(indices, values, strict=True):
        replaced[index] = value
    return replaced


def _path_name(path: tuple) -> str:
    """A parameter's name from its pytree path: keys, attributes and indices joined by '/'."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts) or "param"


def _check_ranks_agree(config: Config, signature: list[tuple[str, tuple, str]]) -> None:
    """Refuse, on every rank of the set, a schedule, codec or parameters that differ between ranks."""
    schedule = config.schedule
    check_agreement({"the schedule (sync_every, fragments, delay)": (schedule.sync_every, schedule.fragments,
                                                                    schedule.delay),
                     "compression": config.compression,
                     "the parameters' names, shapes and dtypes": signature}, config.process_set)


def _state_dict(config: Config, state: DiLoCoState) -> dict[str, Any]:
    """The checkpoint of ``state`` (:meth:`DiLoCoTransformation.state_dict`)."""
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
            "residuals_world_size": current().topology.size}


def _load_state_dict(config: Config, state: DiLoCoState, checkpoint: dict[str, Any]) -> DiLoCoState:
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
    if residuals and checkpoint.get("residuals_world_size") == current().topology.size:
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


__all__ = ["DiLoCo", "DiLoCoState", "DiLoCoTransformation"]

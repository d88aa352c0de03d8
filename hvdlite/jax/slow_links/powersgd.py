"""PowerSGD for the optax ``DistributedOptimizer``: low-rank averaging with error feedback, in jnp.

The algorithm and its rules (which leaves are compressed, as what matrix, the seeded initial
``Q``) are :mod:`hvdlite.training.powersgd`'s, shared with torch. Here the per-leaf factors ``Q``
and the error feedback live in the optax state (:class:`PowerSGDState`), created by ``init`` from
the parameters, so they are saved, restored and jitted with the rest of the state. The step
counter is in the state too: under ``jax.jit`` the switch from plain averaging to PowerSGD at
``start_step`` is a ``lax.cond``, so only the taken branch's collectives run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ...ops import Average
from ...process_sets import ProcessSet
from ...training.powersgd import P_NAME, Q_NAME, UNCOMPRESSED_NAME, VANILLA_NAME, PowerSGD
from ..collectives.arrays import is_traced
from ..collectives.calls import allreduce

# Averages a list of arrays across ranks as one request of the given name.
Reduce = Callable[[list[Any], str], list[Any]]


class PowerSGDState(NamedTuple):
    """State of a ``DistributedOptimizer`` with ``compression=Compression.powersgd(...)``."""

    step: jax.Array  # updates so far; compression starts at start_step
    qs: tuple[jax.Array, ...]  # the warm-started right factor (m x r) of each compressed leaf, in leaf order
    errors: tuple[jax.Array, ...]  # this rank's error feedback (n x m) of each compressed leaf
    inner: Any  # the wrapped transformation's state


def orthogonalize(matrix: jax.Array, epsilon: float) -> jax.Array:
    """Gram-Schmidt on ``matrix``'s columns (r is small and static, so the loop unrolls under jit)."""
    columns, rest = [], matrix
    for _ in range(matrix.shape[1]):
        column = rest[:, :1] / (jnp.linalg.norm(rest[:, :1]) + epsilon)
        rest = rest[:, 1:]
        rest = rest - jnp.sum(column * rest, axis=0, keepdims=True) * column
        columns.append(column)
    return jnp.concatenate(columns, axis=1)


def init_factors(config: PowerSGD, params: Any) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """The initial ``qs`` (seeded, the same on every rank) and zero ``errors`` for ``params``' leaves."""
    qs, errors = [], []
    for index, leaf in enumerate(jax.tree.leaves(params)):
        plan = config.plan(jnp.shape(leaf))
        if plan is not None:
            n, m, r = plan
            dtype = jnp.result_type(leaf)
            qs.append(jnp.asarray(config.initial_q(index, m, r), dtype))
            errors.append(jnp.zeros((n, m), dtype))
    return tuple(qs), tuple(errors)


def powersgd_round(config: PowerSGD, leaves: list[Any], qs: tuple[jax.Array, ...], errors: tuple[jax.Array, ...],
                   reduce: Reduce) -> tuple[list[Any], tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """One compressed step: the averaged ``leaves`` (compressed ones approximated), new ``qs`` and ``errors``."""
    plans = [config.plan(jnp.shape(leaf)) for leaf in leaves]
    compressed = [i for i, plan in enumerate(plans) if plan is not None]
    if len(compressed) != len(qs):
        raise ValueError(f"Compression.powersgd: the updates have {len(compressed)} compressed leaves but the state "
                         f"was made for {len(qs)}; pass updates shaped like the params given to init")
    out = list(leaves)
    plain = [i for i, plan in enumerate(plans) if plan is None]
    if plain:
        for i, value in zip(plain, reduce([leaves[i] for i in plain], UNCOMPRESSED_NAME), strict=True):
            out[i] = value
    if not compressed:
        return out, qs, errors
    # M = this step's gradient plus what earlier approximations left out.
    matrices = [leaves[i].reshape(plans[i][:2]) + e for i, e in zip(compressed, errors, strict=True)]
    ps = reduce([m @ q.astype(m.dtype) for m, q in zip(matrices, qs, strict=True)], P_NAME)
    ps = [orthogonalize(p, config.epsilon) for p in ps]  # the same averaged P on every rank: the same result
    new_qs = reduce([m.T @ p for m, p in zip(matrices, ps, strict=True)], Q_NAME)
    approximations = [p @ q.T for p, q in zip(ps, new_qs, strict=True)]
    for i, approximation in zip(compressed, approximations, strict=True):
        out[i] = approximation.reshape(jnp.shape(leaves[i])).astype(jnp.result_type(leaves[i]))
    new_errors = tuple((m - a).astype(e.dtype) for m, a, e in zip(matrices, approximations, errors, strict=True))
    return out, tuple(q.astype(old.dtype) for q, old in zip(new_qs, qs, strict=True)), new_errors


def powersgd(inner: optax.GradientTransformationExtraArgs, config: PowerSGD, name: str, member: bool,
             process_set: ProcessSet) -> optax.GradientTransformationExtraArgs:
    """``inner`` on updates averaged by PowerSGD (plain averages for the first ``start_step`` updates)."""

    def reduce(arrays: list[Any], label: str) -> list[Any]:
        return allreduce(arrays, name=f"{name}.{label}", op=Average, process_set=process_set)

    def init_fn(params: Any) -> PowerSGDState:
        return PowerSGDState(jnp.zeros([], jnp.int32), *init_factors(config, params), inner.init(params))

    def update_fn(updates: Any, state: PowerSGDState, params: Any = None,
                  **extra_args: Any) -> tuple[Any, PowerSGDState]:
        leaves, treedef = jax.tree.flatten(updates)

        def vanilla(leaves: list[Any], qs: tuple, errors: tuple) -> tuple[list[Any], tuple, tuple]:
            return list(reduce(leaves, VANILLA_NAME)), qs, errors

        def compressed(leaves: list[Any], qs: tuple, errors: tuple) -> tuple[list[Any], tuple, tuple]:
            return powersgd_round(config, leaves, qs, errors, reduce)

        if not member or not leaves:  # off the process set: updates stay local, as without PowerSGD
            reduced, qs, errors = leaves, state.qs, state.errors
        elif is_traced(state.step):
            reduced, qs, errors = jax.lax.cond(state.step < config.start_step, vanilla, compressed,
                                               leaves, state.qs, state.errors)
        else:  # eager: a Python branch, so nothing is traced
            branch = vanilla if int(state.step) < config.start_step else compressed
            reduced, qs, errors = branch(leaves, state.qs, state.errors)
        new_updates, new_inner = inner.update(jax.tree.unflatten(treedef, reduced), state.inner, params, **extra_args)
        return new_updates, PowerSGDState(state.step + 1, qs, errors, new_inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["PowerSGDState", "init_factors", "orthogonalize", "powersgd", "powersgd_round"]

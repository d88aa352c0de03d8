"""Sharded optimizer state (ZeRO-1) for optax with real ranks, against the unsharded wrapper in the same job.

Usage: jax_sharded.py sgd|adam jit|eager. Every rank trains the same parameters (leaves of 12, 5,
7 and 1 elements: 25 in all, so 2 and 3 ranks both need padding) on its own data with two
wrappers, ``shard_optimizer_state=True`` and the unsharded one (adam is adamw, so the parameter
blocks matter too), and compares them after every step. Also checks that each rank's state holds
1/N of the padded vector, and the options sharding refuses. Prints 'ok jax sharded <rank>'.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402
from hvdlite.jax.sharded.transform import ShardedState  # noqa: E402

STEPS, TOTAL = 5, 25


def base_tx(kind: str) -> optax.GradientTransformation:
    return optax.adamw(0.05, weight_decay=0.1) if kind == "adam" else optax.sgd(0.05, momentum=0.5)


def loss_fn(params, rank):
    x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3) * (rank + 1)
    fit = jnp.mean((jnp.tanh(x @ params["w"]) - rank) ** 2)
    return fit + jnp.sum((params["b"] - rank) ** 2) + (params["s"] * (rank + 1) - 1) ** 2 + \
        jnp.sum(jnp.sin(params["v"] * (rank + 1)))


def initial():
    return {"w": jnp.linspace(-0.5, 0.5, 12).reshape(3, 4), "b": jnp.arange(5.0) / 5, "s": jnp.float32(0.3),
            "v": jnp.linspace(0.0, 1.0, 7)}


def check_refusals() -> None:
    for options in ({"local_sgd_period": 1}, {"backward_passes_per_step": 2}):
        try:
            hvd.DistributedOptimizer(optax.sgd(0.1), shard_optimizer_state=True, name="refused", **options)
        except ValueError as error:
            assert "not built" in str(error), error
        else:
            raise AssertionError(f"shard_optimizer_state with {options} was accepted")


def main() -> None:
    kind, mode = sys.argv[1], sys.argv[2]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_refusals()
    sharded = hvd.DistributedOptimizer(base_tx(kind), shard_optimizer_state=True)
    plain = hvd.DistributedOptimizer(base_tx(kind))
    params = reference = initial()
    state, reference_state = sharded.init(params), plain.init(reference)
    assert isinstance(state, ShardedState)
    block = -(-TOTAL // size)  # this rank's share of the padded vector
    vectors = [leaf for leaf in jax.tree.leaves(state.inner) if np.ndim(leaf) == 1]
    assert vectors and all(v.shape == (block,) for v in vectors), (rank, jax.tree.map(np.shape, state.inner))

    def step(tx, params, state):
        grads = jax.grad(loss_fn)(params, rank)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    run = jax.jit(step, static_argnums=0) if mode == "jit" else step
    for at in range(STEPS):
        params, state = run(sharded, params, state)
        reference, reference_state = run(plain, reference, reference_state)
        for name in reference:
            got, want = np.asarray(params[name]), np.asarray(reference[name])
            assert got.shape == want.shape and got.dtype == want.dtype, (rank, at, name, got, want)
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (rank, at, name, got, want)
        assert not np.allclose(params["v"], initial()["v"])  # it trains
    every = hvd.allgather_object(np.concatenate([np.ravel(v) for v in jax.tree.leaves(params)]).tolist())
    assert all(e == every[0] for e in every), every  # one allgather: the same parameters everywhere
    assert all(v.shape == (block,) for v in jax.tree.leaves(state.inner) if np.ndim(v) == 1)
    print(f"ok jax sharded {kind} {mode} {rank}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

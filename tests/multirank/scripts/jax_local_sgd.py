"""Local SGD for optax with real ranks: each rank's parameters against a replay of every rank in one process.

Usage: jax_local_sgd.py sgd|adam jit|eager. Rank r fits a linear model to its own data (x = r + 1)
for STEPS updates with ``local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP``; the replay runs
one optax state per rank (gradients averaged during the warm-up, local afterwards; parameters, and
with Adam its state, averaged every PERIOD local steps). Prints 'ok jax local sgd <rank>'.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

STEPS, PERIOD, WARMUP = 9, 3, 2


def base_tx(kind: str) -> optax.GradientTransformation:
    return optax.adam(0.05) if kind == "adam" else optax.sgd(0.05, momentum=0.5)


def loss_fn(params, rank):
    x = jnp.full((2, 4), rank + 1.0)
    return jnp.mean((x @ params["w"] + params["b"] - rank) ** 2)


def initial():
    return {"w": jnp.linspace(-0.5, 0.5, 4).reshape(4, 1), "b": jnp.zeros((1,))}


def replay(kind: str, size: int) -> list[list[np.ndarray]]:
    """Every rank's flattened parameters after each step, simulated here."""
    tx = base_tx(kind)
    params = [initial() for _ in range(size)]
    states = [tx.init(p) for p in params]
    history = []
    for step in range(STEPS):
        grads = [jax.grad(loss_fn)(p, r) for r, p in enumerate(params)]
        if step < WARMUP:
            mean = jax.tree.map(lambda *g: sum(g) / size, *grads)
            grads = [mean] * size
        for r in range(size):
            updates, states[r] = tx.update(grads[r], states[r], params[r])
            params[r] = optax.apply_updates(params[r], updates)
        local = step + 1 - WARMUP
        if local > 0 and local % PERIOD == 0:
            mean = jax.tree.map(lambda *p: sum(p) / size, *params)
            params = [mean] * size
            if kind == "adam":
                mean_state = jax.tree.map(
                    lambda *s: sum(s) / size if jnp.issubdtype(s[0].dtype, jnp.floating) else s[0], *states)
                states = [mean_state] * size
        history.append([np.concatenate([np.ravel(v) for v in jax.tree.leaves(p)]) for p in params])
    return history


def main() -> None:
    kind, mode = sys.argv[1], sys.argv[2]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tx = hvd.DistributedOptimizer(base_tx(kind), local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP,
                                  local_sgd_average_state=kind == "adam")
    params = initial()
    state = tx.init(params)

    def step(params, state):
        grads = jax.grad(loss_fn)(params, rank)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if mode == "jit" else step
    expected = replay(kind, size)
    for at in range(STEPS):
        params, state = step(params, state)
        mine = np.concatenate([np.ravel(v) for v in jax.tree.leaves(params)])
        assert np.allclose(mine, expected[at][rank], atol=1e-5), (rank, at, mine, expected[at][rank])
        every = hvd.allgather_object(mine.tolist())
        local = at + 1 - WARMUP
        # Together during the warm-up and after an average (p + (mean - p) may round differently per
        # rank, hence the tolerance); apart in between.
        together = all(np.allclose(e, every[0], atol=1e-6) for e in every)
        assert together == (local <= 0 or local % PERIOD == 0), (rank, at, every)
    print(f"ok jax local sgd {rank}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

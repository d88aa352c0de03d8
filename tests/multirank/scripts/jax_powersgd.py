"""PowerSGD for optax with real ranks: each step's updates against a replay of every rank in one process.

Usage: jax_powersgd.py MODE[,MODE] with MODE eager or jit. Rank r fits {"w": 16x12 (compressed at
rank 2), "b": 1-D (uncompressed), "s": 3x4 (too small to be worth compressing)} to its own data
for STEPS updates of SGD through ``DistributedOptimizer(compression=Compression.powersgd(rank=RANK,
start_step=START))``. After every update it checks that the updates and parameters are
bit-identical on every rank, that they equal the replay (the algorithm written plainly in NumPy
float64, QR for the orthogonalization, averaging by hand) and, before START, that they are the
plain average. Prints 'ok jax powersgd <mode> <rank>'.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402
from hvdlite.jax.slow_links.powersgd import PowerSGDState  # noqa: E402

STEPS, START, RANK, LR = 6, 2, 2, 0.1
COMPRESSED = "w"  # (16 + 12) * 2 * 2 < 16 * 12 is compressed; (3 + 4) * 2 * 2 >= 3 * 4 is not


def initial() -> dict:
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((16, 12)) * 0.3, jnp.float32), "b": jnp.zeros((16,), jnp.float32),
            "s": jnp.asarray(rng.standard_normal((3, 4)) * 0.3, jnp.float32)}


def data(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([step, rank])
    return (rng.standard_normal((8, 12)) * (rank + 1)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)


def loss_fn(params: dict, x: jax.Array, target: jax.Array) -> jax.Array:
    y = x @ params["w"].T + params["b"]
    return jnp.mean((y[:, :4] @ params["s"].T + 0.1 * y[:, 4:7] - target) ** 2)


def replay(size: int) -> list[dict[str, dict[str, np.ndarray]]]:
    """Per step: the gradient every rank should end with, and the plain average of the raw ones."""
    params = initial()
    index = sorted(params).index(COMPRESSED)  # the leaf's place in flatten order seeds its Q
    q = np.random.default_rng([0, index]).standard_normal((12, RANK))
    errors = [np.zeros((16, 12)) for _ in range(size)]
    history = []
    for step in range(STEPS):
        raw = [{k: np.asarray(v, np.float64) for k, v in jax.grad(loss_fn)(params, *data(r, step)).items()}
               for r in range(size)]
        mean = {k: sum(r[k] for r in raw) / size for k in params}
        final = dict(mean)
        if step >= START:
            matrices = [raw[r][COMPRESSED] + errors[r] for r in range(size)]
            p, _ = np.linalg.qr(sum(m @ q for m in matrices) / size)
            q = sum(m.T @ p for m in matrices) / size
            final[COMPRESSED] = p @ q.T
            errors = [m - final[COMPRESSED] for m in matrices]
        params = {k: (v - LR * final[k]).astype(np.float32) for k, v in params.items()}
        history.append({"final": final, "mean": mean})
    return history


def check_step(updates: dict, params: dict, state: PowerSGDState, expected: dict, step: int, label: str) -> None:
    rank = hvd.rank()
    grads = {k: -np.asarray(v) / LR for k, v in updates.items()}
    mine = np.concatenate([np.ravel(v) for v in [*jax.tree.leaves(updates), *jax.tree.leaves(params)]])
    every = np.asarray(hvd.allgather(mine[None], name=f"check.{label}.{step}"))
    for other in range(every.shape[0]):  # (a) bit-identical on every rank
        assert np.array_equal(every[other], mine), (rank, step, other, np.abs(every[other] - mine).max())
    for k, grad in grads.items():  # (b) the replay
        assert np.allclose(grad, expected["final"][k], atol=1e-5), (rank, step, k, np.abs(grad - expected["final"][k]).max())
    if step < START:  # (c) plain averaging before start_step
        assert all(np.allclose(g, expected["mean"][k], atol=1e-5) for k, g in grads.items()), (rank, step)
    else:  # compressing: W is no longer the exact average; the others still are
        assert np.abs(grads[COMPRESSED] - expected["mean"][COMPRESSED]).max() > 1e-3, (rank, step)
        assert np.allclose(grads["b"], expected["mean"]["b"], atol=1e-5), (rank, step)
    assert int(state.step) == step + 1 and [q.shape for q in state.qs] == [(12, RANK)], state


def train(mode: str, rank: int, expected: list) -> None:
    tx = hvd.DistributedOptimizer(optax.sgd(LR), compression=hvd.Compression.powersgd(rank=RANK, start_step=START))
    params = initial()
    state = tx.init(params)

    def step(params, state, x, target):
        grads = jax.grad(loss_fn)(params, x, target)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, updates

    step = jax.jit(step) if mode == "jit" else step
    for at in range(STEPS):
        params, state, updates = step(params, state, *map(jnp.asarray, data(rank, at)))
        check_step(updates, params, state, expected[at], at, mode)
    print(f"ok jax powersgd {mode} {rank}", flush=True)


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    try:  # options PowerSGD is not built to combine with are refused by name
        hvd.DistributedOptimizer(optax.sgd(LR), backward_passes_per_step=2, compression=hvd.Compression.powersgd())
        raise AssertionError("backward_passes_per_step=2 was accepted")
    except ValueError as error:
        assert "backward_passes_per_step=2" in str(error), error
    expected = replay(size)
    for mode in sys.argv[1].split(","):
        train(mode, rank, expected)
    hvd.shutdown()


if __name__ == "__main__":
    main()

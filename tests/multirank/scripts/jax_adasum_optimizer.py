"""optax DistributedOptimizer(op=Adasum) on real ranks against a replay in one process.

Usage: jax_adasum_optimizer.py (under hvdliterun, any -np). The replay keeps one optax state per
rank (each rank's state stays its own, as in Horovod): at each step every replayed rank runs the
transformation from the shared parameters on its own data, and the parameters move by
hvdlite.core.transport.adasum_math.reference of those updates, leaf by leaf. Cases: Adam eagerly, SGD with momentum
and AdamW (weight decay is part of the change) under jit, backward_passes_per_step=2 under jit, a
process set of the even ranks (ranks outside it step alone), and the refusals. Prints
"ok jax adasum <case>".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hvdlite.jax as hvd
from hvdlite.core.transport import adasum_math as adasum

# OUTPUTS: with one output, every rank's b1 gradient has the signs of w2 (or their opposite), so
# Adam's first updates (about +-lr each) of two ranks can cancel exactly, where Adasum's result is
# decided by rounding.
STEPS, FEATURES, HIDDEN, OUTPUTS = 4, 5, 8, 2


def init_params() -> dict:
    return dict(_init_params())  # a fresh dict of the one draw (JAX arrays are immutable)


@functools.cache  # every case and every replay starts from the same parameters: draw them once
def _init_params() -> dict:
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.5, "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, OUTPUTS)) * 0.5}


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] - y) ** 2)


def data(rank: int, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * step + 10 * rank + micro)
    return rng.normal(size=(3, FEATURES)).astype(np.float32), rng.normal(size=(3, OUTPUTS)).astype(np.float32)


def transformation(kind: str) -> optax.GradientTransformation:
    return {"adam": lambda: optax.adam(0.05), "sgd": lambda: optax.sgd(0.1, momentum=0.9),
            "adamw": lambda: optax.adamw(0.05, weight_decay=0.1)}[kind]()


def gradients(params: dict, rank: int, step: int, passes: int) -> list[dict]:
    return [jax.grad(loss_fn)(params, *data(rank, step, micro)) for micro in range(passes)]


def replay(kind: str, ranks: list[int], passes: int) -> dict:
    """The parameters every rank of ``ranks`` should end with."""
    tx, params = transformation(kind), init_params()
    states = [tx.init(params) for _ in ranks]
    for step in range(STEPS):
        changes = []
        for index, rank in enumerate(ranks):
            micro = gradients(params, rank, step, passes)
            mean = jax.tree.map(lambda *g: sum(g) / passes, *micro) if passes > 1 else micro[0]
            update, states[index] = tx.update(mean, states[index], params)
            changes.append(update)
        combined = jax.tree.map(lambda *u: adasum.reference([np.asarray(v, np.float64) for v in u]), *changes)
        params = jax.tree.map(lambda p, c: p + jnp.asarray(c, p.dtype), params, combined)
    return params


def run_case(kind: str, passes: int, jit: bool, process_set: hvd.ProcessSet, rank: int) -> None:
    tx = hvd.DistributedOptimizer(transformation(kind), op=hvd.Adasum, backward_passes_per_step=passes,
                                  process_set=process_set)

    def step(params: dict, state: object, x: jax.Array, y: jax.Array) -> tuple[dict, object]:
        updates, state = tx.update(jax.grad(loss_fn)(params, x, y), state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    params = init_params()
    state = tx.init(params)
    for index in range(STEPS):
        for micro in range(passes):
            params, state = step(params, state, *data(rank, index, micro))
    ranks = process_set.ranks if process_set.included() else [rank]
    for name, want in replay(kind, ranks, passes).items():
        np.testing.assert_allclose(params[name], want, rtol=1e-5, atol=1e-6, err_msg=f"{kind}: {name}")


def check_refusals() -> None:
    for options in ({"compression": hvd.Compression.fp16}, {"gradient_predivide_factor": 2.0},
                    {"local_sgd_period": 4}, {"shard_optimizer_state": True}):
        try:
            hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Adasum, **options)
        except ValueError as error:
            assert next(iter(options)) in str(error), error
        else:
            raise AssertionError(f"op=Adasum with {options} was not refused")


def main() -> None:
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, size, 2))) if size > 2 else hvd.global_process_set
    cases = {"adam eager": ("adam", 1, False, hvd.global_process_set),
             "sgd jit": ("sgd", 1, True, hvd.global_process_set),
             "adamw jit": ("adamw", 1, True, hvd.global_process_set),
             "backward_passes_per_step": ("sgd", 2, True, hvd.global_process_set),
             "process set": ("adam", 1, True, evens)}
    for case, (kind, passes, jit, process_set) in cases.items():
        run_case(kind, passes, jit, process_set, rank)
        print(f"ok jax adasum {case}", flush=True)
    check_refusals()
    print("ok jax adasum refusals", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

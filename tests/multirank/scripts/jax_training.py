"""JAX + optax training on N ranks equals one process on the concatenated batch.

A two-layer MLP in pure ``jax.numpy``. Every rank starts from different random parameters (so
``broadcast_parameters`` must work), trains on its own shard with ``DistributedOptimizer``, and
also trains the reference: one process, every rank's rows in each batch, the plain optax
transformation. Parameters must match the reference and be bit-identical across ranks.
Cases (comma-separated argument): host (eager steps), jit, chain (the wrapper inside
``optax.chain``, jitted), multisteps (``optax.MultiSteps`` around the wrapper, jitted: optax
runs it every step), accumulate and accumulate-jit (``backward_passes_per_step=2``: communicates
every second step only). Prints "ok <case> max diff <d>".
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hvdlite.api
import hvdlite.jax as hvd

STEPS, PER_RANK, FEATURES, HIDDEN = 6, 4, 5, 8


@functools.cache  # JAX arrays are immutable: one draw per seed, shared by every case
def init_params(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.5, "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, 1)) * 0.5, "b2": jnp.zeros(1)}


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


@functools.cache  # the same batches for every case (read-only below)
def dataset(size):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, size * PER_RANK, FEATURES)).astype(np.float32)
    y = (x.sum(axis=-1, keepdims=True) * 0.5 + rng.normal(size=(STEPS, size * PER_RANK, 1))).astype(np.float32)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def base_tx():
    return optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.05))


def make_step(tx, jit):
    def step(params, state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    return jax.jit(step) if jit else step


def train(tx, params, batches, jit):
    # every input on the one device, committed like the step's outputs: a mix (broadcast_parameters' committed
    # arrays, an uncommitted step count from tx.init) would compile the jitted step a second time at step 2
    params, state = jax.device_put((params, tx.init(params)), jax.devices()[0])
    step = make_step(tx, jit)
    for x, y in batches:
        params, state = step(params, state, x, y)
    return params


@functools.cache  # depends only on the reference kind: three cases share each one, trained once per job
def reference(size, multisteps):
    """One process training on every rank's rows with the plain optax transformation."""
    x, y = dataset(size)
    reference_tx = optax.MultiSteps(base_tx(), every_k_schedule=2) if multisteps else base_tx()
    return train(reference_tx, init_params(seed=0), [(x[s], y[s]) for s in range(STEPS)], jit=True)


class CountingAllreduce:
    """Counts the core's grouped allreduces (the optimizer's one call per communicating step)."""

    def __init__(self):
        self.calls, self._real = 0, hvdlite.api.grouped_allreduce_async
        hvdlite.api.grouped_allreduce_async = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)

    def close(self):
        hvdlite.api.grouped_allreduce_async = self._real


def run_case(case, rank, size):
    x, y = dataset(size)
    mine = [(x[s, rank * PER_RANK:(rank + 1) * PER_RANK], y[s, rank * PER_RANK:(rank + 1) * PER_RANK]) for s in range(STEPS)]
    if case in ("host", "jit"):
        tx = hvd.DistributedOptimizer(base_tx())
    elif case == "chain":
        tx = optax.chain(hvd.DistributedOptimizer(optax.identity()), base_tx())
    elif case == "multisteps":
        tx = optax.MultiSteps(hvd.DistributedOptimizer(base_tx()), every_k_schedule=2)
    else:
        tx = hvd.DistributedOptimizer(base_tx(), backward_passes_per_step=2)
    params = hvd.broadcast_parameters(init_params(seed=rank), root_rank=0)  # ranks start different
    counter = CountingAllreduce()
    got = train(tx, params, mine, jit=case not in ("host", "accumulate"))
    counter.close()
    want = reference(size, multisteps=case in ("multisteps", "accumulate", "accumulate-jit"))
    communicating_steps = STEPS // 2 if case.startswith("accumulate") else STEPS
    assert counter.calls == communicating_steps, (case, counter.calls)
    diff = max(float(jnp.max(jnp.abs(got[k] - want[k]))) for k in want)
    assert diff < 2e-5, (case, diff)
    flat = jnp.concatenate([jnp.ravel(got[k]) for k in sorted(got)])
    everyone = np.asarray(hvd.allgather(flat[None, :]))
    assert (everyone == everyone[0]).all(), f"{case}: parameters differ across ranks"
    moved = max(float(jnp.max(jnp.abs(got[k] - init_params(0)[k]))) for k in got)
    assert moved > 1e-2, f"{case}: training did not change the parameters"
    print(f"ok {case} max diff {diff:.2e}", flush=True)


def main():
    hvd.init()
    for case in sys.argv[1].split(","):
        run_case(case, hvd.rank(), hvd.size())
    hvd.shutdown()


if __name__ == "__main__":
    main()

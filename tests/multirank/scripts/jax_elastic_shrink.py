"""elastic_shrink.py for JAX: rank 2 of 3 dies mid-training; the survivors, whose collective fails
inside jax.jit, re-form the job inside @hvd.elastic.run, restore the last commit of their JaxState
and finish at size 2.

Usage: jax_elastic_shrink.py kill|raise. Run with ``hvdliterun -np 3 --min-np 2``. Each survivor
prints 'recovered <seconds>', its new rank and size, and 'ok elastic shrink'.
"""

import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hvdlite.jax as hvd

STEPS, KILL_AT = 8, 3


def loss_fn(params, x):
    return jnp.sum(x @ params["w"] + params["b"])


def main() -> None:
    hvd.init()
    world_rank, pid = hvd.rank(), os.getpid()
    run_dir = os.environ["HVDLITE_RUN_DIR"]
    params = {"w": jax.random.normal(jax.random.key(0), (4, 1)), "b": jnp.zeros(1)}
    initial = np.asarray(params["w"])
    tx = hvd.DistributedOptimizer(optax.sgd(0.1))
    state = hvd.elastic.JaxState(params, tx.init(params), step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    timings = {}

    @jax.jit
    def train_step(params, opt_state, x):
        updates, opt_state = tx.update(jax.grad(loss_fn)(params, x), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    @hvd.elastic.run
    def train(state):
        for step in range(state.step, STEPS):
            if world_rank == 2 and step == KILL_AT:
                with open(os.path.join(run_dir, "killed_at"), "w") as handle:
                    handle.write(str(time.time()))
                if sys.argv[1] == "kill":
                    os.kill(pid, signal.SIGKILL)
                raise RuntimeError("rank 2 fails in the middle of a step (on purpose)")
            x = jnp.full((2, 4), float(hvd.rank() + 1))
            state.params, state.opt_state = train_step(state.params, state.opt_state, x)
            jax.block_until_ready(state.params)
            if resets and "recovered" not in timings:
                with open(os.path.join(run_dir, "killed_at")) as handle:
                    timings["recovered"] = time.time() - float(handle.read())
            state.step = step + 1
            state.commit()

    train(state)
    assert hvd.size() == 2 and state.step == STEPS and resets == [2], (hvd.size(), state.step, resets)
    weights = hvd.allgather_object(np.asarray(state.params["w"]).tolist())
    assert weights[0] == weights[1], weights
    # The gradient of w is 2 * x per step, averaged over the ranks: x = 1, 2, 3 for the KILL_AT steps
    # at size 3, then 1, 2 for the rest at size 2. Nothing lost, nothing applied twice.
    expected = initial - 0.1 * (KILL_AT * 2 * 2.0 + (STEPS - KILL_AT) * 2 * 1.5)
    assert np.allclose(state.params["w"], expected, atol=1e-5), (state.params["w"], expected)
    print(f"recovered {timings['recovered']:.3f}", flush=True)
    print(f"new rank {hvd.rank()} size {hvd.size()}", flush=True)
    hvd.shutdown()
    print("ok elastic shrink", flush=True)


if __name__ == "__main__":
    main()

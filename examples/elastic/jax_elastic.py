"""Elastic data-parallel JAX + optax training with hvdlite.jax: a jitted train loop that survives failures.

Run (one host; the job goes on while at least 2 of the 3 ranks are alive):

    hvdliterun -np 3 --min-np 2 python examples/elastic/jax_elastic.py [--steps 300] [--steps-per-commit 10]

Run on whatever hosts a discovery script lists (``host:slots`` lines, re-read every second; the job
grows into new slots and lets go of ranks whose host left the list, at its next commit):

    hvdliterun --min-np 2 --max-np 4 --host-discovery-script ./examples/elastic/hosts.sh \\
        python examples/elastic/jax_elastic.py

What survives a failure: ``hvd.elastic.JaxState`` commits the parameters, the optimizer state (Adam's
moments and, through ``optax.inject_hyperparams``, the learning rate) and the step counter every
``--steps-per-commit`` steps. When a rank dies (its peers' gradient allreduce fails inside
``jax.jit``), the survivors restore the last commit, re-form the job, rescale the learning rate to
the new size (the reset callback), take rank 0's state and go on from the committed step. Each
step's global batch is drawn from a generator seeded by the step number, so a step trained again
after a failure sees the same examples, shared among whichever ranks are left. The steps since the
last commit are lost and trained again.

The data is synthetic and deterministic (points labelled by a fixed random linear "teacher").
"""

from __future__ import annotations

import argparse
import os

# Ranks share the machine's cores: one compute thread each unless the environment says otherwise.
os.environ.setdefault("NPROC", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

FEATURES, HIDDEN, CLASSES = 20, 64, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="steps to train, across failures")
    parser.add_argument("--steps-per-commit", type=int, default=10, help="commit the state every N steps")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--train-size", type=int, default=4096, help="synthetic training examples")
    return parser.parse_args()


def synthetic_data(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    inputs = np.random.default_rng(seed).normal(size=(size, FEATURES)).astype(np.float32)
    return inputs, (inputs @ teacher).argmax(axis=1).astype(np.int32)


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"w0": jax.random.normal(k1, (FEATURES, HIDDEN)) * jnp.sqrt(2.0 / FEATURES), "b0": jnp.zeros(HIDDEN),
            "w1": jax.random.normal(k2, (HIDDEN, CLASSES)) * jnp.sqrt(2.0 / HIDDEN), "b1": jnp.zeros(CLASSES)}


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = jax.nn.relu(x @ params["w0"] + params["b0"]) @ params["w1"] + params["b1"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def my_batch(step: int, size: int, batch_size: int) -> np.ndarray:
    """This rank's share of step ``step``'s global batch (the same draw on every rank, whatever the size)."""
    chosen = np.random.default_rng(step).choice(size, batch_size * hvd.size(), replace=False)
    return chosen[hvd.rank()::hvd.size()]


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y = synthetic_data(args.train_size, seed=1)
    # inject_hyperparams keeps the learning rate in the optimizer state, where a reset can change it.
    tx = hvd.DistributedOptimizer(optax.inject_hyperparams(optax.adam)(learning_rate=args.lr * hvd.size()))
    params = init_params(jax.random.key(hvd.rank()))  # different per rank until the first sync gives rank 0's
    state = hvd.elastic.JaxState(params=params, opt_state=tx.init(params), step=0)

    def on_reset() -> None:
        """The world changed size: keep the learning rate proportional to the global batch."""
        state.opt_state.hyperparams["learning_rate"] = jnp.asarray(args.lr * hvd.size(), jnp.float32)
        if hvd.rank() == 0:
            print(f"reset: the job goes on with {hvd.size()} ranks", flush=True)

    state.register_reset_callbacks([on_reset])

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)  # averaged across ranks in here
        return optax.apply_updates(params, updates), opt_state, loss

    @hvd.elastic.run
    def train(state: hvd.elastic.JaxState) -> None:
        for step in range(state.step, args.steps):
            batch = my_batch(step, args.train_size, args.batch_size)
            state.params, state.opt_state, loss = train_step(state.params, state.opt_state, x[batch], y[batch])
            state.step = step + 1
            if state.step % args.steps_per_commit == 0 or state.step == args.steps:
                state.commit()  # a failure from here on resumes at this step
            if state.step % 100 == 0:
                loss = float(hvd.allreduce(loss, name="train.loss"))
                if hvd.rank() == 0:
                    print(f"step {state.step}/{args.steps}: {hvd.size()} ranks, loss {loss:.4f}", flush=True)

    train(state)
    loss = float(loss_fn(state.params, x, y))  # every rank holds the same parameters: the same loss everywhere
    print(f"rank {hvd.rank()} of {hvd.size()}: done, loss {loss:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

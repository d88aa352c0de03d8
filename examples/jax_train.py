"""A complete data-parallel JAX + optax training script with hvdlite.jax, ready to copy.

Run:  hvdliterun -np 2 python examples/jax_train.py [--epochs 5] [--checkpoint ckpt.npz]

What a real job needs: each rank trains on its own shard of the data (``hvd.shard_indices``,
reshuffled every epoch with a seed every rank shares), the learning rate is scaled by the number
of ranks and warmed up linearly, ``hvd.DistributedOptimizer`` averages the gradients inside the
jitted train step, every rank starts from rank 0's parameters (``hvd.broadcast_parameters``),
the loss is averaged across ranks for the report, and rank 0 alone writes the checkpoint; a
restarted job resumes from it. The model is a pure ``jax.numpy`` MLP (no Flax needed).

The data is synthetic and deterministic (points labelled by a fixed random linear "teacher"), so
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hvdlite.jax as hvd

FEATURES, HIDDEN, CLASSES = 20, 64, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5, help="total epochs (a resumed job stops here too)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs to ramp the learning rate up")
    parser.add_argument("--checkpoint", default=None, help="write the checkpoint here (.npz) and resume from it")
    parser.add_argument("--train-size", type=int, default=8192, help="synthetic training examples")
    return parser.parse_args()


def synthetic_data(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    inputs = np.random.default_rng(seed).normal(size=(size, FEATURES)).astype(np.float32)
    return inputs, (inputs @ teacher).argmax(axis=1).astype(np.int32)


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    sizes = [FEATURES, HIDDEN, HIDDEN, CLASSES]
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        key, sub = jax.random.split(key)
        params[f"w{i}"] = jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
        params[f"b{i}"] = jnp.zeros(fan_out)
    return params


def logits_fn(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    layers = len(params) // 2
    for i in range(layers):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < layers - 1:
            x = jax.nn.relu(x)
    return x


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits_fn(params, x), y).mean()


def save_checkpoint(path: str, params: dict, opt_state, epoch: int) -> None:
    """Rank 0 only: parameters and optimizer state as one .npz (leaves in tree order)."""
    leaves = jax.tree.leaves((params, opt_state))
    tmp = path + ".tmp.npz"  # write, then rename: a crash mid-write leaves the old checkpoint intact
    np.savez(tmp, epoch=epoch, **{f"leaf{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)})
    os.replace(tmp, path)


def load_checkpoint(path: str | None, params: dict, opt_state) -> tuple[dict, object, int]:
    """Rank 0 reads the checkpoint if there is one; the broadcasts below give it to every rank."""
    if not path or hvd.rank() != 0 or not os.path.exists(path):
        return params, opt_state, hvd.broadcast_object(0, root_rank=0)
    with np.load(path) as saved:
        treedef = jax.tree.structure((params, opt_state))
        params, opt_state = jax.tree.unflatten(treedef, [jnp.asarray(saved[f"leaf{i}"])
                                                         for i in range(treedef.num_leaves)])
        return params, opt_state, hvd.broadcast_object(int(saved["epoch"]), root_rank=0)


def main() -> None:
    args = parse_args()
    hvd.init()
    x_train, y_train = synthetic_data(args.train_size, seed=1)
    steps_per_epoch = args.train_size // (args.batch_size * hvd.size())

    # Scale the learning rate by the number of ranks (the global batch grew by that factor) and
    # warm it up, so the first large-batch steps do not diverge.
    schedule = optax.linear_schedule(args.lr, args.lr * hvd.size(), max(1, args.warmup_epochs * steps_per_epoch))
    tx = hvd.DistributedOptimizer(optax.adam(schedule))

    params = init_params(jax.random.key(hvd.rank()))  # deliberately different per rank...
    opt_state = tx.init(params)
    params, opt_state, start_epoch = load_checkpoint(args.checkpoint, params, opt_state)
    params = hvd.broadcast_parameters(params, root_rank=0)  # ...until rank 0's reach everyone
    opt_state = hvd.broadcast_optimizer_state(opt_state, root_rank=0)

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)  # averaged across ranks in here
        return optax.apply_updates(params, updates), opt_state, loss

    for epoch in range(start_epoch, args.epochs):
        mine = hvd.shard_indices(len(x_train), epoch, seed=42, drop_last=True)
        losses = []
        for step in range(steps_per_epoch):
            batch = mine[step * args.batch_size:(step + 1) * args.batch_size]
            params, opt_state, loss = train_step(params, opt_state, x_train[batch], y_train[batch])
            losses.append(loss)
        mean_loss = float(hvd.allreduce(jnp.mean(jnp.stack(losses)), name="epoch_loss"))
        if hvd.rank() == 0:
            accuracy = float(jnp.mean(logits_fn(params, x_train[:1024]).argmax(axis=1) == y_train[:1024]))
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean_loss:.4f} accuracy {accuracy:.3f}", flush=True)
            if args.checkpoint:
                save_checkpoint(args.checkpoint, params, opt_state, epoch + 1)
    hvd.shutdown()


if __name__ == "__main__":
    main()

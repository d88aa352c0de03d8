"""Elastic data-parallel Keras 3 training with hvdlite.tensorflow.keras: ``model.fit`` that survives failures.

Run (one host; the job goes on while at least 2 of the 3 ranks are alive):

    hvdliterun -np 3 --min-np 2 python examples/elastic/keras_elastic.py [--epochs 4] [--batches-per-commit 10]

Run on whatever hosts a discovery script lists (``host:slots`` lines, re-read every second; the job
grows into new slots and lets go of ranks whose host left the list, at its next commit):

    hvdliterun --min-np 2 --max-np 4 --host-discovery-script ./examples/elastic/hosts.sh \\
        python examples/elastic/keras_elastic.py

What survives a failure: ``hvd.elastic.KerasState`` commits the model's weights, the optimizer's
variables and the epoch and batch counters (kept up to date by UpdateEpochStateCallback and
UpdateBatchStateCallback) every ``--batches-per-commit`` batches and at each epoch's end
(CommitStateCallback). When a rank dies inside ``fit``, the survivors restore the last commit,
re-form the job, rescale the learning rate to the new size, take rank 0's state and call ``fit``
again for the epochs left, each rank on its new shard of the data. Keras's ``fit`` cannot start in
the middle of an epoch, so the interrupted epoch is trained again from its first batch (from the
weights of the last commit).

The data is synthetic and deterministic (points labelled by a fixed random linear "teacher").
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Ranks share the machine's cores: one compute thread each unless the environment says otherwise.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

FEATURES, CLASSES = 20, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4, help="epochs to train, across failures")
    parser.add_argument("--batches-per-commit", type=int, default=10, help="commit the state every N batches")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs to ramp the learning rate up")
    parser.add_argument("--train-size", type=int, default=4096, help="synthetic training examples")
    return parser.parse_args()


def synthetic_data(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    inputs = np.random.default_rng(seed).normal(size=(size, FEATURES)).astype(np.float32)
    return inputs, (inputs @ teacher).argmax(axis=1)


def build_model(lr: float) -> keras.Model:
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def report(epochs_done: int, epochs: int, logs: dict) -> None:
    if hvd.rank() == 0:
        print(f"epoch {epochs_done}/{epochs}: {hvd.size()} ranks, loss {logs['loss']:.4f}", flush=True)


def main() -> None:
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(1)  # rank 0's initial weights reach every rank at the first sync
    x, y = synthetic_data(args.train_size, seed=1)
    model = build_model(args.lr * hvd.size())
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(),
                                                      warmup_epochs=args.warmup_epochs)

    def on_reset() -> None:
        """The world changed size: keep the learning rate proportional to the global batch."""
        model.optimizer.learning_rate = warmup.initial_lr = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"reset: the job goes on with {hvd.size()} ranks", flush=True)

    state.register_reset_callbacks([on_reset])
    callbacks = [
        hvd.callbacks.MetricAverageCallback(),  # logs averaged over ranks
        warmup,
        # The update callbacks go before the commit one, so that a commit records the batch just done.
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: report(state.epoch, args.epochs, logs)),
    ]

    @hvd.elastic.run
    def train(state: hvd.elastic.KerasState) -> None:
        # fit counts its epochs from 0: a reset during the warmup starts it over, one after it skips it.
        warmup.end_epoch = args.warmup_epochs if state.epoch < args.warmup_epochs else 0
        warmup.steps_per_epoch = None  # read again from fit: the shards' length changes with the size
        # UpdateEpochStateCallback counts on from state.epoch, so fit runs the epochs left (no initial_epoch).
        model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], batch_size=args.batch_size,
                  epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    loss = model.evaluate(x, y, verbose=0)[0]  # every rank holds the same weights: the same loss everywhere
    print(f"rank {hvd.rank()} of {hvd.size()}: done, loss {loss:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

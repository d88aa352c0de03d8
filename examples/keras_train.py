"""A complete data-parallel Keras 3 training script with hvdlite.tensorflow.keras, ready to copy.

Run:  hvdliterun -np 2 python examples/keras_train.py [--epochs 5] [--checkpoint-dir ckpt]

What a real job needs: each rank trains on its own shard of the data, the learning rate is
scaled by the number of ranks and warmed up (LearningRateWarmupCallback), gradients are averaged
by ``hvd.DistributedOptimizer`` inside ``model.fit``, every rank starts from rank 0's weights
(BroadcastGlobalVariablesCallback), metrics are averaged across ranks (MetricAverageCallback),
and rank 0 alone writes checkpoints; a restarted job resumes from the latest one.

The data is synthetic and deterministic (points labelled by a fixed random linear "teacher"), so
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

FEATURES, CLASSES = 20, 4
CHECKPOINT = re.compile(r"checkpoint-(\d+)\.keras$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5, help="total epochs (a resumed job stops here too)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs to ramp the learning rate up")
    parser.add_argument("--checkpoint-dir", default=None, help="write checkpoints here and resume from them")
    parser.add_argument("--train-size", type=int, default=8192, help="synthetic training examples")
    return parser.parse_args()


def synthetic_data(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
    inputs = np.random.default_rng(seed).normal(size=(size, FEATURES)).astype(np.float32)
    return inputs, (inputs @ teacher).argmax(axis=1)


def build_model() -> keras.Model:
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(CLASSES)])


def latest_checkpoint(directory: str | None) -> int:
    """The highest epoch with a checkpoint in ``directory`` (0 if none), as rank 0 sees it."""
    found = [int(m.group(1)) for name in os.listdir(directory) if (m := CHECKPOINT.match(name))] \
        if directory and hvd.rank() == 0 and os.path.isdir(directory) else []
    return hvd.broadcast_object(max(found, default=0), root_rank=0)


def main() -> None:
    args = parse_args()
    hvd.init()
    x, y = synthetic_data(args.train_size, seed=1)
    # Each rank takes every size()-th example: disjoint shards of equal length.
    x, y = x[hvd.rank():: hvd.size()], y[hvd.rank():: hvd.size()]
    x_val, y_val = synthetic_data(1024, seed=2)
    resume_epoch = latest_checkpoint(args.checkpoint_dir)
    scaled_lr = args.lr * hvd.size()
    if resume_epoch:
        # Every rank loads the same file; load_model makes its optimizer distributed again.
        model = hvd.load_model(os.path.join(args.checkpoint_dir, f"checkpoint-{resume_epoch}.keras"))
    else:
        model = build_model()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=0.9))
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Averages the logs before the callbacks after it (and Keras's History) read them.
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs,
                                                 verbose=1 if hvd.rank() == 0 else 0),
    ]
    if args.checkpoint_dir and hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir,
                                                                      "checkpoint-{epoch}.keras")))
    if resume_epoch and hvd.rank() == 0:
        print(f"resumed from epoch {resume_epoch}", flush=True)
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, initial_epoch=resume_epoch,
                        validation_data=(x_val, y_val), callbacks=callbacks, verbose=0)
    if hvd.rank() == 0:
        for index, epoch in enumerate(range(resume_epoch, args.epochs)):
            logs = {k: v[index] for k, v in history.history.items()}
            print(f"epoch {epoch + 1}/{args.epochs}: loss {logs['loss']:.4f} val_loss {logs['val_loss']:.4f} "
                  f"val acc {logs['val_accuracy']:.3f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

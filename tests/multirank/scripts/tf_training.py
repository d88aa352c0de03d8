"""Keras 3 / TensorFlow training on N ranks equals one process on the concatenated batch.

Each rank trains on its own shard; every rank also trains the reference (one process, every
rank's rows in each batch, plain optimizer) and compares. The reference runs eagerly
(``model.fit`` with ``run_eagerly=True``; one eager tape loop for both tape cases): the same Keras
steps and numbers, without tracing a graph per reference model (a fifth of this job's CPU); the
distributed runs are as before. Weights must also be bit-identical across ranks. Prints "ok <case> max diff <d>" per case; a failed check raises and ends the job.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdlite
import hvdlite.tensorflow as hvd_tf
import hvdlite.tensorflow.keras as hvd

STEPS, PER_RANK, FEATURES = 4, 3, 6


def make_model():
    keras.utils.set_random_seed(7)  # the same initial weights on every rank and in the reference
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(1)])


def dataset(size):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, size, PER_RANK, FEATURES)).astype(np.float32)
    y = (x.sum(axis=-1, keepdims=True) * 0.5 + rng.normal(size=(STEPS, size, PER_RANK, 1))).astype(np.float32)
    return x, y


def shard(array, rank):
    return array[:, rank].reshape(-1, array.shape[-1])


def whole(array):
    return array.reshape(-1, array.shape[-1])


def fit(optimizer, x, y, batch, eager=False):
    model = make_model()
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=eager)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def compare(name, got, want, tol=1e-5):
    diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    assert diff < tol, f"{name}: distributed weights differ from one process on the whole batch by {diff}"
    everyone = hvdlite.allgather_object([w.tolist() for w in got])
    assert all(e == everyone[0] for e in everyone), f"{name}: ranks hold different weights"
    print(f"ok {name} max diff {diff:.1e}", flush=True)


class CountAllreduces:
    """Counts grouped allreduce submissions (one per gradient reduction) while active."""

    def __enter__(self):
        self.count, self._original = 0, hvdlite.api.grouped_allreduce_async

        def counting(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)
        hvdlite.api.grouped_allreduce_async = counting
        return self

    def __exit__(self, *exc):
        hvdlite.api.grouped_allreduce_async = self._original


def fit_cases(rank, size):
    x, y = dataset(size)
    mine, every = (shard(x, rank), shard(y, rank)), (whole(x), whole(y))
    cases = {
        "sgd": (lambda: keras.optimizers.SGD(0.1), {}),
        "adam clipnorm": (lambda: keras.optimizers.Adam(0.05, clipnorm=0.1), {}),
        "adam global_clipnorm": (lambda: keras.optimizers.Adam(0.05, global_clipnorm=0.1), {}),
        "sgd momentum predivide": (lambda: keras.optimizers.SGD(0.1, momentum=0.9), {"gradient_predivide_factor": 2.0}),
        "loss scale": (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.05)), {}),
    }
    for name, (build, options) in cases.items():
        got = fit(hvd.DistributedOptimizer(build(), **options), *mine, PER_RANK)
        compare(name, got, fit(build(), *every, PER_RANK * size, eager=True))
    # Keras's own gradient accumulation: one allreduce per real update, not per micro-step.
    with CountAllreduces() as counter:
        got = fit(hvd.DistributedOptimizer(keras.optimizers.Adam(0.05, gradient_accumulation_steps=2)),
                  *mine, PER_RANK)
    assert counter.count == STEPS // 2, f"{counter.count} allreduces for {STEPS // 2} accumulated updates"
    compare("gradient_accumulation_steps=2",
            got, fit(keras.optimizers.Adam(0.05, gradient_accumulation_steps=2), *every,
                     PER_RANK * size, eager=True))
    # Horovod's backward_passes_per_step sums the micro-steps: SGD(lr) on the sum is SGD(2 lr) on the mean.
    got = fit(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), backward_passes_per_step=2), *mine, PER_RANK)
    compare("backward_passes_per_step=2",
            got, fit(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), *every,
                     PER_RANK * size, eager=True))


def tape_loop(x, y, batch, distributed, compiled):
    model, optimizer = make_model(), keras.optimizers.Adam(0.05)
    loss_fn = keras.losses.MeanSquaredError()

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        if distributed:
            tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    step = tf.function(step) if compiled else step
    for start in range(0, len(x), batch):
        step(tf.constant(x[start:start + batch]), tf.constant(y[start:start + batch]))
    return model.get_weights()


def tape_cases(rank, size):
    x, y = dataset(size)
    reference = tape_loop(whole(x), whole(y), PER_RANK * size, False, False)  # one eager reference for both
    for compiled in (False, True):
        got = tape_loop(shard(x, rank), shard(y, rank), PER_RANK, True, compiled)
        compare(f"gradient tape compiled={compiled}", got, reference)


def main():
    hvd.init()
    for loop in sys.argv[1].split(","):  # one job for both loops: TensorFlow's start costs seconds a rank
        {"fit": fit_cases, "tape": tape_cases}[loop](hvd.rank(), hvd.size())
    hvd.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()

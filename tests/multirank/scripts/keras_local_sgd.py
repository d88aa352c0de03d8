"""Keras local SGD with real ranks: each rank's weights against a replay of every rank in one process.

Usage: keras_local_sgd.py KIND:MODE,... (KIND sgd|adam, MODE fit|eager), one run after the other. Rank r fits a Dense(1) model to its own data
(x = r + 1) for STEPS updates with ``local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP``:
through ``model.fit`` (one batch per step, in a tf.function) or eager ``apply_gradients``. The
replay runs one plain Keras model and optimizer per rank (gradients averaged during the warm-up,
local afterwards; weights, and with Adam its moments, averaged every PERIOD local updates).
Prints 'ok keras local sgd <kind> <mode> <rank>' for each run.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

STEPS, PERIOD, WARMUP = 9, 3, 2


def make_optimizer(kind: str) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(0.05) if kind == "adam" else keras.optimizers.SGD(0.05, momentum=0.5)


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.set_weights([np.linspace(-0.5, 0.5, 4, dtype="float32").reshape(4, 1), np.zeros(1, "float32")])
    return model


def batch(rank: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((2, 4), rank + 1.0, "float32"), np.full((2, 1), float(rank), "float32")


def gradients(model: keras.Model, rank: int) -> list[tf.Tensor]:
    x, y = batch(rank)
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x))
        loss = tf.reduce_mean(loss)
    return tape.gradient(loss, model.trainable_variables)


def replay(kind: str, size: int) -> list[list[np.ndarray]]:
    """Every rank's flattened weights after each update, simulated here."""
    models = [make_model() for _ in range(size)]
    optimizers = [make_optimizer(kind) for _ in range(size)]
    history = []
    for step in range(STEPS):
        grads = [gradients(m, r) for r, m in enumerate(models)]
        if step < WARMUP:
            grads = [[tf.reduce_mean(tf.stack(g), 0) for g in zip(*grads, strict=True)]] * size
        for model, optimizer, own in zip(models, optimizers, grads, strict=True):
            optimizer.apply_gradients(zip(own, model.trainable_variables, strict=True))
        local = step + 1 - WARMUP
        if local > 0 and local % PERIOD == 0:
            _average([m.trainable_variables for m in models])
            if kind == "adam":
                _average([[v for v in o.variables if keras.backend.is_float_dtype(v.dtype) and len(v.shape) > 0]
                          for o in optimizers])
        history.append([np.concatenate([v.numpy().ravel() for v in m.trainable_variables]) for m in models])
    return history


def _average(per_rank: list[list[tf.Variable]]) -> None:
    for variables in zip(*per_rank, strict=True):
        mean = tf.reduce_mean(tf.stack([v.value for v in variables]), 0)
        for variable in variables:
            variable.assign(mean)


def main() -> None:
    hvd.init()
    for spec in sys.argv[1].split(","):  # KIND:MODE,... one run after the other in one job
        check(*spec.split(":"), hvd.rank(), hvd.size())


def check(kind: str, mode: str, rank: int, size: int) -> None:
    expected = replay(kind, size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(make_optimizer(kind), local_sgd_period=PERIOD,
                                         local_sgd_warmup_steps=WARMUP, local_sgd_average_state=kind == "adam")
    if mode == "fit":
        model.compile(optimizer=optimizer, loss="mse")
    for step in range(STEPS):
        if mode == "fit":
            x, y = batch(rank)
            model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
        else:
            optimizer.apply_gradients(zip(gradients(model, rank), model.trainable_variables, strict=True))
        mine = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
        assert np.allclose(mine, expected[step][rank], atol=1e-5), (rank, step, mine, expected[step][rank])
        every = hvd.allgather_object(mine.tolist())
        together = all(np.array_equal(e, every[0]) for e in every)
        local = step + 1 - WARMUP
        # Equal on every rank during the warm-up and right after an average; apart in between.
        assert together == (local <= 0 or local % PERIOD == 0), (rank, step, every)
    print(f"ok keras local sgd {kind} {mode} {rank}", flush=True)


if __name__ == "__main__":
    main()

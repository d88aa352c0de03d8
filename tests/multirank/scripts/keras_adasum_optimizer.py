"""Keras DistributedOptimizer(op=Adasum) on real ranks against a replay in one process.

Usage: keras_adasum_optimizer.py (under hvdliterun, any -np). The replay keeps one plain Keras model
and optimizer per rank (its slot variables stay that rank's own, as in Horovod): at each step every
replayed rank starts from the shared weights, updates on its own data, and the shared weights move by
hvdlite.core.transport.adasum_math.reference of those changes, variable by variable. Weight decay is on, so a change read
after the decay instead of before it (or after the update: no change at all) shows. Cases: SGD with
momentum through eager ``apply``, Adam inside ``model.fit`` and inside a ``tf.function`` step,
``backward_passes_per_step=2`` inside ``model.fit`` (micro-steps summed), a process set of the even
ranks (the others update alone), a LossScaleOptimizer (a step that overflows on rank 0 only is
skipped everywhere), and the options refused with Adasum. Prints "ok keras adasum <case>".
The replays of the whole job (the same on every rank) are computed once, each on one rank, and shared.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.core.transport import adasum_math as adasum  # noqa: E402

STEPS, FEATURES, BATCH = 3, 5, 3


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 for w in model.get_weights()])
    return model


def make_optimizer(kind: str, passes: int = 1) -> keras.optimizers.Optimizer:
    accumulate = passes if passes > 1 else None
    if kind == "adam":
        return keras.optimizers.Adam(0.05, weight_decay=0.1, gradient_accumulation_steps=accumulate)
    return keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.1, gradient_accumulation_steps=accumulate)


def data(rank: int, step: int, micro: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * step + 10 * rank + micro)
    return rng.normal(size=(BATCH, FEATURES)).astype("float32"), rng.normal(size=(BATCH, 1)).astype("float32")


def gradients(model: keras.Model, x: np.ndarray, y: np.ndarray) -> list[tf.Tensor]:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))  # model.fit's "mse"
    return tape.gradient(loss, model.trainable_variables)


def replay(kind: str, ranks: list[int], passes: int, skip: int | None = None) -> list[np.ndarray]:
    """The weights the ranks of ``ranks`` should end with (every one the same); step ``skip`` overflows."""
    shared = make_model().get_weights()
    models = [make_model() for _ in ranks]
    optimizers = [make_optimizer(kind, passes) for _ in ranks]
    for step in range(STEPS):
        if step == skip:
            continue
        changes = []
        for rank, model, optimizer in zip(ranks, models, optimizers, strict=True):
            model.set_weights(shared)
            for micro in range(passes):  # Keras averages the micro-steps; Horovod sums them
                grads = gradients(model, *data(rank, step, micro))
                optimizer.apply([g * passes for g in grads], model.trainable_variables)
            changes.append([new - old for new, old in zip(model.get_weights(), shared, strict=True)])
        shared = [old + adasum.reference([c[i].astype(np.float64) for c in changes]).astype(np.float32)
                  for i, old in enumerate(shared)]
    return shared


GLOBAL_REPLAYS = [("sgd", 1, None), ("adam", 1, None), ("sgd", 2, None), ("sgd", 1, 1)]  # (kind, passes, skip)
_shared_replays: dict[tuple[str, int, int | None], list[np.ndarray]] = {}


def share_replays(rank: int, size: int) -> None:
    """Every replay of all the ranks, computed once (on rank i % size for the i-th) and gathered.

    A replay depends only on the ranks it replays, not on the rank computing it; every rank
    replaying every case (Adam's twice) was about a third of its CPU after TensorFlow's start.
    """
    mine = {key: replay(key[0], list(range(size)), key[1], skip=key[2])
            for i, key in enumerate(GLOBAL_REPLAYS) if i % size == rank}
    for part in hvd.allgather_object(mine):
        _shared_replays.update(part)


def replayed(kind: str, ranks: list[int], passes: int, skip: int | None = None) -> list[np.ndarray]:
    """``replay(kind, ranks, passes, skip)``, shared when ``ranks`` is the whole job."""
    if ranks == list(range(hvd.size())):
        return _shared_replays[(kind, passes, skip)]
    return replay(kind, ranks, passes, skip)


def train(mode: str, model: keras.Model, optimizer: keras.optimizers.Optimizer, rank: int, passes: int) -> None:
    """STEPS updates of ``model`` on this rank's data, eagerly, in ``model.fit`` or in a ``tf.function``."""
    if mode == "fit":
        model.compile(optimizer=optimizer, loss="mse")
    step_fn = tf.function(lambda x, y: optimizer.apply(gradients(model, x, y), model.trainable_variables))
    for step in range(STEPS):
        batches = [data(rank, step, micro) for micro in range(passes)]
        if mode == "fit":
            x, y = (np.concatenate(parts) for parts in zip(*batches, strict=True))
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
        elif mode == "function":
            step_fn(*batches[0])
        else:
            optimizer.apply(gradients(model, *batches[0]), model.trainable_variables)


def run_case(kind: str, mode: str, passes: int, process_set: hvd.ProcessSet, rank: int) -> None:
    model = make_model()
    optimizer = hvd.DistributedOptimizer(make_optimizer(kind), op=hvd.Adasum, backward_passes_per_step=passes,
                                         process_set=process_set)
    optimizer.build(model.trainable_variables)
    train(mode, model, optimizer, rank, passes)
    ranks = process_set.ranks if process_set.included() else [rank]
    check(model, replayed(kind, ranks, passes), f"{kind} {mode}")


def check(model: keras.Model, expected: list[np.ndarray], what: str) -> None:
    for got, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


def run_loss_scale(rank: int) -> None:
    """LossScaleOptimizer(SGD): unscaled gradients step as plain SGD; rank 0's overflow skips step 1 everywhere."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(make_optimizer("sgd"), initial_scale=8.0),
                                         op=hvd.Adasum)
    optimizer.build(model.trainable_variables)
    for step in range(STEPS):
        scale = float(optimizer.dynamic_scale)
        grads = [g * scale for g in gradients(model, *data(rank, step, 0))]
        if step == 1 and rank == 0:
            grads[0] = grads[0] + np.inf
        optimizer.apply(grads, model.trainable_variables)
    assert float(optimizer.dynamic_scale) == 4.0, "the overflow halved the scale on every rank"
    check(model, replayed("sgd", list(range(hvd.size())), 1, skip=1), "loss scale")


def check_refusals() -> None:
    refused = {"compression": {"compression": hvd.Compression.fp16}, "sparse_as_dense": {"sparse_as_dense": True},
               "gradient_predivide_factor=2.0": {"gradient_predivide_factor": 2.0},
               "local_sgd_period": {"local_sgd_period": 2}}
    for label, options in refused.items():
        try:
            hvd.DistributedOptimizer(make_optimizer("sgd"), op=hvd.Adasum, **options)
        except ValueError as exc:
            assert "op=Adasum" in str(exc) and label in str(exc), exc
        else:
            raise AssertionError(f"op=Adasum with {label} was not refused")


def main() -> None:
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, size, 2)))
    share_replays(rank, size)
    cases = {"sgd eager": ("sgd", "eager", 1, hvd.global_process_set),
             "adam fit": ("adam", "fit", 1, hvd.global_process_set),
             "adam tf.function": ("adam", "function", 1, hvd.global_process_set),
             "backward_passes_per_step": ("sgd", "fit", 2, hvd.global_process_set),
             "process set": ("sgd", "fit", 1, evens)}
    for case, (kind, mode, passes, process_set) in cases.items():
        run_case(kind, mode, passes, process_set, rank)
        print(f"ok keras adasum {case}", flush=True)
    run_loss_scale(rank)
    print("ok keras adasum loss scale", flush=True)
    check_refusals()
    print("ok keras adasum refusals", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

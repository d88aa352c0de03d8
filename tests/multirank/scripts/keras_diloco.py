"""Keras DiLoCo with real ranks: every rank's weights after every step against a one-process replay.

Usage: keras_diloco.py GROUP_SIZE fit|eager RUN,... Ranks form groups of GROUP_SIZE consecutive ranks;
inside a group a DistributedOptimizer over the group's set (SGD with momentum) keeps them alike;
across groups DiLoCo averages pseudo-gradients over the ranks holding the same place in each group
and steps a Nesterov outer SGD (lr 0.7, momentum 0.9). RUN is ``refusals`` or
``FRAGMENTS/DELAY[/COMPRESSION]``. Steps run through ``model.fit`` (DiLoCo as a callback) or an
eager loop (``diloco.apply_gradients``). Rank r's batch is x = r + 1 + step / 10.

The replay keeps one plain Keras model per group, and the global weights and the outer Nesterov
momentum in NumPy; fragment p is sent after steps (p + 1) * H / F + k * H and lands DELAY steps later
as ``new global + local progress since it was sent``; with int8 / bf16 each group's pseudo-gradient
is rounded by the library's NumPy codec. Each run also saves its DiLoCo state at step CHECKPOINT_AT
(with an exchange in flight when DELAY > 0), resumes a fresh model from it and must end the same.
Prints 'ok keras diloco RUN RANK' per run.
"""

import copy
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from diloco_common import ReplaySchedule, expect_refusal, parse_run, rounded, run_checks  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.training.diloco import DiLoCoSchedule, split_fragments  # noqa: E402

SYNC_EVERY, STEPS, CHECKPOINT_AT = 4, 13, 6
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])
    model.set_weights([np.linspace(-0.5, 0.5, 24, dtype="float32").reshape(4, 6), np.zeros(6, "float32"),
                       np.linspace(0.3, -0.3, 6, dtype="float32").reshape(6, 1), np.full(1, 0.1, "float32")])
    return model


def inner_optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.05, momentum=0.5)


def outer_optimizer() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4) * np.float32(rank + 1 + step / 10)
    return x, np.full((2, 1), float(rank % 3), "float32")


def gradients(model: keras.Model, rank: int, step: int) -> list[tf.Tensor]:
    x, y = batch(rank, step)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))
    return tape.gradient(loss, model.trainable_variables)


def flat(weights: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in weights])


class Replay(ReplaySchedule):
    """Every group's weights after every step, with DiLoCo's outer steps, in this process."""

    def __init__(self, size: int, group_size: int, fragments: int, delay: int, compression: str) -> None:
        self.groups = [list(range(g, g + group_size)) for g in range(0, size, group_size)]
        self.models = [make_model() for _ in self.groups]
        self.inner = [inner_optimizer() for _ in self.groups]
        self.global_weights = make_model().get_weights()
        self.momentum = [np.zeros_like(w) for w in self.global_weights]
        self.schedule = DiLoCoSchedule(SYNC_EVERY, fragments, delay)
        self.fragments = split_fragments([w.size for w in self.global_weights], fragments)
        self.compression, self.residuals, self.flight = compression, {}, None

    def step(self, step: int) -> None:
        for model, optimizer, ranks in zip(self.models, self.inner, self.groups, strict=True):
            grads = [gradients(model, rank, step) for rank in ranks]
            optimizer.apply_gradients(zip([sum(g) / len(g) for g in zip(*grads, strict=True)],
                                          model.trainable_variables, strict=True))
        self.after_step(step)

    def send(self, fragment: int) -> None:
        part = self.fragments[fragment]
        weights = [m.get_weights() for m in self.models]
        deltas = [[rounded(self.compression, self.residuals, (g, i), self.global_weights[i] - w[i]) for i in part]
                  for g, w in enumerate(weights)]
        average = [sum(d[k] for d in deltas) / np.float32(len(deltas)) for k in range(len(part))]
        self.flight = (fragment, average, [[w[i] for i in part] for w in weights])

    def land(self) -> None:
        fragment, average, anchors = self.flight
        part = self.fragments[fragment]
        for k, i in enumerate(part):  # Nesterov SGD, as torch and Keras define it
            self.momentum[i] = OUTER_MOMENTUM * self.momentum[i] + average[k]
            self.global_weights[i] = self.global_weights[i] - OUTER_LR * (average[k] + OUTER_MOMENTUM * self.momentum[i])
        for model, anchor in zip(self.models, anchors, strict=True):
            weights = model.get_weights()
            for k, i in enumerate(part):
                weights[i] = self.global_weights[i] + (weights[i] - anchor[k])
            model.set_weights(weights)


class Checker(keras.callbacks.Callback):
    """After DiLoCo's callback: steps the replay and compares this rank's weights with its group's."""

    def __init__(self, replay: Replay | None, group: int, run: str, first: int) -> None:
        super().__init__()
        self.replay, self.group, self.run, self.step = replay, group, run, first

    def on_train_batch_end(self, batch_index: int, logs: dict | None = None) -> None:
        if self.replay is not None:
            self.replay.step(self.step)
            mine, want = flat(self.model.get_weights()), flat(self.replay.models[self.group].get_weights())
            assert np.allclose(mine, want, atol=1e-5), (self.run, hvd.rank(), self.step, np.abs(mine - want).max())
        self.step += 1


def build(group_set, cross_set, fragments: int, delay: int, compression: str | None):
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(inner_optimizer(), process_set=group_set), loss="mse")
    diloco = hvd.DiLoCo(model, model.optimizer, outer_optimizer(), sync_every=SYNC_EVERY, process_set=cross_set,
                        fragments=fragments, delay=delay, compression=compression)
    return model, diloco


def train(model, diloco, mode: str, steps: range, checker: Checker) -> None:
    rank = hvd.rank()
    if mode == "fit":
        x, y = (np.concatenate(parts) for parts in zip(*[batch(rank, s) for s in steps], strict=True))
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[diloco, checker])
        return
    checker.set_model(model)
    for step in steps:
        diloco.apply_gradients(zip(gradients(model, rank, step), model.trainable_variables, strict=True))
        checker.on_train_batch_end(step)


def check_refusals(group_size: int, sets: dict) -> None:
    """What DiLoCo cannot run is a ValueError on every rank, naming what is wrong."""
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    local_sgd = hvd.DistributedOptimizer(inner_optimizer(), local_sgd_period=4)
    expect_refusal("DistributedOptimizer with local_sgd_period set",
                   lambda: hvd.DiLoCo(model, local_sgd, outer_optimizer(), sync_every=4))
    expect_refusal("outer_optimizer must be a plain Keras optimizer",
                   lambda: hvd.DiLoCo(model, inner_optimizer(), hvd.DistributedOptimizer(outer_optimizer()),
                                      sync_every=4))
    every = 4 if rank == 0 else 8  # rank 0 disagrees with every other rank
    expect_refusal(f"the schedule (sync_every, fragments, delay) differs across the process set {list(range(size))}: "
                   "rank 0 has (4, 1, 0), rank 1 has (8, 1, 0)",
                   lambda: hvd.DiLoCo(model, inner_optimizer(), outer_optimizer(), sync_every=every))
    others = sets["group"][(rank // group_size + 1) % len(sets["group"])]
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}",
                   lambda: hvd.DiLoCo(model, inner_optimizer(), outer_optimizer(), sync_every=4, process_set=others))
    plain = hvd.DiLoCo(model, inner_optimizer(), outer_optimizer(), sync_every=4)
    expect_refusal(f"this rank is not in DiLoCo's process_set {others.ranks}", lambda: plain.regroup(others))
    expect_refusal("DiLoCo.regroup(inner_process_set=...) needs an inner DistributedOptimizer that averages gradients",
                   lambda: plain.regroup(hvd.global_process_set, inner_process_set=hvd.global_process_set))
    saved = plain.state_dict()
    expect_refusal("DiLoCo checkpoint was saved with another schedule: sync_every=4 there, 8 here",
                   lambda: hvd.DiLoCo(make_model(), inner_optimizer(), outer_optimizer(),
                                      sync_every=8).load_state_dict(saved))
    print(f"ok keras diloco refusals {rank}", flush=True)


def check(run: str, group_size: int, mode: str, sets: dict) -> None:
    if run == "refusals":
        return check_refusals(group_size, sets)
    rank, size = hvd.rank(), hvd.size()
    fragments, delay, compression, group_set, cross_set = parse_run(run, rank, group_size, sets)
    model, diloco = build(group_set, cross_set, fragments, delay, compression)
    replay, group = Replay(size, group_size, fragments, delay, compression or ""), rank // group_size
    train(model, diloco, mode, range(CHECKPOINT_AT), Checker(replay, group, run, 0))
    saved = (copy.deepcopy(diloco.state_dict()), model.get_weights(), [v.numpy() for v in model.optimizer.variables])
    train(model, diloco, mode, range(CHECKPOINT_AT, STEPS), Checker(replay, group, run, CHECKPOINT_AT))
    lands = len([c for c in range(1, STEPS + 1) if replay.schedule.lands_after(c) is not None])
    assert diloco.syncs == lands, (run, diloco.syncs, lands)
    resumed_model, resumed = build(group_set, cross_set, fragments, delay, compression)
    resumed_model.set_weights(saved[1])
    resumed_model.optimizer.build(resumed_model.trainable_variables)
    for variable, value in zip(resumed_model.optimizer.variables, saved[2], strict=True):
        variable.assign(value)
    resumed.load_state_dict(saved[0])
    train(resumed_model, resumed, mode, range(CHECKPOINT_AT, STEPS), Checker(None, group, run, CHECKPOINT_AT))
    mine, again = flat(model.get_weights()), flat(resumed_model.get_weights())
    assert np.allclose(again, mine, atol=1e-6), (run, rank, "resumed", np.abs(again - mine).max())
    print(f"ok keras diloco {run} {rank}", flush=True)


def main() -> None:
    run_checks(hvd, check)  # one thread a rank: TF_NUM_INTRAOP_THREADS, from the tests' harness


if __name__ == "__main__":
    main()

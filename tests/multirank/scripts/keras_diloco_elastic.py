"""Elastic DiLoCo for Keras: a whole group dies, the other trains on without a restart, and a group joins.

Usage: keras_diloco_elastic.py GROUP_SIZE NP, run with ``hvdliterun -np NP --min-np ...
--blacklist-cooldown-range 0.5 1``. The story of torch_diloco_elastic.py with ``model.fit``: groups of
GROUP_SIZE ranks (a DistributedOptimizer over the group's set inside, SGD with momentum), DiLoCo (a
callback) averaging pseudo-gradients over the ranks at the same place in each group every SYNC_EVERY
steps (Nesterov outer SGD). Every rank of the last group is SIGKILLed at step KILL_AT. The survivors
restore their last commit, and in a reset callback register the new world's sets and move DiLoCo and
its inner optimizer onto them (``diloco.regroup``; fit traces its step again). After the host's
cooldown new ranks fill the slots at a commit: they build their model and DiLoCo over the new sets
and receive, in KerasState's sync, rank 0's weights, inner optimizer state, global parameters, outer
optimizer state and step count.

At the end every rank checks its weights against a replay in one process of the groups each
committed step ran with (at a re-form every group starts again from group 0, whose state the sync
gives every rank). Prints 'ok keras diloco elastic RANK SIZES'.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import sys  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from diloco_common import MAX_STEPS, die_on_schedule, note_reform, record_step, register_dynamic_sets  # noqa: E402
from keras_diloco import (  # noqa: E402
    OUTER_LR,
    OUTER_MOMENTUM,
    SYNC_EVERY,
    batch,
    flat,
    gradients,
    inner_optimizer,
    make_model,
    outer_optimizer,
)

import hvdlite.tensorflow.keras as hvd  # noqa: E402

GROUP_SIZE, FULL = int(sys.argv[1]), int(sys.argv[2])  # ranks per group, ranks in the job
STEPS_AFTER_JOIN = 2 * SYNC_EVERY + 1


class Steps(keras.callbacks.Callback):
    """After DiLoCo's callback: the last group dies at KILL_AT; each step's world size is recorded and committed."""

    def __init__(self, state, first_rank):
        super().__init__()
        self.state, self.first_rank = state, first_rank

    def on_train_batch_begin(self, index, logs=None):
        die_on_schedule(self.first_rank, self.state.step, GROUP_SIZE, FULL, hvd.size())

    def on_train_batch_end(self, index, logs=None):
        record_step(hvd, self.state, FULL)
        self.model.stop_training = self.state.joined_steps >= STEPS_AFTER_JOIN


def copy_optimizer(source, model):
    """A new inner optimizer over ``model`` holding ``source``'s state (a joining group's, from the sync)."""
    optimizer = inner_optimizer()
    optimizer.build(model.trainable_variables)
    for mine, theirs in zip(optimizer.variables, source.variables, strict=True):
        mine.assign(theirs)
    return optimizer


def replay(sizes):
    """Each group's weights after the committed steps, run at ``sizes[step]`` ranks each."""
    models = [make_model() for _ in range(FULL // GROUP_SIZE)]
    inners = [inner_optimizer() for _ in models]
    global_weights = make_model().get_weights()
    momentum = [np.zeros_like(w) for w in global_weights]
    live = len(models)
    for step, size in enumerate(sizes):
        if size // GROUP_SIZE != live:  # a re-form: the sync gave every rank rank 0's state (group 0's)
            live = size // GROUP_SIZE
            for g in range(1, live):
                models[g].set_weights(models[0].get_weights())
                inners[g] = copy_optimizer(inners[0], models[g])
        for g in range(live):
            grads = [gradients(models[g], rank, step) for rank in range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE)]
            inners[g].apply_gradients(zip([sum(column) / len(column) for column in zip(*grads, strict=True)],
                                          models[g].trainable_variables, strict=True))
        if (step + 1) % SYNC_EVERY == 0:  # the outer step (Nesterov SGD) on the groups' mean pseudo-gradient
            weights = [m.get_weights() for m in models[:live]]
            for i in range(len(global_weights)):
                average = sum(global_weights[i] - w[i] for w in weights) / np.float32(live)
                momentum[i] = OUTER_MOMENTUM * momentum[i] + average
                global_weights[i] = global_weights[i] - OUTER_LR * (average + OUTER_MOMENTUM * momentum[i])
            for model in models:
                model.set_weights(global_weights)
    return models


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init(process_sets="dynamic")
    first_rank = hvd.rank()
    group, place = register_dynamic_sets(hvd, GROUP_SIZE)
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(inner_optimizer(), process_set=group), loss="mse")
    diloco = hvd.DiLoCo(model, model.optimizer, outer_optimizer(), sync_every=SYNC_EVERY, process_set=place)
    state = hvd.elastic.KerasState(model, diloco, step=0, sizes=[], shrunk=False, joined_steps=0)

    def regroup():
        diloco.regroup(*reversed(register_dynamic_sets(hvd, GROUP_SIZE)))
        note_reform(hvd, state, FULL)

    state.register_reset_callbacks([regroup])

    @hvd.elastic.run
    def train(state):
        steps = range(state.step, MAX_STEPS)
        x, y = (np.concatenate(parts) for parts in zip(*[batch(hvd.rank(), s) for s in steps], strict=True))
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[diloco, Steps(state, first_rank)])

    train(state)
    assert state.shrunk and state.joined_steps >= STEPS_AFTER_JOIN and hvd.size() == FULL, (state.sizes, hvd.size())
    assert diloco.inner_steps == len(state.sizes), (diloco.inner_steps, state.sizes)
    expected = flat(replay(state.sizes)[hvd.rank() // GROUP_SIZE].get_weights())
    np.testing.assert_allclose(flat(model.get_weights()), expected, atol=1e-5, err_msg=f"rank {hvd.rank()}")
    print(f"ok keras diloco elastic {hvd.rank()} {sorted(set(state.sizes))}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""elastic_shrink.py for Keras 3: rank 2 of 3 dies when an epoch begins; the survivors, whose
gradient allreduce fails inside fit's tf.function, re-form the job inside @hvd.elastic.run, restore
the KerasState committed at the previous epoch's end and fit the remaining epochs at size 2.

Usage: keras_elastic_shrink.py kill|raise [arrays|dataset]. Run with ``hvdliterun -np 3 --min-np 2``.
``fit`` reads NumPy arrays (default), or a ``tf.data.Dataset`` that the training function builds from
them, as Horovod's elastic Keras example passes one: with arrays, Keras builds a ``tf.data`` pipeline
at every ``fit`` call (some 50 ms here, in ``bench/elastic_recovery.py``'s recovery). Each survivor
prints 'recovered <seconds>', its new rank and size, and 'ok elastic shrink'.
"""

import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import hvdlite.tensorflow.keras as hvd

EPOCHS, BATCHES, KILL_EPOCH = 4, 2, 2


class Fault(keras.callbacks.Callback):
    """Rank 2 dies when epoch KILL_EPOCH begins; survivors time their first step in the new world."""

    def __init__(self, state, world_rank, resets, timings):
        super().__init__()
        self.state, self.world_rank, self.resets, self.timings = state, world_rank, resets, timings
        self.run_dir = os.environ["HVDLITE_RUN_DIR"]

    def on_epoch_begin(self, epoch, logs=None):
        if self.world_rank == 2 and self.state.epoch == KILL_EPOCH:
            with open(os.path.join(self.run_dir, "killed_at"), "w") as handle:
                handle.write(str(time.time()))
            if sys.argv[1] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("rank 2 fails when an epoch begins (on purpose)")

    def on_train_batch_end(self, batch, logs=None):
        if self.resets and "recovered" not in self.timings:
            with open(os.path.join(self.run_dir, "killed_at")) as handle:
                self.timings["recovered"] = time.time() - float(handle.read())


def main() -> None:
    dataset = sys.argv[2:] == ["dataset"]
    hvd.init()
    world_rank = hvd.rank()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    # Per-sample loss sum(y_pred), averaged over the batch: the kernel's gradient is x's value.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss=lambda y_true, y_pred: keras.ops.sum(y_pred, axis=-1))
    initial = model.layers[0].kernel.numpy().copy()
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    resets, timings = [], {}
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state), Fault(state, world_rank, resets, timings)]

    @hvd.elastic.run
    def train(state):
        x, y = np.full((BATCHES * 2, 4), float(hvd.rank() + 1), np.float32), np.zeros((BATCHES * 2, 1), np.float32)
        inputs = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(2)) if dataset else dict(x=x, y=y, batch_size=2)
        model.fit(**inputs, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
    assert hvd.size() == 2 and state.epoch == EPOCHS and resets == [2], (hvd.size(), state.epoch, resets)
    weights = hvd.allgather_object(model.layers[0].kernel.numpy().tolist())
    assert weights[0] == weights[1], weights
    # x = 1, 2, 3 averaged for the epochs at size 3, then 1, 2 for the rest at size 2.
    expected = initial - 0.1 * BATCHES * (KILL_EPOCH * 2.0 + (EPOCHS - KILL_EPOCH) * 1.5)
    kernel = model.layers[0].kernel.numpy()
    assert np.allclose(kernel, expected, atol=1e-5), (kernel, expected)
    print(f"recovered {timings['recovered']:.3f}", flush=True)
    print(f"new rank {hvd.rank()} size {hvd.size()}", flush=True)
    hvd.shutdown()
    print("ok elastic shrink", flush=True)


if __name__ == "__main__":
    main()

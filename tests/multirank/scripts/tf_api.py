"""hvdlite.tensorflow beyond the collectives: gradients, callbacks, state, sparse gradients, errors.

Usage: tf_api.py CASE [ARG]. Each check prints "ok <name>"; a failed check raises (and ends the job).
"""

import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf
from checks import expect_error

import hvdlite
import hvdlite.tensorflow as hvd
import hvdlite.tensorflow.keras as hvd_keras
from hvdlite.tensorflow.gradients.averaging import is_distributed


def weights(rank, shape):
    """A per-rank weight for a linear loss; every rank can rebuild every other rank's."""
    return tf.reshape(tf.range(int(np.prod(shape)), dtype=tf.float64), shape) * 0.1 + rank


def close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and np.allclose(got, want, atol=1e-9), f"{what}: got {got} want {want}"


def grad_of(fn, x, w, compiled):
    def compute(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(fn(x) * w)
        return tape.gradient(loss, x)
    return (tf.function(compute) if compiled else compute)(x)


def case_gradients(rank, size):
    """For loss_r = sum(op(x) * w_r), the gradient each rank gets is known in closed form."""
    for compiled in (False, True):
        every_w = [weights(r, (size + 1, 2)) for r in range(size)]
        w, x = every_w[rank], tf.ones((size + 1, 2), tf.float64)
        total = sum(every_w)
        close(grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum), x, w, compiled), total, "allreduce Sum")
        close(grad_of(lambda t: hvd.allreduce(t), x, w, compiled), total / size, "allreduce Average")
        close(grad_of(lambda t: hvd.grouped_allreduce([t, t * 2], op=hvd.Sum)[1], x, w, compiled), 2 * total, "grouped")
        close(grad_of(lambda t: hvd.broadcast(t, root_rank=size - 1), x, w, compiled),
              total / size if rank == size - 1 else tf.zeros_like(x), "broadcast")
        gathered_w = [weights(r, (2 * size, 2)) for r in range(size)]
        # Horovod's rules: allgather averages its output's gradient; reducescatter gathers it, times size
        # for Sum (the mathematical gradients: the sum, and the plain gather divided by size for Average).
        close(grad_of(lambda t: hvd.allgather(t), tf.ones((2, 2), tf.float64), gathered_w[rank], compiled),
              sum(gathered_w)[2 * rank: 2 * rank + 2] / size, "allgather")
        rs_w = [weights(r, (1, 2)) for r in range(size)]
        close(grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum), tf.ones((size, 2), tf.float64), rs_w[rank],
                      compiled), tf.concat(rs_w, 0) * size, "reducescatter Sum")
        close(grad_of(lambda t: hvd.reducescatter(t, op=hvd.Average), tf.ones((size, 2), tf.float64), rs_w[rank],
                      compiled), tf.concat(rs_w, 0), "reducescatter Average")
        a2a_w = [weights(r, (size, 2)) for r in range(size)]
        want = tf.stack([a2a_w[d][rank] for d in range(size)])
        close(grad_of(lambda t: hvd.alltoall(t), tf.ones((size, 2), tf.float64), a2a_w[rank], compiled), want,
              "alltoall")
    print("ok gradients", flush=True)


def case_static_shapes(rank, size):
    @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32)])
    def shapes(x):
        return [hvd.allreduce(x), hvd.allgather(x), hvd.broadcast(x, 0), hvd.reducescatter(x),
                hvd.alltoall(tf.tile(x, [size, 1]))]
    got = [t.shape.as_list() for t in shapes.get_concrete_function().structured_outputs]
    mine = 4 // size + (1 if rank < 4 % size else 0)
    assert got == [[4, 3], [None, 3], [4, 3], [mine, 3], [None, 3]], got
    print("ok static_shapes", flush=True)


def case_sparse(rank, size):
    """Embedding gradients are IndexedSlices: allgathered, or reduced dense with sparse_as_dense."""
    table = tf.Variable(tf.zeros((size + 2, 2)))

    def grads(sparse_as_dense):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [rank, size + 1]) * (rank + 1.0))
        return hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(loss, [table])[0]
    sparse = grads(False)
    assert isinstance(sparse, tf.IndexedSlices), type(sparse)
    dense = grads(True)
    assert isinstance(dense, tf.Tensor)
    close(tf.convert_to_tensor(sparse), dense, "sparse vs dense")
    want = np.zeros((size + 2, 2))
    for r in range(size):
        want[r] += (r + 1.0) / size
        want[size + 1] += (r + 1.0) / size
    close(dense, want, "averaged embedding gradient")
    try:
        hvd.allreduce(sparse, op=hvd.Max)
        raise AssertionError("Max on IndexedSlices should fail")
    except hvd.UnsupportedOperationError as exc:
        assert "sparse_as_dense" in str(exc), exc
    print("ok sparse", flush=True)


def case_variables(rank, size):
    v = [tf.Variable(tf.fill((2, 2), float(rank))), keras.Variable(np.full(3, rank, np.int32))]
    hvd.broadcast_variables(v, root_rank=size - 1)
    close(v[0], np.full((2, 2), size - 1.0), "tf.Variable")
    close(v[1], np.full(3, size - 1), "keras.Variable")
    u = tf.Variable(tf.fill((3,), float(rank)))
    @tf.function
    def broadcast_in_graph():
        hvd.broadcast_variables([u], root_rank=0)
    broadcast_in_graph()
    close(u, np.zeros(3), "broadcast_variables in tf.function")
    assert [int(t.numpy()) for t in (hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op())] == [
        size, rank, size, rank]
    print("ok variables", flush=True)


def _model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    return model


class Recorder(keras.callbacks.Callback):
    """Records the learning rate at each batch and a copy of each epoch's logs."""

    def __init__(self):
        super().__init__()
        self.rates, self.logs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def case_callbacks(rank, size):
    model = _model(seed=rank)  # differently initialised on each rank
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    root_initial = hvdlite.broadcast_object(model.get_weights(), root_rank=0)
    rng = np.random.default_rng(rank)
    x, y = rng.normal(size=(12, 4)).astype(np.float32), rng.normal(size=(12, 1)).astype(np.float32) * (rank + 1)
    before, after = Recorder(), Recorder()
    spe, warmup = 4, 2
    warm = hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=warmup, verbose=1)
    history = model.fit(x, y, batch_size=3, epochs=3, shuffle=False, verbose=0, callbacks=[
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), warm, before,
        hvd_keras.callbacks.MetricAverageCallback(), after])
    # Trainable weights stay equal; BatchNormalization's moving statistics follow each rank's own data.
    everyone = hvdlite.allgather_object([w.numpy().tolist() for w in model.trainable_weights])
    assert all(e == everyone[0] for e in everyone), "ranks differ after BroadcastGlobalVariablesCallback"
    # Warmup: lr = initial/size * ((epoch + (batch+1)/spe) * (size-1)/warmup + 1) during warmup, then unchanged.
    want = [0.4 / size * ((e + (b + 1) / spe) * (size - 1) / warmup + 1) for e in range(warmup) for b in range(spe)]
    assert np.allclose(before.rates[: len(want)], want) and np.allclose(before.rates[len(want):], 0.4), before.rates
    # Metric averaging: the logs after the callback are the mean over ranks of the logs before it.
    local = hvdlite.allgather_object(before.logs)
    for epoch in range(3):
        mean = np.mean([local[r][epoch]["loss"] for r in range(size)])
        assert np.isclose(after.logs[epoch]["loss"], mean), (after.logs, mean)
        assert np.isclose(history.history["loss"][epoch], mean), history.history
    assert np.isclose(after.logs[-1]["lr"], 0.4)
    # Broadcast happened before the first step: the root trained from its own initial weights.
    reference = _model(seed=0)
    reference.set_weights(root_initial)
    assert not np.allclose(model.get_weights()[0], root_initial[0])
    schedule = hvd_keras.callbacks.LearningRateScheduleCallback(initial_lr=1.0, multiplier=0.5, start_epoch=1,
                                                                end_epoch=3)
    probe = Recorder()
    model.fit(x, y, batch_size=3, epochs=4, verbose=0, callbacks=[schedule, probe])
    assert np.allclose(probe.rates, [0.4] * 4 + [1.0] * 4 + [0.5] * 4 + [0.5] * 4), probe.rates
    print("ok callbacks", flush=True)


def case_state(rank, size, directory):
    model = _model(seed=0)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    x, y = np.ones((6, 4), np.float32) * (rank + 1), np.ones((6, 1), np.float32)
    model.fit(x, y, batch_size=3, epochs=1, verbose=0)
    path = os.path.join(directory, "model.keras")
    if rank == 0:
        model.save(path)
    hvd.barrier()
    loaded = hvd_keras.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.Adam
    assert is_distributed(loaded.optimizer)
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        close(got, want, f"optimizer variable {got.path}")
    loaded.fit(x, y, batch_size=3, epochs=1, verbose=0)
    everyone = hvdlite.allgather_object([w.numpy().tolist() for w in loaded.trainable_weights])
    assert all(e == everyone[0] for e in everyone), "loaded model trained differently on each rank"
    if rank == 0:  # a process without hvdlite loads the same file with plain Keras
        code = ("import sys, keras; m = keras.models.load_model(sys.argv[1]); "
                "assert 'hvdlite' not in sys.modules; print(type(m.optimizer).__name__, m.optimizer.iterations.numpy())")
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.split() == ["Adam", "2"], (out.stdout, out.stderr)
    broadcast_model = _model(seed=rank)
    broadcast_model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    hvd_keras.broadcast_global_variables(0, model=broadcast_model)
    close(broadcast_model.get_weights()[0], _model(seed=0).get_weights()[0], "broadcast_global_variables")
    print("ok state", flush=True)


def case_mixed_precision(rank, size):
    """Under mixed_float16 the optimizer is wrapped in a LossScaleOptimizer whose overflow check is global."""
    keras.config.set_dtype_policy("mixed_float16")
    model = _model(seed=0)
    optimizer = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01))
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    model.compile(optimizer=optimizer, loss="mse")
    assert model.optimizer is optimizer
    # Rank 0's data overflows float16; every rank must skip the step and halve the scale together.
    x = np.full((4, 4), 6e4 if rank == 0 else 1.0, np.float32)
    model.fit(x, np.ones((4, 1), np.float32), batch_size=4, epochs=1, verbose=0)
    scales = hvdlite.allgather_object(float(optimizer.dynamic_scale.numpy()))
    assert len(set(scales)) == 1 and scales[0] < 32768.0, scales
    everyone = hvdlite.allgather_object([w.numpy().tolist() for w in model.trainable_weights])
    assert all(e == everyone[0] for e in everyone), "ranks diverged under mixed precision"
    keras.config.set_dtype_policy("float32")
    print("ok mixed_precision", flush=True)


def case_errors(rank, size):
    expect_error(hvd.UnsupportedOperationError, "complex64",
                 lambda: hvd.allreduce(tf.ones(2, tf.complex64), name="cplx"), "dtype")
    expect_error(hvd.UnsupportedOperationError, "Adasum needs a floating-point",
                 lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum), "adasum int")
    assert hvd.allreduce(tf.ones(2), op=hvd.Adasum, name="adasum.same").numpy().tolist() == [1.0, 1.0]
    expect_error(hvd.ProcessSetError, "is not registered",
                 lambda: hvd.allreduce(tf.ones(2), process_set=hvd.ProcessSet([0])), "process set")
    # Shapes that disagree across ranks: every rank gets an error naming the tensor, eagerly and in a graph.
    expect_error(hvd.TensorMismatchError, "'bad.shape'", lambda: hvd.allreduce(tf.ones(rank + 1), name="bad.shape"),
                 "mismatch")
    expect_error(tf.errors.OpError, "'bad.graph.shape'",
                 lambda: tf.function(lambda: hvd.allreduce(tf.ones(rank + 1), name="bad.graph.shape"), autograph=False)(), "graph")
    # XLA cannot compile a host callback: refused at trace time with what to change.
    expect_error(hvd.UnsupportedOperationError, "jit_compile=False",
                 lambda: tf.function(lambda: hvd.allreduce(tf.ones(2)), jit_compile=True, autograph=False)(), "xla")
    model = _model(seed=0)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
    expect_error(hvd.UnsupportedOperationError, "jit_compile=False",
                 lambda: model.fit(np.ones((2, 4)), np.ones((2, 1)), verbose=0), "keras xla")
    # A LossScaleOptimizer around a DistributedOptimizer would check overflow per rank.
    model = _model(seed=0)
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(0.1))), loss="mse")
    expect_error(ValueError, "the other way round", lambda: model.fit(np.ones((2, 4)), np.ones((2, 1)), verbose=0),
                 "loss scale order")
    sgd = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
    expect_error(ValueError, "already", lambda: hvd_keras.DistributedOptimizer(sgd), "twice")
    expect_error(ValueError, "Average or op=Sum",
                 lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Max), "op")
    expect_error(TypeError, "Keras 3 optimizer", lambda: hvd_keras.DistributedOptimizer(object()), "type")
    expect_error(ValueError, "needs op=Average",
                 lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0),
                 "predivide")
    expect_error(RuntimeError, "model=model", lambda: hvd_keras.broadcast_global_variables(0), "global variables")
    # The job still works after all of that.
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == size
    print("ok errors", flush=True)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = {"gradients": case_gradients, "static_shapes": case_static_shapes, "sparse": case_sparse,
             "variables": case_variables, "callbacks": case_callbacks, "mixed_precision": case_mixed_precision,
             "errors": case_errors}
    for name in sys.argv[1].split(","):  # "state" saves into the directory sys.argv[2]
        case_state(rank, size, sys.argv[2]) if name == "state" else cases[name](rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()

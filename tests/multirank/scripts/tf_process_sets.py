"""TensorFlow and Keras with two data-parallel process sets (even and odd ranks), as a Horovod script
would have them.

Usage: tf_process_sets.py static|dynamic. Every collective runs on the set eagerly and inside
``tf.function``; gradients of the collectives follow Horovod's rules with the set's size; each set
trains its own model with ``DistributedGradientTape`` and with the Keras ``DistributedOptimizer``
and callbacks, and must equal one process training on the whole of its set's batch. A rank outside
a set gets tf.errors.InvalidArgumentError, as in Horovod: eagerly at once (also hvdlite's ProcessSetError),
in a tf.function or TF1 graph when the op runs. Prints 'ok tf process sets <mode>'.
"""

import sys

import keras
import numpy as np
import tensorflow as tf
from mpi4py import MPI

import hvdlite.tensorflow as hvd
import hvdlite.tensorflow.keras as hvd_keras

STEPS, BATCH = 3, 4


def check_collectives(mine: hvd.ProcessSet, rank: int, compiled: bool) -> None:
    members, n = mine.ranks, mine.size()

    def run(fn):
        return tf.function(fn)() if compiled else fn()

    total = run(lambda: hvd.allreduce(tf.constant([rank + 1.0] * 2), op=hvd.Sum, process_set=mine))
    assert total.numpy().tolist() == [sum(r + 1.0 for r in members)] * 2, total
    avg, summed = run(lambda: hvd.grouped_allreduce([tf.constant([float(rank)]), tf.constant([rank], tf.int32)],
                                                    op=hvd.Average, process_set=mine))
    assert np.isclose(avg.numpy()[0], sum(members) / n) and summed.numpy()[0] == sum(members) // n, (avg, summed)
    gathered = run(lambda: hvd.allgather(tf.fill([rank + 1, 2], float(rank)), process_set=mine))
    assert gathered.numpy()[:, 0].tolist() == [float(r) for r in members for _ in range(r + 1)], gathered
    root = members[-1]
    value = run(lambda: hvd.broadcast(tf.constant([float(rank)] * 3), root_rank=root, process_set=mine))
    assert value.numpy().tolist() == [float(root)] * 3, value
    rows = tf.constant(np.arange(2 * n, dtype=np.float32).reshape(2 * n, 1) + rank)
    scattered = run(lambda: hvd.reducescatter(rows, op=hvd.Sum, process_set=mine))
    me = mine.rank()
    want = np.arange(2 * me, 2 * me + 2, dtype=np.float32).reshape(2, 1) * n + sum(members)
    assert scattered.shape == (2, 1) and np.allclose(scattered.numpy(), want), (scattered, want)
    (first, second) = run(lambda: hvd.grouped_reducescatter([rows, rows * 2], op=hvd.Sum, process_set=mine))
    assert np.allclose(first.numpy(), want) and np.allclose(second.numpy(), 2 * want), (first, second)
    sent = tf.constant([[float(rank)]] * n)
    received = run(lambda: hvd.alltoall(sent, process_set=mine))
    assert received.numpy()[:, 0].tolist() == [float(r) for r in members], received
    run(lambda: hvd.barrier(process_set=mine))
    assert int(hvd.size_op(process_set_id=mine.process_set_id)) == n


def check_eager_only(mine: hvd.ProcessSet, rank: int) -> None:
    members, n = mine.ranks, mine.size()
    data, counts = hvd.alltoall(tf.constant([[float(rank)]] * (n + 1)), splits=[2] + [1] * (n - 1),
                                process_set=mine)
    expected = [float(r) for r in members for _ in range(2 if mine.rank() == 0 else 1)]
    assert data.numpy()[:, 0].tolist() == expected and counts.numpy().tolist() == [len(expected) // n] * n, (data,
                                                                                                           counts)
    sparse = tf.IndexedSlices(tf.constant([[float(rank)]]), tf.constant([rank]), dense_shape=tf.constant([8, 1]))
    result = hvd.allreduce(sparse, op=hvd.Sum, process_set=mine)
    assert sorted(result.indices.numpy().tolist()) == members, result


def check_gradients(mine: hvd.ProcessSet, rank: int) -> None:
    n, root = mine.size(), mine.ranks[-1]
    x = tf.Variable([float(rank + 1)] * 2)
    rows = tf.Variable(tf.ones([rank + 1, 2]))
    block = tf.Variable(tf.ones([2 * n, 1]))
    w = tf.Variable([float(rank)] * 3)
    with tf.GradientTape(persistent=True) as tape:
        reduced = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
        gathered = hvd.allgather(rows, process_set=mine)
        scattered = hvd.reducescatter(block, op=hvd.Average, process_set=mine)
        broadcast = hvd.broadcast(w, root_rank=root, process_set=mine)
        losses = [tf.reduce_sum(t) for t in (reduced, gathered, scattered, broadcast)]
    assert tape.gradient(losses[0], x).numpy().tolist() == [float(n)] * 2
    assert np.all(tape.gradient(losses[1], rows).numpy() == 1.0)  # averaged over the set's ranks
    assert np.allclose(tape.gradient(losses[2], block).numpy(), 1.0)
    assert tape.gradient(losses[3], w).numpy().tolist() == ([1.0] * 3 if rank == root else [0.0] * 3)


def batch(set_index: int, member: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(1000 * set_index + 10 * member + step)
    return generator.normal(size=(BATCH, 5)).astype(np.float32), generator.normal(size=(BATCH, 1)).astype(np.float32)


def model(shift: float) -> keras.Model:
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    for variable in net.weights:
        variable.assign(variable + shift)
    return net


def whole(set_index: int, mine: hvd.ProcessSet, step: int) -> tuple[np.ndarray, np.ndarray]:
    parts = [batch(set_index, member, step) for member in range(mine.size())]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def check_tape_training(mine: hvd.ProcessSet, set_index: int, rank: int) -> None:
    net, reference = model(float(rank)), model(float(mine.ranks[0]))
    hvd.broadcast_variables(net.weights, root_rank=mine.ranks[0], process_set=mine)
    opt, ref_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((net(x) - y) ** 2)
        grads = hvd.DistributedGradientTape(tape, process_set=mine).gradient(loss, net.trainable_variables)
        opt.apply(grads, net.trainable_variables)

    for s in range(STEPS):
        step(*batch(set_index, mine.rank(), s))
        x, y = whole(set_index, mine, s)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((reference(x) - y) ** 2)
        ref_opt.apply(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
    for got, want in zip(net.weights, reference.weights, strict=True):
        assert np.allclose(got.numpy(), want.numpy(), atol=1e-5), (got, want)


def check_keras_training(mine: hvd.ProcessSet, set_index: int, rank: int) -> None:
    net, reference = model(float(rank)), model(float(mine.ranks[0]))
    net.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01), process_set=mine), loss="mse")
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(mine.ranks[0], process_set=mine)
    callback.set_model(net)
    callback.on_train_begin()
    for s in range(STEPS):
        net.train_on_batch(*batch(set_index, mine.rank(), s))
        reference.train_on_batch(*whole(set_index, mine, s))
    for got, want in zip(net.weights, reference.weights, strict=True):
        assert np.allclose(got.numpy(), want.numpy(), atol=1e-5), (got, want)
    logs = {"loss": float(rank)}
    hvd_keras.callbacks.MetricAverageCallback(process_set=mine).on_epoch_end(0, logs)
    assert np.isclose(logs["loss"], sum(mine.ranks) / mine.size()), logs


def check_outsider(other: hvd.ProcessSet, rank: int) -> None:
    """Every collective on a set this rank is not in fails with Horovod's type, InvalidArgumentError:
    eagerly at once (also hvdlite's ProcessSetError); in a tf.function and a TF1 graph when the op
    runs (the op is built), the message naming the rank and the set."""
    expected = f"rank {rank} is not in process set {other.process_set_id}"
    ones = tf.ones([other.size() * 2, 1])
    collectives = {
        "allreduce": lambda: hvd.allreduce(ones, process_set=other),
        "allgather": lambda: hvd.allgather(ones, process_set=other),
        "broadcast": lambda: hvd.broadcast(ones, 0, process_set=other),
        "alltoall": lambda: hvd.alltoall(ones, process_set=other),
        "reducescatter": lambda: hvd.reducescatter(ones, process_set=other),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([ones, ones], process_set=other),
        "grouped_allgather": lambda: hvd.grouped_allgather([ones, ones], process_set=other),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([ones, ones], process_set=other),
    }
    for what, collective in collectives.items():
        expect_invalid_argument(collective, expected, f"{what} eagerly", eager=True)
        expect_invalid_argument(tf.function(collective), expected, f"{what} in a tf.function", eager=False)
    graph = tf.Graph()
    with graph.as_default():
        op = hvd.allreduce(tf.ones([2]), process_set=other)  # built without an error
    with tf.compat.v1.Session(graph=graph) as session:
        expect_invalid_argument(lambda: session.run(op), expected, "allreduce in a TF1 graph", eager=False)


def expect_invalid_argument(attempt, expected: str, what: str, eager: bool) -> None:
    try:
        attempt()
    except tf.errors.InvalidArgumentError as exc:
        assert expected in str(exc) and isinstance(exc, hvd.ProcessSetError) == eager, (what, type(exc), exc)
        return
    raise AssertionError(f"{what}: a collective on a set this rank is not in must fail")


def check_outsider_training(other: hvd.ProcessSet) -> None:
    """As in Horovod's torch optimizer, gradients for a set this rank is not in stay local."""
    variable = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = variable * 3.0
    (grad,) = hvd.DistributedGradientTape(tape, process_set=other).gradient(loss, [variable])
    assert grad.numpy().tolist() == [3.0], grad


def main(mode: str) -> None:
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    groups = [[r for r in range(size) if r % 2 == parity] for parity in (0, 1)]
    groups += [[0, 1]] if size > 2 else []  # [0, 1] overlaps both (at np=2 it is the job)
    if mode == "static":
        sets = [hvd.ProcessSet(g) for g in groups]
        hvd.init(process_sets=sets)
    else:
        hvd.init(process_sets="dynamic")
        sets = [hvd.add_process_set(g) for g in groups]
    mine, other = sets[rank % 2], sets[1 - rank % 2]
    pair = sets[2] if size > 2 else hvd.global_process_set
    for compiled in (False, True):
        check_collectives(mine, rank, compiled)
        if pair.included():
            check_collectives(pair, rank, compiled)
    check_eager_only(mine, rank)
    check_gradients(mine, rank)
    check_tape_training(mine, rank % 2, rank)
    check_keras_training(mine, rank % 2, rank)
    check_outsider(other, rank)
    check_outsider_training(other)
    assert hvd.allgather_object(mine.process_set_id) == [sets[r % 2].process_set_id for r in range(size)]
    assert sorted(s.process_set_id for s in sets) == list(range(1, len(groups) + 1))
    if mode == "dynamic":
        assert all(hvd.remove_process_set(s) for s in sets)  # the same order everywhere
    hvd.shutdown()
    print(f"ok tf process sets {mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

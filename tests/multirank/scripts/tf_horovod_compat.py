"""Where hvdlite.tensorflow once behaved differently from horovod.tensorflow: each case is one such
place, checked against what Horovod's code does. Prints "ok <case>" for each.
"""

import itertools

import numpy as np
import tensorflow as tf
from checks import expect_error

import hvdlite.tensorflow as hvd


def case_graph_without_dependencies(rank, size):
    """More independent collectives in one TF1 graph than inter-op threads, fetched in another order
    on every rank: each hvdlite op blocks a thread while it waits, so unordered ops would hang."""
    with tf.Graph().as_default():
        ops = [hvd.allreduce(tf.constant([float(rank + i)]), op=hvd.Sum) for i in range(21)]
        gathered = hvd.allgather(tf.constant([[rank]]))
        fetches = ops[::-1] if rank % 2 else ops
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)
        with tf.compat.v1.Session(config=config) as session:
            for _ in range(2):  # the chain holds on every run of the graph
                values, rows = session.run([fetches, gathered])
    values = values[::-1] if rank % 2 else values
    assert [float(v[0]) for v in values] == [sum(r + i for r in range(size)) for i in range(21)], values
    assert rows[:, 0].tolist() == list(range(size)), rows
    print("ok graph_without_dependencies", flush=True)


def case_uint16(rank, size):
    value = tf.constant([rank + 1, 60000 // size], tf.uint16)
    total = hvd.allreduce(value, op=hvd.Sum)
    assert total.dtype == tf.uint16 and total.numpy().tolist() == [size * (size + 1) // 2, 60000 // size * size]
    assert hvd.allgather(value).numpy().tolist() == [v for r in range(size) for v in (r + 1, 60000 // size)]
    assert hvd.broadcast(value, root_rank=size - 1).numpy().tolist() == [size, 60000 // size]
    assert hvd.allreduce(value, op=hvd.Max).numpy().tolist() == [size, 60000 // size]
    rows = hvd.reducescatter(tf.ones([size, 2], tf.uint16), op=hvd.Sum)
    assert rows.dtype == tf.uint16 and rows.numpy().tolist() == [[size, size]]
    assert tf.function(lambda: hvd.allreduce(value, op=hvd.Min))().numpy().tolist() == [1, 60000 // size]
    print("ok uint16", flush=True)


def case_error_types(rank, size):
    """Ranks that disagree: Horovod's TF ops raise FailedPreconditionError; hvdlite's type holds too."""
    for what, call in [("shape", lambda: hvd.allreduce(tf.ones(rank + 1), name="c.shape")),
                       ("dtype", lambda: hvd.allgather(tf.ones([1], tf.float32 if rank else tf.float64), name="c.dt")),
                       ("ndim", lambda: hvd.allgather(tf.ones([1] * (rank + 1)), name="c.ndim")),
                       ("root", lambda: hvd.broadcast(tf.ones(1), root_rank=rank, name="c.root"))]:
        error = expect_error(tf.errors.FailedPreconditionError, "c.", call, what)
        assert isinstance(error, hvd.TensorMismatchError), type(error).__mro__
    # Inside a graph TensorFlow picks the type itself: an OpError carrying hvdlite's message.
    expect_error(tf.errors.OpError, "c.graph",
                 lambda: tf.function(lambda: hvd.allreduce(tf.ones(rank + 1), name="c.graph"), autograph=False)(),
                 "graph")
    # Local argument errors: Horovod raises NotImplementedError or ValueError; hvdlite's type is both.
    slices = tf.IndexedSlices(tf.ones([1, 1]), tf.constant([0]), dense_shape=tf.constant([4, 1]))
    for base in (NotImplementedError, ValueError):
        expect_error(base, "Sum and Average", lambda: hvd.allreduce(slices, op=hvd.Max), "sparse max")
    # Bad arguments a collective checks on its rank: Horovod's ops raise tf.errors.InvalidArgumentError
    # (test_horovod_alltoall_equal_split_length_error, _splits_error); hvdlite's error is that too.
    for text, call in [("does not divide", lambda: hvd.alltoall(tf.ones([size + 1, 1]))),
                       ("must be", lambda: hvd.alltoall(tf.ones([size, 1]), splits=[1] * (size + 1))),
                       ("must be", lambda: hvd.alltoall(tf.ones([size - 1]), splits=[1] * size)),
                       ("root_rank=", lambda: hvd.broadcast(tf.ones(1), root_rank=size)),
                       ("at least one dimension", lambda: hvd.allgather(tf.constant(1.0))),
                       ("at least one dimension", lambda: hvd.reducescatter(tf.constant(1.0)))]:
        for base in (tf.errors.InvalidArgumentError, hvd.UnsupportedOperationError, NotImplementedError, ValueError):
            expect_error(base, text, call, text)
        expect_error(tf.errors.InvalidArgumentError, text, tf.function(call, autograph=False), f"{text} in a graph")
    print("ok error_types", flush=True)


def case_broadcast_grad(rank, size):
    """Horovod's test_horovod_broadcast_grad: a broadcast from each root, float32 and float64, 1-3
    dimensions, differentiated eagerly, in tf.function and in a TF1 graph. The gradient is the average
    of the output gradients on the root (Horovod's current rule), times zero elsewhere: a graph runs
    only what a fetch depends on, and zeros that did not depend on the allreduce let the other ranks
    skip the allreduce the root waited in."""
    cases = list(itertools.product([tf.float32, tf.float64], [1, 2, 3], range(size)))

    def check(got, dim, root):
        assert np.array_equal(np.asarray(got), np.full([5] * dim, 1.0 if rank == root else 0.0)), (dim, root, got)

    for dtype, dim, root in cases:
        variable = tf.Variable(tf.ones([5] * dim) * rank)
        with tf.GradientTape() as tape:
            tensor = tf.cast(variable, dtype)
            broadcasted = hvd.broadcast(tensor, root)
        check(tape.gradient(broadcasted, tensor), dim, root)

    def graph_gradient(dtype, dim, root):
        tensor = tf.cast(tf.ones([5] * dim) * rank, dtype)
        return tf.gradients(hvd.broadcast(tensor, root), tensor, tf.ones([5] * dim, dtype))[0]

    traced = tf.function(lambda: [graph_gradient(*case) for case in cases], autograph=False)()
    for got, (_, dim, root) in zip(traced, cases, strict=True):
        check(got, dim, root)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        for dtype, dim, root in cases:  # one graph: each run also runs the collectives built before
            check(session.run(graph_gradient(dtype, dim, root)), dim, root)
    print("ok broadcast_grad", flush=True)


def case_graph_divergence(rank, size):
    """Ranks that run different sequences of unnamed collectives in a graph: an error on every rank
    (as the core gives for unnamed eager calls), not a stall. Graph names are the core's generated
    names (tfgraph.noname.<n>), so the core sees either two collectives under one name or ranks at
    different points of the sequence."""
    def branch():  # rank 0 builds an allreduce the others do not
        if rank == 0:
            hvd.allreduce(tf.ones(7))
        return hvd.broadcast(tf.ones(5), 0)
    expect_error(tf.errors.InvalidArgumentError, "Mismatched collective", tf.function(branch, autograph=False),
                 "branch on the rank")
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float64, [None])
        first = hvd.allreduce(x, op=hvd.Sum)
        second = hvd.allreduce(x, op=hvd.Sum)  # chained after first: running it runs first too
        with tf.compat.v1.Session() as session:
            if rank:
                session.run(first, {x: [1.0]})  # rank 0 fetches nothing here; its next run completes this one
            # Then rank 0 is at the second collective and the others at the first again (with a new
            # shape, so it is not answered by the response cache and reaches the coordinator at once).
            expect_error(tf.errors.InvalidArgumentError, "different sequences of unnamed tfgraph",
                         lambda: session.run(second, {x: [1.0] if rank == 0 else [1.0, 2.0]}), "fetch")
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == size, "the job goes on"
    print("ok graph_divergence", flush=True)


def case_broadcast_inplace(rank, size):
    """``broadcast_`` leaves the root's values in the variables and returns them, in every mode."""
    root = size - 1
    many = [tf.Variable([float(rank)] * 2), tf.Variable([[rank * 10]], dtype=tf.int32)]
    returned = hvd.broadcast_(many, root_rank=root)
    assert [v.numpy().tolist() for v in many] == [[float(root)] * 2, [[root * 10]]], many
    assert [t.numpy().tolist() for t in returned] == [[float(root)] * 2, [[root * 10]]], returned
    one = tf.Variable([float(rank)] * 3)
    assert hvd.broadcast_(one, root_rank=root).numpy().tolist() == [float(root)] * 3
    assert one.numpy().tolist() == [float(root)] * 3
    traced = tf.Variable([float(rank)])
    assert tf.function(lambda: hvd.broadcast_([traced], root_rank=root))()[0].numpy().tolist() == [float(root)]
    assert traced.numpy().tolist() == [float(root)]
    with tf.Graph().as_default():
        variable = tf.compat.v1.Variable([float(rank)] * 2, use_resource=False)
        new_values = hvd.broadcast_([variable], root_rank=root)
        with tf.compat.v1.Session() as session:
            session.run(variable.initializer)
            assert session.run(new_values)[0].tolist() == [float(root)] * 2
            assert session.run(variable).tolist() == [float(root)] * 2
    print("ok broadcast_inplace", flush=True)


def _dense_of(result):
    return tf.convert_to_tensor(result).numpy() if isinstance(result, tf.IndexedSlices) else result.numpy()


def case_mixed_dense_and_sparse(rank, size):
    """A group of dense tensors and IndexedSlices with Average: each member as if reduced alone."""
    def members():
        dense_a = tf.fill([2], float(rank + 1))
        sparse_a = tf.IndexedSlices(tf.fill([1, 3], float(rank + 1)), tf.constant([rank]),
                                    dense_shape=tf.constant([size, 3]))
        dense_b = tf.fill([3, 1], float(10 * rank))
        sparse_b = tf.IndexedSlices(tf.fill([2, 1], float(rank)), tf.constant([0, 1]), dense_shape=tf.constant([2, 1]))
        return [sparse_a, dense_a, sparse_b, dense_b]

    mean = (size + 1) / 2
    want = [np.array([[r + 1.0] * 3 for r in range(size)]) / size, np.full([2], mean),
            np.full([2, 1], sum(range(size)) / size), np.full([3, 1], 10 * sum(range(size)) / size)]
    for compiled in (False, True):
        run = tf.function(lambda: hvd.grouped_allreduce(members(), op=hvd.Average)) if compiled else \
            (lambda: hvd.grouped_allreduce(members(), op=hvd.Average))
        got = [_dense_of(t) for t in run()]
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert np.allclose(g, w), (compiled, index, g, w)
    # Integer IndexedSlices with Average, alone and in a group, eagerly and in a graph: as Horovod, the
    # gathered values divided by the size with TensorFlow's true division, so they come back as floats.
    for dtype, sign, float_type in ((tf.uint8, 1, tf.float32), (tf.int8, -1, tf.float32), (tf.int32, -1, tf.float64),
                                    (tf.int64, 1, tf.float64)):
        def alone(dtype=dtype, sign=sign):
            return hvd.allreduce(_int_slices(dtype, sign * (2 * rank + 1), rank, size), op=hvd.Average)

        def grouped(dtype=dtype, sign=sign):
            return hvd.grouped_allreduce([tf.constant([rank], dtype), _int_slices(dtype, sign * (2 * rank + 1), rank,
                                                                                 size)], op=hvd.Average)[1]
        for run in (alone, grouped, tf.function(alone), tf.function(grouped)):
            result = run()
            assert result.values.dtype == float_type, (dtype, result.values.dtype)
            want = [sign * (2 * r + 1) / size for r in range(size)]
            assert np.allclose(result.values.numpy()[:, 0], want, rtol=1e-6), (dtype, run, result.values)
    _horovods_mixed_average(rank, size)
    print("ok mixed_dense_and_sparse", flush=True)


def _horovods_mixed_average(rank, size):
    """Horovod's test_horovod_grouped_allreduce_mixed_indexed_slices_average_cpu, for the integer types:
    every rank's two rows [x, x] at indices [rank, rank + 1] and x itself, averaged in one group; rows
    with one index summed (unsorted_segment_sum) and cast back equal the reference exactly."""
    for dtype in (tf.uint8, tf.int8, tf.int32, tf.int64):
        low, high = (0, 2) if dtype == tf.uint8 else (-1, 2) if dtype == tf.int8 else (-100, 100)
        x = tf.constant(np.random.default_rng(7).integers(low, high, [17, 3]), dtype)
        slices = tf.IndexedSlices(tf.stack([x] * 2), tf.constant([rank, rank + 1]))
        sparse, dense = hvd.grouped_allreduce([slices, x], op=hvd.Average)
        summed = tf.math.unsorted_segment_sum(sparse.values, sparse.indices, size + 1)
        reference = [x / size if i in (0, size) else x * 2 / size for i in range(size + 1)]
        assert np.array_equal(tf.cast(summed, dtype).numpy(), tf.cast(tf.stack(reference), dtype).numpy()), dtype
        assert np.array_equal(dense.numpy(), x.numpy()), dtype


def _int_slices(dtype, value, rank, size):
    return tf.IndexedSlices(tf.constant([[value]], dtype), tf.constant([rank]), dense_shape=tf.constant([size, 1]))


def case_signatures(rank, size):
    """Horovod's TF argument order and the tape's local sources."""
    assert hvd.broadcast_object({"r": rank}, size - 1, None, "obj.positional") == {"r": size - 1}
    assert hvd.allgather_object(rank, None, "gather.positional") == list(range(size))
    assert hvd.broadcast_object_fn(root_rank=0, name="obj.fn")(rank * 10) == 0
    import keras

    shared, local = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
    x = tf.constant([[float(rank + 1)]])
    shared.build((1, 1))
    local.build((1, 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared(x)) + tf.reduce_sum(local(x))
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=local, num_groups=1)
    g_shared, g_local = partial.gradient(loss, [shared.kernel, local.kernel])
    assert np.isclose(float(g_shared[0, 0]), (size + 1) / 2), g_shared  # averaged over ranks
    assert np.isclose(float(g_local[0, 0]), (rank + 1) / size), g_local  # local, scaled by 1/size as Horovod
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(local(x))
    unscaled = hvd.DistributedGradientTape(tape, scale_local_gradients=False)
    unscaled.register_local_source(local.kernel)
    assert np.isclose(float(unscaled.gradient(loss, [local.kernel])[0][0, 0]), rank + 1)
    expect_error(ValueError, "groups should be", lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=-1),
                 "groups")
    assert int(hvd.process_set_included_op(0)) == 1 and not (hvd.rocm_built() or hvd.ddl_built() or hvd.ccl_built())
    import hvdlite.tensorflow.keras as hvd_keras

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1), keras.layers.Dense(1)])
    for variable in model.weights:
        variable.assign(tf.fill(variable.shape, float(rank)))
    kept = model.layers[1].kernel
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[kept])
    callback.set_model(model)
    callback.on_train_begin()
    assert float(model.layers[0].kernel[0, 0]) == 0.0 and float(kept[0, 0]) == float(rank), model.weights
    print("ok signatures", flush=True)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for case in (case_graph_without_dependencies, case_uint16, case_error_types, case_broadcast_inplace,
                 case_mixed_dense_and_sparse, case_signatures, case_broadcast_grad, case_graph_divergence):
        case(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()

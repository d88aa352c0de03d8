"""In-process checks of the TensorFlow adapter's pure parts: dtypes, graph names, XLA refusal, options."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdlite.core.work.naming import diverged_generated_names
from hvdlite.errors import UnsupportedOperationError
from hvdlite.ops import ReduceOp
from hvdlite.tensorflow.collectives.tensors import as_tensor, core_dtype, graph_name, run_on_host
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.gradients.averaging import is_distributed
from hvdlite.tensorflow.gradients.tape import DistributedGradientTape, predivide_scales
from hvdlite.tensorflow.optimizer import DistributedOptimizer
from hvdlite.utils import dtypes


@pytest.mark.parametrize("dtype", [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                                   tf.float32, tf.float64, tf.bool])
def test_every_core_dtype_maps_and_shares_memory_eagerly(dtype):
    tensor = tf.cast(tf.reshape(tf.range(6), (2, 3)), dtype)
    assert core_dtype(tensor) in dtypes.SUPPORTED
    seen = {}

    def record(array):
        seen["array"] = array
        return [array.copy()]
    (result,) = run_on_host(record, [tensor], [dtype], "test")
    assert seen["array"].dtype == dtypes.SUPPORTED[core_dtype(tensor)]
    assert np.shares_memory(seen["array"], np.asarray(tensor)), "eager input should be a view, not a copy"
    assert result.dtype == dtype and np.array_equal(result.numpy(), tensor.numpy())


def test_unsupported_dtypes_and_sparse_inputs_are_refused_by_name():
    with pytest.raises(UnsupportedOperationError, match="complex64"):
        as_tensor(tf.ones(2, tf.complex64), "allreduce of 'x'")
    with pytest.raises(UnsupportedOperationError, match="IndexedSlices"):
        as_tensor(tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0])), "broadcast of 'x'")


def test_graph_names_are_fixed_at_trace_and_stable_across_retraces():
    assert graph_name(None) is None, "eagerly the core counts calls"
    assert graph_name("mine") == "mine"
    names = []

    @tf.function
    def trace(x):
        with tf.name_scope(f"tower_{len(names)}"):  # a scope differs between traces; names do not
            names.append((graph_name(None), graph_name(None, process_set_id=2), graph_name(None)))
        return x

    trace(tf.ones(1))
    trace(tf.ones(2))  # a new shape retraces
    assert names[0] == names[1] == ("tfgraph.noname.1", "tfgraph.noname.1", "tfgraph.noname.2"), names


def test_graph_names_are_generated_names_the_core_checks_for_divergence():
    """Ranks at different points of a graph's sequence of unnamed collectives fail instead of stalling."""
    with tf.Graph().as_default():
        sequence = [graph_name(None) for _ in range(3)]
    assert diverged_generated_names({sequence[0]: [0], sequence[2]: [1]}), "rank 1 ran two more than rank 0"
    assert not diverged_generated_names({sequence[1]: [0, 1]})


def test_local_argument_errors_are_also_tensorflows_invalid_argument_error():
    def refuse(array):
        raise UnsupportedOperationError("alltoall of tensor 'x': splits [1] must be 2 non-negative counts")

    with pytest.raises(tf.errors.InvalidArgumentError, match="splits") as caught:
        run_on_host(refuse, [tf.ones(1)], [tf.float32], "alltoall of 'x'")
    assert isinstance(caught.value, UnsupportedOperationError) and isinstance(caught.value, NotImplementedError)
    assert caught.value.args == ("alltoall of tensor 'x': splits [1] must be 2 non-negative counts",)


def test_xla_compiled_functions_are_refused_at_trace_time():
    @tf.function(jit_compile=True)
    def compiled(x):
        return run_on_host(lambda a: [a], [x], [x.dtype], "allreduce of 'grads'")[0]

    with pytest.raises(UnsupportedOperationError, match="allreduce of 'grads'.*jit_compile=False"):
        compiled(tf.ones(2))


def test_fp16_and_bf16_compression_round_trip_floats_only():
    x = tf.constant([1.5, -2.0], tf.float32)
    for compressor, wire in ((Compression.fp16, tf.float16), (Compression.bf16, tf.bfloat16)):
        sent, ctx = compressor.compress(x)
        assert sent.dtype == wire
        assert compressor.decompress(sent, ctx).dtype == tf.float32
    ints, ctx = Compression.fp16.compress(tf.constant([1, 2]))
    assert ints.dtype == tf.int32 and ctx is None


def test_predivide_needs_average():
    assert predivide_scales(ReduceOp.AVERAGE, 1.0) == (1.0, 1.0)
    assert predivide_scales(ReduceOp.AVERAGE, 4.0) == (0.25, 4.0)
    with pytest.raises(ValueError, match="op=Average"):
        predivide_scales(ReduceOp.SUM, 2.0)


def test_distributed_optimizer_is_the_users_object_and_saves_as_its_class():
    adam = keras.optimizers.Adam(0.01)
    config = adam.get_config()
    assert DistributedOptimizer(adam) is adam and is_distributed(adam)
    assert type(adam) is keras.optimizers.Adam and adam.get_config() == config
    assert "_clip_gradients" in vars(adam), "the averaging hook is on the instance, not the class"
    assert "_clip_gradients" not in vars(keras.optimizers.Adam)


def test_distributed_optimizer_rejects_bad_arguments():
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        DistributedOptimizer(object())
    with pytest.raises(ValueError, match="op=Average or op=Sum"):
        DistributedOptimizer(keras.optimizers.SGD(), op=ReduceOp.MAX)
    with pytest.raises(ValueError, match="conflicts"):
        DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=3), backward_passes_per_step=2)
    built = keras.optimizers.SGD()
    built.build([keras.Variable(np.zeros(2))])
    with pytest.raises(ValueError, match="not been built"):
        DistributedOptimizer(built, backward_passes_per_step=2)
    accumulating = DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=2)
    assert accumulating.gradient_accumulation_steps == 2


def test_gradient_tape_wrapper_keeps_the_tape_api():
    x = tf.Variable(2.0)
    with DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        y = x * x
    assert tape.watched_variables() == (x,), "attributes other than gradient() are the tape's own"
    assert float(tape._tape.gradient(y, x)) == 4.0, "the wrapped tape recorded inside the with block"
    with pytest.raises(TypeError, match="tf.GradientTape"):
        DistributedGradientTape(object())


def test_autograph_leaves_hvdlites_functions_as_written():
    # AutoGraph would otherwise rewrite hvdlite's code, down through the core, every time a user's
    # tf.function calling a collective is traced (seconds per trace, per rank).
    from tensorflow.python.autograph.impl.conversion import is_allowlisted

    import hvdlite.tensorflow as hvd
    import hvdlite.tensorflow.keras as hvd_keras

    public = [getattr(module, name) for module in (hvd, hvd_keras) for name in module.__all__]
    converted = [f for f in public if callable(f) and not isinstance(f, type) and not is_allowlisted(f)]
    assert not converted, converted
    assert is_allowlisted(graph_name) and is_allowlisted(run_on_host)


def test_gpu_available_answers_for_this_machine_and_says_why_not(capsys):
    import hvdlite.basics
    import hvdlite.tensorflow as hvd_tf
    import hvdlite.torch as hvd_torch

    assert hvd_tf.gpu_available is hvd_torch.gpu_available is hvdlite.basics.gpu_available
    sees = bool(tf.config.list_physical_devices("GPU")) and hvd_tf.cuda_built()
    assert hvd_tf.gpu_available("tensorflow", verbose=True) is sees
    assert hvd_tf.gpu_available("mxnet", verbose=True) is False
    printed = capsys.readouterr().out
    assert "GPU not available for mxnet: hvdlite has no 'mxnet' adapter" in printed, printed
    if not sees:
        assert "GPU not available for tensorflow: " in printed, printed

"""TensorFlow tensor <-> core NumPy buffer conversion, and running core calls eagerly or in a graph.

Eagerly, a CPU tensor's memory is handed to the core as a NumPy view (``np.asarray`` shares it).
Inside ``tf.function`` the core call becomes one stateful ``tf.numpy_function`` op: TensorFlow
passes its inputs as views, keeps such ops in program order (automatic control dependencies),
and never prunes them. XLA cannot compile a host callback, so a collective traced under
``jit_compile=True`` is refused with an error that says what to change.

Eagerly, a GPU tensor goes to the core as a :class:`~hvdlite.gpu.arrays.DeviceArray` through
DLPack when hvdlite's GPU plane is installed (``hvdlite[gpu]``), and results come back through
DLPack. TensorFlow does not expose the stream that produced a tensor, so the adapter waits for
the device first (``sync_devices``). Inside ``tf.function``, ``tf.numpy_function`` stages device
tensors through host memory.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import func_graph
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from ...errors import UnsupportedOperationError
from ...gpu import arrays as gpu_arrays
from ...utils import dtypes
from .errors import CONVERTED, as_tensorflow_error

_TF_TO_CORE: dict[tf.dtypes.DType, str] = {
    tf.uint8: "uint8", tf.int8: "int8", tf.uint16: "uint16", tf.int16: "int16", tf.int32: "int32", tf.int64: "int64",
    tf.float16: "float16", tf.bfloat16: "bfloat16", tf.float32: "float32", tf.float64: "float64", tf.bool: "bool",
}
_CORE_TO_TF = {name: dtype for dtype, name in _TF_TO_CORE.items()}


def core_dtype(tensor: Any) -> str:
    """The core's name for ``tensor``'s dtype (TensorFlow's own name if the core lacks it)."""
    return _TF_TO_CORE.get(tensor.dtype, tensor.dtype.name)


def cast(tensor: tf.Tensor, dtype_name: str) -> tf.Tensor:
    """``tensor`` converted to the core dtype ``dtype_name``."""
    return tf.cast(tensor, _CORE_TO_TF[dtype_name])


def as_tensor(value: Any, what: str) -> tf.Tensor:
    """``value`` (a tensor, variable, array or number) as a dense tensor of a dtype the core supports."""
    if isinstance(value, tf.IndexedSlices):
        raise UnsupportedOperationError(f"{what} takes a dense tensor, got tf.IndexedSlices")
    tensor = value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)
    if tensor.dtype not in _TF_TO_CORE:
        raise UnsupportedOperationError(
            f"{what} has dtype {tensor.dtype.name}, which hvdlite does not support; supported: "
            f"{', '.join(d.name for d in _TF_TO_CORE)}")
    return tensor


def in_graph() -> bool:
    """True while tracing a ``tf.function`` (or building a TF1 graph)."""
    return not tf.executing_eagerly()


GRAPH_KIND = "tfgraph"  # the kind of generated name an unnamed collective in a graph gets


def graph_name(name: str | None, process_set_id: int = 0) -> str | None:
    """The request name for a collective built now.

    Eagerly ``None`` lets the core count calls. In a graph the name is fixed when the op is built:
    ``tfgraph.noname.<n>`` for the n-th unnamed collective built in this graph on this process set,
    whatever its kind. Every rank that builds the same graph derives the same names (no name scope:
    those hold Keras layer names, which count the layers each rank happened to create), and a
    retraced function gets them again, so steps reuse the core's response cache. Ranks that run
    different sequences of them (a branch on the rank, or a fetch that needs fewer of them) get a
    ``TensorMismatchError``, not a stall: at the same n they disagree on the collective or tensor,
    at different n the core sees that they are at different points of the sequence.
    """
    if name is not None or not in_graph():
        return name
    graph = tf_ops.get_default_graph()
    counts = getattr(graph, "_hvdlite_collectives", None)
    if counts is None:
        counts = graph._hvdlite_collectives = collections.Counter()
    counts[process_set_id] += 1
    return f"{GRAPH_KIND}.noname.{counts[process_set_id]}"


def _refuse_xla(what: str) -> None:
    if control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()):
        raise UnsupportedOperationError(
            f"{what} cannot run inside an XLA-compiled function: hvdlite's collectives run on the host, "
            "which XLA cannot compile. Use tf.function(jit_compile=False), or model.compile(..., "
            "jit_compile=False) for Keras (Keras turns jit_compile='auto' into True when it sees a GPU)")


def _on_gpu_plane(tensor: tf.Tensor) -> bool:
    return ":GPU:" in tensor.device.upper() and gpu_arrays.device_count() > 0


def to_core(tensor: tf.Tensor) -> np.ndarray | gpu_arrays.DeviceArray:
    """An eager tensor for the core: a NumPy view on the host, its device memory on a GPU (DLPack)."""
    if not _on_gpu_plane(tensor):
        return np.asarray(tensor)
    import cupy

    name = core_dtype(tensor)
    # cupy has no bfloat16: hand over its bits (a new tensor; the in-place forms are not TensorFlow's).
    view = tf.bitcast(tensor, tf.uint16) if name == "bfloat16" else tensor
    tf.test.experimental.sync_devices()
    values = cupy.from_dlpack(tf.experimental.dlpack.to_dlpack(view))
    return gpu_arrays.DeviceArray(values.data.ptr, tuple(tensor.shape), dtypes.NUMPY_DTYPE[name], values.device.id,
                                  values)


def from_core(result: np.ndarray | gpu_arrays.DeviceArray, dtype: tf.dtypes.DType) -> tf.Tensor:
    """A core result as a tensor: on the GPU (DLPack, no copy) for a device result."""
    if not isinstance(result, gpu_arrays.DeviceArray):
        return tf.convert_to_tensor(result, dtype=dtype)
    tensor = tf.experimental.dlpack.from_dlpack(gpu_arrays.cupy_view(result).__dlpack__())
    if dtypes.is_bfloat16(result.dtype):
        tensor = tf.bitcast(tensor, tf.bfloat16)
    return tf.reshape(tensor, result.shape)


def _previous_collective(graph: tf.Graph) -> list[tf.Operation]:
    """The hvdlite op built last in ``graph``'s current control-flow context, for a TF1 graph.

    Each hvdlite op blocks one of TensorFlow's inter-op threads while it waits for its peers. In a
    TF1 graph, independent ops run in any order, so ranks could each block every thread on a
    different collective and wait for ever. Chaining every op to the one built before it makes
    every rank run them in the order the script built them, which is the same on every rank.
    ``tf.function`` graphs need nothing: their automatic control dependencies already order
    stateful ops. A chain does not cross control-flow contexts (a ``tf.while_loop`` body starts its own).
    """
    if isinstance(graph, func_graph.FuncGraph):
        return []
    previous = getattr(graph, "_hvdlite_last_collective", None)
    if previous is None or previous._get_control_flow_context() is not graph._get_control_flow_context():
        return []
    return [previous]


@contextlib.contextmanager
def separate_chain(graph: tf.Graph) -> Iterator[None]:
    """Collectives built inside form a chain of their own in a TF1 ``graph``: they depend on no
    collective built before, and none built later depends on them. For ops that a session runs on
    their own (a hook's broadcast at session start, built after the training step): chained to the
    step, running them would run the step; the step chained to them would broadcast every step."""
    before = getattr(graph, "_hvdlite_last_collective", None)
    graph._hvdlite_last_collective = None
    try:
        yield
    finally:
        graph._hvdlite_last_collective = before


def run_on_host(fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence[tf.Tensor],
                output_dtypes: Sequence[tf.dtypes.DType], what: str) -> list[tf.Tensor]:
    """Run ``fn`` on NumPy views of ``inputs`` and return its arrays as tensors.

    Eagerly ``fn`` runs now, in this thread, so the core's exceptions reach the caller (ranks that
    disagree: also as ``tf.errors.FailedPreconditionError``, a bad argument: also as
    ``tf.errors.InvalidArgumentError``, as Horovod's ops raise). In a graph it becomes one op that
    runs each time the graph does.
    """
    if not in_graph():
        try:
            results = fn(*(to_core(t) for t in inputs))
        except CONVERTED as exc:
            raise as_tensorflow_error(exc).with_traceback(exc.__traceback__) from None
        return [from_core(r, d) for r, d in zip(results, output_dtypes, strict=True)]
    _refuse_xla(what)
    graph = tf_ops.get_default_graph()
    with tf.control_dependencies(_previous_collective(graph)):
        results = tf.numpy_function(lambda *arrays: list(fn(*arrays)), list(inputs), list(output_dtypes),
                                    stateful=True)
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    if not isinstance(graph, func_graph.FuncGraph):
        graph._hvdlite_last_collective = results[0].op
    return results

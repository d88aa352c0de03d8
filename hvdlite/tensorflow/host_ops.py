"""The core's collectives as TensorFlow ops, without gradients: each builds one host call.

Every function takes and returns ``tf.Tensor``s, works eagerly and inside ``tf.function``, and
sets the static shape of its results wherever it is known. :mod:`.collectives` adds gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from .. import api, basics
from ..ops import ReduceOp
from ..training.broadcast import broadcast_arrays
from ..utils.rows import scatter_rows
from .tensors import graph_name, in_graph, run_on_host


def _wait(handles: Sequence[api.Handle]) -> list[np.ndarray]:
    return [api.synchronize(h) for h in handles]


def _label(kind: str, name: str | None) -> str:
    return f"{kind} of {name!r}" if name else kind


def allreduce(tensors: Sequence[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
              single: bool = False) -> list[tf.Tensor]:
    """Reduce ``tensors`` as one group (``single``: one tensor named exactly ``name``)."""
    base = graph_name(name, "allreduce")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:
            return _wait([api.allreduce_async(arrays[0], None, base, op, prescale, postscale)])
        return _wait(api.grouped_allreduce_async(arrays, None, base, op, prescale, postscale))

    results = run_on_host(run, tensors, [t.dtype for t in tensors], _label("allreduce", base))
    for result, tensor in zip(results, tensors, strict=True):
        result.set_shape(tensor.shape)
    return results


def allgather(tensors: Sequence[tf.Tensor], name: str | None, single: bool = False) -> list[tf.Tensor]:
    """Concatenate every rank's tensors along dimension 0 (its length is known only at run time)."""
    base = graph_name(name, "allgather")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:
            return _wait([api.allgather_async(arrays[0], base)])
        return _wait(api.grouped_allgather_async(arrays, base))

    results = run_on_host(run, tensors, [t.dtype for t in tensors], _label("allgather", base))
    for result, tensor in zip(results, tensors, strict=True):
        if tensor.shape.rank is not None:
            result.set_shape([None] + tensor.shape.as_list()[1:])
    return results


def broadcast(tensors: Sequence[tf.Tensor], root_rank: int, name: str | None, single: bool = False) -> list[tf.Tensor]:
    """``root_rank``'s ``tensors`` on every rank, as one group (``single``: one tensor named exactly ``name``)."""
    base = graph_name(name, "broadcast")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return broadcast_arrays(arrays, root_rank, base, single)

    results = run_on_host(run, tensors, [t.dtype for t in tensors], _label("broadcast", base))
    for result, tensor in zip(results, tensors, strict=True):
        result.set_shape(tensor.shape)
    return results


def alltoall(tensor: tf.Tensor, splits: tf.Tensor | None, name: str | None) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[r]`` rows to rank r; returns (received rows, rows received from each rank as int32)."""
    base = graph_name(name, "alltoall")

    def run(array: np.ndarray, *split_array: np.ndarray) -> list[np.ndarray]:
        data, received = api.synchronize(api.alltoall_async(array, split_array[0] if split_array else None, base))
        return [data, received.astype(np.int32)]

    if splits is not None and not in_graph():
        with tf.device("/CPU:0"):  # the counts are read on the host, wherever the data lives
            splits = tf.identity(splits)
    inputs = [tensor] if splits is None else [tensor, splits]
    data, received = run_on_host(run, inputs, [tensor.dtype, tf.int32], _label("alltoall", base))
    if tensor.shape.rank is not None:
        data.set_shape([None] + tensor.shape.as_list()[1:])
    received.set_shape([basics.size()])
    return data, received


def reducescatter(tensors: Sequence[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
                  single: bool = False) -> list[tf.Tensor]:
    """Reduce each tensor and keep this rank's block of rows (the first ``rows % size`` ranks get one more)."""
    base = graph_name(name, "reducescatter")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        if single:
            return _wait([api.reducescatter_async(arrays[0], op, base, prescale, postscale)])
        return _wait(api.grouped_reducescatter_async(arrays, op, base, prescale, postscale))

    results = run_on_host(run, tensors, [t.dtype for t in tensors], _label("reducescatter", base))
    size, rank = basics.size(), basics.rank()
    for result, tensor in zip(results, tensors, strict=True):
        if tensor.shape.rank:
            rows = tensor.shape[0]
            mine = None if rows is None else scatter_rows(rows, size)[rank]
            result.set_shape([mine] + tensor.shape.as_list()[1:])
    return results


def join() -> tf.Tensor:
    """Declare this rank out of data; the result is the rank that joined last (an int32 scalar)."""
    (result,) = run_on_host(lambda: [np.array(api.join(), dtype=np.int32)], [], [tf.int32], "join")
    result.set_shape([])
    return result


def barrier() -> tf.Tensor:
    """Wait for every rank; returns an int32 zero so that a graph can depend on it."""
    (result,) = run_on_host(lambda: [np.array(api.barrier() or 0, dtype=np.int32)], [], [tf.int32], "barrier")
    result.set_shape([])
    return result

"""Horovod's ``horovod.tensorflow`` collectives, differentiable, eagerly and inside ``tf.function``.

Each collective is a ``tf.custom_gradient`` whose gradient is the rule in
:mod:`hvdlite.training.gradients`, with :data:`_OPS` as the TensorFlow operations the rules need.
``tf.IndexedSlices`` are allreduced as Horovod does: their values and indices are allgathered
(:mod:`hvdlite.training.sparse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ...compression import Compressor, NoneCompressor
from ...ops import ReduceOp, resolve_op
from ...process_sets import ProcessSet, global_process_set
from ...training import gradients as rules
from ...training.options import require_sum_or_average
from ...training.sparse import allreduce_sparse
from . import host_ops
from .tensors import as_tensor


def _scale(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """``tensor * factor`` in ``tensor``'s dtype; integers are scaled in float64 and truncated back,
    as the core scales them (casting the factor to an integer type would make 0.5 a 0)."""
    if tensor.dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)
    return tensor * tf.cast(factor, tensor.dtype)


def _alltoall_rows(tensor: tf.Tensor, splits: tf.Tensor, process_set: ProcessSet | None = None) -> tf.Tensor:
    return host_ops.alltoall(tensor, tf.cast(splits, tf.int64), None, process_set)[0]


_OPS = rules.GradientOps(
    allreduce=lambda tensors, op, prescale, postscale, process_set=None: host_ops.allreduce(
        tensors, None, op, prescale, postscale, process_set=process_set),
    allgather=lambda tensors, process_set=None: host_ops.allgather(tensors, None, process_set=process_set),
    alltoall=_alltoall_rows, zeros_like=tf.zeros_like, scale=_scale, total=tf.reduce_sum,
    rows=lambda tensor, start, stop: tensor[start:stop],
)


def _zeros_if_none(grads: Sequence[tf.Tensor | None], like: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    return [tf.zeros_like(t) if g is None else g for g, t in zip(grads, like, strict=True)]


def _reduce(tensors: list[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
            single: bool, process_set: ProcessSet) -> list[tf.Tensor]:
    @tf.custom_gradient
    def reduce(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return rules.allreduce_grads(rules.on_set(_OPS, process_set), _zeros_if_none(dys, xs), op, prescale,
                                         postscale)
        return host_ops.allreduce(list(xs), name, op, prescale, postscale, single, process_set), grad
    return list(reduce(*tensors))


def _gather(tensors: list[tf.Tensor], name: str | None, single: bool, process_set: ProcessSet) -> list[tf.Tensor]:
    @tf.custom_gradient
    def gather(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            ops = rules.on_set(_OPS, process_set)
            return [rules.allgather_grad(ops, dy, tf.shape(x, out_type=tf.int64)[:1])
                    for dy, x in zip(_zeros_if_none(dys, outputs), xs, strict=True)]
        outputs = host_ops.allgather(list(xs), name, single, process_set)
        return outputs, grad
    return list(gather(*tensors))


def _allreduce_sparse(slices: tf.IndexedSlices, name: str | None, op: ReduceOp, prescale: float,
                      postscale: float, process_set: ProcessSet, what: str | None = None) -> tf.IndexedSlices:
    """Every rank's rows of ``slices``, concatenated (rows with equal indices are not summed).

    Average divides the gathered values by the set's size as Horovod does, with TensorFlow's true
    division: integer values come back as floats (int8, uint8 as float32; int32, int64 as float64),
    so rows that sum later (``unsorted_segment_sum``) lose nothing to per-row truncation.
    """
    def gather(values: tf.Tensor, indices: tf.Tensor, name: str | None) -> Any:
        gathered = _gather([values, indices], name, False, process_set)
        return lambda: tuple(gathered)

    average = op is ReduceOp.AVERAGE  # (other ops are checked by allreduce_sparse)
    values, indices = allreduce_sparse(slices.values, slices.indices, name, ReduceOp.SUM if average else op, prescale,
                                       postscale, gather, _scale, what, process_set.size())()
    if average:
        values = tf.math.truediv(values, tf.cast(process_set.size(), values.dtype))
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` across ranks (default Average) and return the result. Differentiable.

    ``tf.IndexedSlices`` come back as IndexedSlices holding every rank's rows. ``device_dense``,
    ``device_sparse`` and ``ignore_name_scope`` are accepted for Horovod compatibility.
    """
    resolved = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, name, resolved, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(as_tensor(tensor, f"allreduce of {name or 'a tensor'!r}"))
    (reduced,) = _reduce([compressed], name, resolved, prescale_factor, postscale_factor, True, process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: type[Compressor] = NoneCompressor,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Reduce several tensors as one group (negotiated together, fused) and return them in order.

    Dense tensors go in one group; ``tf.IndexedSlices`` are allgathered. Differentiable.
    """
    resolved = resolve_op(op, average)
    results: list[Any] = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, tensor in enumerate(tensors):
        if isinstance(tensor, tf.IndexedSlices):
            results[i] = _allreduce_sparse(tensor, None if name is None else f"{name}.sparse.{i}", resolved,
                                           prescale_factor, postscale_factor, process_set,
                                           f"sparse tensor {i} of grouped_allreduce")
    if dense:
        pairs = [compression.compress(as_tensor(tensors[i], f"tensor {i} of grouped_allreduce")) for i in dense]
        reduced = _reduce([t for t, _ in pairs], name, resolved, prescale_factor, postscale_factor, False, process_set)
        for i, result, (_, ctx) in zip(dense, reduced, pairs, strict=True):
            results[i] = compression.decompress(result, ctx)
    return results


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (lengths may differ). Differentiable."""
    return _gather([as_tensor(tensor, f"allgather of {name or 'a tensor'!r}")], name, True, process_set)[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Allgather several tensors as one group. Differentiable."""
    return _gather([as_tensor(t, f"tensor {i} of grouped_allgather") for i, t in enumerate(tensors)],
                   name, False, process_set)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank. Differentiable."""
    tensor = as_tensor(tensor, f"broadcast of {name or 'a tensor'!r}")

    @tf.custom_gradient
    def bcast(x: tf.Tensor):
        def grad(dy: tf.Tensor) -> tf.Tensor:
            return rules.broadcast_grad(rules.on_set(_OPS, process_set), dy, root_rank)
        return host_ops.broadcast([x], root_rank, name, True, process_set)[0], grad
    return bcast(tensor)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[r]`` rows of ``tensor`` to rank r (equal parts without ``splits``).

    Returns the received tensor, and with ``splits`` also the rows received from each rank, as
    Horovod does. Differentiable with respect to ``tensor``.
    """
    tensor = as_tensor(tensor, f"alltoall of {name or 'a tensor'!r}")
    split_tensor = None if splits is None else tf.reshape(tf.cast(splits, tf.int64), [-1])

    @tf.custom_gradient
    def exchange(x: tf.Tensor):
        def grad(dy: tf.Tensor, _received: Any) -> tf.Tensor:
            return rules.alltoall_grad(rules.on_set(_OPS, process_set), tf.zeros_like(output) if dy is None else dy,
                                       received)
        output, received = host_ops.alltoall(x, split_tensor, name, process_set)
        return (output, tf.stop_gradient(received)), grad
    output, received = exchange(tensor)
    return output if splits is None else (output, received)


def _reducescatter(tensors: list[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
                   single: bool, process_set: ProcessSet) -> list[tf.Tensor]:
    require_sum_or_average(op, f"reducescatter of {name or 'a tensor'!r}")  # at trace time, not when run

    @tf.custom_gradient
    def scatter(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return rules.reducescatter_grads(rules.on_set(_OPS, process_set), _zeros_if_none(dys, outputs), op,
                                             prescale, postscale)
        outputs = host_ops.reducescatter(list(xs), name, op, prescale, postscale, single, process_set)
        return outputs, grad
    return list(scatter(*tensors))


def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = NoneCompressor,
                  op: ReduceOp | None = None, name: str | None = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` (Average by default, or Sum) and return this rank's block of rows. Differentiable."""
    compressed, ctx = compression.compress(as_tensor(tensor, f"reducescatter of {name or 'a tensor'!r}"))
    (result,) = _reducescatter([compressed], name, resolve_op(op), prescale_factor, postscale_factor, True,
                               process_set)
    return compression.decompress(result, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None) -> list[tf.Tensor]:
    """Reducescatter several tensors as one group. Differentiable."""
    pairs = [compression.compress(as_tensor(t, f"tensor {i} of grouped_reducescatter")) for i, t in enumerate(tensors)]
    results = _reducescatter([t for t, _ in pairs], name, resolve_op(op), prescale_factor, postscale_factor,
                             False, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, pairs, strict=True)]


def join(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Declare this rank out of data; returns the rank that joined last (an int32 scalar tensor).

    Horovod's ``join`` takes no process set; hvdlite's optionally joins within one.
    """
    return host_ops.join(process_set)


def barrier(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return once every rank (of ``process_set``) has called ``barrier()``."""
    return host_ops.barrier(process_set)

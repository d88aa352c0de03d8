"""Horovod's ``horovod.tensorflow`` collectives, differentiable, eagerly and inside ``tf.function``.

Gradients, the same as hvdlite.torch's: allreduce's is an allreduce of the gradient with the same
op and scale factors; allgather's is this rank's rows of the summed gradient; broadcast's is the
averaged gradient on the root and zero elsewhere; alltoall's sends the gradient back along the
received splits; reducescatter's gathers the gradient blocks (divided by the size for Average).
``tf.IndexedSlices`` are allreduced as Horovod does: their values and indices are allgathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from .. import basics
from ..compression import Compressor, NoneCompressor
from ..errors import UnsupportedOperationError
from ..ops import ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set, require_global
from . import host_ops
from .tensors import as_tensor


def _zeros_if_none(grads: Sequence[tf.Tensor | None], like: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    return [tf.zeros_like(t) if g is None else g for g, t in zip(grads, like, strict=True)]


def _reduce(tensors: list[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
            single: bool) -> list[tf.Tensor]:
    @tf.custom_gradient
    def reduce(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return host_ops.allreduce(_zeros_if_none(dys, xs), None, op, prescale, postscale)
        return host_ops.allreduce(list(xs), name, op, prescale, postscale, single), grad
    return list(reduce(*tensors))


def _my_rows(grad: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """This rank's rows of an allgather's gradient, summed over ranks."""
    (summed,) = host_ops.allreduce([grad], None, ReduceOp.SUM, 1.0, 1.0)
    (every,) = host_ops.allgather([tf.reshape(rows, [1])], None)
    offset = tf.reduce_sum(every[: basics.rank()])
    return summed[offset: offset + rows]


def _gather(tensors: list[tf.Tensor], name: str | None, single: bool) -> list[tf.Tensor]:
    @tf.custom_gradient
    def gather(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return [_my_rows(dy, tf.shape(x, out_type=tf.int64)[0])
                    for dy, x in zip(_zeros_if_none(dys, outputs), xs, strict=True)]
        outputs = host_ops.allgather(list(xs), name, single)
        return outputs, grad
    return list(gather(*tensors))


def _check_sparse_op(op: ReduceOp, what: str) -> None:
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise UnsupportedOperationError(
            f"{what}: tf.IndexedSlices are allgathered and support Sum and Average, not {op.name}; "
            "pass sparse_as_dense=True to reduce them as dense tensors")


def _allreduce_sparse(slices: tf.IndexedSlices, name: str | None, op: ReduceOp, prescale: float,
                      postscale: float) -> tf.IndexedSlices:
    """Every rank's rows of ``slices``, concatenated (rows with equal indices are not summed)."""
    _check_sparse_op(op, f"allreduce of {name or 'IndexedSlices'!r}")
    values, indices = _gather([slices.values, slices.indices], name, single=False)
    scale = prescale * postscale / (basics.size() if op is ReduceOp.AVERAGE else 1)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` across ranks (default Average) and return the result. Differentiable.

    ``tf.IndexedSlices`` come back as IndexedSlices holding every rank's rows. ``device_dense``,
    ``device_sparse`` and ``ignore_name_scope`` are accepted for Horovod compatibility.
    """
    require_global(process_set, "allreduce")
    resolved = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, name, resolved, prescale_factor, postscale_factor)
    compressed, ctx = compression.compress(as_tensor(tensor, f"allreduce of {name or 'a tensor'!r}"))
    (reduced,) = _reduce([compressed], name, resolved, prescale_factor, postscale_factor, single=True)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: type[Compressor] = NoneCompressor,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Reduce several tensors as one group (negotiated together, fused) and return them in order.

    Dense tensors go in one group; ``tf.IndexedSlices`` are allgathered. Differentiable.
    """
    require_global(process_set, "grouped_allreduce")
    resolved = resolve_op(op, average)
    results: list[Any] = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, tensor in enumerate(tensors):
        if isinstance(tensor, tf.IndexedSlices):
            results[i] = _allreduce_sparse(tensor, None if name is None else f"{name}.sparse.{i}", resolved,
                                           prescale_factor, postscale_factor)
    if dense:
        pairs = [compression.compress(as_tensor(tensors[i], f"tensor {i} of grouped_allreduce")) for i in dense]
        reduced = _reduce([t for t, _ in pairs], name, resolved, prescale_factor, postscale_factor, single=False)
        for i, result, (_, ctx) in zip(dense, reduced, pairs, strict=True):
            results[i] = compression.decompress(result, ctx)
    return results


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (lengths may differ). Differentiable."""
    require_global(process_set, "allgather")
    return _gather([as_tensor(tensor, f"allgather of {name or 'a tensor'!r}")], name, single=True)[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Allgather several tensors as one group. Differentiable."""
    require_global(process_set, "grouped_allgather")
    return _gather([as_tensor(t, f"tensor {i} of grouped_allgather") for i, t in enumerate(tensors)],
                   name, single=False)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank. Differentiable."""
    require_global(process_set, "broadcast")
    tensor = as_tensor(tensor, f"broadcast of {name or 'a tensor'!r}")

    @tf.custom_gradient
    def bcast(x: tf.Tensor):
        def grad(dy: tf.Tensor) -> tf.Tensor:
            (averaged,) = host_ops.allreduce([dy], None, ReduceOp.AVERAGE, 1.0, 1.0)
            return averaged if basics.rank() == root_rank else tf.zeros_like(averaged)
        return host_ops.broadcast([x], root_rank, name, single=True)[0], grad
    return bcast(tensor)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[r]`` rows of ``tensor`` to rank r (equal parts without ``splits``).

    Returns the received tensor, and with ``splits`` also the rows received from each rank, as
    Horovod does. Differentiable with respect to ``tensor``.
    """
    require_global(process_set, "alltoall")
    tensor = as_tensor(tensor, f"alltoall of {name or 'a tensor'!r}")
    split_tensor = None if splits is None else tf.reshape(tf.cast(splits, tf.int64), [-1])

    @tf.custom_gradient
    def exchange(x: tf.Tensor):
        def grad(dy: tf.Tensor, _received: Any) -> tf.Tensor:
            dy = tf.zeros_like(output) if dy is None else dy
            return host_ops.alltoall(dy, tf.cast(received, tf.int64), None)[0]
        output, received = host_ops.alltoall(x, split_tensor, name)
        return (output, tf.stop_gradient(received)), grad
    output, received = exchange(tensor)
    return output if splits is None else (output, received)


def _reducescatter(tensors: list[tf.Tensor], name: str | None, op: ReduceOp, prescale: float, postscale: float,
                   single: bool) -> list[tf.Tensor]:
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise UnsupportedOperationError(f"reducescatter of {name or 'a tensor'!r} supports Sum and Average, "
                                        f"not {op.name}")
    scale = prescale * postscale / (basics.size() if op is ReduceOp.AVERAGE else 1)

    @tf.custom_gradient
    def scatter(*xs: tf.Tensor):
        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            gathered = host_ops.allgather(_zeros_if_none(dys, outputs), None)
            return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gathered]
        outputs = host_ops.reducescatter(list(xs), name, op, prescale, postscale, single)
        return outputs, grad
    return list(scatter(*tensors))


def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = NoneCompressor,
                  op: ReduceOp | None = None, name: str | None = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` (Average by default, or Sum) and return this rank's block of rows. Differentiable."""
    require_global(process_set, "reducescatter")
    compressed, ctx = compression.compress(as_tensor(tensor, f"reducescatter of {name or 'a tensor'!r}"))
    (result,) = _reducescatter([compressed], name, resolve_op(op), prescale_factor, postscale_factor, single=True)
    return compression.decompress(result, ctx)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = NoneCompressor, op: ReduceOp | None = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None) -> list[tf.Tensor]:
    """Reducescatter several tensors as one group. Differentiable."""
    require_global(process_set, "grouped_reducescatter")
    pairs = [compression.compress(as_tensor(t, f"tensor {i} of grouped_reducescatter")) for i, t in enumerate(tensors)]
    results = _reducescatter([t for t, _ in pairs], name, resolve_op(op), prescale_factor, postscale_factor,
                             single=False)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, pairs, strict=True)]


def join() -> tf.Tensor:
    """Declare this rank out of data; returns the rank that joined last (an int32 scalar tensor)."""
    return host_ops.join()


def barrier(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Return once every rank has called ``barrier()``."""
    require_global(process_set, "barrier")
    return host_ops.barrier()

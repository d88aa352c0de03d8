"""Averaging a list of gradients across ranks in one collective call, and DistributedGradientTape.

One grouped call for the whole list lets the core negotiate and fuse the gradients together;
one call per gradient would negotiate each alone. Shared by the tape and the Keras optimizer.
``predivide_scales`` is the core's (:mod:`hvdlite.training.options`), re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from ..compression import Compressor, NoneCompressor
from ..ops import Average, ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set
from ..training.options import predivide_scales
from .collectives import grouped_allreduce


def reduce_gradients(grads: Sequence[Any], op: ReduceOp = Average, compression: type[Compressor] = NoneCompressor,
                     sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                     name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """``grads`` reduced across ranks in one grouped call; ``None`` entries stay ``None``.

    ``tf.IndexedSlices`` are made dense first with ``sparse_as_dense``, else allgathered. On a rank
    outside ``process_set`` the gradients stay local, as with Horovod's torch optimizer.
    """
    prescale, postscale = predivide_scales(op, gradient_predivide_factor)
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present or process_set.included() is False:  # None: unregistered, refused by the collective
        return list(grads)
    chosen = [grads[i] for i in present]
    if sparse_as_dense:
        chosen = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in chosen]
    reduced = grouped_allreduce(chosen, compression=compression, op=op, prescale_factor=prescale,
                                postscale_factor=postscale, name=name, process_set=process_set)
    results = list(grads)
    for i, value in zip(present, reduced, strict=True):
        results[i] = value
    return results


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient()`` averages the gradients across ranks.

    Wraps the user's tape; everything but ``gradient`` is the tape's own. Use it after the
    ``with tf.GradientTape() as tape:`` block, or as the context manager itself.
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: type[Compressor] = NoneCompressor, sparse_as_dense: bool = False,
                 op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                 process_set: ProcessSet = global_process_set) -> None:
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        self._tape = gradtape
        self._op = resolve_op(op)
        predivide_scales(self._op, gradient_predivide_factor)  # reject a bad combination now, not at gradient()
        self._options = dict(compression=compression, sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE) -> Any:
        """The tape's gradients of ``target`` for ``sources``, reduced across ranks (same structure)."""
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads)
        reduced = reduce_gradients(flat, self._op, **self._options)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._tape, attribute)


__all__ = ["DistributedGradientTape", "predivide_scales", "reduce_gradients"]

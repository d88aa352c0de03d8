"""Averaging a list of gradients across ranks in one collective call, and DistributedGradientTape.

One grouped call for the whole list lets the core negotiate and fuse the gradients together;
one call per gradient would negotiate each alone. Shared by the tape and the Keras optimizer.
``predivide_scales`` is the core's (:mod:`hvdlite.training.options`), re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from ...compression import Compressor, NoneCompressor
from ...ops import Average, ReduceOp, resolve_op
from ...process_sets import ProcessSet, global_process_set
from ...training.options import predivide_scales
from ..collectives.differentiable import grouped_allreduce


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


def check_groups(num_groups: int, groups: Any) -> None:
    """Horovod's checks of ``num_groups``/``groups``. hvdlite reduces the whole gradient list as one
    group, which the core negotiates together and fuses, so grouping changes no result."""
    chosen = groups if groups is not None else (num_groups or None)
    if chosen is not None and not (isinstance(chosen, list) or chosen > 0):
        raise ValueError(f"groups should be a non-negative integer or a list of list of tf.Variable, got {chosen!r}")


def source_key(source: Any) -> Any:
    """A hashable identity for a variable (tf.Variable's ref(); a Keras 3 variable by its object)."""
    return source.ref() if hasattr(source, "ref") else id(source)


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient()`` averages the gradients across ranks.

    Wraps the user's tape; everything but ``gradient`` is the tape's own. Use it after the
    ``with tf.GradientTape() as tape:`` block, or as the context manager itself. Sources registered
    with :meth:`register_local_source` keep their local gradient (divided by the number of ranks
    with ``scale_local_gradients``, as in Horovod).
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: type[Compressor] = NoneCompressor, sparse_as_dense: bool = False,
                 op: ReduceOp = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        check_groups(num_groups, groups)
        self._tape = gradtape
        self._op = resolve_op(op)
        predivide_scales(self._op, gradient_predivide_factor)  # reject a bad combination now, not at gradient()
        self._options = dict(compression=compression, sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources: set[Any] = set()

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient local: no collective for it (Horovod's API)."""
        self._local_sources.add(source_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE) -> Any:
        """The tape's gradients of ``target`` for ``sources``, reduced across ranks (same structure)."""
        grads = self._tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat, flat_sources = tf.nest.flatten(grads), tf.nest.flatten(sources)
        local = [source_key(s) in self._local_sources for s in flat_sources]
        results = reduce_except_local(flat, local, lambda shared: reduce_gradients(shared, self._op, **self._options),
                                      self.process_set.size() or 1, self.scale_local_gradients)
        return tf.nest.pack_sequence_as(grads, results)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._tape, attribute)


def reduce_except_local(grads: Sequence[Any], local: Sequence[bool], reduce: Callable[[list[Any]], list[Any]],
                        size: int, scale_local: bool) -> list[Any]:
    """``grads`` with the shared ones reduced by ``reduce`` and the ``local`` ones kept, divided by
    ``size`` with ``scale_local`` (Horovod's ``scale_local_gradients``)."""
    shared = [i for i, is_local in enumerate(local) if not is_local]
    results = list(grads)
    for i, value in zip(shared, reduce([grads[i] for i in shared]), strict=True):
        results[i] = value
    if scale_local and any(local):
        results = [_divided(g, size) if is_local and g is not None else g for g, is_local in zip(results, local,
                                                                                                   strict=True)]
    return results


def scaled_gradients(grads: Sequence[Any], factor: float) -> list[Any]:
    """Every gradient times ``factor`` (``None`` stays ``None``; a sparse one stays sparse)."""
    if factor == 1.0:
        return list(grads)
    return [_scaled(grad, factor) for grad in grads]


def _scaled(grad: Any, factor: float) -> Any:
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):  # an embedding's gradient stays sparse
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _divided(grad: Any, size: int) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",  # noqa: N802 - Horovod's name
                                   device_sparse: str = "", compression: type[Compressor] = NoneCompressor,
                                   sparse_as_dense: bool = False, op: ReduceOp = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                                   process_set: ProcessSet = global_process_set, local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> DistributedGradientTape:
    """A DistributedGradientTape that keeps the gradients of ``local_layers``' trainable weights local."""
    variables = local_layer_variables(local_layers)  # checked before the tape is made
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in variables:
        tape.register_local_source(variable)
    return tape


def local_layer_variables(local_layers: Any) -> list[Any]:
    """The trainable weights of Horovod's ``local_layers`` argument (None, a Keras layer, or a list of them)."""
    import keras

    layers = [] if local_layers is None else [local_layers] if isinstance(local_layers, keras.layers.Layer) \
        else list(local_layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return [variable for layer in layers for variable in layer.trainable_weights]


__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "local_layer_variables", "predivide_scales",
           "reduce_except_local", "reduce_gradients", "source_key"]

"""``DistributedOptimizer(op=Adasum)`` for Keras 3: each rank steps on its own gradients, and the
variables' *changes* are combined with Adasum, as Horovod's ``_DistributedAdasumOptimizer`` does.

Keras's ``BaseOptimizer._backend_apply_gradients`` makes every real update (once per
``gradient_accumulation_steps`` micro-steps) as ``_clip_gradients``, ``_apply_weight_decay``,
``_backend_update_step``. Two instance attributes shadow the last two:

- ``_apply_weight_decay(variables)`` first reads the variables it is given (the ones this update
  changes, after Keras dropped those without a gradient): the change then includes weight decay;
- ``_backend_update_step`` runs the optimizer's own update (its slot variables, e.g. Adam's
  moments, stay this rank's own, as in Horovod), then combines each variable's change across the
  process set with ``op=Adasum`` (one request per variable: the core never fuses Adasum requests,
  each change is weighed by its own dot products) and sets the variable to where it started plus
  the combined change.

Gradients are not reduced (the clip hook of :mod:`.optimizer` passes them through). Eagerly and
inside ``tf.function`` alike: TensorFlow orders the reads and assignments of one resource
variable in program order, so the starting values are read before weight decay changes them.
A rank outside the process set updates alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from ...compression import Compressor, NoneCompressor
from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ...training.options import refuse_with_adasum
from ..collectives import host_ops
from .tape import scaled_gradients


class AdasumDeltas:
    """The Adasum combination of one Keras optimizer's variable changes (see the module's doc)."""

    op = ReduceOp.ADASUM

    def __init__(self, process_set: ProcessSet, postscale: float) -> None:
        self.process_set = process_set
        self.postscale = postscale  # as for Average: accumulated micro-steps are summed, as in Horovod
        self._start: list[tf.Tensor] | None = None  # the variables' values before this update

    def reduce(self, grads: list[Any]) -> list[Any]:
        """This rank's own gradients, not reduced (the clip hook calls this); only ``postscale``d."""
        return scaled_gradients(grads, self.postscale)

    def remember(self, variables: list[Any]) -> None:
        """Read ``variables`` now, before this update's weight decay and step change them."""
        # tf.identity: a value of its own, not an alias of the variable's buffer.
        self._start = [tf.identity(tf.convert_to_tensor(v)) for v in variables]

    def combine(self, variables: list[Any]) -> None:
        """Set each variable to its start plus the Adasum of every rank's change since :meth:`remember`."""
        start, self._start = self._start, None
        if start is None:
            raise RuntimeError("DistributedOptimizer(op=Adasum): the optimizer stepped without _apply_weight_decay "
                               "being called first, so the variables' starting values are unknown")
        if not variables or self.process_set.included() is False:  # outside the set: the rank's own step stands
            return
        changes = [tf.convert_to_tensor(v) - before for v, before in zip(variables, start, strict=True)]
        # One grouped call, one request per variable: the core combines each change on its own.
        combined = host_ops.allreduce(changes, None, ReduceOp.ADASUM, 1.0, 1.0, process_set=self.process_set)
        for variable, before, change in zip(variables, start, combined, strict=True):
            variable.assign(before + tf.cast(change, before.dtype))


def install(optimizer: keras.optimizers.Optimizer, process_set: ProcessSet, postscale: float) -> AdasumDeltas:
    """Hook ``optimizer`` (a plain Keras optimizer, not a LossScaleOptimizer) so that its updates are
    combined with Adasum across ``process_set``; returns the hooks' state, for the clip hook."""
    deltas = AdasumDeltas(process_set, postscale)
    optimizer._apply_weight_decay = _remember_then(deltas, optimizer._apply_weight_decay)
    optimizer._backend_update_step = _combine_after(deltas, optimizer._backend_update_step)
    return deltas


def _remember_then(deltas: AdasumDeltas, apply_weight_decay: Callable[[Any], None]) -> Callable[[Any], None]:
    """``_apply_weight_decay`` that reads the starting values first (the change includes the decay)."""
    def remember_then_decay(variables: Any) -> None:
        deltas.remember(list(variables))
        apply_weight_decay(variables)
    return remember_then_decay


def _combine_after(deltas: AdasumDeltas, update_step: Callable[..., None]) -> Callable[..., None]:
    """``_backend_update_step`` that combines the changes across the ranks after the rank's own step."""
    def update_then_combine(grads: Any, trainable_variables: Any, learning_rate: Any) -> None:
        variables = list(trainable_variables)
        update_step(grads, variables, learning_rate)
        deltas.combine(variables)
    return update_then_combine


def refuse_unsupported(compression: type[Compressor], sparse_as_dense: bool, gradient_predivide_factor: float,
                       local_sgd_period: int | None) -> None:
    """A ValueError naming the given options that do not combine with Adasum (changes, not gradients,
    are reduced: there is no gradient to compress, densify, predivide or keep local)."""
    refuse_with_adasum({"compression": compression is not NoneCompressor, "sparse_as_dense": bool(sparse_as_dense),
                        f"gradient_predivide_factor={gradient_predivide_factor}": gradient_predivide_factor != 1.0,
                        "local_sgd_period": local_sgd_period is not None})


__all__ = ["AdasumDeltas", "install", "refuse_unsupported"]

"""Local SGD for the Keras 3 ``DistributedOptimizer``: K local updates, then an average.

The schedule is torch's and JAX's (:mod:`hvdlite.training.local_sgd`), counted from the
optimizer's own ``iterations`` variable (divided by ``gradient_accumulation_steps``), so it is
saved with the optimizer and works inside ``model.fit``'s ``tf.function`` as well as eagerly:

- gradients are averaged (through :mod:`hvdlite.tensorflow.optimizer`'s usual path) only
  on warm-up updates: a ``tf.cond`` around the reduction, so the collective runs in the taken
  branch only;
- after every ``period``-th local update the trainable variables (with ``average_state``, also the
  optimizer's floating-point variables, e.g. Adam's moments) are averaged over the process set in
  one grouped request, and assigned back.

In the local phase sparse gradients (``tf.IndexedSlices``) are made dense first, so both branches of
the ``tf.cond`` return the same structure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ...training.local_sgd import LocalSGDSchedule
from ..collectives import host_ops


class KerasLocalSGD:
    """Local SGD on one Keras optimizer (see the module's doc)."""

    def __init__(self, optimizer: keras.optimizers.Optimizer, schedule: LocalSGDSchedule, average_state: bool,
                 process_set: ProcessSet) -> None:
        self._optimizer, self.schedule = optimizer, schedule
        self._average_state, self._process_set = average_state, process_set

    def _update_index(self) -> tf.Tensor:
        """The 0-based index of the update being made (``iterations`` counts accumulation micro-steps)."""
        passes = self._optimizer.gradient_accumulation_steps or 1
        return tf.cast(self._optimizer.iterations, tf.int64) // passes

    def reduce_in_warmup(self, grads: list[Any], reduce: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """``reduce(grads)`` during the warm-up, the rank's own gradients afterwards."""
        dense = [g if g is None else tf.convert_to_tensor(g) for g in grads]
        present = [i for i, g in enumerate(dense) if g is not None]

        def synchronous() -> list[tf.Tensor]:
            reduced = reduce(list(dense))
            return [tf.convert_to_tensor(reduced[i]) for i in present]

        def local() -> list[tf.Tensor]:
            return [tf.identity(dense[i]) for i in present]

        chosen = tf.cond(self.schedule.synchronous(self._update_index()), synchronous, local) if present else []
        result = list(dense)
        for i, value in zip(present, chosen, strict=True):
            result[i] = value
        return result

    def after_apply(self, trainable_variables: list[Any]) -> None:
        """Average the variables if the update just made (``iterations`` has advanced) ends a period."""
        passes = self._optimizer.gradient_accumulation_steps or 1
        iterations = tf.cast(self._optimizer.iterations, tf.int64)
        made = iterations // passes - 1  # the update just made; none yet on an accumulation micro-step
        due = (iterations % passes == 0) & self.schedule.averages_after(made)
        tf.cond(due, lambda: self.average(trainable_variables), lambda: tf.constant(False))

    def average(self, trainable_variables: list[Any]) -> tf.Tensor:
        """Average the variables (and with ``average_state`` the optimizer's) across the set, now."""
        variables = list(trainable_variables)
        if self._average_state:
            known = {id(v) for v in variables} | {id(self._optimizer.iterations)}
            variables += [v for v in self._optimizer.variables
                          if id(v) not in known and keras.backend.is_float_dtype(v.dtype) and len(v.shape) > 0]
        values = [tf.convert_to_tensor(v) for v in variables]
        if self._process_set.included() is False or not values:
            return tf.constant(True)
        averaged = host_ops.allreduce(values, "local_sgd", ReduceOp.AVERAGE, 1.0, 1.0, process_set=self._process_set)
        for variable, value in zip(variables, averaged, strict=True):
            variable.assign(tf.cast(value, variable.dtype))
        return tf.constant(True)


def install(optimizer: keras.optimizers.Optimizer, schedule: LocalSGDSchedule, average_state: bool,
            process_set: ProcessSet) -> KerasLocalSGD:
    """Local SGD on ``optimizer``: its averaging runs after ``apply`` (``apply_gradients`` and
    ``model.fit`` both go through it); the warm-up reduction is the caller's to route through it."""
    local_sgd = KerasLocalSGD(optimizer, schedule, average_state, process_set)
    apply = optimizer.apply

    def apply_then_average(grads: Any, trainable_variables: Any = None) -> Any:
        result = apply(grads, trainable_variables)
        local_sgd.after_apply(list(trainable_variables) if trainable_variables is not None
                              else list(optimizer._trainable_variables))
        return result

    optimizer.apply = apply_then_average
    return local_sgd


__all__ = ["KerasLocalSGD", "install"]

"""``SyncBatchNormalization``: Keras batch normalization with statistics over every rank's batch.

Horovod's layer, for Keras 3. In training, the per-channel mean comes from one allreduce (Sum) of
every rank's sample count and sum, and the variance from a second one of the squared deviations
from that mean (two passes: no ``E[x^2] - E[x]^2`` cancellation). Both allreduces are
differentiable, and the gradient of a Sum allreduce is the Sum allreduce of the gradient, so the
input gradients are exactly those of one process on the whole batch. Keras's own ``call`` does the
rest (moving statistics, scale and offset), so every option of ``BatchNormalization`` but masks works.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from ..errors import UnsupportedOperationError
from ..ops import ReduceOp
from ..process_sets import ProcessSet, global_process_set
from .collectives.differentiable import allreduce, grouped_allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics span every rank of ``process_set``.

    Every rank must call its layers in the same order (they are collectives); the collectives are
    named after the layer, so layers must be built in the same order on every rank too (as a model
    is). Statistics are computed in float64. ``process_set`` is not saved with the layer's config.
    """

    def __init__(self, *args: Any, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if mask is not None:
            raise UnsupportedOperationError(f"SyncBatchNormalization {self.name!r} does not take a mask")
        axes = list(self._reduction_axes)
        x = tf.cast(inputs, tf.float64)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float64)
        count, total = grouped_allreduce([tf.reshape(count, [1]), tf.reduce_sum(x, axes, keepdims=True)],
                                         op=ReduceOp.SUM, name=f"{self.name}.sum", process_set=self.process_set)
        mean = total / count[0]
        squares = allreduce(tf.reduce_sum(tf.square(x - mean), axes, keepdims=True), op=ReduceOp.SUM,
                            name=f"{self.name}.squares", process_set=self.process_set)
        variance = squares / count[0]
        return tf.cast(tf.squeeze(mean), inputs.dtype), tf.cast(tf.squeeze(variance), inputs.dtype)

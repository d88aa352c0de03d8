"""What every rank of a ``KerasEstimator`` fit runs: Horovod's Keras training on hvdlite.

As Horovod's: the rank rebuilds the optimizer from its config with the learning rate multiplied
by the number of ranks, wraps it in ``hvdlite.tensorflow.keras.DistributedOptimizer``, compiles
the model and calls ``model.fit`` on its share of the data, with rank 0's weights and optimizer
state broadcast first and the epoch's metrics averaged over the ranks. Rank 0 saves a checkpoint
(the weights and the optimizer's variables) and the Keras history into the run folder after every
epoch; a fit with the same ``run_id`` resumes from there and trains ``epochs`` more (Horovod's).
With ``use_gpu`` TensorFlow sees only the rank's GPU (its local rank's) where every rank has one,
else none (:mod:`hvdlite.spark.common.device`).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from ..common.device import agreed_uses_gpu
from ..common.shapes import reshaped
from ..common.spec import Batch, DataSpec
from ..estimator import label_as_output


@dataclasses.dataclass
class KerasSpec:
    """Everything a rank needs, pickled to it."""

    data: DataSpec
    model: bytes  # the uncompiled model, cloudpickled (Keras pickles models as .keras archives)
    optimizer: dict[str, Any]  # keras.optimizers.serialize(...)
    loss: Any
    loss_weights: list[float] | None
    metrics: list[Any]
    callbacks: list[Any]
    custom_objects: dict[str, Any]
    output_shapes: list[tuple[int, ...]]  # each output's per-row shape: the labels are reshaped to it
    input_shapes: list[list[int]] | None  # each feature column's shape for the model's input, where it differs
    compression: Any
    backward_passes_per_step: int
    use_gpu: bool = True


def train(spec: KerasSpec) -> dict[str, Any] | None:
    """Train on this rank; rank 0 returns the Keras history and the trained weights."""
    import hvdlite.tensorflow.keras as hvd

    hvd.init()
    _place(spec.use_gpu, hvd)
    data = spec.data
    if data.seed is not None:
        keras.utils.set_random_seed(data.seed)
    model, optimizer = _compiled(spec, hvd)
    history = _resume(spec, model, optimizer, hvd)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 *spec.callbacks]
    if hvd.rank() == 0:
        callbacks.append(_Checkpoint(spec, optimizer, history, hvd.size()))
    val_batches = data.val_batches(hvd.rank(), hvd.size())
    model.fit(_for_keras(spec, data.train_batches(hvd.rank(), hvd.size())), steps_per_epoch=data.steps,
              epochs=len(history.get("loss", [])) + data.epochs, initial_epoch=len(history.get("loss", [])),
              callbacks=callbacks,
              validation_data=None if val_batches is None else _for_keras(spec, val_batches),
              validation_steps=data.val_steps if val_batches is not None else None,
              shuffle=False, verbose=2 if data.verbose and hvd.rank() == 0 else 0)  # the batches come shuffled
    if hvd.rank() != 0:
        return None
    return {"history": history, "weights": model.get_weights()}


def _place(use_gpu: bool, hvd: Any) -> None:
    """Let TensorFlow see only this rank's GPU (its local rank's) where ``use_gpu`` and every rank
    has one, else no GPU: left alone, every rank of a host would take GPU 0. Before any tensor exists."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    on_gpu = agreed_uses_gpu(use_gpu, hvd.local_rank(), len(gpus) if use_gpu else 0)
    if gpus:
        tf.config.set_visible_devices([gpus[hvd.local_rank()]] if on_gpu else [], "GPU")


def _compiled(spec: KerasSpec, hvd: Any) -> tuple[Any, Any]:
    """The rank's model, compiled with the distributed optimizer (learning rate scaled by the size)."""
    import cloudpickle

    config = dict(spec.optimizer, config=dict(spec.optimizer["config"]))
    if scales_learning_rate(spec.optimizer):  # a schedule is left as given
        config["config"]["learning_rate"] *= hvd.size()
    with keras.saving.custom_object_scope(spec.custom_objects):
        model = cloudpickle.loads(spec.model)
        optimizer = keras.optimizers.deserialize(config, custom_objects=spec.custom_objects)
    optimizer = hvd.DistributedOptimizer(optimizer, compression=spec.compression or hvd.Compression.none,
                                         backward_passes_per_step=spec.backward_passes_per_step)
    model.compile(optimizer=optimizer, loss=spec.loss, loss_weights=spec.loss_weights, metrics=spec.metrics or None)
    return model, optimizer


def scales_learning_rate(optimizer_config: dict[str, Any]) -> bool:
    """Whether the optimizer's learning rate is a number (scaled by the ranks), not a schedule."""
    return isinstance(optimizer_config["config"].get("learning_rate"), (int, float))


def _for_keras(spec: KerasSpec, batches: Iterator[Batch]) -> Iterator[tuple[Any, ...]]:
    """Batches as ``model.fit`` takes them: ``(inputs, labels[, sample_weights])``, one array or a
    tuple of arrays for several columns, each label in its output's shape (or one value per row: a class index)."""
    data = spec.data
    for batch in batches:
        inputs = tuple(reshaped([_float32(batch[name]) for name in data.feature_cols], spec.input_shapes))
        labels = tuple(label_as_output(_float32(batch[name]), shape)
                       for name, shape in zip(data.label_cols, spec.output_shapes, strict=True))
        item = (inputs[0] if len(inputs) == 1 else inputs, labels[0] if len(labels) == 1 else labels)
        yield (*item, _float32(batch[data.sample_weight_col])) if data.sample_weight_col else item


def _float32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32) if values.dtype == np.float64 else values


class _Checkpoint(keras.callbacks.Callback):
    """Rank 0's callback: after each epoch (its logs averaged by then), append them to the history
    and save the checkpoint and the history into the run folder."""

    def __init__(self, spec: KerasSpec, optimizer: Any, history: dict[str, list[float]], size: int) -> None:
        super().__init__()
        self._spec, self._optimizer, self._history, self._size = spec, optimizer, history, size

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        for name, value in (logs or {}).items():
            self._history.setdefault(name, []).append(float(value))
        state = {"weights": self.model.get_weights(), "size": self._size,
                 "optimizer": [keras.ops.convert_to_numpy(variable) for variable in self._optimizer.variables]}
        self._spec.data.save(pickle.dumps(state), self._history)


def _resume(spec: KerasSpec, model: Any, optimizer: Any, hvd: Any) -> dict[str, list[float]]:
    """The history so far: from the run's checkpoint if it has one, restored on rank 0 (the
    broadcast at the start of ``fit`` gives it to every rank); empty otherwise."""
    history: dict[str, list[float]] = {}
    saved = spec.data.saved_checkpoint() if hvd.rank() == 0 else None
    if saved is not None:
        state = pickle.load(io.BytesIO(saved))
        model.set_weights(state["weights"])
        with keras.name_scope(optimizer.name):
            optimizer.build(model.trainable_variables)
        for variable, value in zip(optimizer.variables, state["optimizer"], strict=True):
            variable.assign(value)
        if scales_learning_rate(spec.optimizer):  # as it was then (callbacks may have changed it), rescaled
            optimizer.learning_rate = float(optimizer.learning_rate) * hvd.size() / state["size"]
        history = spec.data.saved_history()
    return hvd.broadcast_object(history, root_rank=0)


__all__ = ["KerasSpec", "train", "scales_learning_rate"]

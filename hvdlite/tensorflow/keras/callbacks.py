"""Horovod's Keras callbacks for Keras 3: initial broadcast, metric averaging, learning-rate schedules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from ... import basics
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..collectives import host_ops
from .state import broadcast_model


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copy ``root_rank``'s model weights and optimizer state to every rank when training starts.

    Unlike Horovod, which broadcasts after the first batch (so that step trains on unequal weights),
    this broadcasts before the first batch when the model is already built, building the
    optimizer's slots first so that a state restored on the root reaches every rank. A model that
    builds itself on its first batch is broadcast after that batch, as Horovod does. With a
    ``process_set`` (an hvdlite extra), ``root_rank`` (a rank of the job) broadcasts to the set's
    ranks only; a rank outside the set keeps its weights. ``local_variables`` (as in Horovod) are
    not broadcast.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.local_variables = [] if local_variables is None else list(local_variables)
        self.process_set = process_set
        self.broadcast_done = False

    def _broadcast(self) -> None:
        if self.process_set.included() is not False:
            broadcast_model(self.model, self.root_rank, self.process_set, self.local_variables)
        self.broadcast_done = True

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.broadcast_done and self.model.built and self.model.weights:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average every value in the epoch's logs across ranks, in one collective, at the end of each epoch.

    Place it before callbacks that read the logs (ReduceLROnPlateau, ModelCheckpoint, TensorBoard).
    Keras's History and progress bar come after user callbacks, so they see averaged values. With a
    ``process_set`` (an hvdlite extra) the average is over the set's ranks; others keep their own.
    """

    def __init__(self, device: str = "", process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs or self.process_set.included() is False:
            return
        names = sorted(logs)  # the same order on every rank
        values = [tf.constant(np.asarray(logs[n], dtype=np.float64)) for n in names]
        averaged = host_ops.allreduce(values, None, ReduceOp.AVERAGE, 1.0, 1.0, process_set=self.process_set)
        for name, value in zip(names, averaged, strict=True):
            logs[name] = float(value)


def _learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    ``multiplier`` is a function of the epoch, or a number m meaning ``m ** (epoch - start_epoch)``.
    With ``staircase`` the rate changes at the start of each epoch; otherwise at every batch, with
    a fractional epoch (``epoch + batch / steps_per_epoch``; steps_per_epoch defaults to fit's).
    ``momentum_correction`` scales an SGD momentum by new_lr / old_lr for the batch in which the
    rate changes (Goyal et al.); Keras 3 reads momentum when it traces the train step, so this takes
    effect with ``run_eagerly=True`` only. The epoch's logs get the rate as ``lr``.
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required: the learning rate the schedule multiplies (scaled by size)")
        self.initial_lr = float(initial_lr)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: float(multiplier) ** (epoch - start_epoch)
        self.current_epoch = 0
        self._restore_momentum: float | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} needs steps_per_epoch: fit() did not say how many "
                                 "steps an epoch has (pass steps_per_epoch to fit or to the callback)")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        momentum = getattr(optimizer, "momentum", None)
        if self.momentum_correction and isinstance(momentum, float) and momentum and old_lr > 0:
            self._restore_momentum = momentum
            optimizer.momentum = momentum * new_lr / old_lr

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + batch / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._restore_momentum is not None:
            self.model.optimizer.momentum = self._restore_momentum
            self._restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, per batch.

    ``initial_lr`` is the rate for the whole job (usually one process's rate times ``size()``);
    large-batch training diverges if it starts there (Goyal et al.). The rate reaches it exactly at
    the last batch of the last warmup epoch.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        self.warmup_epochs, self.verbose = warmup_epochs, verbose

        def multiplier(epoch: float) -> float:
            # Shift by one batch so each epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback"]

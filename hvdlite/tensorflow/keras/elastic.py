"""``hvd.elastic`` for Keras 3: ``KerasState``, the state callbacks and ``run`` (Horovod's API)::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=steps, epochs=epochs - state.epoch, callbacks=callbacks)

Put the update callbacks before ``CommitStateCallback``, so that a commit records the batch and
epoch just finished.
"""

from __future__ import annotations

from typing import Any

import keras

from ...elastic import ObjectState, State
from ...errors import HorovodInternalError, HostsUpdatedInterrupt
from ..elastic import TensorFlowKerasState, run


class KerasState(TensorFlowKerasState):
    """State of a Keras 3 model and optimizer (default: the compiled one), plus keyword attributes."""

    def __init__(self, model: keras.Model, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Set ``state.batch`` to the index of the batch just finished, and back to 0 at the end of each epoch.

    As Horovod's, it lowers ``params['steps']`` at the start of an epoch by ``state.batch``; Keras 3's
    ``fit`` does not read that back (only its progress bar does), so a training function that resumes
    mid-epoch passes ``steps_per_epoch`` for the rest of the epoch itself.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Set ``state.epoch`` at the end of each epoch to the number of epochs finished, across resets.

    Keras counts the epochs of each ``fit`` from 0; the count goes on from ``state.epoch`` as it was
    when training began, plus one, so that a reset after the epoch's end does not repeat it.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["State", "ObjectState", "TensorFlowKerasState", "KerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run", "HorovodInternalError",
           "HostsUpdatedInterrupt"]

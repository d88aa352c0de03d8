"""Keras DiLoCo as elastic state: :class:`DiLoCoHandler` (``hvd.elastic.KerasState(model, diloco)``)."""

from __future__ import annotations

from ...training.diloco import root_outer_state
from .diloco import DiLoCo


class DiLoCoHandler:
    """Commits, restores and syncs a DiLoCo object's outer state (:meth:`DiLoCo.state_dict`) in
    ``hvd.elastic.KerasState``, which tracks its inner optimizer's variables with the model's.

    A sync gives every rank rank 0's: a joining group receives the global parameters, the outer
    optimizer's state, the step counters and an exchange in flight. int8's error feedback starts
    again from zero on every rank (each rank's residuals are its own and the world changed). A
    commit waits for an exchange in flight.
    """

    def __init__(self, diloco: DiLoCo) -> None:
        self.value = diloco
        self.save()

    # No copies of their own: state_dict() builds new arrays, and load_state_dict() copies them in.
    def save(self) -> None:
        self._saved = self.value.state_dict()

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(root_outer_state(self.value))


__all__ = ["DiLoCoHandler"]

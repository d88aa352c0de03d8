"""Keras DiLoCo's checkpoints in the layout torch's and JAX's write (:mod:`hvdlite.torch.diloco_state`).

``{"format": "hvdlite.diloco/1", "sync_every", "fragments", "delay", "inner_steps", "syncs",
"global": {name: array}, "outer_optimizer": [the outer optimizer's variables' values], "in_flight":
None or {"fragment", "sent_at", "average": {name: array}, "anchor": {name: array} or None},
"residuals": {name: flat array}, "residuals_world_size"}`` with NumPy arrays, names being the
variables' positions and names ("0.kernel"). An exchange in flight is waited for and saved with its result; it lands at its
own step after a restore. int8's residuals are restored at the same number of ranks only. The model
and the inner optimizer are saved as usual, beside it.

:class:`DiLoCoHandler` makes a DiLoCo object elastic state (``hvd.elastic.KerasState(model, diloco)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..training.diloco import FORMAT, check_loadable, root_outer_state
from ..training.diloco_exchange import InFlight, done, settle

if TYPE_CHECKING:
    from .diloco import DiLoCo


def _world_size() -> int:
    from ..core.runtime import current

    return current().topology.size


def diloco_state_dict(diloco: DiLoCo) -> dict[str, Any]:
    """The checkpoint of ``diloco`` (see the module's doc)."""
    schedule, flight, names = diloco.schedule, diloco._in_flight, diloco.names
    in_flight = None
    if flight is not None:
        averages = settle(flight)
        indices = diloco.fragments[flight.fragment]
        in_flight = {"fragment": flight.fragment, "sent_at": flight.sent_at,
                     "average": {names[i]: np.array(a) for i, a in zip(indices, averages, strict=True)},
                     "anchor": None if flight.anchors is None else
                     {names[i]: np.array(a) for i, a in zip(indices, flight.anchors, strict=True)}}
    return {"format": FORMAT, "sync_every": schedule.sync_every, "fragments": schedule.fragments,
            "delay": schedule.delay, "inner_steps": diloco.inner_steps, "syncs": diloco.syncs,
            "global": {name: np.array(value) for name, value in zip(names, diloco.global_params, strict=True)},
            "outer_optimizer": [np.array(v.numpy()) for v in diloco.outer_optimizer.variables],
            "in_flight": in_flight,
            "residuals": {name: np.array(value) for name, value in diloco.residuals.items()},
            "residuals_world_size": _world_size()}


def load_diloco_state_dict(diloco: DiLoCo, state: dict[str, Any]) -> None:
    """Restore ``diloco`` from :func:`diloco_state_dict`'s checkpoint, checked first."""
    check_loadable(diloco.schedule, diloco.names, state)
    variables = diloco.outer_optimizer.variables
    if len(variables) != len(state["outer_optimizer"]):
        raise ValueError(f"DiLoCo checkpoint's outer optimizer has {len(state['outer_optimizer'])} variables, this "
                         f"one has {len(variables)}: was it saved with another outer optimizer?")
    for variable, value in zip(variables, state["outer_optimizer"], strict=True):
        variable.assign(value)
    diloco.global_params = [np.array(state["global"][name], dtype=mine.dtype).reshape(mine.shape)
                            for name, mine in zip(diloco.names, diloco.global_params, strict=True)]
    diloco.inner_steps, diloco.syncs = int(state["inner_steps"]), int(state["syncs"])
    diloco._in_flight = None
    flight = state["in_flight"]
    if flight is not None:
        names = [diloco.names[i] for i in diloco.fragments[flight["fragment"]]]
        averages = [np.array(flight["average"][name]) for name in names]
        anchors = None if flight["anchor"] is None else [np.array(flight["anchor"][name]) for name in names]
        diloco._in_flight = InFlight(flight["fragment"], flight["sent_at"], anchors, done(averages))
    diloco.residuals = {}  # error feedback starts again from zero at another number of ranks
    if state.get("residuals_world_size") == _world_size():
        diloco.residuals = {name: np.array(value) for name, value in state["residuals"].items()}


class DiLoCoHandler:
    """Commits, restores and syncs a DiLoCo object's outer state (:func:`diloco_state_dict`) in
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


__all__ = ["DiLoCoHandler", "diloco_state_dict", "load_diloco_state_dict"]

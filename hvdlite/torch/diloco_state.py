"""DiLoCo's checkpoints: the outer state, in one layout for torch, Keras and JAX.

``{"format": "hvdlite.diloco/1", "sync_every", "fragments", "delay", "inner_steps", "syncs",
"global": {name: tensor}, "outer_optimizer": <the outer optimizer's own state>, "in_flight": None or
{"fragment", "sent_at", "average": {name: tensor}, "anchor": {name: tensor} or None},
"residuals": {name: tensor}, "residuals_world_size"}``. Every tensor is shaped like its parameter: a DTensor placed like a
``fully_shard`` parameter for a sharded one (so that DCP saves and reshards it), else a plain
tensor, the same on every rank of a group (so that rank 0 may save it and any number of ranks load
it). An exchange in flight is waited for and saved with its result, and lands at its own step after
a restore, as it would have without the checkpoint. int8's error-feedback residuals belong to
each rank (what its own rounding dropped): they are restored at the same number of ranks, and at
another error feedback starts again from zero (a rounding error of the last sync is lost). The model and the inner optimizer are saved as
usual, beside it.

:class:`DiLoCoHandler` makes a DiLoCo object elastic state (``hvd.elastic.TorchState(model, diloco)``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from ..core.runtime import current
from ..training.diloco import FORMAT, check_loadable, root_outer_state
from ..training.diloco_exchange import settle
from .diloco_exchange import InFlight, done
from .state import broadcast_optimizer_state

if TYPE_CHECKING:
    from .diloco import DiLoCo


def _shaped_like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's values of ``param``) as a tensor placed like ``param``."""
    local = local.detach().clone().reshape(param.to_local().shape if isinstance(param, DTensor) else param.shape)
    if isinstance(param, DTensor):
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return local


def _local_of(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def _by_name(diloco: DiLoCo, indices: list[int], values: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {diloco.names[i]: _shaped_like(diloco.params[i], value) for i, value in zip(indices, values, strict=True)}


def diloco_state_dict(diloco: DiLoCo) -> dict[str, Any]:
    """The checkpoint of ``diloco`` (see the module's doc)."""
    schedule, flight = diloco.schedule, diloco._in_flight
    in_flight = None
    if flight is not None:
        averages = settle(flight)
        indices = diloco.fragments[flight.fragment]
        in_flight = {"fragment": flight.fragment, "sent_at": flight.sent_at,
                     "average": _by_name(diloco, indices, averages),
                     "anchor": None if flight.anchors is None else _by_name(diloco, indices, flight.anchors)}
    everything = list(range(len(diloco.params)))
    residuals = getattr(diloco._exchange, "residuals", {})
    return {"format": FORMAT, "sync_every": schedule.sync_every, "fragments": schedule.fragments,
            "delay": schedule.delay, "inner_steps": diloco.inner_steps, "syncs": diloco.syncs,
            "global": _by_name(diloco, everything, diloco.global_params),
            "outer_optimizer": diloco.outer_optimizer.state_dict(), "in_flight": in_flight,
            "residuals": {name: value.clone() for name, value in residuals.items()},
            "residuals_world_size": current().topology.size}


def load_diloco_state_dict(diloco: DiLoCo, state: dict[str, Any]) -> None:
    """Restore ``diloco`` from :func:`diloco_state_dict`'s checkpoint, checked first."""
    check_loadable(diloco.schedule, diloco.names, state)
    with torch.no_grad():
        for name, target in zip(diloco.names, diloco.global_params, strict=True):
            target.copy_(_local_of(state["global"][name]).reshape(target.shape))
    diloco.outer_optimizer.load_state_dict(state["outer_optimizer"])
    diloco.inner_steps, diloco.syncs = int(state["inner_steps"]), int(state["syncs"])
    diloco._in_flight = None
    flight = state["in_flight"]
    if flight is not None:
        indices = diloco.fragments[flight["fragment"]]
        names = [diloco.names[i] for i in indices]
        averages = [_local_of(flight["average"][name]).clone() for name in names]
        anchors = None if flight["anchor"] is None else [_local_of(flight["anchor"][name]).clone() for name in names]
        diloco._in_flight = InFlight(flight["fragment"], flight["sent_at"], anchors, done(averages))
    residuals = getattr(diloco._exchange, "residuals", None)
    if residuals is not None:
        residuals.clear()
        if state.get("residuals_world_size") == current().topology.size:  # else error feedback starts again from zero
            residuals.update({name: value.clone() for name, value in state["residuals"].items()})


class DiLoCoHandler:
    """Commits, restores and syncs a DiLoCo object in ``hvd.elastic.TorchState``: its outer state
    (:func:`diloco_state_dict`) and its inner optimizer's state.

    A sync gives every rank rank 0's: a joining group receives the global parameters, the outer
    optimizer's state, the step counters and an exchange in flight, as the model handler gives it
    rank 0's parameters. int8's error feedback starts again from zero on every rank (each rank's
    residuals are its own and the world changed). A commit waits for an exchange in flight.
    """

    def __init__(self, diloco: DiLoCo) -> None:
        if any(isinstance(param, DTensor) for param in diloco.params):
            raise ValueError("TorchState: DiLoCo over fully sharded parameters cannot be elastic state yet (each "
                             "rank's global parameters are its own shard); use a replicated model inside each group")
        self.value = diloco
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy((self.value.state_dict(), self.value.inner_optimizer.state_dict()))

    def restore(self) -> None:
        # Copies again: torch's load_state_dict may keep the given tensors, which training then changes in place.
        outer, inner = copy.deepcopy(self._saved)
        self.value.load_state_dict(outer)
        self.value.inner_optimizer.load_state_dict(inner)

    def sync(self) -> None:
        self.value.load_state_dict(root_outer_state(self.value))
        broadcast_optimizer_state(self.value.inner_optimizer, root_rank=0)


__all__ = ["DiLoCoHandler", "diloco_state_dict", "load_diloco_state_dict", "FORMAT"]

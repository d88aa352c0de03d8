"""DiLoCo for torch: groups train on their own and exchange pseudo-gradients every H inner steps.

Inside a group ranks stay synchronous over their fast link (a ``DistributedOptimizer`` over the
group's process set, or a model ``fully_shard``-ed over it); across groups only the pseudo-gradient
``global - local`` travels, every ``sync_every`` inner steps, averaged over ``process_set`` and
applied to the global parameters by the user's outer optimizer (DiLoCo: SGD with Nesterov
momentum, lr 0.7, momentum 0.9). The schedule (fragments, delay) is :mod:`hvdlite.training.diloco`.

Merge rule, with ``delay`` tau > 0: a fragment's pseudo-gradient is taken after inner step ``s``,
its average lands after step ``s + tau``, and the fragment's parameters become the new global
parameters plus the group's own progress in those tau steps (``local(s + tau) - local(s)``). No
inner step is thrown away (torchft's default, ``fragment_update_alpha=0``, discards them) and none
is counted twice: the progress is part of the next pseudo-gradient, taken against the new global
parameters. With ``delay=0`` the rule is plain DiLoCo.

A sharded parameter (a ``fully_shard`` DTensor) is handled through its local shard: each rank's
pseudo-gradient is its own shard, and ``process_set`` must pair the ranks that hold the same shard
in each group, so that only 1/N of the model crosses the slow link.

Checkpoints (:meth:`DiLoCo.state_dict`) hold the outer state, in one layout for torch, Keras and JAX:
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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ...core.runtime import current
from ...process_sets import ProcessSet, global_process_set
from ...training.diloco import (
    FORMAT,
    DiLoCoSchedule,
    ScheduledExchanges,
    check_agreement,
    check_loadable,
    check_member,
    split_fragments,
)
from ...training.diloco_exchange import settle
from ..gradients.reducer import GradientReducer
from .diloco_exchange import Exchange, InFlight, done, make_exchange


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``param``: a DTensor's local shard, else the parameter's data."""
    return param.to_local() if isinstance(param, DTensor) else param.data


def _as_grad(param: torch.Tensor, local_grad: torch.Tensor) -> torch.Tensor:
    """``local_grad`` shaped as ``param``'s gradient (a DTensor placed like ``param`` for a DTensor)."""
    if isinstance(param, DTensor):
        return DTensor.from_local(local_grad, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return local_grad


def _named(model_or_params: torch.nn.Module | Iterable[Any]) -> tuple[list[str], list[torch.Tensor]]:
    """Names and parameters in model order, from a module, ``named_parameters()`` or parameters."""
    items = list(model_or_params.named_parameters() if isinstance(model_or_params, torch.nn.Module)
                 else model_or_params)
    if not items:
        raise ValueError("DiLoCo was given no parameters")
    if all(isinstance(item, tuple) and len(item) == 2 for item in items):
        return [name for name, _ in items], [param for _, param in items]
    return [f"param.{index}" for index in range(len(items))], items


class DiLoCo(ScheduledExchanges):
    """DiLoCo (and streaming DiLoCo) around an inner and an outer optimizer (see the module's doc).

    ``model_or_params``: the module (or its ``named_parameters()``, or its parameters) both
    optimizers train. ``inner_optimizer`` steps every call of :meth:`step`; ``outer_optimizer``,
    built by the user over the same parameters (``torch.optim.SGD(model.parameters(), lr=0.7,
    momentum=0.9, nesterov=True)``), steps on the averaged pseudo-gradients every ``sync_every``
    inner steps (one fragment every ``sync_every / fragments``, landing ``delay`` steps after it is
    sent). ``process_set``: the ranks pseudo-gradients are averaged over. ``compression``: None,
    ``"bf16"`` or ``"int8"`` (see :mod:`hvdlite.torch.slow_links.diloco_exchange`).
    """

    def __init__(self, model_or_params: torch.nn.Module | Iterable[Any], inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: torch.optim.Optimizer, *, sync_every: int, process_set: ProcessSet = global_process_set,
                 fragments: int = 1, delay: int = 0, compression: str | None = None) -> None:
        self.schedule = DiLoCoSchedule(sync_every, fragments, delay)
        self.names, self.params = _named(model_or_params)
        _check_optimizers(inner_optimizer, outer_optimizer, self.names, self.params)
        check_member(process_set)
        self.inner_optimizer, self.outer_optimizer, self.process_set = inner_optimizer, outer_optimizer, process_set
        self.fragments = split_fragments([param.numel() for param in self.params], fragments, self.names)
        self._connect(compression)
        self.global_params = [_local(param).detach().clone() for param in self.params]
        self.inner_steps = 0  # inner steps taken (the schedule's count)
        self.syncs = 0  # fragment exchanges landed
        self._in_flight: InFlight | None = None

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One inner step; then, on the schedule, land the exchange in flight and send the next fragment."""
        loss = self.inner_optimizer.step() if closure is None else self.inner_optimizer.step(closure)
        self.after_inner_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``."""
        self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def regroup(self, process_set: ProcessSet, inner_process_set: ProcessSet | None = None) -> None:
        """Elastic: carry on in a re-formed job. Call it on every rank from a reset callback, with the
        new world's sets registered again (``hvd.add_process_set``; the old world's are gone):
        ``process_set``, the ranks pseudo-gradients are averaged over now, and ``inner_process_set``,
        the group an inner ``DistributedOptimizer`` averages gradients over now (None: leave the
        inner optimizer as it is). An exchange in flight belonged to the old world and is dropped
        (the elastic state's restore and sync bring back the committed one); int8's error feedback
        starts again from zero. A joining rank builds its DiLoCo over the same sets instead."""
        check_member(process_set)
        if inner_process_set is not None:
            reducer = getattr(self.inner_optimizer, "_hvdlite_reducer", None)
            if not isinstance(reducer, GradientReducer):
                raise ValueError("DiLoCo.regroup(inner_process_set=...) needs an inner DistributedOptimizer that "
                                 "averages gradients (not Adasum, a sharded or a fully sharded one)")
            check_member(inner_process_set)
            reducer.world_changed(inner_process_set)
        self.process_set, self._in_flight = process_set, None
        self._connect(self._exchange.label)

    def _connect(self, compression: str | None) -> None:
        """Build the exchange over ``process_set`` (sliced over the inner group when every rank of the
        set holds the same place in it), after checking that the set's ranks agree."""
        self._exchange: Exchange = make_exchange(compression, self.process_set)
        group = _replica_group(self.inner_optimizer, self.params)
        if self._check_agreement(group):
            self._exchange = make_exchange(compression, self.process_set, group)

    def _send(self, fragment: int, background: bool | None = None) -> None:
        """Start averaging the fragment's pseudo-gradients ``global - local`` over the process set (on
        a helper thread with a ``delay``, unless ``background`` says otherwise)."""
        background = bool(self.schedule.delay) if background is None else background
        indices = self.fragments[fragment]
        with torch.no_grad():
            locals_ = [_local(self.params[i]) for i in indices]
            deltas = [self.global_params[i] - local for i, local in zip(indices, locals_, strict=True)]
            anchors = [local.clone() for local in locals_] if background else None
        names = [self.names[i] for i in indices]
        pending = self._exchange.start(deltas, names, f"diloco.{fragment}", background=background)
        self._in_flight = InFlight(fragment, self.inner_steps, anchors, pending)

    def _land(self) -> None:
        """Apply the exchange in flight: the outer step on the fragment, then the merge rule."""
        flight, self._in_flight = self._in_flight, None
        averages = flight.pending.wait()
        indices = self.fragments[flight.fragment]
        with torch.no_grad():
            progress = None
            if flight.anchors is not None:  # local(now) - local(sent), kept across the outer step
                progress = [anchor.neg_().add_(_local(self.params[i])) for i, anchor in zip(indices, flight.anchors,
                                                                                           strict=True)]
            for i in indices:
                _local(self.params[i]).copy_(self.global_params[i])
            self._outer_step(indices, averages)
            for position, i in enumerate(indices):
                local = _local(self.params[i])
                self.global_params[i].copy_(local)
                if progress is not None:
                    local.add_(progress[position])
        self.syncs += 1

    def _outer_step(self, indices: list[int], averages: list[torch.Tensor]) -> None:
        """Step the outer optimizer on the fragment alone: the other parameters have no gradient
        during it (so it leaves them and their momentum as they are), and every gradient is put back."""
        stashed = [param.grad for param in self.params]
        try:
            for param in self.params:
                param.grad = None
            for i, average in zip(indices, averages, strict=True):
                self.params[i].grad = _as_grad(self.params[i], average)
            self.outer_optimizer.step()
        finally:
            for param, grad in zip(self.params, stashed, strict=True):
                param.grad = grad

    def _check_agreement(self, group: ProcessSet | None) -> bool:
        """Refuse, on every rank of the set, options or shards that differ between its ranks; return
        whether the exchange can be sliced over ``group`` (every rank of the set holds the same place
        in a group of identical replicas of the same size)."""
        mine = {"the schedule (sync_every, fragments, delay)": (self.schedule.sync_every, self.schedule.fragments,
                                                                self.schedule.delay),
                "compression": self._exchange.label,
                "the (local) parameters' names, shapes and dtypes": [
                    (name, tuple(_local(p).shape), str(p.dtype)) for name, p in zip(self.names, self.params, strict=True)]}
        place = None if group is None or group.size() == 1 else (group.rank(), group.size())
        places = check_agreement(mine, self.process_set, place)
        return place is not None and all(theirs == place for theirs in places)

    # checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The outer state: global parameters, the outer optimizer's state, the step counters, and an
        exchange in flight (waited for, so that it lands at its step after a restore)."""
        return _state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s outer state (at the same or another number of ranks)."""
        _load_state_dict(self, state)


def _check_optimizers(inner: Any, outer: Any, names: list[str], params: list[torch.Tensor]) -> None:
    """Refuse optimizers DiLoCo cannot step: not torch optimizers, an inner one that already does local
    SGD, an outer one that is a DistributedOptimizer, or an outer one missing one of the parameters."""
    for role, optimizer in (("inner_optimizer", inner), ("outer_optimizer", outer)):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DiLoCo's {role} must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    reducer = getattr(inner, "_hvdlite_reducer", None)
    if getattr(reducer, "local_sgd", None) is not None:
        raise ValueError("DiLoCo's inner_optimizer is a DistributedOptimizer with local_sgd_period set: DiLoCo "
                         "already trains locally between syncs; keep the inner optimizer synchronous (no local SGD)")
    if getattr(outer, "_hvdlite_reducer", None) is not None:
        raise ValueError("DiLoCo's outer_optimizer must be a plain torch optimizer, not a DistributedOptimizer: "
                         "DiLoCo averages the pseudo-gradients itself, over process_set")
    in_outer = {id(param) for group in outer.param_groups for param in group["params"]}
    missing = [name for name, param in zip(names, params, strict=True) if id(param) not in in_outer]
    if missing:
        raise ValueError(f"DiLoCo's outer_optimizer does not hold parameter(s) {', '.join(missing)}: build it over the "
                         "model's own parameters, e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, "
                         "nesterov=True)")


def _replica_group(inner: torch.optim.Optimizer, params: list[torch.Tensor]) -> ProcessSet | None:
    """The ranks holding the same parameters as this one: the process set of an inner
    ``DistributedOptimizer`` that averages gradients (not of sharded parameters), else None."""
    group = getattr(getattr(inner, "_hvdlite_reducer", None), "process_set", None)
    if group is None or any(isinstance(param, DTensor) for param in params):
        return None
    return group


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


def _state_dict(diloco: DiLoCo) -> dict[str, Any]:
    """The checkpoint of ``diloco`` (:meth:`DiLoCo.state_dict`)."""
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


def _load_state_dict(diloco: DiLoCo, state: dict[str, Any]) -> None:
    """Restore ``diloco`` from :func:`_state_dict`'s checkpoint, checked first."""
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


__all__ = ["DiLoCo"]

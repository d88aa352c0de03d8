"""Making every rank start from the root's model and optimizer state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ... import basics, objects
from ...process_sets import ProcessSet, global_process_set
from . import async_ops


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor] | torch.Tensor],
                         root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Overwrite every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()`` (parameters and buffers), ``named_parameters()``, or, as
    Horovod accepts, a list of tensors (``list(model.parameters())``: named by position). All
    broadcasts start before any is waited for, so they overlap.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (str(i), p) for i, p in enumerate(params)]
    handles = []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        handles.append(async_ops.broadcast_async_(tensor.data, root_rank, name=f"broadcast.param.{name}",
                                                  process_set=process_set))
    for handle in handles:
        async_ops.synchronize(handle)


def _replace(state: Any, kind: type, make: Callable[[Any], Any]) -> Any:
    """``state`` with every ``kind`` leaf replaced by ``make(leaf)``, visited in a fixed order."""
    if isinstance(state, kind):
        return make(state)
    if isinstance(state, dict):
        return {key: _replace(value, kind, make) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_replace(value, kind, make) for value in state)
    return state


@dataclasses.dataclass(frozen=True)
class _TensorSlot:
    """Where a tensor sat in the root's state_dict: what a receiving rank must allocate."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device_type: str = "cpu"  # the root's tensor's device type: a receiver allocates on its own such device


def receiving_device(device_type: str, optimizer: Any) -> torch.device:
    """Where a receiving rank puts a state tensor the root holds on a ``device_type`` device: beside
    this rank's parameters of that type (its own GPU), else the type's current device; "cpu" stays."""
    if device_type == "cpu":
        return torch.device("cpu")
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.device.type == device_type:
                return param.device
    return torch.device(device_type)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state (buffers and hyperparameters) equal to ``root_rank``'s.

    The root's ``state_dict()`` structure (including lazily created state other ranks do not
    have yet, and scalar hyperparameters such as the learning rate) travels as one object; its
    tensors travel as tensor broadcasts, then every rank loads the result. With
    ``shard_optimizer_state=True`` each rank's state is its own slice: only the root's group settings
    (learning rates...) travel.
    """
    sharded = getattr(optimizer, "_hvdlite_checkpoints", None)
    if sharded is not None:
        sharded.broadcast_hyperparameters(root_rank)
        return
    is_root = basics.rank() == root_rank
    tensors: list[torch.Tensor] = []  # the same order on every rank: the structure's traversal order

    def send(tensor: torch.Tensor) -> _TensorSlot:
        tensors.append(tensor)
        return _TensorSlot(tuple(tensor.shape), tensor.dtype, tensor.device.type)

    def receive(slot: _TensorSlot) -> torch.Tensor:
        # On the root's kind of device (found on the GPU: receivers allocated CUDA state on the CPU,
        # and the broadcast failed with a device mismatch on every rank).
        device = receiving_device(slot.device_type, optimizer)
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype, device=device))
        return tensors[-1]

    structure = _replace(optimizer.state_dict(), torch.Tensor, send) if is_root else None
    structure = objects.broadcast_object(structure, root_rank, name="broadcast.optimizer_state.structure",
                                         process_set=process_set)
    if not is_root:
        received = _replace(structure, _TensorSlot, receive)
    handles = [async_ops.broadcast_async_(t, root_rank, name=f"broadcast.optimizer_state.{i}", process_set=process_set)
               for i, t in enumerate(tensors)]
    for handle in handles:
        async_ops.synchronize(handle)
    if not is_root:
        optimizer.load_state_dict(received)

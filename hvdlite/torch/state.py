"""Making every rank start from the root's model and optimizer state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import basics, objects
from ..process_sets import ProcessSet, global_process_set, require_global
from . import async_ops


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                         root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Overwrite every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()`` (parameters and buffers) or ``named_parameters()``. All
    broadcasts start before any is waited for, so they overlap.
    """
    require_global(process_set, "broadcast_parameters")
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    handles = []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(tensor).__name__}, not a tensor")
        handles.append(async_ops.broadcast_async_(tensor.data, root_rank, name=f"broadcast.param.{name}"))
    for handle in handles:
        async_ops.synchronize(handle)


def _placeholders(state: Any, tensors: list[torch.Tensor]) -> Any:
    """``state`` with each tensor replaced by ``_TensorSlot(index)``; the tensors go to ``tensors``."""
    if isinstance(state, torch.Tensor):
        tensors.append(state)
        return _TensorSlot(len(tensors) - 1, tuple(state.shape), state.dtype)
    if isinstance(state, dict):
        return {key: _placeholders(value, tensors) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_placeholders(value, tensors) for value in state)
    return state


def _fill(state: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(state, _TensorSlot):
        return tensors[state.index]
    if isinstance(state, dict):
        return {key: _fill(value, tensors) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_fill(value, tensors) for value in state)
    return state


class _TensorSlot:
    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.index, self.shape, self.dtype = index, shape, dtype


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state (buffers and hyperparameters) equal to ``root_rank``'s.

    The root's ``state_dict()`` structure (including lazily created state other ranks do not
    have yet, and scalar hyperparameters such as the learning rate) travels as one object; its
    tensors travel as tensor broadcasts, then every rank loads the result.
    """
    require_global(process_set, "broadcast_optimizer_state")
    is_root = basics.rank() == root_rank
    tensors: list[torch.Tensor] = []
    structure = _placeholders(optimizer.state_dict(), tensors) if is_root else None
    structure = objects.broadcast_object(structure, root_rank, name="broadcast.optimizer_state.structure")
    if not is_root:
        tensors = []
        _collect_slots(structure, tensors)
    handles = [async_ops.broadcast_async_(t, root_rank, name=f"broadcast.optimizer_state.{i}")
               for i, t in enumerate(tensors)]
    for handle in handles:
        async_ops.synchronize(handle)
    if not is_root:
        optimizer.load_state_dict(_fill(structure, tensors))


def _collect_slots(state: Any, tensors: list[torch.Tensor]) -> None:
    """Allocate a receive tensor for each slot in ``state``, in slot order."""
    slots: list[_TensorSlot] = []

    def visit(value: Any) -> None:
        if isinstance(value, _TensorSlot):
            slots.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)

    visit(state)
    for slot in sorted(slots, key=lambda s: s.index):
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype))

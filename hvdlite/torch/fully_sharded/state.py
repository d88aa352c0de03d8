"""Full state dicts of a fully sharded model, and gradient clipping across shards."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch.distributed.tensor import DTensor

from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from ..collectives.async_ops import allgather_async, allreduce_async, synchronize
from .param import ShardedParam, local_tensor
from .unit import ShardedUnit


def units_under(module: torch.nn.Module) -> list[ShardedUnit]:
    return [m._hvdlite_unit for m in module.modules() if getattr(m, "_hvdlite_unit", None) is not None]


def keys_of(module: torch.nn.Module, unit: ShardedUnit) -> list[list[str]]:
    """Each of the unit's parameters' state-dict keys (a tied parameter has several)."""
    paths = {id(m): path for path, m in module.named_modules(remove_duplicate=False)}
    return [[f"{paths[id(owner)]}.{attribute}".lstrip(".") for owner, attribute in param.owners if id(owner) in paths]
            for param in unit.params]


def full_state_dict(module: torch.nn.Module, *, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The model's state dict with every parameter whole, as the unsharded model's ``state_dict()``.

    Gathered one unit at a time into CPU tensors; with ``rank0_only`` (the default) only rank 0 of
    each unit's process set keeps them (the other ranks get ``{}``), so no rank but that one ever
    holds more than the largest unit. Every rank must call it. It loads into the plain model.
    """
    units = units_under(module)
    keep = not rank0_only or all(unit.process_set.rank() == 0 for unit in units)
    full: dict[str, torch.Tensor] = {}
    for unit in units:
        if not unit.params:
            continue
        copies = unit.gather_copies()
        if keep:
            for copy, keys in zip(copies, keys_of(module, unit), strict=True):
                full.update(dict.fromkeys(keys, copy))
    if not keep:
        return {}
    # Buffers (and anything else a module saves) come from the model's own state dict, in its order.
    ordered = {}
    for key, value in module.state_dict().items():
        ordered[key] = full[key] if key in full else value.detach().to("cpu", copy=True)
    return ordered


def load_full_state_dict(module: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load a whole model's state dict (a plain model's ``state_dict()``, or :func:`full_state_dict`'s)
    into the fully sharded ``module``: each rank copies only the rows of its shards.

    Every rank passes the whole dict. For a model larger than memory, load it with
    ``torch.load(path, mmap=True)``: a rank then reads only the pages of its own rows.
    """
    by_key: dict[str, tuple[ShardedUnit, ShardedParam]] = {}
    for unit in units_under(module):
        for param, keys in zip(unit.params, keys_of(module, unit), strict=True):
            by_key.update({key: (unit, param) for key in keys})
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise KeyError(f"load_full_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    plain = {}
    for key, value in state_dict.items():
        if key not in by_key:
            plain[key] = value
            continue
        unit, param = by_key[key]
        layout = unit.layout.params[unit.params.index(param)]
        if tuple(value.shape) != tuple(layout.shape):
            raise ValueError(f"load_full_state_dict: '{key}' has shape {tuple(value.shape)}, the model's parameter "
                             f"{tuple(layout.shape)}")
        with torch.no_grad():
            param.local.copy_(layout.local_of(value.to(param.shard.dtype), unit.process_set.rank()))
    if plain:
        module.load_state_dict({**module.state_dict(), **plain})


def sharded_params(module: torch.nn.Module) -> dict[int, tuple[ShardedUnit, int]]:
    """id(shard) -> (its unit, its index in the unit), for every shard under ``module``."""
    return {id(param.shard): (unit, index) for unit in units_under(module) for index, param in enumerate(unit.params)}


def _gather_rows(shard: torch.Tensor, unit: ShardedUnit, index: int, name: str) -> torch.Tensor:
    """The whole tensor of which ``shard`` (placed as the unit's ``index``-th shard) holds this rank's rows."""
    layout = unit.layout.params[index]
    padded = layout.padded(local_tensor(shard).detach())
    gathered = synchronize(allgather_async(padded, name=name, process_set=unit.process_set))
    return gathered[:layout.rows].reshape(layout.shape).to("cpu", copy=True)


def full_optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                              rank0_only: bool = True) -> dict:
    """``optimizer.state_dict()`` with every state tensor whole, as the same optimizer over the
    unsharded model would give it (it loads there). ``optimizer`` steps ``module``'s shards. Every
    rank must call it; with ``rank0_only`` the others get ``{}``."""
    sharded = sharded_params(module)
    state_dict = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    full_state = {}
    for index, state in state_dict["state"].items():
        where = sharded.get(id(params[index]))
        full_state[index] = {
            key: _gather_rows(value, *where, f"fully_shard.optimizer.{index}.{key}")
            if where is not None and isinstance(value, DTensor) else value
            for key, value in state.items()}
    keep = not rank0_only or all(unit.process_set.rank() == 0 for unit in units_under(module))
    return {"state": full_state, "param_groups": state_dict["param_groups"]} if keep else {}


def load_full_optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Load a whole optimizer state dict (a plain optimizer's over the unsharded model, or
    :func:`full_optimizer_state_dict`'s) into ``optimizer``, which steps ``module``'s shards: each
    rank keeps its rows of every state tensor. Every rank passes the whole dict."""
    sharded = sharded_params(module)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    mine = {}
    for index, state in state_dict["state"].items():
        where = sharded.get(id(params[int(index)]))
        if where is None:
            mine[index] = state
            continue
        unit, position = where
        layout = unit.layout.params[position]
        # Copies, scalars too: torch's load_state_dict keeps a tensor it needs not convert, and a step
        # count shared with the optimizer the dict came from would advance twice per step.
        param = unit.params[position]
        mine[index] = {key: (param.as_dtensor(layout.local_of(value, unit.process_set.rank()))
                             if _like_param(key, value, layout.shape) else value.clone())
                       if torch.is_tensor(value) else value for key, value in state.items()}
    optimizer.load_state_dict({"state": mine, "param_groups": state_dict["param_groups"]})


def _like_param(key: str, value: torch.Tensor, shape: torch.Size) -> bool:
    """Whether an optimizer state tensor is one per element of its parameter (so sharded as it is):
    shaped like it, but not the step count, which is 0-dim as a 0-dim parameter is."""
    return tuple(value.shape) == tuple(shape) and (value.dim() > 0 or key != "step")


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                    process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over a model whose parameters are shards: the returned norm
    is the whole model's (what the unsharded model's gradients give), and every rank scales its
    gradients by the same factor. Parameters that are not shards count once (not once per rank)."""
    params = [p for p in parameters if p.grad is not None]
    size = process_set.size()
    norm_type = float(norm_type)
    local = torch.zeros((), dtype=torch.float64)
    for param in params:
        grad = local_tensor(param.grad).detach().to(torch.float64)
        if math.isinf(norm_type):
            local = torch.maximum(local, grad.abs().max() if grad.numel() else local)
            continue
        local = local + _share(param, size) * grad.abs().pow(norm_type).sum()
    op = ReduceOp.MAX if math.isinf(norm_type) else ReduceOp.SUM
    total = synchronize(allreduce_async(local, op=op, name="fully_shard.clip_grad_norm", process_set=process_set))
    norm = total if math.isinf(norm_type) else total.pow(1.0 / norm_type)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for param in params:
        local_tensor(param.grad).detach().mul_(coefficient.to(param.grad.dtype))
    return norm.to(torch.float32)


def _share(param: torch.Tensor, size: int) -> float:
    """How much of a parameter's gradient norm this rank counts: all of its own rows of a shard;
    1/size of a tensor every rank holds whole (replicated, or a 0-dim parameter of a unit)."""
    if isinstance(param, DTensor):
        return 1.0 if any(placement.is_shard() for placement in param.placements) else 1.0 / size
    return 1.0 / size


__all__ = ["clip_grad_norm_", "full_optimizer_state_dict", "full_state_dict", "load_full_optimizer_state_dict",
           "load_full_state_dict"]

"""Sharded checkpoints: each rank writes its own rows, and any number of ranks reads them back.

A checkpoint is a directory: ``layout.json`` (the world size it was written at, each parameter's
full shape) and one file per rank, ``rank-<r>.pt``, holding the rows of every parameter (and of
every optimizer state tensor shaped like it) that rank r owned, without padding, so the files'
rows one after the other are the whole tensor. Rank 0's file also holds what is not sharded
(buffers, the optimizer's scalars and param groups). To load at another world size each rank
reads, memory-mapped, only the rows its new shards need.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from .layout import ParamLayout
from .param import local_tensor
from .state import keys_of, sharded_params, units_under

LAYOUT = "layout.json"


def _rank_and_size(module: torch.nn.Module) -> tuple[int, int]:
    units = units_under(module)
    if not units:
        raise ValueError("sharded checkpoint: the module has no fully_shard unit")
    return units[0].process_set.rank(), units[0].process_set.size()


def _mine(layout: ParamLayout, shard: torch.Tensor, rank: int) -> torch.Tensor:
    """This rank's rows of a shard (or of its optimizer state), as rows (a 0-dim parameter: one)."""
    rows = local_tensor(shard).detach().reshape(len(layout.owned_rows(rank)), *layout.shape[1:])
    return rows.to("cpu", copy=True)


def save_sharded_state(directory: str | os.PathLike, module: torch.nn.Module,
                       optimizer: torch.optim.Optimizer | None = None) -> None:
    """Write this rank's shards of ``module`` (and of ``optimizer``'s state) under ``directory``.
    Every rank calls it (no collective: each writes its own file; the directory must be shared
    between hosts to load on others)."""
    rank, size = _rank_and_size(module)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rows, shapes, sharded_keys = {}, {}, set()
    for unit in units_under(module):
        for param, layout, keys in zip(unit.params, unit.layout.params, keys_of(module, unit), strict=True):
            shapes[keys[0]] = list(layout.shape)
            rows[keys[0]] = _mine(layout, param.shard, rank)
            sharded_keys.update(keys)  # a tied parameter's other keys are the same shard: saved once
    saved: dict[str, Any] = {"params": rows}
    if rank == 0:
        saved["other"] = {key: value for key, value in module.state_dict().items() if key not in sharded_keys}
    if optimizer is not None:
        saved["optimizer"] = _optimizer_rows(module, optimizer, rank)
    torch.save(saved, directory / f"rank-{rank}.pt")
    if rank == 0:
        (directory / LAYOUT).write_text(json.dumps({"world_size": size, "shapes": shapes}))


def _optimizer_rows(module: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> dict:
    sharded = sharded_params(module)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state_dict = optimizer.state_dict()
    state = {}
    for index, entry in state_dict["state"].items():
        where = sharded.get(id(params[index]))
        layout = where[0].layout.params[where[1]] if where else None
        state[index] = {key: _mine(layout, value, rank) if layout is not None and isinstance(value, DTensor)
                        else value for key, value in entry.items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


def read_rows(files: list[dict], path: list, layout: ParamLayout, rank: int, old_size: int) -> torch.Tensor:
    """This rank's shard under ``layout`` (the new world size), cut from the old ranks' rows."""
    old = ParamLayout(layout.name, layout.shape, old_size, 0)
    wanted = layout.owned_rows(rank)
    shard = torch.zeros(layout.shard_shape, dtype=_dig(files[0], path).dtype)
    for old_rank, data in enumerate(files):
        held = old.owned_rows(old_rank)
        low, high = max(held.start, wanted.start), min(held.stop, wanted.stop)
        if low < high:
            shard[low - wanted.start:high - wanted.start] = _dig(data, path)[low - held.start:high - held.start]
    return shard


def _dig(data: Any, path: list) -> Any:
    for step in path:
        data = data[step]
    return data


def load_sharded_state(directory: str | os.PathLike, module: torch.nn.Module,
                       optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load a checkpoint :func:`save_sharded_state` wrote, at this or another world size, into the
    fully sharded ``module`` (built and sharded as when it was saved) and ``optimizer``."""
    rank, _ = _rank_and_size(module)
    directory = Path(directory)
    layout_file = json.loads((directory / LAYOUT).read_text())
    old_size = layout_file["world_size"]
    files = [torch.load(directory / f"rank-{r}.pt", mmap=True, weights_only=True) for r in range(old_size)]
    by_key = {}
    for unit in units_under(module):
        for param, layout, keys in zip(unit.params, unit.layout.params, keys_of(module, unit), strict=True):
            if list(layout.shape) != layout_file["shapes"].get(keys[0]):
                raise ValueError(f"load_sharded_state: '{keys[0]}' has shape {list(layout.shape)} in the model, "
                                 f"{layout_file['shapes'].get(keys[0])} in {directory}")
            by_key[keys[0]] = (param, layout)
            with torch.no_grad():
                param.local.copy_(layout.local_view(read_rows(files, ["params", keys[0]], layout, rank, old_size), rank))
    if files[0]["other"]:
        module.load_state_dict({**module.state_dict(), **files[0]["other"]})
    if optimizer is not None:
        _load_optimizer(files, module, optimizer, rank, old_size)


def _load_optimizer(files: list[dict], module: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int,
                    old_size: int) -> None:
    sharded = sharded_params(module)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = files[0]["optimizer"]
    state = {}
    for index, entry in saved["state"].items():
        where = sharded.get(id(params[index]))
        if where is None:
            state[index] = entry
            continue
        param, layout = where[0].params[where[1]], where[0].layout.params[where[1]]
        state[index] = {key: param.as_dtensor(layout.local_view(
                            read_rows(files, ["optimizer", "state", index, key], layout, rank, old_size), rank))
                        if torch.is_tensor(value) and value.dim() > 0 else value for key, value in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


__all__ = ["load_sharded_state", "save_sharded_state"]

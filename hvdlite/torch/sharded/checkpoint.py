"""Full, unsharded checkpoints of a sharded optimizer (:mod:`hvdlite.torch.sharded.reducer`).

As torch's ``ZeroRedundancyOptimizer``: ``optimizer.consolidate_state_dict(to=0)`` (on every rank:
it gathers every rank's slices) then ``optimizer.state_dict()`` on rank ``to`` gives the state dict
an unsharded optimizer of the same class would have, keyed by the original parameters' indices,
so a checkpoint loads into unsharded runs and into sharded runs of any size. ``load_state_dict``
takes such a full dict on every rank and keeps this rank's slices. A consolidated dict is dropped
at the next step, so a stale one is never saved by mistake.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import objects
from ...process_sets import ProcessSet
from ..collectives import async_ops
from .layout import ShardBucket
from .reducer import ShardedReducer

NOT_CONSOLIDATED = ("state_dict() of a sharded optimizer (shard_optimizer_state=True) needs "
                    "optimizer.consolidate_state_dict(to=rank) first, called on every rank since the last step; "
                    "the rank named by `to` then has the full state")


# The per-parameter scalars of torch's elementwise optimizers (Adam's step count, ASGD's eta and mu).
SCALAR_STATE = ("step", "eta", "mu")


class ShardedCheckpoints:
    """``consolidate_state_dict``, ``state_dict`` and ``load_state_dict`` for one sharded optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer, reducer: ShardedReducer, process_set: ProcessSet) -> None:
        self._optimizer, self._reducer, self._process_set = optimizer, reducer, process_set
        self._original_load = optimizer.load_state_dict
        self._original_state_dict = optimizer.state_dict
        self.consolidated: dict[str, Any] | None = None
        optimizer.register_step_post_hook(lambda *_: self._drop())

    def _drop(self) -> None:
        self.consolidated = None

    def consolidate_state_dict(self, to: int | None = 0) -> None:
        """Gather the full state onto rank ``to`` of the process set (every rank, with None). Collective."""
        buckets = self._reducer.all_buckets
        entries = [(b, key) for b in buckets for key, value in sorted(self._optimizer.state[b.shard].items())
                   if _is_elementwise(value, b)]
        gathered = []
        if entries:
            handle = async_ops.grouped_allgather_async(
                [self._optimizer.state[b.shard][key].detach() for b, key in entries], name="zero.state",
                process_set=self._process_set)
            gathered = async_ops.synchronize(handle)
        full = dict(zip(((b.index, key) for b, key in entries), gathered, strict=True))
        keep = to is None or to == self._process_set.rank()
        self.consolidated = self._full_state_dict(buckets, full) if keep else None

    def _full_state_dict(self, buckets: list[ShardBucket], gathered: dict[tuple[int, str], torch.Tensor]) -> dict:
        index = {id(p): i for i, p in enumerate(p for params in self._reducer.original_params for p in params)}
        state: dict[int, dict[str, Any]] = {}
        for bucket in buckets:
            shard_state = self._optimizer.state[bucket.shard]
            for key, value in sorted(shard_state.items()):
                values = (bucket.split(gathered[(bucket.index, key)]) if (bucket.index, key) in gathered
                          else [_copy(value)] * len(bucket.params))
                for param, piece in zip(bucket.params, values, strict=True):
                    state.setdefault(index[id(param)], {})[key] = _copy(piece)
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [index[id(p)] for p in params]}
                  for group, params in zip(self._optimizer.param_groups, self._reducer.original_params, strict=True)]
        return {"state": state, "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """The full state dict made by the last ``consolidate_state_dict`` (on the rank it was sent to)."""
        if self.consolidated is None:
            raise RuntimeError(NOT_CONSOLIDATED)
        return self.consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full (unsharded) state dict, given on every rank: each rank keeps its own slices."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(p) for p in self._reducer.original_params]:
            raise ValueError(f"load_state_dict: the state dict's param groups hold "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer's "
                             f"{[len(p) for p in self._reducer.original_params]}")
        by_param = {id(p): state_dict["state"].get(i, {}) for params, g in zip(self._reducer.original_params,
                                                                              groups, strict=True)
                    for p, i in zip(params, g["params"], strict=True)}
        shard_state, shard_groups, position = {}, [], 0
        for group, buckets in zip(groups, self._reducer.buckets, strict=True):
            indices = []
            for bucket in buckets:
                entry = _bucket_state(bucket, [by_param[id(p)] for p in bucket.params])
                if entry:
                    shard_state[position] = entry
                indices.append(position)
                position += 1
            shard_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": indices})
        self._original_load({"state": shard_state, "param_groups": shard_groups})
        self.consolidated = None

    def broadcast_hyperparameters(self, root_rank: int) -> None:
        """``broadcast_optimizer_state`` of a sharded optimizer: the root's learning rates and other
        group settings. Each rank's state is its own slice, so it is not sent (load checkpoints with
        ``load_state_dict`` on every rank)."""
        mine = [{k: v for k, v in group.items() if k != "params"} for group in self._optimizer.param_groups]
        settings = objects.broadcast_object(mine, root_rank, name="broadcast.optimizer_state.groups",
                                            process_set=self._process_set)
        for group, root in zip(self._optimizer.param_groups, settings, strict=True):
            group.update(root)


def _is_elementwise(value: Any, bucket: ShardBucket) -> bool:
    return torch.is_tensor(value) and value.shape == bucket.shard.shape


def _copy(value: Any) -> Any:
    return value.detach().clone() if torch.is_tensor(value) else value


def _bucket_state(bucket: ShardBucket, states: list[dict[str, Any]]) -> dict[str, Any]:
    """This rank's shard state from the full states of the bucket's parameters."""
    if not any(states):
        return {}
    if not all(states) or any(s.keys() != states[0].keys() for s in states):
        shapes = [tuple(p.shape) for p in bucket.params]
        raise ValueError(f"load_state_dict: the parameters of shapes {shapes} share a shard, but the state dict "
                         "holds state for only some of them or different entries; a sharded optimizer needs "
                         "the same state entries for all of them")
    entry = {}
    for key, first in states[0].items():
        values = [s[key] for s in states]
        if _shaped_like_params(key, values, bucket.params):
            entry[key] = bucket.slice_of(values).to(bucket.shard.dtype)
        else:
            entry[key] = _copy(first)
    return entry


def _shaped_like_params(key: str, values: list[Any], params: list[torch.Tensor]) -> bool:
    """True for per-element state (a tensor shaped like each parameter), false for counters like
    Adam's ``step``; a 0-dim parameter's entries count as per-element unless named as a counter."""
    if not all(torch.is_tensor(v) and v.shape == p.shape for v, p in zip(values, params, strict=True)):
        return False
    return any(p.dim() > 0 for p in params) or key not in SCALAR_STATE


__all__ = ["NOT_CONSOLIDATED", "ShardedCheckpoints"]

"""Elastic training of a fully sharded model: commits that survive a rank's death, and re-sharding
for the new world (what ``hvd.elastic.TorchState`` uses for a model ``fully_shard`` sharded).

Each rank holds only its own shards, so rank 0's copy, which ``sync`` broadcasts for a replicated
model, is of no use. At every ``state.commit()`` a rank keeps a copy of its shards and of their
optimizer state, and sends the same bytes to the next rank: rank r's rows live on r and on
r+1 (mod N), so any one death, or deaths of ranks that are not neighbours, lose nothing.

When the job has re-formed, ``sync`` rebuilds each tensor (a parameter, or one of its optimizer
state tensors) for the new world size, one tensor at a time: every rank fills the rows it holds (its
own, or its dead neighbour's) into a zero tensor of the full shape, and a summing reduce-scatter
gives each rank its new shard. Nothing is read from a file and no process restarts; a rank that
joined (the job grew) has no commit, contributes zeros and receives its shards the same way. The
first commit is made by the first sync (``hvd.elastic.run`` starts with one), not when the state is
built: committing is collective, and a joining rank builds its state while the others are syncing.
The re-sharded state is committed at once, so a second failure finds it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ... import basics
from ...errors import HvdliteError
from ...objects import allgather_object, broadcast_object
from ...ops import ReduceOp
from ..collectives.async_ops import alltoall_async, broadcast_async_, reducescatter_async, synchronize
from .layout import ParamLayout, UnitLayout
from .mesh import mesh_for, renew_after_world_change
from .param import local_tensor
from .state import units_under
from .unit import ShardedUnit


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One sharded tensor of a commit: a parameter's shard (``key`` None) or one of its optimizer
    state tensors, of the parameter's ``unit``-th unit and ``param``-th place in it."""

    unit: int
    param: int
    key: str | None
    full_shape: torch.Size
    dtype: torch.dtype


@dataclasses.dataclass
class _Commit:
    """This rank's copy of the last commit, and its neighbour's."""

    rank: int
    size: int
    entries: list[_Entry]
    own: list[torch.Tensor]
    neighbour: list[torch.Tensor]  # rank - 1's tensors (empty at size 1)
    scalars: dict[tuple[int, int, str], Any]  # optimizer state that is not sharded (Adam's step), alike on every rank
    replicated: dict[str, torch.Tensor]  # buffers and the parameters no unit holds


def is_fully_sharded(module: Any) -> bool:
    return isinstance(module, torch.nn.Module) and bool(units_under(module))


def _check_elastic(units: list[ShardedUnit]) -> None:
    for unit in units:
        if unit.process_set.process_set_id != 0 or unit.replicate_process_set is not None or unit.reshard_group:
            raise ValueError(f"hvd.elastic.TorchState: unit '{unit.name}' of the fully sharded model shards over "
                             f"{unit.process_set}, with replicate_process_set={unit.replicate_process_set} and "
                             f"reshard group {unit.reshard_group}; elastic re-sharding supports units sharded over "
                             "the global process set only (process sets do not outlive a world change)")


class ShardedModelHandler:
    """Commits, restores and re-shards a fully sharded model and the optimizer that steps its shards
    (``TorchState``'s handler for such a model; same interface as its other handlers)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.value, self.optimizer = model, optimizer
        self._units = units_under(model)
        _check_elastic(self._units)
        self._check_optimizer()
        # No commit until the first sync: committing is collective (each rank sends its copy to the next),
        # and a rank that joins a running job builds its state while the others are already syncing.
        self._commit: _Commit | None = None

    def _shard_ids(self) -> set[int]:
        return {id(param.shard) for unit in self._units for param in unit.params}

    def _check_optimizer(self) -> None:
        if self.optimizer is None:
            return
        shards = self._shard_ids()
        others = [i for i, p in enumerate(p for g in self.optimizer.param_groups for p in g["params"])
                  if id(p) not in shards]
        if others:
            raise ValueError(f"hvd.elastic.TorchState: the optimizer's parameters {others} (in param_groups order) "
                             "are not shards of the fully sharded model; give TorchState the optimizer that steps "
                             "the model's parameters, after fully_shard was applied to the whole model")

    def _state_of(self, shard: torch.Tensor) -> dict:
        return self.optimizer.state[shard] if self.optimizer is not None else {}

    # ---- commit ----------------------------------------------------------------------------------
    def save(self) -> None:
        """Copy this rank's shards and their optimizer state, and send the copy to the next rank."""
        entries, own, scalars = [], [], {}
        for u, unit in enumerate(self._units):
            for i, (param, layout) in enumerate(zip(unit.params, unit.layout.params, strict=True)):
                # padded: every rank's copy has the same size, whatever rows it owns
                entries.append(_Entry(u, i, None, layout.shape, param.shard.dtype))
                own.append(layout.padded(param.local.detach()))
                for key, value in sorted(self._state_of(param.shard).items()):
                    if isinstance(value, DTensor):  # per element of the shard, placed as it is
                        entries.append(_Entry(u, i, key, layout.shape, value.dtype))
                        own.append(layout.padded(local_tensor(value).detach()))
                    else:
                        scalars[(u, i, key)] = copy.deepcopy(value)
        replicated = {name: t.detach().clone() for name, t in self._replicated_tensors(self._shard_ids())}
        self._commit = _Commit(basics.rank(), basics.size(), entries, own, self._exchange(entries, own), scalars,
                               replicated)

    def _replicated_tensors(self, shards: set[int]) -> list[tuple[str, torch.Tensor]]:
        plain = [(name, p) for name, p in self.value.named_parameters() if id(p) not in shards]
        return plain + list(self.value.named_buffers())

    def _exchange(self, entries: list[_Entry], own: list[torch.Tensor]) -> list[torch.Tensor]:
        """Send this rank's tensors to rank + 1 and return rank - 1's, one alltoall per unit."""
        rank, size = basics.rank(), basics.size()
        if size == 1:
            return []
        received: list[torch.Tensor] = []
        for u in range(len(self._units)):
            mine = [t for e, t in zip(entries, own, strict=True) if e.unit == u]
            packed = torch.cat([t.reshape(-1).view(torch.uint8).cpu() for t in mine]) if mine else \
                torch.empty(0, dtype=torch.uint8)
            splits = [0] * size
            splits[(rank + 1) % size] = packed.numel()
            data, counts = synchronize(alltoall_async(packed, splits, name=f"fully_shard.elastic.commit.{u}"))
            if int(counts[(rank - 1) % size]) != packed.numel():
                raise HvdliteError(f"hvd.elastic commit: rank {(rank - 1) % size} sent {int(counts[(rank - 1) % size])} "
                                   f"bytes of unit {u}, this rank holds {packed.numel()}: the ranks' models differ")
            at = 0
            for tensor in mine:
                nbytes = tensor.numel() * tensor.element_size()
                piece = data[at:at + nbytes].view(tensor.dtype).view(tensor.shape)
                received.append(piece.to(tensor.device))
                at += nbytes
        return received

    # ---- restore (the old world, without communicating) ---------------------------------------------
    def restore(self) -> None:
        commit = self._commit
        if commit is None:  # failed before its first commit: the model stays as it was built
            return
        layouts = {u: UnitLayout.plan([(p.name, p.shape) for p in unit.layout.params], commit.size)
                   for u, unit in enumerate(self._units)}
        for u, unit in enumerate(self._units):
            unit.abandon(layouts[u])
        for entry, tensor in zip(commit.entries, commit.own, strict=True):
            self._put(entry, tensor.clone(), commit.rank)
        for (u, i, key), value in commit.scalars.items():
            self._state_of(self._units[u].params[i].shard)[key] = copy.deepcopy(value)
        with torch.no_grad():
            for name, tensor in self._replicated_tensors(set()):
                if name in commit.replicated:
                    tensor.copy_(commit.replicated[name])

    def _put(self, entry: _Entry, padded: torch.Tensor, rank: int) -> None:
        """Make ``padded`` (this rank's shard of one tensor, padded) the shard's rows or a state tensor."""
        unit = self._units[entry.unit]
        param, local = unit.params[entry.param], unit.layout.params[entry.param].local_view(padded, rank)
        if entry.key is None:
            param.replace_local(local)
        else:
            self._state_of(param.shard)[entry.key] = param.as_dtensor(local)

    def _renew_meshes(self) -> None:
        """The torch groups of the old world are gone: every shard, and every optimizer state tensor
        placed as one, moves to a mesh of the world as it is now (its rows unchanged)."""
        renew_after_world_change()
        for unit in self._units:
            for param in unit.params:
                param.mesh = mesh_for(unit.process_set, None, param.mesh.device_type)
                param.replace_local(param.local)
                state = self._state_of(param.shard)
                for key, value in state.items():
                    if isinstance(value, DTensor):
                        state[key] = param.as_dtensor(local_tensor(value))

    # ---- sync (the new world, collective) -------------------------------------------------------
    def sync(self) -> None:
        """Give every rank its shards for the world as it is now, and rank 0's replicated tensors."""
        commit = self._commit
        mine = None if commit is None else (commit.rank, commit.size)
        places = allgather_object(mine, name="fully_shard.elastic.places")
        self._renew_meshes()
        # Nothing committed anywhere (the job starts): every rank holds its shards of the model as built.
        if any(places) and places != [(rank, basics.size()) for rank in range(basics.size())]:
            self._reshard(places)
        replicated = self._replicated_tensors(self._shard_ids())
        handles = [broadcast_async_(tensor.data, 0, name=f"fully_shard.elastic.replicated.{name}")
                   for name, tensor in replicated]
        for handle in handles:
            synchronize(handle)
        self.save()

    def _reshard(self, places: list[tuple[int, int] | None]) -> None:
        source = next((rank for rank, place in enumerate(places) if place is not None), None)
        if source is None:
            raise HvdliteError("hvd.elastic: no rank holds a commit of the fully sharded model")
        spec = broadcast_object((self._commit.entries, self._commit.scalars, self._commit.size)
                                if basics.rank() == source else None, source, name="fully_shard.elastic.spec")
        entries, scalars, old_size = spec
        providers = _providers(places, old_size)
        size = basics.size()
        for unit in self._units:
            unit.abandon(UnitLayout.plan([(p.name, p.shape) for p in unit.layout.params], size))
        for index, entry in enumerate(entries):
            self._put(entry, self._reshard_entry(index, entry, old_size, providers), basics.rank())
        for (u, i, key), value in scalars.items():
            self._state_of(self._units[u].params[i].shard)[key] = copy.deepcopy(value)

    def _reshard_entry(self, index: int, entry: _Entry, old_size: int, providers: dict[int, tuple[int, bool]]) -> torch.Tensor:
        """This rank's new shard of one tensor: the rows it holds go in, a summing reduce-scatter cuts."""
        device = self._units[entry.unit].params[entry.param].local.device
        old = ParamLayout("", entry.full_shape, old_size, 0)
        full = torch.zeros(old.rows, old.row_numel, dtype=entry.dtype, device=device)
        for old_rank, (rank, is_own) in providers.items():
            if rank != basics.rank() or (old.replicated and old_rank != 0):  # (summed: a 0-dim one comes once)
                continue
            rows = old.owned_rows(old_rank)
            held = (self._commit.own if is_own else self._commit.neighbour)[index]
            full[rows.start:rows.stop].copy_(held.reshape(old.rows_per_rank, -1)[:len(rows)])
        new = UnitLayout.plan([("", entry.full_shape)], basics.size())
        packed = new.pack_gradients([full.view(entry.full_shape)], entry.dtype, device)
        reduced = synchronize(reducescatter_async(packed, name=f"fully_shard.elastic.reshard.{index}", op=ReduceOp.SUM))
        return new.split_shards(reduced)[0].clone()


def _providers(places: list[tuple[int, int] | None], old_size: int) -> dict[int, tuple[int, bool]]:
    """For each rank of the committed world: (the rank now that holds its rows, whether as its own)."""
    now = {place[0]: rank for rank, place in enumerate(places) if place is not None}
    providers, lost = {}, []
    for old_rank in range(old_size):
        if old_rank in now:
            providers[old_rank] = (now[old_rank], True)
        elif old_size > 1 and (old_rank + 1) % old_size in now:
            providers[old_rank] = (now[(old_rank + 1) % old_size], False)
        else:
            lost.append(old_rank)
    if lost:
        raise HvdliteError(f"hvd.elastic: the shards of rank(s) {lost} of the last commit's {old_size} are lost: each "
                           "rank's copy lives on that rank and the next, and both died. Resume from a checkpoint "
                           "(hvd.save_sharded_state)")
    return providers


class ShardedOptimizerHandler:
    """The hyperparameters of an optimizer over shards (its state travels with the model's handler)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.value = optimizer
        self.save()

    def _groups(self) -> list[dict]:
        return [{key: value for key, value in group.items() if key != "params"} for group in self.value.param_groups]

    def save(self) -> None:
        self._saved = copy.deepcopy(self._groups())

    def restore(self) -> None:
        for group, saved in zip(self.value.param_groups, self._saved, strict=True):
            group.update(copy.deepcopy(saved))

    def sync(self) -> None:
        groups = broadcast_object(self._groups(), 0, name="fully_shard.elastic.hyperparameters")
        for group, synced in zip(self.value.param_groups, groups, strict=True):
            group.update(synced)
        self.save()


__all__ = ["ShardedModelHandler", "ShardedOptimizerHandler", "is_fully_sharded"]

"""Parameters tied across units: one Parameter that modules of different ``fully_shard`` calls use.

A tied parameter (an embedding's weight used again by the output layer) is one Parameter registered
on two modules. A unit gathers only its own parameters, so a tied one must belong to a unit whose
forward and backward enclose both uses: the lowest unit that holds every module using it. FSDP2
leaves that to the user (and, when embedding and head are wrapped apart, trains two copies); here it
is arranged as the calls come, bottom-up. A later call that finds, among its modules, a parameter an
earlier unit already sharded (the original Parameter, still registered on the second module, or the
shard itself, tied after sharding) resolves the tie:

- if every module using it lies under the new unit's module, the new unit takes it from the earlier
  one (the shard moves as it is: both units cut it for the same ranks);
- otherwise (two sibling units: embedding and head) neither can hold it: the earlier unit gives it
  up and it waits, *lifted*, for the first later unit whose module holds every use (usually the
  model's). A model whose first forward finds one still waiting is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...process_sets import ProcessSet
from .param import ShardedParam, mark_one, sharded_as
from .unit import ShardedUnit

Owners = list[tuple[torch.nn.Module, str]]


def mark(original: torch.nn.Parameter, sharded: ShardedParam) -> None:
    """Let later ``fully_shard`` calls recognise ``original`` and the shard as ``sharded``."""
    mark_one(original, sharded)
    mark_one(sharded.shard, sharded)


def take_ties(module: torch.nn.Module, found: dict[int, tuple[Owners, ShardedParam]], process_set: ProcessSet,
              compute_device: Callable[[ShardedParam], torch.device | None],
              ) -> tuple[list[tuple[str, ShardedParam]], list[ShardedParam]]:
    """Resolve the ties of the unit being made on ``module``: ``found`` holds the already sharded
    parameters among its own modules (where they are registered, which they are), keyed by
    identity; the units under it may hold lifted ones. ``compute_device``: where the new unit would
    compute a parameter (offloaded: its accelerator; else None). Returns (name, parameter) for each
    one the new unit takes, and the lifted ones it leaves waiting."""
    paths = {id(m): path for path, m in module.named_modules(remove_duplicate=False)}
    candidates = {id(p): p for sub in module.modules() for p in getattr(getattr(sub, "_hvdlite_unit", None), "lifted", [])
                  if p.holder is None}
    candidates.update((id(param), param) for _, param in found.values())
    for param in candidates.values():
        _check_compatible(param, process_set, compute_device(param), _name_of(param, paths))
    for owners, param in found.values():
        param.owners.extend(owner for owner in owners if owner not in param.owners)
        param.put_on_owners(param.shard)
    taken, lifted = [], []
    for param in candidates.values():
        holder = param.holder
        if holder is not None:
            holder.release(param)
        if all(id(owner) in paths for owner, _ in param.owners):
            taken.append((_name_of(param, paths), param))
        else:
            lifted.append(param)
            if holder is not None:  # a later unit holding the earlier unit finds it there too
                holder.lifted.append(param)
    return taken, lifted


def _name_of(param: ShardedParam, paths: dict[int, str]) -> str:
    for owner, attribute in param.owners:
        if id(owner) in paths:
            return f"{paths[id(owner)] + '.' if paths[id(owner)] else ''}{attribute}"
    return param.owners[0][1]


def _check_compatible(param: ShardedParam, process_set: ProcessSet, compute_device: torch.device | None,
                      name: str) -> None:
    if param.holder is not None and param.holder.root is not None:
        raise ValueError(f"fully_shard: parameter '{name}' is tied to unit '{param.holder.name}', which has already "
                         "run; call fully_shard on every module before the first forward")
    if param.process_set.ranks != process_set.ranks:
        raise ValueError(f"fully_shard: parameter '{name}' is tied to a unit sharded over {param.process_set}, "
                         f"this one shards over {process_set}; tied parameters need units on one process set")
    if param.compute_device != compute_device:
        raise ValueError(f"fully_shard: parameter '{name}' is tied to a unit with another offload setting; "
                         "tied parameters need units that both offload, or neither")


def check_none_waiting(root: torch.nn.Module, units: list[ShardedUnit]) -> None:
    """Before the first forward: every tied parameter must have found a unit holding all its uses."""
    paths = {id(m): path for path, m in root.named_modules(remove_duplicate=False)}
    waiting = {id(p): p for unit in units for p in unit.lifted if p.holder is None}
    if not waiting:
        return
    uses = [[f"{paths.get(id(owner)) or type(owner).__name__.removeprefix('FullySharded')}.{attribute}"
             for owner, attribute in p.owners] for p in waiting.values()]
    raise ValueError(f"fully_shard: parameter(s) tied across units {uses} belong to no unit that holds every module "
                     "using them; call fully_shard on a module that holds them all (e.g. the whole model) "
                     "before the first forward")


__all__ = ["check_none_waiting", "mark", "sharded_as", "take_ties"]

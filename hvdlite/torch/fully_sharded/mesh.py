"""The torch device meshes that make ``fully_shard``'s parameters DTensors.

A DTensor names the ranks it is spread over with a ``DeviceMesh``, whose dimensions are
torch.distributed process groups. A unit's mesh is its process set (``Shard(0)``), or for hybrid
sharding the replicas by the shard set (``(Replicate(), Shard(0))``); the groups are hvdlite's own
backend (:mod:`hvdlite.torch.distributed`), so whatever torch computes on the parameters (a global
gradient norm, a full state dict, a resharding checkpoint load) runs on hvdlite's core.

``fully_shard`` needs no ``dist.init_process_group``: without one it starts the default group on
hvdlite's backend, with a store local to the process (hvdlite's ranks have met already; nothing
else needs a rendezvous). After an elastic world change that group is started again for the new
world (:func:`renew_after_world_change`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ... import basics
from ...objects import allgather_object
from ...process_sets import ProcessSet
from ..distributed import BACKEND_NAME, CollectivesOnly, ProcessGroupHvdlite

_started_here = False  # whether this module started the default group (then it may restart it)
# By process set (the object: a set removed and registered again is another set, with another group).
_meshes: dict[tuple[ProcessSet, ProcessSet | None, str], DeviceMesh] = {}
_groups: dict[ProcessSet, dist.ProcessGroup] = {}


def _default_group_ready() -> None:
    """Start the default group on hvdlite's backend unless the user has started one."""
    global _started_here
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (basics.rank(), basics.size()):
            raise RuntimeError(f"fully_shard: torch.distributed's default group is rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, hvdlite's rank {basics.rank()} of {basics.size()}; "
                               "start both on the same processes (or leave init_process_group to fully_shard)")
        return
    dist.init_process_group(BACKEND_NAME, store=dist.HashStore(), rank=basics.rank(), world_size=basics.size(),
                            pg_options=CollectivesOnly())
    _started_here = True


def renew_after_world_change() -> None:
    """An elastic job re-formed: forget the meshes and groups of the old world, and restart the
    default group if this module started it (a user's own group is the user's to restart)."""
    _meshes.clear()
    _groups.clear()
    if _started_here and dist.is_initialized():
        dist.destroy_process_group()
    _default_group_ready()


def _ranks(process_set: ProcessSet) -> list[int]:
    return list(process_set.ranks or range(basics.size()))


def _group(process_set: ProcessSet) -> dist.ProcessGroup:
    """The group of ``process_set``'s ranks on hvdlite's backend (created by the members alone)."""
    if process_set not in _groups:
        ranks = _ranks(process_set)
        if ranks == list(range(basics.size())) and isinstance(dist.group.WORLD, ProcessGroupHvdlite):
            _groups[process_set] = dist.group.WORLD
        else:
            _groups[process_set] = dist.new_group(ranks, backend=BACKEND_NAME, use_local_synchronization=True,
                                                  pg_options=CollectivesOnly())
    return _groups[process_set]


def mesh_for(process_set: ProcessSet, replicas: ProcessSet | None, device_type: str) -> DeviceMesh:
    """The mesh of a unit sharded over ``process_set`` (and replicated over ``replicas``): 1-D over
    the shard set, or 2-D (replicate, shard) with one row per replica."""
    _default_group_ready()
    key = (process_set, replicas, device_type)
    if key not in _meshes:
        if replicas is None:
            _meshes[key] = DeviceMesh.from_group(_group(process_set), device_type)
        else:
            rows = allgather_object(_ranks(process_set), name="fully_shard.mesh", process_set=replicas)
            _meshes[key] = DeviceMesh.from_group([_group(replicas), _group(process_set)], device_type,
                                                 mesh=torch.tensor(rows, dtype=torch.int),
                                                 mesh_dim_names=("replicate", "shard"))
    return _meshes[key]


def mesh_device_type(device: torch.device) -> str:
    """The mesh's device type for parameters computed on ``device`` (``meta``: where they will be)."""
    if device.type == "meta":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.type


__all__ = ["mesh_device_type", "mesh_for", "renew_after_world_change"]

"""One parameter of a fully sharded unit: its shard (a DTensor Parameter), its full form, its owners.

The shard is what modules hold between a unit's forward and backward, what ``module.parameters()``
and the optimizer see, and what torch's tools read: an ``nn.Parameter`` DTensor, ``Shard(0)`` on the
unit's device mesh (a 0-dim parameter ``Replicate()``; hybrid sharding adds a leading
``Replicate()``), whose local tensor is this rank's rows. The full parameter is a plain Parameter
whose storage is filled by the unit's all-gather and freed after use.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Any, Protocol

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from ...process_sets import ProcessSet


class Holder(Protocol):
    """The unit that holds a parameter (``unit.ShardedUnit``, which imports this module), as the
    bookkeeping of parameters tied across units sees it (:mod:`.ties`)."""

    name: str
    root: Any  # the ShardedRoot once the unit has run, else None
    lifted: list[ShardedParam]

    def release(self, param: ShardedParam) -> None: ...


@dataclasses.dataclass(eq=False)
class ShardedParam:
    """One parameter of the unit: where it is registered, its shard and its full form."""

    owners: list[tuple[torch.nn.Module, str]]  # (module, attribute) pairs that hold it (tied: several)
    shard: torch.nn.Parameter  # a DTensor: this rank's rows (its local tensor) of the whole parameter
    # Storage resized to 0 while the unit is sharded (printing it then would crash: not in the repr).
    full: torch.nn.Parameter = dataclasses.field(repr=False)
    process_set: ProcessSet  # whose ranks the shard was cut for
    mesh: DeviceMesh = dataclasses.field(repr=False)  # the process set's (hybrid: replicas x shard set)
    compute_device: torch.device | None = None  # offload: the full parameter's device (the shard is on the CPU)
    # The unit it belongs to; None while a parameter tied across units waits for one (ties.py).
    holder: Holder | None = dataclasses.field(default=None, repr=False)

    @property
    def local(self) -> torch.Tensor:
        """This rank's rows: the shard's local tensor (a plain tensor; writing it writes the shard)."""
        return local_tensor(self.shard)

    def as_dtensor(self, local: torch.Tensor) -> DTensor:
        """``local`` (rows shaped like this rank's) as a DTensor placed as the shard is: its gradient,
        its optimizer state."""
        placement = Shard(0) if self.full.dim() else Replicate()
        placements = (placement,) if self.mesh.ndim == 1 else (Replicate(), placement)
        meta = TensorMeta(self.full.shape, self.full.stride(), local.dtype)  # (full: contiguous, made empty)
        return DTensor(local, DTensorSpec(self.mesh, placements, tensor_meta=meta), requires_grad=False)

    def replace_local(self, local: torch.Tensor) -> None:
        """Make ``local`` the shard's rows, the Parameter staying the same object (the optimizer
        keys its state by it): after an elastic world change, on a new mesh."""
        replacement = torch.nn.Parameter(self.as_dtensor(local), requires_grad=self.shard.requires_grad)
        replacement.__dict__.update(self.shard.__dict__)  # swap_tensors swaps the attributes too
        torch.utils.swap_tensors(self.shard, replacement)

    def follow_shard(self, dtype: torch.dtype | None) -> None:
        """Make the full parameter anew (in ``dtype``, else the shard's) if the shard moved
        (``to_empty`` after building on ``meta``, ``.to(device)``) or changed dtype: only between
        iterations, when autograd holds no reference to it. Offloaded: it stays on the compute device."""
        dtype = dtype or self.shard.dtype
        device = self.compute_device or self.local.device
        if self.full.device != device or self.full.dtype != dtype:
            self.full = torch.nn.Parameter(torch.empty(self.full.shape, dtype=dtype, device=device),
                                           requires_grad=self.full.requires_grad)

    def put_on_owners(self, tensor: torch.nn.Parameter) -> None:
        for module, attribute in self.owners:
            module._parameters[attribute] = tensor

    def __deepcopy__(self, memo: dict) -> ShardedParam:
        # The full parameter is made anew, empty: copying it would read its freed storage.
        full = torch.nn.Parameter(torch.empty_like(self.full, device=self.full.device),
                                  requires_grad=self.full.requires_grad)
        if full.device.type != "meta":
            free(full)
        result = ShardedParam([], self.shard, full, self.process_set, self.mesh, self.compute_device)  # memo first: the
        memo[id(self)] = result  # shard's attributes and the owners lead back here
        result.shard = copy.deepcopy(self.shard, memo)
        mark_one(result.shard, result)  # (the copied weak reference still names this one)
        result.owners = copy.deepcopy(self.owners, memo)
        result.holder = copy.deepcopy(self.holder, memo)
        return result


def sharded_as(param: torch.nn.Parameter) -> ShardedParam | None:
    """The sharded parameter ``param`` already is (an original a unit has sharded, or a shard)."""
    ref = getattr(param, "_hvdlite_sharded_as", None)
    return None if ref is None else ref()


def mark_one(tensor: torch.Tensor, sharded: ShardedParam) -> None:
    """Let later ``fully_shard`` calls recognise ``tensor`` as ``sharded``. A weak reference: a
    DTensor's deep copy copies its attributes before it memoizes the copy, so a strong one (the
    ShardedParam points back at the shard) would copy the shard twice."""
    tensor._hvdlite_sharded_as = weakref.ref(sharded)


def check_replacement(tensor: torch.Tensor, param: ShardedParam, local_shape: torch.Size, where: str) -> None:
    """A Parameter put in a shard's place must be this rank's rows of the same tensor, placed alike."""
    expected = param.as_dtensor(torch.empty(local_shape, device="meta"))
    if not isinstance(tensor, DTensor) or tensor.placements != expected.placements or tensor.shape != expected.shape \
            or tensor._local_tensor.shape != local_shape or tensor.device_mesh.mesh.tolist() != param.mesh.mesh.tolist():
        got = (f"a DTensor {tuple(tensor.shape)} placed {tensor.placements} on ranks {tensor.device_mesh.mesh.tolist()}, "
               f"local {tuple(tensor._local_tensor.shape)}" if isinstance(tensor, DTensor)
               else f"a {type(tensor).__name__} {tuple(tensor.shape)}")
        raise ValueError(f"fully_shard: parameter '{where}' was replaced by {got}; the shard is a DTensor "
                         f"{tuple(expected.shape)} placed {expected.placements} on ranks {param.mesh.mesh.tolist()}, "
                         f"local {tuple(local_shape)}: load with distribute_tensor(full, p.device_mesh, p.placements), "
                         "or without assign=True (or hvd.load_full_state_dict)")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor; any other tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def free(tensor: torch.Tensor) -> None:
    tensor.untyped_storage().resize_(0)


def refill(tensor: torch.Tensor) -> None:
    needed = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().size() != needed:
        tensor.untyped_storage().resize_(needed)


__all__ = ["ShardedParam", "check_replacement", "free", "local_tensor", "mark_one", "refill", "sharded_as"]

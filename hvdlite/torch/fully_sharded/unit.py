"""One fully sharded unit: its parameters' shards, their full forms, and the unit's two collectives.

Outside its forward and backward a unit's modules hold this rank's shards (``nn.Parameter`` of
shape ``(ceil(rows / N), *rest)``), which are what ``module.parameters()`` and the optimizer see.
To run, the unit all-gathers the shards into full parameters and puts those on the modules; to
reshard it puts the shards back and frees the full parameters' memory (their storage is resized to
zero, so tensors autograd saved keep pointing at them, and the next all-gather refills the same
storage). Gradients reach the full parameters; the unit reduce-scatters them (averaged over the
process set) into the shards' ``.grad``.
"""

from __future__ import annotations

import dataclasses
import enum

import torch

from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ..collectives.async_ops import Handle, allgather_async, reducescatter_async, synchronize
from .layout import UnitLayout


class UnitState(enum.Enum):
    SHARDED = "sharded"
    GATHERING = "gathering"
    UNSHARDED = "unsharded"


@dataclasses.dataclass
class ShardedParam:
    """One parameter of the unit: where it is registered, its shard and its full form."""

    owners: list[tuple[torch.nn.Module, str]]  # (module, attribute) pairs that hold it (tied: several)
    shard: torch.nn.Parameter
    full: torch.nn.Parameter  # storage resized to 0 while the unit is sharded

    def follow_shard(self) -> None:
        """Make the full parameter anew if the shard moved (``to_empty`` after building on ``meta``,
        ``.to(device)``): only between iterations, when autograd holds no reference to it."""
        if self.full.device != self.shard.device or self.full.dtype != self.shard.dtype:
            self.full = torch.nn.Parameter(torch.empty(self.full.shape, dtype=self.shard.dtype, device=self.shard.device),
                                           requires_grad=self.full.requires_grad)

    def put_on_owners(self, tensor: torch.nn.Parameter) -> None:
        for module, attribute in self.owners:
            module._parameters[attribute] = tensor


def _free(tensor: torch.Tensor) -> None:
    tensor.untyped_storage().resize_(0)


def _refill(tensor: torch.Tensor) -> None:
    needed = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().size() != needed:
        tensor.untyped_storage().resize_(needed)


class ShardedUnit:
    """The shards, full parameters and collectives of one ``fully_shard`` call."""

    def __init__(self, module: torch.nn.Module, params: list[ShardedParam], layout: UnitLayout,
                 process_set: ProcessSet, reshard_after_forward: bool) -> None:
        self.module = module
        self.params = params
        self.layout = layout
        self.process_set = process_set
        self.reshard_after_forward = reshard_after_forward
        self.name = type(module).__name__  # replaced by the module's path once the root is known
        self.state = UnitState.SHARDED
        self.requires_gradient_sync = True
        self.forward_prefetch: list[ShardedUnit] | None = None  # explicit lists; None: the recorded order
        self.backward_prefetch: list[ShardedUnit] | None = None
        self._gather: Handle | None = None
        self._reduces: list[Handle] = []  # in flight
        self._reduced = 0  # reduce-scatters started in this backward
        self.root = None  # the ShardedRoot, set at the first forward
        self.ran_with_grad = False  # this iteration's forward ran with autograd on: its backward reduces
        self._trainable = [p for p in params if p.full.requires_grad]

    def adopt_shards(self) -> None:
        """Take the Parameters the modules hold as the shards (after ``Module._apply`` replaced them)."""
        for param in self.params:
            module, attribute = param.owners[0]
            current = module._parameters[attribute]
            if current is not param.shard:
                current._hvdlite_fully_sharded = True
                param.shard = current
                param.put_on_owners(current)

    # ---- all-gather ------------------------------------------------------------------------------
    def unshard(self) -> None:
        """Start gathering the full parameters (no-op if gathered or on the way)."""
        if self.state is not UnitState.SHARDED:
            return
        if not self.params:  # a root whose blocks hold every parameter
            self.state = UnitState.UNSHARDED
            return
        with torch.no_grad():
            packed = self.layout.pack_shards([p.shard.detach() for p in self.params])
        self._gather = allgather_async(packed, name=f"fully_shard.{self.name}.allgather",
                                       process_set=self.process_set)
        self.state = UnitState.GATHERING

    def wait_unshard(self) -> None:
        """Finish the all-gather and put the full parameters on the modules."""
        self.unshard()
        if self.state is UnitState.GATHERING:
            gathered = synchronize(self._gather)
            self._gather = None
            with torch.no_grad():
                for param in self.params:
                    param.follow_shard()
                    _refill(param.full)
                # through .data: no version bump, so the tensors autograd saved from it stay valid
                self.layout.copy_full(gathered, [param.full.data for param in self.params])
            self.state = UnitState.UNSHARDED
        for param in self.params:
            param.put_on_owners(param.full)

    def reshard(self) -> None:
        """Put the shards back on the modules and free the full parameters' memory."""
        if self.state is UnitState.GATHERING:
            self.wait_unshard()
        if self.state is UnitState.UNSHARDED:
            for param in self.params:
                param.put_on_owners(param.shard)
                _free(param.full)
            self.state = UnitState.SHARDED

    # ---- reduce-scatter --------------------------------------------------------------------------
    def reduce_gradients(self) -> None:
        """Start reduce-scattering the full gradients accumulated so far (zeros where a parameter got
        none), unless gradient sync is off (they keep accumulating) or there is nothing new to send.

        Usually once per backward (:meth:`end_backward` starts the count again); a unit whose forward ran twice reduces after each backward pass
        through it (each reduce-scatter is named by its count, the same on every rank).
        """
        if not self._trainable or not self.requires_gradient_sync:
            return
        grads = [p.full.grad if p.full.requires_grad else None for p in self.params]
        if self._reduced and all(g is None for g in grads):
            return
        first = self._trainable[0].shard
        packed = self.layout.pack_gradients(grads, first.dtype, first.device)
        for param in self._trainable:
            param.full.grad = None
        name = f"fully_shard.{self.name}.reducescatter" + (f".{self._reduced}" if self._reduced else "")
        self._reduced += 1
        self._reduces.append(reducescatter_async(packed, name=name, op=ReduceOp.AVERAGE, process_set=self.process_set))

    def end_backward(self) -> None:
        """Land what is in flight and start the next iteration's count."""
        self.land_gradients()
        self._reduced = 0
        self.ran_with_grad = False

    @property
    def reducing(self) -> bool:
        """True while a reduce-scatter of this unit's gradients is in flight."""
        return bool(self._reduces)

    def land_gradients(self) -> None:
        """Wait for the reduce-scatters in flight and add their results to the shards' gradients."""
        for handle in self._reduces:
            reduced = synchronize(handle)
            for param, piece in zip(self.params, self.layout.split_shards(reduced), strict=True):
                if not param.shard.requires_grad:
                    continue
                if param.shard.grad is None:
                    param.shard.grad = piece
                else:
                    param.shard.grad += piece
        self._reduces.clear()


__all__ = ["ShardedParam", "ShardedUnit", "UnitState"]

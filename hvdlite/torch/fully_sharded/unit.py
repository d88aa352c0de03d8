"""One fully sharded unit: its parameters' shards, their full forms, and the unit's two collectives.

Outside its forward and backward a unit's modules hold this rank's shards: ``nn.Parameter``
DTensors, ``Shard(0)`` on the unit's device mesh, whose local tensors are this rank's rows (FSDP2's
parameters); they are what ``module.parameters()``, the optimizer and torch's own tools see.
To run, the unit all-gathers the shards into full parameters and puts those on the modules; to
reshard it puts the shards back and frees the full parameters' memory (their storage is resized to
zero, so tensors autograd saved keep pointing at them, and the next all-gather refills the same
storage). Gradients reach the full parameters; the unit reduce-scatters them (averaged over the
process set) into the shards' ``.grad``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum

import torch

from ...ops import ReduceOp
from ...process_sets import ProcessSet
from ..collectives.async_ops import Handle, allgather_async, allreduce_async, reducescatter_async, synchronize
from . import stale
from .layout import UnitLayout, common_dtype
from .param import ShardedParam, check_replacement, free, local_tensor, mark_one, refill


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """The dtypes of a unit's mixed precision (FSDP2's ``MixedPrecisionPolicy``): full parameters
    (compute and all-gather) in ``param_dtype``, gradients reduce-scattered in ``reduce_dtype``
    (default: ``param_dtype``), floating outputs cast to ``output_dtype``, floating inputs cast to
    ``param_dtype`` if ``cast_forward_inputs``. ``None``: the shards' dtype. Shards stay as built
    (fp32), so the optimizer steps full-precision parameters."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


@dataclasses.dataclass(frozen=True)
class UnitOptions:
    """How one unit shards and communicates (``fully_shard``'s arguments)."""

    process_set: ProcessSet
    reshard_after_forward: bool = True
    precision: MixedPrecisionPolicy = MixedPrecisionPolicy()
    replicate_process_set: ProcessSet | None = None  # hybrid: the shards averaged across these ranks too
    reshard_group: ProcessSet | None = None  # after forward, keep 1/G of the unit, sharded within these G ranks


class UnitState(enum.Enum):
    SHARDED = "sharded"
    GROUP_SHARDED = "sharded within its group"  # between forward and backward, reshard_after_forward=G
    GATHERING = "gathering"
    UNSHARDED = "unsharded"


class ShardedUnit:
    """The shards, full parameters and collectives of one ``fully_shard`` call."""

    def __init__(self, module: torch.nn.Module, params: list[ShardedParam], layout: UnitLayout,
                 options: UnitOptions) -> None:
        self.module = module
        self.params = params
        self.process_set = options.process_set
        self.replicate_process_set = options.replicate_process_set
        self.precision = options.precision
        self.reshard_after_forward = options.reshard_after_forward
        self.reshard_group = options.reshard_group
        self.group_layout: UnitLayout | None = None
        self._group_rows: torch.Tensor | None = None  # this rank's 1/G of the unit, kept for backward
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
        self.in_backward = False  # between this unit's pre-backward and post-backward
        self.inputs_need_grad = False  # this forward's inputs (some of them) require grad
        self.hidden_hook = None  # the gradient hook of a unit whose output hides its tensors (root.py)
        self.warned_hidden = False
        self.lifted: list[ShardedParam] = []  # parameters tied across units, waiting for a unit holding every use
        self._take_layout(layout)
        for param in params:
            param.holder = self

    def _take_layout(self, layout: UnitLayout) -> None:
        self.layout = self._gather_layout = layout  # (the gather layout: the one of the all-gather in flight)
        self.group_layout = None if self.reshard_group is None else UnitLayout.plan(
            [(p.name, p.shape) for p in layout.params], self.reshard_group.size())
        self.trainable = [p for p in self.params if p.full.requires_grad]

    def release(self, param: ShardedParam) -> None:
        """Give up ``param`` (tied across units: another unit takes it); before the first forward only,
        while nothing of this unit is gathered or in flight."""
        if self.root is not None or self.state is not UnitState.SHARDED:
            raise ValueError(f"fully_shard: unit '{self.name}' has already run; a parameter it holds is tied to "
                             "another module: call fully_shard on every module before the first forward")
        kept = [(p, layout) for p, layout in zip(self.params, self.layout.params, strict=True) if p is not param]
        self.params = [p for p, _ in kept]
        self._take_layout(UnitLayout.plan([(layout.name, layout.shape) for _, layout in kept], self.layout.ranks))
        param.holder = None

    def __deepcopy__(self, memo: dict) -> ShardedUnit:
        """``copy.deepcopy(model)`` (an EMA or teacher model): a sharded model of its own, with copies
        of this rank's shards; taken with the unit sharded (it is resharded first), between iterations."""
        if self._reduces or self.in_backward:
            raise RuntimeError(f"fully_shard: copy.deepcopy of unit '{self.name}' during its backward; copy the model "
                               "between iterations")
        self.reshard()
        result = ShardedUnit.__new__(ShardedUnit)
        memo[id(self)] = result
        immutable = {"layout", "group_layout", "_gather_layout", "precision", "process_set", "replicate_process_set",
                     "reshard_group"}
        for key, value in self.__dict__.items():
            setattr(result, key, value if key in immutable else copy.deepcopy(value, memo))
        return result

    def adopt_shards(self, by: str = "_apply (to_empty, .to)") -> None:
        """Take the Parameters the modules hold as the shards, after ``by`` replaced them
        (``Module._apply`` on a plain tensor, ``load_state_dict(assign=True)``); a replacement must
        be placed as the shard was (FSDP2's ``distribute_tensor(full, p.device_mesh, p.placements)``)."""
        rank = self.process_set.rank()
        for param, layout in zip(self.params, self.layout.params, strict=True):
            module, attribute = param.owners[0]
            current = module._parameters[attribute]
            if current is param.shard:
                continue
            check_replacement(current, param, layout.local_shape(rank), f"{layout.name} ({by})")
            stale.mark_replaced(param.shard, f"{type(module).__name__}.{by} replaced this shard")
            current._hvdlite_fully_sharded = True
            mark_one(current, param)
            param.shard = current
            param.put_on_owners(current)

    # ---- all-gather ------------------------------------------------------------------------------
    def unshard(self) -> None:
        """Start gathering the full parameters (no-op if gathered or on the way)."""
        if self.state is UnitState.GROUP_SHARDED:  # backward: gather within the group (a host) only
            self._gather, self._gather_layout = allgather_async(
                self._group_rows, name=f"fully_shard.{self.name}.group_allgather",
                process_set=self.reshard_group), self.group_layout
            self.state = UnitState.GATHERING
            return
        if self.state is not UnitState.SHARDED:
            return
        if not self.params:  # a root whose blocks hold every parameter
            self.state = UnitState.UNSHARDED
            return
        with torch.no_grad():
            packed = self.layout.pack_shards([p.local.detach() for p in self.params], self.precision.param_dtype)
        self._gather = allgather_async(packed, name=f"fully_shard.{self.name}.allgather",
                                       process_set=self.process_set)
        self._gather_layout = self.layout
        self.state = UnitState.GATHERING

    def wait_unshard(self) -> None:
        """Finish the all-gather and put the full parameters on the modules."""
        self.unshard()
        if self.state is UnitState.GATHERING:
            gathered = synchronize(self._gather)
            self._gather = None
            with torch.no_grad():
                for param in self.params:
                    param.follow_shard(self.precision.param_dtype)
                    refill(param.full)
                self._follow_requires_grad()
                gathered = gathered.to(self.params[0].full.device)  # offloaded: one host-to-device copy
                # through .data: no version bump, so the tensors autograd saved from it stay valid
                self._gather_layout.copy_full(gathered, [param.full.data for param in self.params])
            self._group_rows = None
            self.state = UnitState.UNSHARDED
        for param in self.params:
            param.put_on_owners(param.full)

    def _follow_requires_grad(self) -> None:
        """A shard frozen or unfrozen after ``fully_shard`` (``requires_grad_`` on ``model.parameters()``):
        its full parameter follows, so autograd computes the gradients the shards want (an unfrozen
        shard would otherwise get zeros for ever)."""
        changed = [param for param in self.params if param.full.requires_grad != param.shard.requires_grad]
        for param in changed:
            param.full.requires_grad_(param.shard.requires_grad)
        if changed:
            self.trainable = [param for param in self.params if param.full.requires_grad]

    def gather_copies(self) -> list[torch.Tensor]:
        """New whole tensors of the unit's parameters, gathered from the shards in their own dtype
        (not the compute dtype of mixed precision); the unit's state is left as it is."""
        with torch.no_grad():
            packed = self.layout.pack_shards([p.local.detach() for p in self.params])
        gathered = synchronize(allgather_async(packed, name=f"fully_shard.{self.name}.copies",
                                               process_set=self.process_set))
        copies = [torch.empty(layout.shape, dtype=p.shard.dtype) for layout, p in zip(self.layout.params, self.params,
                                                                                      strict=True)]
        self.layout.copy_full(gathered.cpu(), copies)
        return copies

    def reshard(self) -> None:
        """Put the shards back on the modules and free the full parameters' memory."""
        if self.state is UnitState.GATHERING:
            self.wait_unshard()
        if self.state is UnitState.UNSHARDED:
            self._put_shards_back()
        self._group_rows = None
        self.state = UnitState.SHARDED

    def reshard_for_backward(self) -> None:
        """After forward: reshard, or with a reshard group keep this rank's 1/G of the full
        parameters (in the compute dtype), so backward gathers within the group."""
        if self.reshard_group is None or self.state is not UnitState.UNSHARDED:
            self.reshard()
            return
        rank = self.reshard_group.rank()
        with torch.no_grad():
            rows = [layout.shard_of(p.full.detach(), rank) for layout, p in zip(self.group_layout.params, self.params,
                                                                                   strict=True)]
            self._group_rows = self.group_layout.pack_shards(rows)
        self._put_shards_back()
        self.state = UnitState.GROUP_SHARDED

    def abandon(self, layout: UnitLayout | None = None) -> None:
        """After a peer's death: forget the collectives in flight (their world is gone), hold the
        shards again, drop gradients, and take ``layout`` (the world's size changed) if given."""
        self._gather, self._group_rows = None, None
        self._reduces.clear()
        self._reduced, self.ran_with_grad, self.in_backward = 0, False, False
        self._put_shards_back()
        self.state = UnitState.SHARDED
        for param in self.params:
            param.full.grad = param.shard.grad = None
        if layout is not None:
            self.layout = self._gather_layout = layout
        if self.root is not None:
            self.root.backward_queued = False

    def _put_shards_back(self) -> None:
        for param in self.params:
            param.put_on_owners(param.shard)
            free(param.full)

    # ---- reduce-scatter --------------------------------------------------------------------------
    def reduce_gradients(self) -> None:
        """Start reduce-scattering the full gradients accumulated so far (zeros where a parameter got
        none), unless gradient sync is off (they keep accumulating) or there is nothing new to send.

        Usually once per backward (:meth:`end_backward` starts the count again); a unit whose forward
        ran twice reduces after each backward pass through it (each reduce-scatter is named by its
        count, the same on every rank).
        """
        if not self.trainable or not self.requires_gradient_sync:
            return
        grads = [p.full.grad if p.full.requires_grad else None for p in self.params]
        if self._reduced and all(g is None for g in grads):
            return
        first = self.trainable[0]
        # FSDP2's default: the compute dtype (one holding each trainable parameter's, if they differ)
        dtype = self.precision.reduce_dtype or common_dtype(p.full.dtype for p in self.trainable)
        # Packed where the gradients are; offloaded, moved to the shards' (host) memory in one copy.
        packed = self.layout.pack_gradients(grads, dtype, first.full.device).to(first.local.device)
        for param in self.trainable:
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
        for count, handle in enumerate(self._reduces):
            reduced = synchronize(handle)
            if self.replicate_process_set is not None:  # hybrid: average the shard across the replicas
                reduced = synchronize(allreduce_async(reduced, name=f"fully_shard.{self.name}.replicas.{count}",
                                                      op=ReduceOp.AVERAGE, process_set=self.replicate_process_set))
            rank = self.process_set.rank()
            for param, layout, piece in zip(self.params, self.layout.params, self.layout.split_shards(reduced),
                                            strict=True):
                if not param.shard.requires_grad:
                    continue
                # reduced in reduce_dtype, kept as the shard's (fp32)
                piece = layout.local_view(piece, rank).to(param.shard.dtype)
                if param.shard.grad is None:
                    # Its own tensor, not a view into the unit's buffer: a DTensor over a view that does
                    # not start its storage has a data pointer, and copy.deepcopy then fails on it (and
                    # one view left would keep the whole buffer alive beside the copies).
                    in_buffer = piece.untyped_storage().data_ptr() == reduced.untyped_storage().data_ptr()
                    param.shard.grad = param.as_dtensor(piece.clone() if in_buffer else piece)
                else:
                    local_tensor(param.shard.grad).add_(piece)
        self._reduces.clear()


__all__ = ["MixedPrecisionPolicy", "ShardedUnit", "UnitOptions", "UnitState"]

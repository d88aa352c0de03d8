"""The hooks that drive a fully sharded model's units through forward and backward.

The root is the outermost unit whose forward runs (found at the first forward, as FSDP2 finds it);
it knows every unit under it, names each by its module path (so a collective's name says which
unit it is) and records the order in which the units' forwards run, which is the order the next
iterations prefetch in: the next unit's all-gather starts when a unit's forward starts, the
previous unit's when its backward starts.

- Before a unit's forward: gather it (or finish the prefetched gather), start the next one's, and
  wrap the forward's tensor inputs in :class:`_PostBackward`, whose backward runs once the unit's
  whole backward has (autograd runs a node only after every node created later that feeds it).
- After a unit's forward: hook the outputs, so the unit is gathered again before its backward
  starts; then reshard (not the root, which backward needs at once, nor with
  ``reshard_after_forward=False``).
- After a unit's backward: reduce-scatter its gradients, reshard, and land the previous unit's
  reduce-scatter (so one unit's reduction overlaps the next unit's backward, and no more are held).
- A forward inside a unit's backward (activation checkpointing recomputing it) keeps the gathered
  parameters and prefetches nothing: the backward about to run needs them.
- At the end of backward (a callback autograd runs once per backward): units whose inputs needed
  no gradient (the first layer) reduce here; every reduce-scatter is waited for, gradients land on
  the shards, and every unit is sharded again.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .unit import ShardedUnit


def _cast_floats(tree: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


class _PostBackward(torch.autograd.Function):
    """Identity on a unit's inputs; its backward is the unit's post-backward."""

    @staticmethod
    def forward(ctx: Any, unit: ShardedUnit, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.unit = unit
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.unit.root.post_backward(ctx.unit)
        return (None, *grads)


class ShardedRoot:
    """Every unit of one fully sharded model and the state of the current iteration."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.units: list[ShardedUnit] = []
        for path, sub in module.named_modules():
            unit = getattr(sub, "_hvdlite_unit", None)
            if unit is not None and unit.root is None:
                unit.root, unit.name = self, path or "root"
                self.units.append(unit)
        self.order: list[ShardedUnit] = []  # the forward order, recorded in the first iteration
        self.recording = True
        self.backward_queued = False

    # ---- forward ---------------------------------------------------------------------------------
    def pre_forward(self, unit: ShardedUnit, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self.recording and unit not in self.order:
            self.order.append(unit)
        unit.ran_with_grad |= torch.is_grad_enabled()
        unit.wait_unshard()
        if not unit.in_backward:  # (a forward inside backward recomputes activations: nothing to prefetch)
            for following in self._forward_prefetch(unit):
                following.unshard()
        if unit.precision.param_dtype is not None and unit.precision.cast_forward_inputs:
            args, kwargs = _cast_floats((args, kwargs), unit.precision.param_dtype)
        unit.inputs_need_grad = False
        if not torch.is_grad_enabled():
            return args, kwargs
        flat, _ = tree_flatten((args, kwargs))
        needing = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]
        if not needing:
            return args, kwargs
        unit.inputs_need_grad = True
        wrapped = dict(zip(map(id, needing), _PostBackward.apply(unit, *needing), strict=True))
        return tree_map(lambda t: wrapped.get(id(t), t) if isinstance(t, torch.Tensor) else t, (args, kwargs))

    def post_forward(self, unit: ShardedUnit, output: Any) -> Any:
        """Hook the outputs for the pre-backward and reshard; returns the outputs (cast to the
        unit's ``output_dtype`` if it has one)."""
        if unit.precision.output_dtype is not None:
            output = _cast_floats(output, unit.precision.output_dtype)
        if unit.in_backward:
            # Activation checkpointing recomputing this unit's forward in its backward: the backward
            # about to run needs the full parameters, and its hooks are already in place (FSDP2 does the same).
            return output
        grad = torch.is_grad_enabled()
        flat, _ = tree_flatten(output)
        needing = [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad]
        if grad and needing:
            torch.autograd.graph.register_multi_grad_hook(needing, lambda _: self.pre_backward(unit), mode="any")
        # No tensor in sight (a class pytree does not know, or None): a backward may still come.
        hidden = grad and bool(unit.trainable or unit.inputs_need_grad) and not any(
            isinstance(t, torch.Tensor) for t in flat)
        if hidden:
            self._keep_for_hidden_backward(unit, output)
        if unit.module is self.module:
            self.recording = False
            if not (grad and needing) and not hidden:  # no backward follows: shard everything now
                for each in self.units:
                    each.reshard()
        elif unit.reshard_after_forward and grad and not hidden:
            unit.reshard_for_backward()
        elif unit.reshard_after_forward and not grad:
            unit.reshard()  # evaluation: no backward will want the 1/G a reshard group keeps
        return output

    def _keep_for_hidden_backward(self, unit: ShardedUnit, output: Any) -> None:
        """A unit whose output hides its tensors from pytree (a class it does not know) cannot have
        its pre-backward hooked there, yet a backward may come through it: keep its full parameters
        (freeing them would let that backward read freed memory) and start its backward's business
        when the first of its gradients arrives."""
        if not unit.warned_hidden:
            unit.warned_hidden = True
            warnings.warn(f"fully_shard: unit '{unit.name}' returned a {type(output).__name__}, in which no tensor "
                          "is visible to torch.utils._pytree: its full parameters stay gathered until its backward. "
                          "Return tensors (or lists, tuples, dicts, or a registered pytree node) to free them after "
                          "forward", stacklevel=4)
        if unit.hidden_hook is not None:
            unit.hidden_hook.remove()
        fulls = [param.full for param in unit.trainable]
        unit.hidden_hook = None if not fulls else torch.autograd.graph.register_multi_grad_hook(
            fulls, lambda _: self.pre_backward(unit), mode="any")

    def _forward_prefetch(self, unit: ShardedUnit) -> list[ShardedUnit]:
        if unit.forward_prefetch is not None:
            return unit.forward_prefetch
        if self.recording or unit not in self.order:
            return []
        index = self.order.index(unit)
        return self.order[index + 1:index + 2]

    # ---- backward --------------------------------------------------------------------------------
    def pre_backward(self, unit: ShardedUnit) -> None:
        if not self.backward_queued:
            self.backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_backward)
        unit.in_backward = True
        unit.wait_unshard()
        for previous in self._backward_prefetch(unit):
            previous.unshard()

    def _backward_prefetch(self, unit: ShardedUnit) -> list[ShardedUnit]:
        if unit.backward_prefetch is not None:
            return unit.backward_prefetch
        if unit not in self.order:
            return []
        index = self.order.index(unit)
        return self.order[index - 1:index] if index > 0 else []

    def post_backward(self, unit: ShardedUnit) -> None:
        unit.in_backward = False
        if unit.ran_with_grad:
            unit.reduce_gradients()
        unit.reshard()
        # At most two reduce-scatters in flight: each holds a unit-sized input and output, and all of
        # them together would be a model-sized buffer by the end of backward.
        for other in self.units:
            if other is not unit and other.reducing:
                other.land_gradients()

    def finish_backward(self) -> None:
        """Once per backward: reduce what is left, wait for every reduce-scatter, shard everything."""
        self.backward_queued = False
        for unit in self.units:
            if unit.ran_with_grad:
                unit.reduce_gradients()
        for unit in self.units:
            unit.end_backward()
            unit.reshard()
            unit.in_backward = False
            if unit.hidden_hook is not None:
                unit.hidden_hook.remove()
                unit.hidden_hook = None


__all__ = ["ShardedRoot"]

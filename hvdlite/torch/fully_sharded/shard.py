"""``fully_shard``: turn a module into one fully sharded unit (FSDP2's call, on hvdlite's core)."""

from __future__ import annotations

from typing import Any

import torch

from ...process_sets import ProcessSet, global_process_set
from .layout import UnitLayout
from .root import ShardedRoot
from .unit import ShardedParam, ShardedUnit


class FullyShardedModule:
    """What ``fully_shard`` adds to a module's class (as FSDP2's ``FSDPModule``)."""

    _hvdlite_unit: ShardedUnit

    def unshard(self) -> None:
        """Gather this unit's full parameters now (e.g. to read them outside forward)."""
        self._hvdlite_unit.wait_unshard()

    def reshard(self) -> None:
        """Free this unit's full parameters and put its shards back on the module."""
        self._hvdlite_unit.reshard()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to(), .to_empty(), .double() may replace a shard with a new Parameter (meta -> cpu does):
        # the unit adopts what the module holds afterwards.
        self._hvdlite_unit.reshard()
        result = super()._apply(fn, recurse)
        self._hvdlite_unit.adopt_shards()
        return result

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """With False, backward keeps full local gradients (memory of the unsharded gradients) and
        reduce-scatters nothing; the next backward with True reduces everything accumulated."""
        for unit in _units_under(self) if recurse else [self._hvdlite_unit]:
            unit.requires_gradient_sync = requires_gradient_sync

    def set_modules_to_forward_prefetch(self, modules: list[FullyShardedModule]) -> None:
        """Units whose all-gather starts when this unit's forward starts (default: the next one)."""
        self._hvdlite_unit.forward_prefetch = [_unit_of(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list[FullyShardedModule]) -> None:
        """Units whose all-gather starts when this unit's backward starts (default: the previous one)."""
        self._hvdlite_unit.backward_prefetch = [_unit_of(m) for m in modules]


def _unit_of(module: Any) -> ShardedUnit:
    unit = getattr(module, "_hvdlite_unit", None)
    if unit is None:
        raise ValueError(f"{type(module).__name__} is not fully sharded: call fully_shard on it first")
    return unit


def _units_under(module: torch.nn.Module) -> list[ShardedUnit]:
    return [m._hvdlite_unit for m in module.modules() if getattr(m, "_hvdlite_unit", None) is not None]


_CLASSES: dict[type, type] = {}


def _sharded_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"FullySharded{cls.__name__}", (FullyShardedModule, cls), {})
    return _CLASSES[cls]


def _own_parameters(module: torch.nn.Module) -> dict[int, tuple[str, list[tuple[torch.nn.Module, str]], torch.nn.Parameter]]:
    """This unit's parameters: those under ``module`` that no unit inside it holds, each once with
    every (module, attribute) that registers it; keyed by identity, in registration order."""
    inner = {id(m) for sub in module.modules() if sub is not module and hasattr(sub, "_hvdlite_unit")
             for m in sub.modules()}
    found: dict[int, tuple[str, list[tuple[torch.nn.Module, str]], torch.nn.Parameter]] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        if id(sub) in inner:
            continue
        for attribute, param in sub._parameters.items():
            if param is None:
                continue
            if getattr(param, "_hvdlite_fully_sharded", False):
                raise ValueError(f"fully_shard: parameter '{path + '.' if path else ''}{attribute}' is already a shard "
                                 "of another unit (tied across units); tied parameters must be in one unit: "
                                 "call fully_shard on a module that holds every place they are used")
            entry = found.setdefault(id(param), (f"{path + '.' if path else ''}{attribute}", [], param))
            if (sub, attribute) not in entry[1]:
                entry[1].append((sub, attribute))
    return found


def _check_arguments(process_set: ProcessSet, reshard_after_forward: Any, mp_policy: Any, offload: Any) -> None:
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"fully_shard: reshard_after_forward={reshard_after_forward!r}: only True or False are "
                         "supported so far (resharding to groups of ranks is not)")
    if mp_policy is not None or offload is not None:
        raise ValueError("fully_shard: mp_policy and offload are not supported yet; leave them None")
    if not process_set.included():
        raise ValueError(f"fully_shard: this rank is not in {process_set}")


def fully_shard(module: torch.nn.Module, *, process_set: ProcessSet = global_process_set,
                reshard_after_forward: bool = True, mp_policy: Any = None, offload: Any = None) -> torch.nn.Module:
    """Shard ``module``'s parameters over ``process_set``: one unit, one all-gather, one reduce-scatter.

    Call it bottom-up, as FSDP2's ``fully_shard``: on each block, then on the whole model (which
    takes the parameters no block holds). Afterwards each parameter is this rank's shard (rows
    ``[r*c, (r+1)*c)`` of dimension 0, ``c = ceil(rows / N)``, zero-padded), so
    ``module.parameters()`` feeds any element-wise ``torch.optim`` optimizer and its state is
    sharded too; no optimizer wrapper is needed (``hvd.DistributedOptimizer`` leaves shards alone).
    Before the unit's forward and backward its full parameters are gathered; after them they are
    freed (``reshard_after_forward=False`` keeps them from forward to backward). Gradients are
    reduce-scattered as soon as the unit's backward is done, averaged over the set, into the
    shards' ``.grad``. Returns ``module``, whose class now also has :class:`FullyShardedModule`'s
    methods.
    """
    _check_arguments(process_set, reshard_after_forward, mp_policy, offload)
    if hasattr(module, "_hvdlite_unit"):
        raise ValueError(f"fully_shard: {type(module).__name__} is already fully sharded")
    rank, size = process_set.rank(), process_set.size()
    own = list(_own_parameters(module).values())
    layout = UnitLayout.plan([(name, param.shape) for name, _, param in own], size)
    params = []
    for (_name, owners, param), param_layout in zip(own, layout.params, strict=True):
        with torch.no_grad():
            shard = torch.nn.Parameter(param_layout.shard_of(param.detach(), rank), requires_grad=param.requires_grad)
        shard._hvdlite_fully_sharded = True
        full = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=param.device),
                                  requires_grad=param.requires_grad)
        if full.device.type != "meta":
            full.untyped_storage().resize_(0)
        sharded = ShardedParam(owners, shard, full)
        sharded.put_on_owners(shard)
        params.append(sharded)
    unit = ShardedUnit(module, params, layout, process_set, reshard_after_forward)
    module._hvdlite_unit = unit
    module.__class__ = _sharded_class(type(module))
    module.register_forward_pre_hook(_pre_forward, with_kwargs=True, prepend=True)
    module.register_forward_hook(_post_forward)
    return module


def _pre_forward(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    unit = module._hvdlite_unit
    if unit.root is None:
        ShardedRoot(module)
    return unit.root.pre_forward(unit, args, kwargs)


def _post_forward(module: torch.nn.Module, _args: tuple, output: Any) -> None:
    unit = module._hvdlite_unit
    unit.root.post_forward(unit, output)


__all__ = ["FullyShardedModule", "fully_shard"]

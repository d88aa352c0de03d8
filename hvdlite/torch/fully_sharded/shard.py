"""``fully_shard``: turn a module into one fully sharded unit (FSDP2's call, on hvdlite's core)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from ...errors import ProcessSetError
from ...lifecycle import add_process_set
from ...objects import allgather_object
from ...process_sets import ProcessSet, global_process_set
from . import stale, ties
from .layout import UnitLayout
from .mesh import mesh_device_type, mesh_for
from .param import ShardedParam
from .root import ShardedRoot
from .unit import MixedPrecisionPolicy, ShardedUnit, UnitOptions


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


Found = dict[int, tuple[str, list[tuple[torch.nn.Module, str]], torch.nn.Parameter]]


def _own_parameters(module: torch.nn.Module) -> tuple[Found, dict[int, tuple[list, ShardedParam]]]:
    """This unit's parameters: those under ``module`` that no unit inside it holds, each once with
    every (module, attribute) that registers it; keyed by identity, in registration order. Those that
    another unit already sharded (tied across units) come apart, by the sharded parameter."""
    inner = {id(m) for sub in module.modules() if sub is not module and hasattr(sub, "_hvdlite_unit")
             for m in sub.modules()}
    found: Found = {}
    tied: dict[int, tuple[list, ShardedParam]] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        if id(sub) in inner:
            continue
        for attribute, param in sub._parameters.items():
            if param is None:
                continue
            sharded = ties.sharded_as(param)
            owners = (tied.setdefault(id(sharded), ([], sharded))[0] if sharded is not None
                      else found.setdefault(id(param), (f"{path + '.' if path else ''}{attribute}", [], param))[1])
            if (sub, attribute) not in owners:
                owners.append((sub, attribute))
    return found, tied


def _check_arguments(process_set: ProcessSet, reshard_after_forward: Any, mp_policy: Any, offload: Any) -> None:
    size = process_set.size()
    if not isinstance(reshard_after_forward, int) or (
            not isinstance(reshard_after_forward, bool) and not (0 < reshard_after_forward <= size
                                                                  and size % reshard_after_forward == 0)):
        raise ValueError(f"fully_shard: reshard_after_forward={reshard_after_forward!r}: True, False, or a number of "
                         f"ranks that divides the process set's {size}")
    if not (offload is None or offload == "cpu" or type(offload).__name__ == "CPUOffloadPolicy"):
        raise ValueError(f"fully_shard: offload={offload!r}: None, 'cpu', or FSDP2's CPUOffloadPolicy()")
    if mp_policy is not None:
        dtypes = {name: getattr(mp_policy, name, "missing") for name in ("param_dtype", "reduce_dtype")}
        dtypes["output_dtype"] = getattr(mp_policy, "output_dtype", None)
        bad = {name: value for name, value in dtypes.items()
               if not (value is None or (isinstance(value, torch.dtype) and value.is_floating_point))}
        if bad:
            raise ValueError(f"fully_shard: mp_policy {bad}: param_dtype, reduce_dtype and output_dtype must be "
                             "floating torch dtypes or None (hvd.MixedPrecisionPolicy, or FSDP2's)")
    if not process_set.included():
        raise ValueError(f"fully_shard: this rank is not in {process_set}")


_GROUPS: dict[tuple[int, ...], ProcessSet] = {}  # the reshard groups registered so far, by their ranks


def _reshard_group(process_set: ProcessSet, reshard_after_forward: bool | int) -> tuple[bool, ProcessSet | None]:
    """(reshard after forward at all, the set of G ranks this rank reshards to for backward)."""
    if isinstance(reshard_after_forward, bool):  # (before the int test: True == 1 in Python)
        return reshard_after_forward, None
    if reshard_after_forward in (1, process_set.size()):  # keep all of it; or 1/N, as True does
        return reshard_after_forward == process_set.size(), None
    width, ranks = reshard_after_forward, process_set.ranks
    for start in range(0, len(ranks), width):  # every rank registers every group, in the same order
        members = tuple(ranks[start:start + width])
        if members not in _GROUPS:
            try:
                _GROUPS[members] = add_process_set(list(members))
            except ProcessSetError as error:
                raise ProcessSetError(f"fully_shard(reshard_after_forward={width}) registers a process set per "
                                      f"group of {width} ranks: {error}") from error
    mine = process_set.rank() // width * width
    return True, _GROUPS[tuple(ranks[mine:mine + width])]


def _check_replicas(process_set: ProcessSet, replicas: ProcessSet | None) -> None:
    """Hybrid sharding needs this rank in both sets, and a replica set that crosses the shard set
    once (its ranks hold the same shards only if they have the same place in sets of one size)."""
    if replicas is None:
        return
    if not replicas.included():
        raise ValueError(f"fully_shard: this rank is not in replicate_process_set {replicas}")
    shared = set(replicas.ranks or []) & set(process_set.ranks or [])
    if len(shared) != 1:
        raise ValueError(f"fully_shard: replicate_process_set {replicas} and process_set {process_set} share ranks "
                         f"{sorted(shared)}; they must cross in exactly this rank (shard within a set of ranks, "
                         "replicate across such sets)")
    places = allgather_object((process_set.rank(), process_set.size()), name="fully_shard.replicas", process_set=replicas)
    if len(set(places)) != 1:
        raise ValueError(f"fully_shard: the ranks of replicate_process_set {replicas} have (rank, size) {places} in "
                         "their process_set; replicas must hold the same shard: the same place in sets of one size")


def fully_shard(module: torch.nn.Module, *, process_set: ProcessSet = global_process_set,
                reshard_after_forward: bool | int = True, mp_policy: Any = None, offload: Any = None,
                replicate_process_set: ProcessSet | None = None) -> torch.nn.Module:
    """Shard ``module``'s parameters over ``process_set``: one unit, one all-gather, one reduce-scatter.

    Call it bottom-up, as FSDP2's ``fully_shard``: on each block, then on the whole model (which
    takes the parameters no block holds). Afterwards each parameter is this rank's shard (rows
    ``[r*c, (r+1)*c)`` of dimension 0, ``c = ceil(rows / N)``, zero-padded), so
    ``module.parameters()`` feeds any element-wise ``torch.optim`` optimizer and its state is
    sharded too; no optimizer wrapper is needed (``hvd.DistributedOptimizer`` leaves shards alone).
    Before the unit's forward and backward its full parameters are gathered; after them they are
    freed (``reshard_after_forward=False`` keeps them from forward to backward; an int G keeps 1/G,
    sharded within groups of G consecutive ranks of the set, e.g. a host's, so backward gathers there;
    it registers those groups as process sets, which needs ``init(process_sets="dynamic")``). ``mp_policy``
    (:class:`MixedPrecisionPolicy`, or FSDP2's) gathers and computes in ``param_dtype`` and
    reduce-scatters in ``reduce_dtype``; the shards, which the optimizer steps, stay fp32. Gradients are
    reduce-scattered as soon as the unit's backward is done, averaged over the set, into the
    shards' ``.grad``. With ``replicate_process_set`` (hybrid sharding, FSDP2's HSDP) the shards are
    also averaged across that set, whose ranks hold the same shards: shard within a host (the
    all-gathers stay on its shared memory), replicate across hosts (only 1/N of the gradients cross
    the network). ``offload="cpu"`` (or FSDP2's ``CPUOffloadPolicy()``) keeps the shards, their
    gradients and the optimizer's state in host memory and computes on the GPU the parameters were
    on (the current CUDA device for a model built on the CPU or ``meta``; without CUDA it changes
    nothing). Returns ``module``, whose class now also has :class:`FullyShardedModule`'s methods.
    """
    _check_arguments(process_set, reshard_after_forward, mp_policy, offload)
    stale.watch_optimizers()
    _check_replicas(process_set, replicate_process_set)
    if hasattr(module, "_hvdlite_unit"):
        raise ValueError(f"fully_shard: {type(module).__name__} is already fully sharded")
    found, tied = _own_parameters(module)
    own = list(found.values())
    taken, lifted = ties.take_ties(module, tied, process_set,
                                   lambda param: None if offload is None else _compute_device(param.full))
    layout = UnitLayout.plan([(name, param.shape) for name, _, param in own]
                             + [(name, param.full.shape) for name, param in taken], process_set.size())
    mesh = _unit_mesh(own, taken, offload, process_set, replicate_process_set)
    params = [_shard_parameter(owners, param, param_layout.local_of(param.detach(), process_set.rank()), process_set,
                               mesh, _compute_device(param) if offload is not None else None)
              for (_name, owners, param), param_layout in zip(own, layout.params[:len(own)], strict=True)]
    after_forward, group = _reshard_group(process_set, reshard_after_forward)
    options = UnitOptions(process_set, after_forward, _precision(mp_policy), replicate_process_set, group)
    unit = ShardedUnit(module, params + [param for _, param in taken], layout, options)
    unit.lifted = lifted
    module._hvdlite_unit = unit
    module.__class__ = _sharded_class(type(module))
    module.register_forward_pre_hook(_pre_forward, with_kwargs=True, prepend=True)
    module.register_forward_hook(_post_forward)
    module.register_load_state_dict_post_hook(_after_load)
    return module


def _unit_mesh(own: list, taken: list[tuple[str, ShardedParam]], offload: Any, process_set: ProcessSet,
               replicas: ProcessSet | None) -> DeviceMesh | None:
    """The mesh of the unit's DTensors, of the device type where it computes; None if it has no
    parameters of its own (then no group is made: all ranks skip it alike)."""
    params = [param for _, _, param in own] + [param.full for _, param in taken]
    if not params:
        return None
    device = (_compute_device(params[0]) if offload is not None else None) or params[0].device
    return mesh_for(process_set, replicas, mesh_device_type(device))


def _compute_device(param: torch.nn.Parameter) -> torch.device | None:
    """Where an offloaded unit computes: the parameter's accelerator, or the current CUDA device for
    a parameter built on the CPU or ``meta``; None (compute where the shard is) without CUDA."""
    if param.device.type not in ("cpu", "meta"):
        return param.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


def _shard_parameter(owners: list[tuple[torch.nn.Module, str]], param: torch.nn.Parameter, rows: torch.Tensor,
                     process_set: ProcessSet, mesh: DeviceMesh,
                     compute_device: torch.device | None = None) -> ShardedParam:
    """Put this rank's ``rows`` of ``param`` on its owners as a new DTensor Parameter, and make the
    (empty) full parameter that forward and backward will gather into. With a ``compute_device``
    (offload) the shard lives in host memory and the full parameter on that device."""
    if compute_device is not None and rows.device.type != "meta":
        rows = rows.to("cpu")
    full = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=compute_device or param.device),
                              requires_grad=param.requires_grad)
    if full.device.type != "meta":
        full.untyped_storage().resize_(0)
    sharded = ShardedParam(owners, None, full, process_set, mesh, compute_device)
    shard = torch.nn.Parameter(sharded.as_dtensor(rows), requires_grad=param.requires_grad)
    shard._hvdlite_fully_sharded = True
    sharded.shard = shard
    ties.mark(param, sharded)
    stale.mark_replaced(param, "fully_shard put its shard in its place")
    sharded.put_on_owners(shard)
    return sharded


def _precision(mp_policy: Any) -> MixedPrecisionPolicy:
    """hvdlite's policy from ours or FSDP2's (same attribute names)."""
    if mp_policy is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(mp_policy.param_dtype, mp_policy.reduce_dtype, getattr(mp_policy, "output_dtype", None),
                                getattr(mp_policy, "cast_forward_inputs", True))


def _pre_forward(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    unit = module._hvdlite_unit
    if unit.root is None:
        ties.check_none_waiting(module, _units_under(module))
        ShardedRoot(module)
    return unit.root.pre_forward(unit, args, kwargs)


def _after_load(module: torch.nn.Module, _incompatible_keys: Any) -> None:
    """``load_state_dict(assign=True)`` put new Parameters in the shards' places: they become the shards."""
    module._hvdlite_unit.adopt_shards("load_state_dict(assign=True)")


def _post_forward(module: torch.nn.Module, _args: tuple, output: Any) -> Any:
    unit = module._hvdlite_unit
    return unit.root.post_forward(unit, output)


__all__ = ["FullyShardedModule", "MixedPrecisionPolicy", "fully_shard"]

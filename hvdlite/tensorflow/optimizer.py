"""DistributedOptimizer for Keras 3: the user's own optimizer, averaging gradients across ranks.

Keras 3 never calls the hooks Horovod's wrapper overrides (``get_gradients``,
``_aggregate_gradients``), so under Horovod ``model.fit`` trains with gradients silently not
averaged. Here the averaging goes into ``_clip_gradients``, which Keras calls exactly once per
real update (after ``gradient_accumulation_steps`` micro-steps are summed), before clipping and
weight decay: the same place a single process on the whole batch clips its gradients.

The optimizer object is returned, not a subclass: ``isinstance`` holds, ``get_config`` and a
saved ``.keras`` model name the user's class, and the model loads back without hvdlite
(undistributed) or through ``hvdlite.tensorflow.keras.load_model`` (distributed again).

With a ``LossScaleOptimizer``, each rank decides from its own gradients whether a step
overflowed; ranks that disagree would diverge and mismatch their collectives. So the
finiteness check is made global as well.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import keras
import tensorflow as tf

from ..compression import Compressor, NoneCompressor
from ..ops import Average, ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set
from ..training.local_sgd import LocalSGDSchedule
from ..training.options import check_passes, predivide_scales
from .collectives import host_ops
from .gradients import adasum
from .gradients.averaging import MARK, Averaging
from .gradients.tape import (
    check_groups,
    local_layer_variables,
    reduce_except_local,
    source_key,
)
from .slow_links import local_sgd as local_sgd_module

_LOCAL = "_hvdlite_local_variables"

def _global_finite(check_finite: Any, process_set: ProcessSet) -> Any:
    """A LossScaleOptimizer check that is true only when every rank's (of the set) gradients are finite."""
    def check(grads: list[Any]) -> Any:
        local = tf.cast(check_finite(grads), tf.int32)
        if process_set.included() is False:  # a rank outside the set trains alone
            return tf.cast(local, tf.bool)
        (everywhere,) = host_ops.allreduce([local], None, ReduceOp.MIN, 1.0, 1.0, process_set=process_set)
        return tf.cast(everywhere, tf.bool)
    return check


def _loss_scaler_around(optimizer: keras.optimizers.Optimizer) -> Any:
    """The LossScaleOptimizer, if any, whose ``apply`` is calling ``optimizer`` right now.

    Keras's compile() wraps an optimizer in a LossScaleOptimizer under mixed_float16, after
    DistributedOptimizer has run; the wrapper's finiteness check is then local. The only trace of
    it is the caller's frame, looked at once per trace.
    """
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.optimizers.LossScaleOptimizer) and owner.inner_optimizer is optimizer:
            return owner
        frame = frame.f_back
    return None


def _average_before_clipping(optimizer: keras.optimizers.Optimizer,
                             local: local_sgd_module.KerasLocalSGD | None) -> None:
    clip = optimizer._clip_gradients  # bound method of the class; the instance attribute shadows it
    local_variables = getattr(optimizer, _LOCAL)

    def clip_gradients(grads: list[Any]) -> list[Any]:
        averaging = getattr(optimizer, MARK)  # read when traced: regroup() may have moved it to another set
        scaler = _loss_scaler_around(optimizer)
        if scaler is not None and not hasattr(scaler, MARK):
            raise ValueError(
                "this hvdlite DistributedOptimizer is wrapped in a keras LossScaleOptimizer (model.compile does "
                "that under the mixed_float16 policy), whose overflow check would be local to each rank. Wrap "
                "the other way round: hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt))")
        if local is not None:  # local SGD: gradients are averaged in the warm-up only
            return clip(local.reduce_in_warmup(list(grads), averaging.reduce))
        if local_variables.keys:  # registered local variables keep their gradients (Horovod's register_local_var)
            flags = [source_key(v) in local_variables.keys for v in local_variables.applying]
            return clip(reduce_except_local(list(grads), flags, averaging.reduce,
                                            averaging.process_set.size() or 1, local_variables.scale))
        return clip(averaging.reduce(list(grads)))

    optimizer._clip_gradients = clip_gradients


@dataclasses.dataclass
class _LocalVariables:
    """The variables whose gradients an optimizer keeps local, and the ones it is updating now
    (``_clip_gradients`` gets gradients only: which variable each is for is known one call up)."""

    scale: bool  # divide the local gradients by the set's size, as Horovod's scale_local_gradients
    keys: set[Any] = dataclasses.field(default_factory=set)
    applying: list[Any] = dataclasses.field(default_factory=list)


def _track_local_variables(returned: keras.optimizers.Optimizer, target: keras.optimizers.Optimizer,
                           scale_local_gradients: bool, refusal: str | None) -> None:
    """Give ``returned`` Horovod's ``register_local_var(var)``; ``refusal``: why it cannot have one."""
    local = _LocalVariables(scale_local_gradients)
    setattr(target, _LOCAL, local)
    apply = target._backend_apply_gradients

    def backend_apply_gradients(grads: list[Any], trainable_variables: list[Any]) -> Any:
        local.applying = list(trainable_variables)
        return apply(grads, trainable_variables)

    def register_local_var(var: Any) -> None:
        """Keep ``var``'s gradient local: no collective for it (Horovod's API)."""
        if refusal is not None:
            raise ValueError(f"register_local_var: {refusal}")
        if not local.keys:
            target._backend_apply_gradients = backend_apply_gradients
        local.keys.add(source_key(var))

    returned.register_local_var = register_local_var


def _accumulate(optimizer: keras.optimizers.Optimizer, passes: int) -> None:
    """Horovod's backward_passes_per_step, as Keras 3's own gradient_accumulation_steps."""
    current = optimizer.gradient_accumulation_steps
    if current and current != passes:
        raise ValueError(f"backward_passes_per_step={passes} conflicts with the optimizer's "
                         f"gradient_accumulation_steps={current}; set only one")
    if optimizer.built and not current:
        raise ValueError(f"backward_passes_per_step={passes} needs an optimizer that has not been built yet; "
                         f"or construct it with gradient_accumulation_steps={passes}")
    optimizer.gradient_accumulation_steps = passes


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
                         device_sparse: str = "", compression: type[Compressor] = NoneCompressor,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                         process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True,
                         local_sgd_period: int | None = None, local_sgd_warmup_steps: int = 0,
                         local_sgd_average_state: bool = False) -> keras.optimizers.Optimizer:
    """Make a Keras 3 optimizer average its gradients across ranks before every update; returns it.

    Under the ``mixed_float16`` policy a plain optimizer comes back inside a LossScaleOptimizer, as
    ``model.compile`` would have wrapped it. ``backward_passes_per_step=N`` accumulates N micro-steps locally (Keras's
    ``gradient_accumulation_steps``) and communicates once per update; the accumulated gradients
    are summed, as in Horovod, unless ``average_aggregated_gradients``. ``name``,
    ``device_dense`` and ``device_sparse`` are accepted for Horovod compatibility. The optimizer gains
    Horovod's ``register_local_var(var)``: such a variable's gradient stays local (divided by the set's
    size with ``scale_local_gradients``, as Horovod does); ``num_groups``/``groups`` are checked as Horovod checks them,
    and the whole gradient list is one group, which the core fuses. ``local_sgd_period=K``: after
    ``local_sgd_warmup_steps`` synchronous updates, local updates with the variables averaged every
    K. ``op=Adasum``: each rank steps on its own gradients and the variables' changes are combined
    with Adasum.
    """
    check_groups(num_groups, groups)
    _check_wrappable(optimizer)
    resolved = resolve_op(op)
    if resolved is ReduceOp.ADASUM:
        adasum.refuse_unsupported(compression, sparse_as_dense, gradient_predivide_factor, local_sgd_period)
    elif resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer supports op=Average or op=Sum (or op=Adasum), got {resolved.name}")
    predivide_scales(resolved, gradient_predivide_factor)
    passes = check_passes(backward_passes_per_step)
    averaging = Averaging(resolved, compression, sparse_as_dense, gradient_predivide_factor,
                           float(passes) if passes > 1 and not average_aggregated_gradients else 1.0, process_set)
    optimizer, target = _loss_scaled(optimizer, process_set)
    if passes > 1:
        _accumulate(target, passes)
    if resolved is ReduceOp.ADASUM:  # each rank steps on its own gradients; the changes are combined
        averaging = adasum.install(target, process_set, averaging.postscale)
    local = None if local_sgd_period is None else local_sgd_module.install(
        target, LocalSGDSchedule(local_sgd_period, local_sgd_warmup_steps), local_sgd_average_state, process_set)
    refusal = ("op=Adasum combines the variables' changes, not gradients" if resolved is ReduceOp.ADASUM else
               "local SGD averages the variables themselves" if local is not None else None)
    if local is not None:
        target._hvdlite_local_sgd = local  # DiLoCo refuses an inner optimizer that already trains locally
    _track_local_variables(optimizer, target, scale_local_gradients, refusal)
    _average_before_clipping(target, local)
    setattr(optimizer, MARK, averaging)
    if target is not optimizer:
        setattr(target, MARK, averaging)
    return optimizer


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,  # noqa: N802
                                device_dense: str = "", device_sparse: str = "",
                                compression: type[Compressor] = NoneCompressor, sparse_as_dense: bool = False,
                                backward_passes_per_step: int = 1, op: ReduceOp = Average,
                                gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                                groups: Any = None, process_set: ProcessSet = global_process_set,
                                scale_local_gradients: bool = True, local_layers: Any = None) -> keras.optimizers.Optimizer:
    """Horovod's ``PartialDistributedOptimizer``: :func:`DistributedOptimizer`, with the trainable
    weights of ``local_layers`` (a Keras layer or a list of them) kept local: their gradients are not
    averaged (divided by the set's size with ``scale_local_gradients``), the rest are."""
    variables = local_layer_variables(local_layers)  # checked before the optimizer is changed
    distributed = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                       gradient_predivide_factor, op, backward_passes_per_step,
                                       average_aggregated_gradients, groups=groups, process_set=process_set,
                                       scale_local_gradients=scale_local_gradients)
    for variable in variables:
        distributed.register_local_var(variable)
    return distributed


def _check_wrappable(optimizer: Any) -> None:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.Optimizer), got "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}; for a custom training loop "
                        "use hvd.DistributedGradientTape")
    if hasattr(optimizer, MARK):
        raise ValueError(f"optimizer {optimizer.name!r} is already a hvdlite DistributedOptimizer")


def _loss_scaled(optimizer: keras.optimizers.Optimizer,
                 process_set: ProcessSet) -> tuple[keras.optimizers.Optimizer, keras.optimizers.Optimizer]:
    """(the optimizer to return, the one whose gradients are averaged): a LossScaleOptimizer's inner
    one, its overflow check agreed across the set."""
    if (keras.config.dtype_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        # compile() would wrap it in a LossScaleOptimizer after us, checking overflow per rank.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer.check_finite = _global_finite(optimizer.check_finite, process_set)
        return optimizer, optimizer.inner_optimizer
    return optimizer, optimizer


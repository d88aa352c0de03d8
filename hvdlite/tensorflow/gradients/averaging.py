"""The mark a Keras ``DistributedOptimizer`` carries: how it reduces its gradients (``Averaging``),
read back by the elastic state and by DiLoCo, which may move it to another process set."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from ...compression import Compressor
from ...ops import ReduceOp
from ...process_sets import ProcessSet, global_process_set
from .tape import reduce_gradients, scaled_gradients

MARK = "_hvdlite_distributed"


@dataclasses.dataclass(frozen=True)
class Averaging:
    """How an optimizer reduces its gradients."""

    op: ReduceOp
    compression: type[Compressor]
    sparse_as_dense: bool
    gradient_predivide_factor: float
    postscale: float  # Horovod sums accumulated micro-steps unless average_aggregated_gradients
    process_set: ProcessSet = global_process_set

    def reduce(self, grads: list[Any]) -> list[Any]:
        reduced = reduce_gradients(grads, self.op, self.compression, self.sparse_as_dense,
                                   self.gradient_predivide_factor, process_set=self.process_set)
        return scaled_gradients(reduced, self.postscale)


def is_distributed(optimizer: Any) -> bool:
    """True if ``optimizer`` went through :func:`DistributedOptimizer`."""
    return hasattr(optimizer, MARK)


def averages_every_step(optimizer: Any) -> bool:
    """True for a :func:`DistributedOptimizer` whose replicas stay equal: it averages (or Adasums) every
    step's gradients over the whole job, without local SGD."""
    averaging = getattr(optimizer, MARK, None)
    local_sgd = getattr(getattr(optimizer, "inner_optimizer", optimizer), "_hvdlite_local_sgd", None)
    return isinstance(averaging, Averaging) and averaging.process_set is global_process_set and local_sgd is None


def average_over(optimizer: Any, process_set: ProcessSet) -> None:
    """Make a :func:`DistributedOptimizer` that averages gradients average them over ``process_set``
    from its next trace on (an elastic job's re-formed sets: DiLoCo's ``regroup``)."""
    averaging = getattr(optimizer, MARK, None)
    if (not isinstance(averaging, Averaging) or isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            or getattr(optimizer, "_hvdlite_local_sgd", None) is not None):
        raise ValueError("DiLoCo.regroup(inner_process_set=...) needs an inner DistributedOptimizer that averages "
                         "gradients (not Adasum, local SGD or loss scaling)")
    setattr(optimizer, MARK, dataclasses.replace(averaging, process_set=process_set))

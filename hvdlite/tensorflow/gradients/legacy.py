"""TensorFlow 1 style training: Horovod's DistributedOptimizer over a ``tf.compat.v1.train.Optimizer``
and ``BroadcastGlobalVariablesHook`` for ``tf.compat.v1.train.MonitoredTrainingSession``.

The wrapper delegates to the user's optimizer object, so a subclass that overrides
``compute_gradients`` or ``apply_gradients`` keeps its behaviour: its gradients are averaged across
the ranks (of ``process_set``) between the two, as Horovod's ``_DistributedOptimizer`` does. The
collectives are hvdlite's graph ops, which run in a ``tf.compat.v1.Session`` as in a ``tf.function``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ...compression import Compressor, NoneCompressor
from ...ops import Average, ReduceOp, resolve_op
from ...process_sets import ProcessSet, global_process_set
from ...training.options import check_passes, predivide_scales
from ..collectives.tensors import separate_chain
from ..collectives.variables import broadcast_global_variables
from .tape import check_groups, reduce_gradients

LegacyOptimizer = tf.compat.v1.train.Optimizer


class _DistributedLegacyOptimizer(LegacyOptimizer):
    """A ``tf.compat.v1.train.Optimizer`` that averages the wrapped optimizer's gradients across ranks."""

    def __init__(self, optimizer: LegacyOptimizer, name: str | None, use_locking: bool, compression: type[Compressor],
                 sparse_as_dense: bool, op: ReduceOp, gradient_predivide_factor: float,
                 process_set: ProcessSet) -> None:
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer
        self._reduce = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                            gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's ``(gradient, variable)`` pairs, the gradients averaged across ranks."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs, strict=True)
        return list(zip(reduce_gradients(list(grads), **self._reduce), variables, strict=True))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> list[str]:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._optimizer.variables(*args, **kwargs)


def distributed_legacy_optimizer(optimizer: LegacyOptimizer, name: str | None = None, use_locking: bool = False,
                                 device_dense: str = "", device_sparse: str = "",
                                 compression: type[Compressor] = NoneCompressor, sparse_as_dense: bool = False,
                                 backward_passes_per_step: int = 1, op: ReduceOp = Average,
                                 gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                                 num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                                 scale_local_gradients: bool = True) -> LegacyOptimizer:
    """Horovod's ``DistributedOptimizer`` for a ``tf.compat.v1.train.Optimizer``, with its argument
    order (``device_*``, ``average_aggregated_gradients`` and ``scale_local_gradients`` are accepted,
    as Horovod accepts them; no variable is local here)."""
    check_groups(num_groups, groups)
    resolved = resolve_op(op)
    if resolved not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer of a tf.compat.v1 optimizer supports op=Average or op=Sum, got "
                         f"{resolved.name}")
    if check_passes(backward_passes_per_step) > 1:
        raise NotImplementedError("DistributedOptimizer of a tf.compat.v1 optimizer: backward_passes_per_step > 1 "
                                  "is not supported; accumulate the gradients in the graph, or use a Keras optimizer")
    predivide_scales(resolved, gradient_predivide_factor)
    return _DistributedLegacyOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, resolved,
                                       gradient_predivide_factor, process_set)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Horovod's ``SessionRunHook``: once the session is created, every global variable takes
    ``root_rank``'s value (a rank of the job in ``process_set``), so ranks that initialised differently
    start alike. For ``tf.compat.v1.train.MonitoredTrainingSession(hooks=[...])``."""

    def __init__(self, root_rank: int, device: str = "", process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank, self.device, self.process_set = root_rank, device, process_set
        self.bcast_op = None

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            with tf.device(self.device), separate_chain(graph):  # run alone, once, at session start
                self.bcast_op = broadcast_global_variables(self.root_rank, process_set=self.process_set)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


__all__ = ["BroadcastGlobalVariablesHook", "LegacyOptimizer", "distributed_legacy_optimizer"]

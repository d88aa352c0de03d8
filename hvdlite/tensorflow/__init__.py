"""hvdlite.tensorflow: Horovod's ``horovod.tensorflow`` API on the hvdlite core, for TF 2.16+.

Change ``import horovod.tensorflow as hvd`` to ``import hvdlite.tensorflow as hvd``::

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

Every collective works eagerly and inside ``tf.function`` (not under XLA: ``jit_compile=True``
is refused with a clear error). For Keras, see :mod:`hvdlite.tensorflow.keras`.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("hvdlite.tensorflow needs TensorFlow: pip install 'hvdlite[tensorflow]'") from exc

from tensorflow.python.autograph.core import config as _autograph_config

# AutoGraph rewrites every Python function a tf.function calls, down through hvdlite's own code (1.6 s
# to trace six collectives, 0.1 s as written). hvdlite has no Python control flow on tensors to convert,
# so its modules are left as written, by the rule TF applies to its own and to Keras's.
if not any(getattr(rule, "_prefix", None) == "hvdlite" for rule in _autograph_config.CONVERSION_RULES):
    _autograph_config.CONVERSION_RULES = (_autograph_config.DoNotConvert("hvdlite"), *_autograph_config.CONVERSION_RULES)

from ..common import *  # noqa: F403 - the names every adapter shares
from ..common import __all__ as _common_names
from . import elastic  # hvd.elastic, as in Horovod
from .collectives.differentiable import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    reducescatter,
)
from .collectives.topology_ops import local_rank_op, local_size_op, process_set_included_op, rank_op, size_op
from .collectives.variables import broadcast_, broadcast_global_variables, broadcast_variables
from .compression import Compression, Compressor
from .functions import allgather_object, broadcast_object, broadcast_object_fn  # noqa: F401 - TF argument order
from .gradients import legacy
from .gradients.legacy import BroadcastGlobalVariablesHook
from .gradients.tape import DistributedGradientTape, PartialDistributedGradientTape
from .slow_links.diloco import DiLoCo
from .sync_batch_norm import SyncBatchNormalization


def DistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 - Horovod's name
    """Make an optimizer average gradients across ranks: a Keras 3 optimizer (see
    hvdlite.tensorflow.keras.DistributedOptimizer), or a ``tf.compat.v1.train.Optimizer`` for TF1
    graphs, wrapped as Horovod wraps it (Horovod's argument order for each)."""
    if isinstance(optimizer, legacy.LegacyOptimizer):
        return legacy.distributed_legacy_optimizer(optimizer, *args, **kwargs)
    from .optimizer import DistributedOptimizer as keras_distributed_optimizer

    return keras_distributed_optimizer(optimizer, *args, **kwargs)


def PartialDistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 - Horovod's name
    """DistributedOptimizer keeping ``local_layers``' gradients local: see
    hvdlite.tensorflow.keras.PartialDistributedOptimizer."""
    from .optimizer import PartialDistributedOptimizer as keras_partial_optimizer

    return keras_partial_optimizer(optimizer, *args, **kwargs)


__all__ = [
    *_common_names, "rank_op", "size_op", "process_set_included_op", "local_rank_op", "local_size_op", "allreduce", "grouped_allreduce",
    "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
    "grouped_reducescatter", "join", "barrier", "broadcast_variables", "broadcast_global_variables",
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "PartialDistributedOptimizer", "DiLoCo",
    "BroadcastGlobalVariablesHook", "Compression",
    "Compressor", "broadcast_object_fn", "SyncBatchNormalization", "elastic",
]

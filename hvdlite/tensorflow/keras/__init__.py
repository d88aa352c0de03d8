"""hvdlite.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` API for Keras 3.

Change ``import horovod.tensorflow.keras as hvd`` to ``import hvdlite.tensorflow.keras as hvd``::

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size())), loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])
"""

from __future__ import annotations

from typing import Any

from ...common import *  # noqa: F403 - the names every adapter shares
from ...common import __all__ as _common_names
from ...compression import Compressor, NoneCompressor
from ...ops import ReduceOp
from ..collectives import differentiable as collectives
from ..compression import Compression
from ..functions import allgather_object, broadcast_object  # noqa: F401 - TF argument order
from ..optimizer import DistributedOptimizer, PartialDistributedOptimizer
from ..slow_links.diloco import DiLoCo
from . import callbacks, elastic
from .state import broadcast_global_variables, load_model


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: ReduceOp | None = None,
              compression: type[Compressor] = NoneCompressor) -> Any:
    """``value`` (a tensor, array or number) reduced across ranks (default Average), as a tensor."""
    return collectives.allreduce(value, average=average, compression=compression, op=op,
                                 prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def allgather(value: Any, name: str | None = None) -> Any:
    """Every rank's ``value`` concatenated along dimension 0, as a tensor."""
    return collectives.allgather(value, name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """``root_rank``'s ``value`` on every rank, as a tensor."""
    return collectives.broadcast(value, root_rank, name=name)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp | None = None) -> Any:
    """``value`` reduced across ranks (default Average); this rank's block of rows, as a tensor."""
    return collectives.reducescatter(value, op=op, name=name)


__all__ = [
    *_common_names, "DistributedOptimizer", "PartialDistributedOptimizer", "DiLoCo", "broadcast_global_variables", "load_model", "allreduce", "allgather",
    "broadcast", "reducescatter", "callbacks", "elastic", "Compression",
]

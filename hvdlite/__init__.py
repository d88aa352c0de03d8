"""hvdlite: Horovod-style data-parallel training for PyTorch, TensorFlow/Keras and JAX.

This package is the framework-free core; its tensors are NumPy arrays. Framework adapters live
in ``hvdlite.torch``, ``hvdlite.tensorflow`` and ``hvdlite.jax``.
"""

from .api import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from .common import *  # noqa: F403 - the names every adapter shares
from .common import __all__ as _common_names
from .core.work.request import Handle

__version__ = "0.1.0"

__all__ = [
    *_common_names, "allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "join", "poll", "synchronize", "Handle",
]

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
from .basics import (
    cross_rank,
    cross_size,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    size,
)
from .errors import (
    ConfigError,
    DuplicateNameError,
    HorovodInternalError,
    HvdliteError,
    HvdliteShutdownError,
    NotInitializedError,
    StallError,
    TensorMismatchError,
    UnsupportedOperationError,
)
from .objects import allgather_object, broadcast_object
from .ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .request import Handle
from .runtime import init, shutdown

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "nccl_built",
    "gloo_enabled", "gloo_built", "allreduce", "allreduce_async", "grouped_allreduce",
    "grouped_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_async", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "barrier", "join", "poll", "synchronize", "broadcast_object", "allgather_object", "Handle",
    "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product", "HvdliteError",
    "NotInitializedError", "ConfigError", "TensorMismatchError", "DuplicateNameError",
    "UnsupportedOperationError", "StallError", "HvdliteShutdownError", "HorovodInternalError",
]

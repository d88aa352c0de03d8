"""What the core and every framework adapter export unchanged: lifecycle, topology, op
constants, object collectives and error classes.

One list, so ``hvdlite``, ``hvdlite.torch``, ``hvdlite.tensorflow`` and ``hvdlite.jax`` cannot
drift apart. Each of them does ``from ..common import *`` and adds its own tensor operations.
"""

from .basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    gpu_available,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
)
from .core.runtime import start_timeline, stop_timeline
from .errors import (
    CommTimeoutError,
    ConfigError,
    DuplicateNameError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    HvdliteError,
    HvdliteShutdownError,
    InvalidArgumentError,
    NotInitializedError,
    ProcessSetError,
    StallError,
    TensorMismatchError,
    UnsupportedOperationError,
)
from .lifecycle import add_process_set, init, remove_process_set, shutdown
from .objects import allgather_object, broadcast_object
from .ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .process_sets import ProcessSet, global_process_set

__all__ = [
    "init", "shutdown", "start_timeline", "stop_timeline", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "nccl_built",
    "gloo_enabled", "gloo_built", "broadcast_object", "allgather_object", "ReduceOp", "Average", "Sum",
    "Adasum", "Min", "Max", "Product", "HvdliteError", "NotInitializedError", "ConfigError",
    "TensorMismatchError", "InvalidArgumentError", "DuplicateNameError", "UnsupportedOperationError", "StallError",
    "HvdliteShutdownError", "HorovodInternalError", "HostsUpdatedInterrupt", "CommTimeoutError", "ProcessSetError", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set", "cuda_built", "gpu_available", "rocm_built", "ddl_built",
    "ccl_built",
]

"""hvdlite.torch: Horovod's ``horovod.torch`` API on the hvdlite core.

Change ``import horovod.torch as hvd`` to ``import hvdlite.torch as hvd``; the rest of a Horovod
script stays as it is::

    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""

import importlib
from typing import TYPE_CHECKING, Any

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("hvdlite.torch needs PyTorch: pip install 'hvdlite[torch]'") from exc

from ..common import *  # noqa: F403 - the names every adapter shares
from ..common import __all__ as _common_names
from ..lifecycle import init as _init
from . import distributed, elastic  # hvd.elastic, as in Horovod
from .collectives.async_ops import (
    Handle,
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    synchronize,
)
from .collectives.differentiable import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from .collectives.state import broadcast_optimizer_state, broadcast_parameters
from .compression import Compression, Compressor
from .distributed.rendezvous import publish as _publish_rendezvous
from .gradients.sparse import sparse_allreduce, sparse_allreduce_async
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

if TYPE_CHECKING:  # the names imported on first use (below), for type checkers
    from .fully_sharded import (
        FullyShardedModule,
        MixedPrecisionPolicy,
        clip_grad_norm_,
        full_optimizer_state_dict,
        full_state_dict,
        fully_shard,
        load_full_optimizer_state_dict,
        load_full_state_dict,
        load_sharded_state,
        save_sharded_state,
    )
    from .slow_links.diloco import DiLoCo

distributed.register()  # dist.init_process_group("hvdlite") works once hvd.init() ran

# Imported on first use: they import torch.distributed.tensor (DTensor), half a second of CPU that
# every rank of a job without fully_shard or DiLoCo would pay at ``import hvdlite.torch``.
_LAZY = {"DiLoCo": ".slow_links.diloco", **{name: ".fully_sharded" for name in (
    "FullyShardedModule", "MixedPrecisionPolicy", "clip_grad_norm_", "full_optimizer_state_dict", "full_state_dict",
    "fully_shard", "load_full_optimizer_state_dict", "load_full_state_dict", "load_sharded_state",
    "save_sharded_state")}}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def init(comm=None, process_sets=None) -> None:
    """Start hvdlite (:func:`hvdlite.init`), and set the variables torch's ``env://`` rendezvous reads
    where they are unset, so that ``dist.init_process_group("hvdlite")`` follows (collective); a
    ``dist.init_process_group()`` without a backend, and ``init_device_mesh`` without a group, start
    the ``"hvdlite"`` backend too."""
    from ..core.runtime import current

    _init(comm, process_sets)
    _publish_rendezvous(current())
    distributed.make_default()

__all__ = [
    *_common_names, "fully_shard", "FullyShardedModule", "MixedPrecisionPolicy", "full_state_dict", "load_full_state_dict", "clip_grad_norm_",
    "full_optimizer_state_dict", "load_full_optimizer_state_dict", "save_sharded_state", "load_sharded_state",
    "SyncBatchNorm", "elastic", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async", "broadcast_",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "Handle",
    "broadcast_parameters", "broadcast_optimizer_state", "DistributedOptimizer", "DiLoCo", "Compression", "Compressor", "sparse_allreduce", "sparse_allreduce_async",
]

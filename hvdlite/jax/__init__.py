"""hvdlite.jax: Horovod-style data-parallel training for JAX and optax.

One process per rank, launched by ``hvdliterun``; each holds the whole model and trains on its
own shard of the data::

    import hvdlite.jax as hvd
    hvd.init()
    tx = hvd.DistributedOptimizer(optax.adam(1e-3))      # averages gradients across ranks
    params = hvd.broadcast_parameters(params, root_rank=0)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

Collectives take arrays or whole pytrees and work outside ``jax.jit`` (host path, no copies on
the CPU) and inside it (an ordered ``io_callback``).

Process sets, as in Horovod: register sets with ``hvd.init(process_sets=[...])`` (or
``add_process_set`` after ``init(process_sets="dynamic")``) and pass ``process_set=`` to any
collective, ``barrier``, ``join``, ``DistributedOptimizer``, ``broadcast_parameters`` and
``broadcast_optimizer_state``.
"""

try:
    import jax as _jax  # noqa: F401
    import optax as _optax  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("hvdlite.jax needs JAX and optax: pip install 'hvdlite[jax]'") from exc

from ..common import *  # noqa: F403 - the names every adapter shares
from ..common import __all__ as _common_names
from . import elastic  # hvd.elastic, as in Horovod
from .collectives.calls import (
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
from .collectives.state import broadcast_optimizer_state, broadcast_parameters
from .compression import Compression, Compressor
from .data import shard_indices
from .optimizer import DistributedOptimizer
from .slow_links.diloco import DiLoCo

__all__ = [
    *_common_names, "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter", "barrier", "join", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "DiLoCo", "Compression", "Compressor", "shard_indices", "elastic",
]

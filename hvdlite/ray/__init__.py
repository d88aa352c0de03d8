"""hvdlite on Ray: ``RayExecutor`` runs a function as MPI ranks in Ray actors, as Horovod's.

The actors are placed by Ray (one placement group, spread over the nodes); hvdlite only forms the
MPI world among them with its launcher. ``ElasticRayExecutor`` (or ``RayExecutor(min_workers=...,
max_workers=...)``) runs an elastic job whose ranks survive a lost actor. Needs ``pip install hvdlite[ray]``.
"""

from ..runner.remote.job import RemoteJobError
from .elastic import ElasticRayExecutor
from .executor import RayExecutor, RayJobError

__all__ = ["ElasticRayExecutor", "RayExecutor", "RayJobError", "RemoteJobError"]

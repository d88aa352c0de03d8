"""hvdlite on Ray: ``RayExecutor`` runs a function as MPI ranks in Ray actors, as Horovod's.

The actors are placed by Ray (one placement group, spread over the nodes); hvdlite only forms the
MPI world among them with its launcher. Needs ``pip install hvdlite[ray]``.
"""

from ..runner.remote.job import RemoteJobError
from .executor import RayExecutor, RayJobError

__all__ = ["RayExecutor", "RayJobError", "RemoteJobError"]

"""What ``dist.init_process_group("hvdlite")`` finds in the environment after ``hvd.init()``.

torch's default rendezvous (``env://``) reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, as torchrun sets them, and builds a TCPStore on rank 0. hvdliterun starts ranks
through MPI, which sets none of them, so ``hvd.init()`` sets those that are missing (and
``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``), with hvdlite's own ranks: a script written for torchrun then
runs under hvdliterun unchanged. The hvdlite backend does not use the store for its collectives;
torch needs one to create groups. Variables already set (by torchrun, or the user) are kept, and the
backend checks that they agree with hvdlite's ranks.
"""

from __future__ import annotations

from ...core.runtime import Runtime
from ...settings.config import environ, set_environ

_LOOPBACK = "127.0.0.1"


def publish(runtime: Runtime) -> None:
    """Set torch's rendezvous variables that are not set. Local: no collective (a rank that joins an
    elastic job calls ``init`` alone); the port is the one rank 0 found free at start."""
    env = environ()
    topology = runtime.topology
    # One host: the loopback, which leaves no machine. Several: rank 0's host name, as torchrun's
    # --master-addr would be; set MASTER_ADDR yourself where that name does not resolve.
    address = _LOOPBACK if len(set(runtime.hosts)) <= 1 else runtime.hosts[0]
    wanted = {"RANK": str(topology.rank), "WORLD_SIZE": str(topology.size),
              "LOCAL_RANK": str(topology.local_rank), "LOCAL_WORLD_SIZE": str(topology.local_size),
              "MASTER_ADDR": address, "MASTER_PORT": str(runtime.rendezvous_port)}
    set_environ({name: value for name, value in wanted.items() if not env.get(name)})

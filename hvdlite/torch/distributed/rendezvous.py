"""What ``dist.init_process_group("hvdlite")`` finds in the environment after ``hvd.init()``.

torch's default rendezvous (``env://``) reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, as torchrun sets them, and builds a TCPStore on rank 0. hvdliterun starts ranks
through MPI, which sets none of them, so ``hvd.init()`` sets those that are missing (and
``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``), with hvdlite's own ranks: a script written for torchrun then
runs under hvdliterun unchanged. The hvdlite backend does not use the store for its collectives;
torch needs one to create groups. Variables already set (by torchrun, or the user) are kept, and the
backend checks that they agree with hvdlite's ranks. hvdliterun's torchrun mode sets the rest of
what torchrun gives a worker (:func:`torchrun_variables`).
"""

from __future__ import annotations

from ...core.runtime import Runtime
from ...settings.config import environ, set_environ

_LOOPBACK = "127.0.0.1"


def rendezvous_variables(runtime: Runtime) -> dict[str, str]:
    """Ranks, sizes and rank 0's address, as torch's ``env://`` rendezvous reads them. The port is the
    one rank 0 found free at start."""
    topology = runtime.topology
    # One host: the loopback, which leaves no machine. Several: rank 0's host name, as torchrun's
    # --master-addr would be; set MASTER_ADDR yourself where that name does not resolve.
    address = _LOOPBACK if len(set(runtime.hosts)) <= 1 else runtime.hosts[0]
    return {"RANK": str(topology.rank), "WORLD_SIZE": str(topology.size),
            "LOCAL_RANK": str(topology.local_rank), "LOCAL_WORLD_SIZE": str(topology.local_size),
            "MASTER_ADDR": address, "MASTER_PORT": str(runtime.rendezvous_port)}


def torchrun_variables(runtime: Runtime) -> dict[str, str]:
    """Everything torchrun sets for a worker (torch's ``LocalElasticAgent``), for hvdlite's ranks:
    hosts are torchrun's nodes (``GROUP_RANK``: this host's place among the job's hosts, in rank
    order), one role, no restarts, and no agent store (rank 0 serves torch's store)."""
    hosts = list(dict.fromkeys(runtime.hosts))
    here = runtime.hosts[runtime.topology.rank] if runtime.hosts else ""
    base = rendezvous_variables(runtime)
    return {**base, "GROUP_RANK": str(hosts.index(here) if here in hosts else 0),
            "GROUP_WORLD_SIZE": str(max(1, len(hosts))), "ROLE_RANK": base["RANK"], "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": base["WORLD_SIZE"], "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False"}


def publish(runtime: Runtime, everything: bool = False) -> None:
    """Set torch's rendezvous variables that are not set (``everything``: all of torchrun's). Local:
    no collective (a rank that joins an elastic job calls ``init`` alone)."""
    env = environ()
    wanted = torchrun_variables(runtime) if everything else rendezvous_variables(runtime)
    set_environ({name: value for name, value in wanted.items() if not env.get(name)})

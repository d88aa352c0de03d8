"""Where each rank sits: its host, its index on that host, and its index across hosts."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Topology:
    """Horovod's rank vocabulary. ``cross_rank`` is this rank's index among ranks with its local_rank."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    is_homogeneous: bool

    def outnumbers_cores(self) -> bool:
        """True if this host runs more of the job's ranks than this process has cores: a rank
        that waits by spinning then takes the core another rank needs."""
        return self.local_size > usable_cores()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a cgroup or ``taskset`` may allow fewer
    than the machine has), or the machine's count where the platform has no affinity (macOS)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def topology_from_hosts(hosts: list[str], rank: int) -> Topology:
    """Build the topology from every rank's host name (index = rank), hosts in first-seen order."""
    order = list(dict.fromkeys(hosts))
    ranks_on = {host: [r for r, h in enumerate(hosts) if h == host] for host in order}
    mine = ranks_on[hosts[rank]]
    local_rank = mine.index(rank)
    peers = [ranks[local_rank] for ranks in ranks_on.values() if len(ranks) > local_rank]
    return Topology(
        rank=rank,
        size=len(hosts),
        local_rank=local_rank,
        local_size=len(mine),
        cross_rank=peers.index(rank),
        cross_size=len(peers),
        is_homogeneous=len({len(ranks) for ranks in ranks_on.values()}) == 1,
    )

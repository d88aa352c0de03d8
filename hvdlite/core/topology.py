"""Where each rank sits: its host, its index on that host, and its index across hosts."""

from __future__ import annotations

import dataclasses


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

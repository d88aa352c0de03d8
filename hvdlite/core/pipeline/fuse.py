"""Fusion planning: which ready allreduces share one buffer, in which order. Pure logic.

Measured on shared-memory MPICH: packing and unpacking copies cost more than they save for large
tensors, while small tensors are dominated by per-message latency. So only tensors up to
``SMALL_TENSOR_BYTES`` (in their wire dtype) are packed, into buffers of at most the fusion
threshold; larger tensors are reduced straight from their own buffers (the transport cuts them into
chunks). The plan depends only on the responses, which are identical on every rank, so every
rank builds the same plan.
"""

from __future__ import annotations

from ...ops import Collective
from ..work.item import WorkItem
from ..work.response import Response

SMALL_TENSOR_BYTES = 64 * 1024


def plan(responses: list[Response], threshold: int) -> list[WorkItem]:
    """Group ``responses`` into work items; unfusable responses keep their relative order."""
    if len(responses) == 1:  # nothing to fuse with (a blocking call's cycle): skip the bookkeeping
        return [WorkItem((responses[0],))]
    small = min(SMALL_TENSOR_BYTES, threshold)
    items: list[WorkItem | list[Response]] = []  # a list: a fusion bucket, still filling
    open_buckets: dict[tuple, tuple[list[Response], int]] = {}  # key -> (members, bytes)
    for response in responses:
        nbytes = response.wire_nbytes if response.meta.collective is Collective.ALLREDUCE else 0
        packable = 0 < nbytes <= small and not response.error
        if not packable:
            items.append(WorkItem((response,)))
            continue
        key = response.fusion_key
        members, used = open_buckets.get(key, (None, 0))
        if members is None or used + nbytes > threshold:
            members, used = [], 0
            items.append(members)  # the bucket keeps this place in the order
        members.append(response)
        open_buckets[key] = (members, used + nbytes)
    return [item if isinstance(item, WorkItem) else WorkItem(tuple(item), fused=len(item) > 1) for item in items]

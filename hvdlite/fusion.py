"""Fusion planning: which ready allreduces share one buffer, in which order. Pure logic.

Measured on shared-memory MPICH: packing and unpacking copies cost more than they save for large
tensors, while small tensors are dominated by per-message latency. So only tensors up to
``SMALL_TENSOR_BYTES`` (in their wire dtype) are packed, into buffers of at most the fusion
threshold; larger tensors are reduced straight from their own buffers (the backend cuts them into
chunks). The plan depends only on the responses, which are identical on every rank, so every
rank builds the same plan.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from . import dtypes
from .ops import Collective
from .response import Response

SMALL_TENSOR_BYTES = 64 * 1024


class WorkItem(NamedTuple):
    """One unit of execution: several packed allreduces, or a single response.

    Compared by identity where it matters (the engine's list of started items).
    """

    responses: tuple[Response, ...]
    fused: bool = False


def describe(item: WorkItem) -> str:
    """What ``item`` does, for error messages: the collective and up to three tensor names."""
    names = [r.meta.name for r in item.responses]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{item.responses[0].meta.collective.name.lower()} of {names[:3]}{more}"


def wire_nbytes(response: Response) -> int:
    meta = response.meta
    return math.prod(meta.shape) * dtypes.SUPPORTED[dtypes.wire_name(meta.dtype, meta.device)].itemsize


def _fusion_key(response: Response) -> tuple:
    meta = response.meta
    # Host and device tensors never share a buffer: they live in different memories.
    return (meta.device, dtypes.wire_name(meta.dtype, meta.device), dtypes.wire_op(meta.dtype, meta.op),
            meta.prescale, meta.postscale)


def plan(responses: list[Response], threshold: int) -> list[WorkItem]:
    """Group ``responses`` into work items; unfusable responses keep their relative order."""
    if len(responses) == 1:  # nothing to fuse with (a blocking call's cycle): skip the bookkeeping
        return [WorkItem((responses[0],))]
    items: list[WorkItem] = []
    open_buckets: dict[tuple, tuple[int, list[Response], int]] = {}  # key -> (item slot, members, bytes)
    for response in responses:
        nbytes = wire_nbytes(response) if response.meta.collective is Collective.ALLREDUCE else 0
        packable = (
            response.meta.collective is Collective.ALLREDUCE
            and not response.error
            and 0 < nbytes <= min(SMALL_TENSOR_BYTES, threshold)
        )
        if not packable:
            items.append(WorkItem((response,)))
            continue
        key = _fusion_key(response)
        slot, members, used = open_buckets.get(key, (-1, [], 0))
        if slot < 0 or used + nbytes > threshold:
            items.append(WorkItem(()))  # placeholder, filled below
            slot, members, used = len(items) - 1, [], 0
        members.append(response)
        open_buckets[key] = (slot, members, used + nbytes)
        items[slot] = WorkItem(tuple(members), fused=len(members) > 1)
    return items

"""How a reduction runs on NCCL, decided from its description alone (no GPU, no cupy): the op and
the factor folded into NCCL's pre-multiplied sum, the scaling left around it, where each member of
a device fusion buffer starts, and whether an in-place allreduce is a single NCCL call.

Every rank decides alike from the same description, so these plans can differ by rank only if the
descriptions do (which negotiation rules out). Used by :mod:`hvdlite.core.planes.nccl`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..ops import Collective, ReduceOp
from ..utils import dtypes
from ..utils.buffers import padded_count
from .arrays import DEVICE


class ReductionPlan(NamedTuple):
    """How a reduction runs on NCCL."""

    op: ReduceOp  # the NCCL op
    factor: float  # folded into NCCL's pre-multiplied sum (floating Sum and Average)
    pre: float  # applied to the inputs before the reduction
    post: float  # applied to the result after it ...
    divisor: int  # ... and then divided by (a scaled integer Average)


def reduction_plan(dtype: str, op: ReduceOp, prescale: float, postscale: float, size: int) -> ReductionPlan:
    """How to run a reduction of ``dtype`` on NCCL.

    Sum and a floating Average become one pre-multiplied sum by ``prescale * postscale [/ size]``;
    an unscaled integer Average is ncclAvg (integer division, as the host path's truncation). NCCL
    cannot pre-multiply integers, so a scaled integer reduction scales before and after, and its
    Average is a Sum whose result is divided with the post-scale, as the host path does. Min, Max
    and Product keep the factors for separate scaling before and after.
    """
    wire_op = dtypes.wire_op(dtype, op)
    if dtypes.is_floating(dtype) and wire_op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        factor = prescale * postscale / (size if wire_op is ReduceOp.AVERAGE else 1)
        return ReductionPlan(ReduceOp.SUM, factor, 1.0, 1.0, 1)
    if wire_op is ReduceOp.AVERAGE:
        if prescale == 1.0 and postscale == 1.0:
            return ReductionPlan(ReduceOp.AVERAGE, 1.0, 1.0, 1.0, 1)
        return ReductionPlan(ReduceOp.SUM, 1.0, prescale, postscale, size)
    return ReductionPlan(wire_op, 1.0, prescale, postscale, 1)


def member_offsets(counts: list[int], itemsize: int) -> list[int]:
    """Start of each member in a device fusion buffer (64-byte aligned), and the total as the last entry."""
    starts = [0]
    for count in counts:
        starts.append(starts[-1] + padded_count(count, itemsize))
    return starts


def in_place_launch(meta: Any, size: int) -> tuple:
    """(count, op, factor) when an in-place allreduce of ``meta`` is one NCCL call on its own memory
    (its own dtype on the wire, nothing to scale before or after); () otherwise."""
    if (meta.collective is not Collective.ALLREDUCE or meta.op is ReduceOp.ADASUM
            or dtypes.wire_name(meta.dtype, DEVICE) != meta.dtype):
        return ()
    plan = reduction_plan(meta.dtype, meta.op, meta.prescale, meta.postscale, size)
    if plan.pre != 1.0 or plan.post != 1.0 or plan.divisor != 1:
        return ()
    return math.prod(meta.shape), plan.op, plan.factor

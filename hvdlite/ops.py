"""Reduction operators and collective kinds shared by the core and every adapter."""

from __future__ import annotations

import enum


class ReduceOp(enum.IntEnum):
    """Reduction applied by ``allreduce`` / ``reducescatter``."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


class Collective(enum.IntEnum):
    """What a request asks the engine to do."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6


def resolve_op(op: ReduceOp | int | None, average: bool | None = None) -> ReduceOp:
    """Turn Horovod's ``op=`` / deprecated ``average=`` pair into one :class:`ReduceOp`."""
    if average is None and op.__class__ is ReduceOp:
        return op  # already resolved (every call of a training loop): no enum lookup
    if op is not None and average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if average is not None:
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return ReduceOp.AVERAGE
    try:
        resolved = ReduceOp(int(op))
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
    return resolved

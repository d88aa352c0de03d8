"""torch.distributed's reduction ops in hvdlite's terms."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ...errors import UnsupportedOperationError
from ...ops import ReduceOp

_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM,
    dist.ReduceOp.AVG: ReduceOp.AVERAGE,
    dist.ReduceOp.MIN: ReduceOp.MIN,
    dist.ReduceOp.MAX: ReduceOp.MAX,
    dist.ReduceOp.PRODUCT: ReduceOp.PRODUCT,
}


def core_reduction(op: Any, call: str) -> tuple[ReduceOp, float]:
    """(hvdlite's op, prescale factor) for torch's ``op`` (a ``ReduceOp`` or its ``RedOpType``).

    PREMUL_SUM (``dist._make_nccl_premul_sum(factor)``, which FSDP2 uses) is a Sum of inputs
    multiplied by ``factor``: the core's prescale. Bitwise ops have no core counterpart (the group
    folds them itself, :mod:`.gathered`); here they are refused by name, not reduced as something else.
    """
    kind = getattr(op, "op", op)
    core_op = _OPS.get(kind)  # (RedOpType hashes: one lookup on every call's path)
    if core_op is not None:
        return core_op, 1.0
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        return ReduceOp.SUM, float(factor.item() if hasattr(factor, "item") else factor)
    raise UnsupportedOperationError(f"{call}: the hvdlite backend does not reduce with {kind} (it has SUM, AVG, MIN, "
                                    "MAX, PRODUCT, PREMUL_SUM, and BAND, BOR, BXOR for integers and bool)")


_PLAIN = tuple(_OPS.items())  # compared with ==: hashing torch's op costs several times more


def plain_reduction(op: Any) -> ReduceOp | None:
    """hvdlite's op for torch's ``op`` where it is one of the core's own (no prescale), else None."""
    for torch_op, core_op in _PLAIN:
        if op == torch_op:
            return core_op
    return None

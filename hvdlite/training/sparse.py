"""Sparse gradients reduced as Horovod reduces them: every rank's rows allgathered, then scaled.

A sparse tensor travels as its (values, indices) rows. Gathering concatenates them; rows with
the same index are added later by the framework (torch coalesces, a TensorFlow optimizer
scatter-adds IndexedSlices), so the result is a Sum, or an Average after scaling. No other op
can be built this way: Min, Max and Product are refused with an error naming the tensor and the
op (Horovod would quietly sum), pointing at ``sparse_as_dense``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import basics
from ..ops import ReduceOp
from .options import reduction_scale, require_sum_or_average

# (values, indices, name) -> a function that waits for and returns every rank's (values, indices)
Gather = Callable[[Any, Any, str | None], Callable[[], tuple[Any, Any]]]


def check_sparse_op(op: ReduceOp, what: str) -> None:
    """Refuse an op that gathering sparse rows cannot compute; ``what`` names the call and tensor."""
    require_sum_or_average(op, what, "; sparse tensors are allgathered (their rows concatenated), so pass "
                                     "sparse_as_dense=True to reduce them as dense tensors")


def allreduce_sparse(values: Any, indices: Any, name: str | None, op: ReduceOp, prescale: float, postscale: float,
                     gather: Gather, scale: Callable[[Any, float], Any],
                     what: str | None = None, size: int | None = None) -> Callable[[], tuple[Any, Any]]:
    """Start reducing a sparse tensor given as rows; returns a function that gives every rank's rows.

    ``gather`` starts the framework's allgather of the rows, ``scale`` multiplies values by a
    float. ``what`` names the call in errors (by default, from ``name``). ``size``: how many ranks
    take part (a process set's; default every rank of the job).
    """
    if what is None:
        what = f"allreduce of sparse tensor {name!r}" if name else "allreduce of a sparse tensor"
    check_sparse_op(op, what)
    factor = reduction_scale(op, prescale, postscale, basics.size() if size is None else size)
    wait = gather(values, indices, name)

    def finish() -> tuple[Any, Any]:
        gathered_values, gathered_indices = wait()
        if factor != 1.0:
            gathered_values = scale(gathered_values, factor)
        return gathered_values, gathered_indices
    return finish

"""The dtypes the core moves, and how each is reduced.

The core's tensor type is a NumPy array; bfloat16 comes from ``ml_dtypes``. float16 and bfloat16
are *reduced in float32*: the engine widens them into a float32 wire buffer, reduces, applies the
scale factors, and rounds once on the way back. That costs twice the bytes on the wire but gives
exactly what a float32 accumulation would give, whatever the number of ranks (a reduction in the
narrow type would round at every hop). MPI has no bfloat16 type anyway.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import UnsupportedOperationError
from .ops import ReduceOp

bfloat16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED: dict[str, np.dtype] = {
    d.name: d
    for d in (
        np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32),
        np.dtype(np.int64), np.dtype(np.float16), bfloat16, np.dtype(np.float32),
        np.dtype(np.float64), np.dtype(np.bool_),
    )
}
_WIDENED = {"float16", "bfloat16"}


def dtype_name(array: np.ndarray, tensor_name: str) -> str:
    """Name of ``array``'s dtype, or a clear error if the core cannot move it."""
    name = array.dtype.name
    if name not in SUPPORTED:
        raise UnsupportedOperationError(
            f"tensor {tensor_name!r} has dtype {name}, which hvdlite does not support; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    return name


def is_floating(name: str) -> bool:
    """True for float16, bfloat16, float32 and float64."""
    return name in _WIDENED or np.issubdtype(SUPPORTED[name], np.floating)


def wire_dtype(name: str) -> np.dtype:
    """The dtype a reduction of ``name`` travels in (float32 for the 16-bit floats, uint8 for bool)."""
    if name in _WIDENED:
        return np.dtype(np.float32)
    if name == "bool":
        return np.dtype(np.uint8)
    return SUPPORTED[name]


def wire_op(name: str, op: ReduceOp) -> ReduceOp:
    """The op actually run on the wire: bool Sum/Max are logical or (Max), Product/Min are and (Min)."""
    if name != "bool":
        return op
    return ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN


def check_reduction(name: str, op: ReduceOp, prescale: float, postscale: float, tensor: str) -> None:
    """Reject reductions that have no sensible meaning for the dtype, naming the tensor."""
    if name == "bool" and op is ReduceOp.AVERAGE:
        raise UnsupportedOperationError(f"tensor {tensor!r}: Average is not defined for bool; use Sum/Min/Max")
    if not is_floating(name) and (prescale != 1.0 or postscale != 1.0):
        raise UnsupportedOperationError(
            f"tensor {tensor!r}: prescale_factor/postscale_factor need a floating-point tensor, got {name}"
        )

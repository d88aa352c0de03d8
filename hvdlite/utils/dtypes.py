"""The dtypes the core moves, and how each is reduced.

The core's tensor type is a NumPy array; bfloat16 comes from ``ml_dtypes``. float16 and bfloat16
are *reduced in float32*: the engine widens them into a float32 wire buffer, reduces, applies the
scale factors, and rounds once on the way back. That costs twice the bytes on the wire but gives
exactly what a float32 accumulation would give, whatever the number of ranks (a reduction in the
narrow type would round at every hop). MPI has no bfloat16 type anyway.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

from ..errors import UnsupportedOperationError
from ..ops import ReduceOp

# ml_dtypes, where bfloat16's NumPy dtype comes from, costs about 0.9 s of CPU to import: it is
# loaded once a bfloat16 array is seen or its dtype asked for (TensorFlow and JAX import it anyway;
# a torch job without bfloat16 never pays it). The two tables below add bfloat16 on their first miss
# on it, so every other lookup stays a plain dict lookup (these run for every tensor of every step).
NAMES: tuple[str, ...] = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                          "float64", "bool")
_NUMPY = {np.dtype(t).name: np.dtype(t) for t in (
    np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_)}


class _ByName(dict):
    """Core dtype name -> NumPy dtype (``[]``: bfloat16 loads ml_dtypes the first time)."""

    def __missing__(self, name: str) -> np.dtype:
        if name != "bfloat16":
            raise KeyError(name)
        return _load_bfloat16()


class _NameOf(dict):
    """NumPy dtype -> core name (``[]``: bfloat16's once ml_dtypes is loaded; ``get`` stays dict's own
    and misses it until a ``[]`` or :func:`dtype_name` has added it)."""

    def __missing__(self, dtype: Any) -> str:
        if is_bfloat16(dtype):
            return NAME_OF[_load_bfloat16()]
        raise KeyError(dtype)


NUMPY_DTYPE: dict[str, np.dtype] = _ByName(_NUMPY)
NAME_OF: dict[np.dtype, str] = _NameOf({dtype: name for name, dtype in _NUMPY.items()})


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes when no one else did."""
    return "ml_dtypes" in sys.modules and isinstance(dtype, np.dtype) and dtype == _load_bfloat16()


@functools.cache
def _load_bfloat16() -> np.dtype:
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16)
    dict.__setitem__(NUMPY_DTYPE, "bfloat16", dtype)
    dict.__setitem__(NAME_OF, dtype, "bfloat16")
    return dtype


def __getattr__(name: str) -> Any:
    """``bfloat16`` (the dtype) and ``SUPPORTED`` (name -> dtype, every dtype), which load ml_dtypes."""
    if name == "bfloat16":
        return _load_bfloat16()
    if name == "SUPPORTED":
        return {dtype_name: NUMPY_DTYPE[dtype_name] for dtype_name in NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_WIDENED = {"float16", "bfloat16"}
_FLOATING = frozenset(name for name in NAMES if name in _WIDENED or np.issubdtype(_NUMPY[name], np.floating))
_WIRE = {name: np.dtype(np.float32) if name in _WIDENED else np.dtype(np.uint8) if name == "bool" else _NUMPY[name]
         for name in NAMES}
WIRE_NAME = {name: wire.name for name, wire in _WIRE.items()}
# On the device (NCCL) path the 16-bit floats reduce in their own type, as NCCL, DDP and Horovod
# do: on a GPU the halved bytes are the point of them. NCCL has no int16 (widened to int32) and
# no bool (bytes, with the logical ops of wire_op). uint16 fits in int32 too.
DEVICE_WIRE_NAME = {name: "int32" if name in ("int16", "uint16") else "uint8" if name == "bool" else name
                    for name in NAMES}


def wire_name(name: str, device: str) -> str:
    """The dtype a reduction of ``name`` travels in on ``device`` ("cpu", or "cuda" for NCCL)."""
    return WIRE_NAME[name] if device == "cpu" else DEVICE_WIRE_NAME[name]


def dtype_name(array: np.ndarray, tensor_name: str) -> str:
    """Name of ``array``'s dtype, or a clear error if the core cannot move it."""
    name = NAME_OF.get(array.dtype)
    if name is None:
        if is_bfloat16(array.dtype):
            return NAME_OF[array.dtype]  # the first bfloat16 array: ml_dtypes is loaded now
        name = array.dtype.name
        if name in NAMES:  # equal names, unequal dtypes: a byte-swapped array
            raise UnsupportedOperationError(
                f"tensor {tensor_name!r} has dtype {array.dtype.str} in non-native byte order; "
                "convert it with .astype(array.dtype.newbyteorder('='))")
        raise UnsupportedOperationError(
            f"tensor {tensor_name!r} has dtype {name}, which hvdlite does not support; "
            f"supported: {', '.join(NAMES)}"
        )
    return name


def is_floating(name: str) -> bool:
    """True for float16, bfloat16, float32 and float64."""
    return name in _FLOATING


def wire_dtype(name: str) -> np.dtype:
    """The dtype a reduction of ``name`` travels in (float32 for the 16-bit floats, uint8 for bool)."""
    return _WIRE[name]


def wire_op(name: str, op: ReduceOp) -> ReduceOp:
    """The op actually run on the wire: bool Sum/Max are logical or (Max), Product/Min are and (Min)."""
    if name != "bool":
        return op
    return ReduceOp.MAX if op in (ReduceOp.SUM, ReduceOp.MAX) else ReduceOp.MIN


def check_reduction(name: str, op: ReduceOp, prescale: float, postscale: float, tensor: str) -> None:
    """Reject reductions that have no sensible meaning for the dtype, naming the tensor.

    Integer tensors may be scaled, as in Horovod: each value times the factor in float64, truncated
    back to the integer type (before the reduction for ``prescale``, after it for ``postscale``),
    on the host and on a GPU alike.
    """
    if op is ReduceOp.ADASUM:
        _check_adasum(name, prescale, postscale, tensor)
    if name == "bool" and op is ReduceOp.AVERAGE:
        raise UnsupportedOperationError(f"tensor {tensor!r}: Average is not defined for bool; use Sum/Min/Max")
    if name == "bool" and (prescale != 1.0 or postscale != 1.0):
        raise UnsupportedOperationError(
            f"tensor {tensor!r}: prescale_factor/postscale_factor need a numeric tensor, got bool")


def _check_adasum(name: str, prescale: float, postscale: float, tensor: str) -> None:
    """Adasum weighs floating-point gradients by their dot products: no integers, no extra scaling."""
    if not is_floating(name):
        raise UnsupportedOperationError(f"tensor {tensor!r}: Adasum needs a floating-point tensor "
                                        f"(float16, bfloat16, float32, float64), got {name}")
    if prescale != 1.0 or postscale != 1.0:
        raise UnsupportedOperationError(f"tensor {tensor!r}: Adasum takes no prescale_factor/postscale_factor "
                                        f"(got {prescale:g}, {postscale:g}): scale the tensor before or after")

"""Scaling device buffers in place, bfloat16 included (cupy has no bfloat16 type).

NCCL's pre-multiplied sum folds the factors of floating Sums and Averages into the reduction. The
rest comes here, as on the host path: Min, Max and Product with a pre/post-scale factor, and every
scaled integer reduction (PreMulSum is floating-point only), which is scaled the host plane's way:
each value times the factor in float64, truncated back toward zero (Horovod's convention). Every
function takes the array module ``xp`` (cupy on the device); written only with operations NumPy
shares, so the arithmetic is tested against the host plane and ``ml_dtypes`` without a GPU.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def bfloat16_to_float32(bits: Any, xp: ModuleType) -> Any:
    """bfloat16 values held as uint16 bits -> float32 (exact: bfloat16 is float32's top half)."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def float32_to_bfloat16(values: Any, xp: ModuleType) -> Any:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even; NaN stays a (quiet) NaN."""
    bits = values.view(xp.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(xp.uint16)
    return xp.where(xp.isnan(values), xp.uint16(0x7FC0), rounded)


def scale_in_place(values: Any, dtype_name: str, factor: float, xp: ModuleType, divisor: int = 1) -> None:
    """``values *= factor`` (then ``/= divisor``) for an array holding ``dtype_name`` (bfloat16 as its uint16 bits).

    ``divisor`` is an integer Average's rank count: divided after the factor, in float64, as the
    host plane does, so the truncated results equal the host's bit for bit.
    """
    if factor == 1.0 and divisor == 1:
        return
    if dtype_name == "bfloat16":
        values[...] = float32_to_bfloat16(bfloat16_to_float32(values, xp) * xp.float32(factor / divisor), xp)
    elif values.dtype.kind == "f":
        values *= values.dtype.type(factor / divisor)
    else:
        wide = values.astype(xp.float64) * factor
        if divisor != 1:
            wide /= divisor
        values[...] = wide.astype(values.dtype)  # a C cast: truncation toward zero

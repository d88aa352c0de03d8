"""Scaling device buffers in place, bfloat16 included (cupy has no bfloat16 type).

Sums and Averages never come here: NCCL's pre-multiplied sum folds their factors into the
reduction. Min, Max and Product with a pre/post-scale factor do, as on the host path. Every
function takes the array module ``xp`` (cupy on the device); written only with operations NumPy
shares, so the bit arithmetic is tested against ``ml_dtypes`` on machines without a GPU.
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


def scale_in_place(values: Any, dtype_name: str, factor: float, xp: ModuleType) -> None:
    """``values *= factor`` for an array holding ``dtype_name`` (bfloat16 as its uint16 bits)."""
    if factor == 1.0:
        return
    if dtype_name == "bfloat16":
        values[...] = float32_to_bfloat16(bfloat16_to_float32(values, xp) * xp.float32(factor), xp)
    else:
        values *= values.dtype.type(factor)

"""Output buffers the core allocates: 64-byte aligned, so frameworks can adopt them without a copy.

JAX (and XLA generally) takes a NumPy array into a device buffer without copying only when its
data pointer is 64-byte aligned; NumPy's allocator guarantees 16. Every result the core hands
back therefore starts on a 64-byte boundary, including each member's slice of a fusion buffer.
"""

from __future__ import annotations

import math

import numpy as np

ALIGNMENT = 64


def aligned_empty(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    # The ndarray constructor keeps the offset even for an empty array (an empty slice would not).
    return np.ndarray(shape, dtype, buffer=raw, offset=-raw.ctypes.data % ALIGNMENT)


def aligned_copy(array: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """``array`` copied (and cast to ``dtype``, if given) into an aligned buffer."""
    out = aligned_empty(array.shape, array.dtype if dtype is None else dtype)
    np.copyto(out, array, casting="unsafe")
    return out


def padded_count(count: int, itemsize: int) -> int:
    """``count`` elements rounded up so that whatever follows them in a buffer stays aligned."""
    step = ALIGNMENT // math.gcd(ALIGNMENT, itemsize)
    return -(-count // step) * step

"""A tensor stored in pieces: several arrays of one dtype, reduced as their concatenation.

An optimizer reduces a *bucket* of gradients as one request: one name, one negotiation, one
handle, one completion, instead of one of each per gradient. Each gradient is still reduced in
its own memory (no packing copy): the executor reduces the pieces one after another, pipelined.

The arrays are produced by ``resolve`` on the engine thread, when the reduction runs. A gradient
hook inside backward then only counts arrivals: measured at np=2 on two busy cores, converting a
gradient to a NumPy view and checking it costs 35-70 us per gradient inside backward (cold
caches), against about 1 us for the count; on the engine thread that work runs beside backward.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import UnsupportedOperationError


class Segments:
    """``size`` elements of ``dtype`` held by the arrays ``resolve()`` returns (flat, contiguous)."""

    __slots__ = ("name", "dtype", "size", "_resolve", "_arrays")

    def __init__(self, name: str, dtype: np.dtype, size: int, resolve: Callable[[], list[np.ndarray]]) -> None:
        self.name = name
        self.dtype = np.dtype(dtype)
        self.size = size
        self._resolve = resolve
        self._arrays: list[np.ndarray] | None = None

    def arrays(self) -> list[np.ndarray]:
        """The pieces, resolved on first use and checked against the description."""
        if self._arrays is None:
            arrays = self._resolve()
            wrong = [f"piece {i}: {a.dtype}, {'contiguous' if a.flags.c_contiguous else 'not contiguous'}"
                     for i, a in enumerate(arrays)
                     if a.dtype != self.dtype or not (a.flags.c_contiguous and a.flags.writeable)]
            total = sum(a.size for a in arrays)
            if wrong or total != self.size:
                raise UnsupportedOperationError(
                    f"tensor {self.name!r} was described as {self.size} elements of {self.dtype} in writable "
                    f"contiguous pieces; got {total} elements" + (f" ({'; '.join(wrong)})" if wrong else ""))
            self._arrays = [a.reshape(-1) for a in arrays]
        return self._arrays

    def scatter(self, flat: np.ndarray) -> None:
        """Write ``flat`` (``size`` elements, any dtype that casts) back into the pieces."""
        start = 0
        for array in self.arrays():
            np.copyto(array, flat[start:start + array.size], casting="unsafe")
            start += array.size

    def __repr__(self) -> str:
        return f"Segments({self.name!r}, {self.size} x {self.dtype})"

"""Checked descriptions of reductions (:class:`~hvdlite.core.work.request.RequestMeta`), remembered per runtime.

A training loop repeats the same calls every step; checking the dtype, op and scale factors and
building the description again each time cost microseconds on the small-tensor path.
"""

from __future__ import annotations

import numpy as np

from ..gpu.arrays import DeviceArray
from ..ops import Collective, ReduceOp
from .work.request import RequestMeta, checked_reduction


def device_of(array: np.ndarray | DeviceArray) -> str:
    """Where ``array`` lives, as negotiated: "cpu", or "cuda" for a :class:`DeviceArray`."""
    return array.device if isinstance(array, DeviceArray) else "cpu"


def describe_reduction(collective: Collective, array: np.ndarray | DeviceArray, name: str, op: ReduceOp,
                       prescale: float, postscale: float) -> RequestMeta:
    """The checked description of a reduction (raises on a bad dtype, op or scale factor)."""
    return checked_reduction(collective, array, name, op, prescale, postscale, device_of(array))


class Descriptions:
    """Reduction descriptions by everything they depend on; bounded, since generated names never repeat."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._memo: dict[tuple, RequestMeta] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def reduction(self, collective: Collective, array: np.ndarray | DeviceArray, name: str, op: ReduceOp,
                  prescale: float, postscale: float) -> RequestMeta:
        """:func:`describe_reduction`, remembered."""
        prescale, postscale = float(prescale), float(postscale)  # also makes a 0-d tensor or NumPy scalar a key
        key = (name, collective, array.dtype, array.shape, op, prescale, postscale, type(array))
        meta = self._memo.get(key)
        if meta is None:
            meta = describe_reduction(collective, array, name, op, prescale, postscale)
            if len(self._memo) >= self.LIMIT:
                self._memo.clear()
            self._memo[key] = meta
        return meta

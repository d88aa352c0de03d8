"""The interfaces to a transport: the negotiation's control channel and the host plane's data transport.

Negotiation and fusion never see MPI; the host data plane (:mod:`hvdlite.core.planes.host`) moves
host buffers through a :class:`Transport`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ...ops import ReduceOp


class ControlChannel(Protocol):
    """The negotiation transport: small collectives on a communicator of their own."""

    rank: int
    size: int

    def band(self, vector: bytes) -> bytes | bytearray:
        """Bitwise-AND all-reduce of a byte string (every rank's has the same length)."""

    def carries(self, vector_bytes: int, payload_bytes: int) -> bool:
        """True if :meth:`band_carrying` can carry a payload of ``payload_bytes`` (the same on every rank)."""

    def band_carrying(self, vector: bytes, payload: memoryview) -> tuple[bytes, list[memoryview]]:
        """:meth:`band`, also handing every rank's ``payload`` (of one length) to every rank, in rank order.

        Small tensors ride the negotiation this way (see :meth:`hvdlite.core.pipeline.negotiate.Negotiator.agree_lone`).
        """

    def carrier(self, vector_bytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> Carrier | None:
        """What runs :meth:`band_carrying` for one tensor of ``dtype`` and ``shape`` beside a vector of
        ``vector_bytes``, call after call (the small-op path), or None where this channel cannot carry it."""

    def gather_to_root(self, payload: bytes) -> list[bytes] | None:
        """Every rank's payload on rank 0 (``None`` elsewhere)."""

    def broadcast_from_root(self, payload: bytes | None) -> bytes:
        """Rank 0's payload on every rank."""

    def reachable_peers(self, window: float) -> set[int]:
        """After a timed-out wait: the ranks (this one included) that answer within ``window`` seconds."""

    def close(self) -> None:
        """Release what the channel holds beyond its communicator (collective: at shutdown, on every rank)."""


class Carrier(Protocol):
    """One tensor's :meth:`ControlChannel.band_carrying`, with what each call needs built once
    (see :mod:`hvdlite.core.pipeline.lone`)."""

    def exchange(self, vector: bytes, tensor: np.ndarray) -> tuple[bytes, Sequence[np.ndarray] | None]:
        """The AND of every rank's ``vector``, and, if every rank sent this very vector, every rank's
        ``tensor`` in rank order (arrays valid until this rank's next exchange but one); else None."""


class SoleRankCarrier:
    """The carrier of a one-rank channel: the AND of one vector is itself, and the only tensor is this one."""

    @staticmethod
    def exchange(vector: bytes, tensor: np.ndarray) -> tuple[bytes, tuple[np.ndarray]]:
        return vector, (tensor,)


class VectorCarrier:
    """The carrier of a tensor that cannot ride along (device memory): the vector alone, through the
    channel's :meth:`ControlChannel.band`; every rank's tensor stays where it is (an empty sequence)."""

    def __init__(self, band: Callable[[bytes], bytes | bytearray]) -> None:
        self._band = band

    def exchange(self, vector: bytes, tensor: object) -> tuple[bytes | bytearray, tuple | None]:
        reduced = self._band(vector)
        return (vector, ()) if reduced == vector else (reduced, None)


class Transport(Protocol):
    """Moves host tensor bytes for the host plane. Buffers are flat, contiguous NumPy arrays in the wire dtype."""

    name: str
    chunk_bytes: int  # large reductions go in pieces of this size; the same on every rank (autotune moves it)

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: ReduceOp,
                  finish_piece: Callable[[np.ndarray], None] | None = None,
                  done: Callable[[], None] | None = None) -> None:
        """Reduce into ``recv``; ``send=None`` means in place. SUM stands in for AVERAGE.

        ``finish_piece`` is applied to each finished piece of the result while it is still in
        cache: scaling there is cheaper than a second pass over the whole buffer. It must be
        element-wise: a transport may apply it to a piece before that piece reaches ``recv``.

        Without ``done`` the call returns once ``recv`` holds the result. With it, the transport may
        return while the reduction is still in flight and call ``done()`` once it finished, from a
        later call on the same thread or from :meth:`flush`; the buffers must stay untouched until then.
        """

    def flush(self) -> None:
        """Finish every reduction still in flight (running their ``done`` callbacks)."""

    def quiesce(self) -> None:
        """:meth:`flush`, then return only once no peer needs this rank's help to finish its transfers."""

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        """Concatenate every rank's ``send`` (``counts[r]`` elements from rank r) into ``recv``."""

    def broadcast(self, buffer: np.ndarray, root: int) -> None:
        """Overwrite ``buffer`` with ``root``'s contents."""

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]) -> None:
        """Send ``send_counts[r]`` elements to rank r; receive ``recv_counts[r]`` from it."""

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int], op: ReduceOp) -> None:
        """Reduce ``send`` and leave block r (``counts[r]`` elements) on rank r."""

    def barrier(self) -> None:
        """Return once every rank has entered."""

    def adasum(self, buffer: np.ndarray) -> None:
        """Replace the flat float32/float64 ``buffer`` by the Adasum of every rank's (:mod:`hvdlite.core.transport.adasum_math`)."""

    def close(self) -> None:
        """Release what the transport holds beyond its communicator (collective: at shutdown, on every rank)."""

"""Adasum across the ranks of one communicator, by recursive vector halving (as Horovod's AdasumMPI).

For the ``p`` ranks of the largest power of two (the others first hand their vector to rank
``r - p``, which combines the two whole vectors itself; see :mod:`hvdlite.core.transport.adasum_math` for the order):
at level ``k`` each rank pairs with ``rank ^ 2**k``. The pair shares one range of the vector; the
lower rank keeps its first half, the higher its second, and each sends the other the half it gives
up. Both halves it now holds belong to two subtree results, A (the lower rank's side) and B; the
dot product and norms of the *whole* A and B are the sum of the partial sums over every rank of the
``2**(k+1)`` ranks holding pieces of them, which those ranks add up by recursive doubling (three
float64 numbers). Each rank then replaces its kept half by the Adasum combination. After the last
level every rank owns ``1/p`` of the result; a recursive doubling allgather rebuilds the whole
vector on every rank, and the leftover ranks get it from their partner. Every rank ends with the
same bits: each piece is computed once, by its owner.

Point-to-point messages only (no sub-communicators to build), each wait polled with the
transport's deadline, so a dead peer is an error within ``HVDLITE_COMM_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from . import adasum_math as adasum

_TAG_FOLD, _TAG_HALF, _TAG_SUMS, _TAG_GATHER, _TAG_BACK = 7301, 7302, 7303, 7304, 7305


class AdasumExchange:
    """Adasum of one flat floating buffer in place, on every rank of ``comm``."""

    def __init__(self, comm: MPI.Comm, wait: Callable[[MPI.Request], None]) -> None:
        self._comm = comm
        self._wait = wait
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def reduce(self, buffer: np.ndarray) -> None:
        """Replace ``buffer`` (flat float32 or float64, the same length on every rank) by the Adasum."""
        if self.size == 1:
            return
        p = adasum.largest_power_of_two(self.size)
        if self.rank >= p:  # a leftover rank: its partner combines for it, then sends the result
            self._wait(self._comm.Isend(buffer, dest=self.rank - p, tag=_TAG_FOLD))
            self._wait(self._comm.Irecv(buffer, source=self.rank - p, tag=_TAG_BACK))
            return
        leftover = self.rank + p if self.rank + p < self.size else None
        if leftover is not None:
            theirs = np.empty_like(buffer)
            self._wait(self._comm.Irecv(theirs, source=leftover, tag=_TAG_FOLD))
            adasum.combine_into(buffer, theirs, adasum.partial_sums(buffer, theirs), buffer)
        owned = self._halve(buffer, p)
        self._gather(buffer, owned, p)
        if leftover is not None:
            self._wait(self._comm.Isend(buffer, dest=leftover, tag=_TAG_BACK))

    def _exchange(self, send: np.ndarray, recv: np.ndarray, peer: int, tag: int) -> None:
        receiving = self._comm.Irecv(recv, source=peer, tag=tag)
        sending = self._comm.Isend(send, dest=peer, tag=tag)
        self._wait(receiving)
        self._wait(sending)

    def _halve(self, buffer: np.ndarray, p: int) -> tuple[int, int]:
        """The reduce-scatter levels; returns the range of the result this rank owns."""
        low, high = 0, buffer.size
        distance = 1
        while distance < p:
            peer = self.rank ^ distance
            middle = low + (high - low) // 2
            lower = self.rank & distance == 0
            keep, give = ((low, middle), (middle, high)) if lower else ((middle, high), (low, middle))
            theirs = np.empty(keep[1] - keep[0], dtype=buffer.dtype)
            self._exchange(buffer[give[0]:give[1]], theirs, peer, _TAG_HALF)
            mine = buffer[keep[0]:keep[1]]
            a, b = (mine, theirs) if lower else (theirs, mine)  # A: the lower rank's subtree
            sums = self._sum_over_subtree(adasum.partial_sums(a, b), 2 * distance)
            adasum.combine_into(a, b, sums, mine)
            low, high = keep
            distance *= 2
        return low, high

    def _sum_over_subtree(self, sums: np.ndarray, width: int) -> np.ndarray:
        """The sum of ``sums`` over the ``width`` ranks of this rank's aligned block (recursive doubling:
        the lower rank's value first, so every rank of the block gets the same bits)."""
        step = 1
        while step < width:
            theirs = np.empty_like(sums)
            self._exchange(sums, theirs, self.rank ^ step, _TAG_SUMS)
            sums = sums + theirs if self.rank & step == 0 else theirs + sums
            step *= 2
        return sums

    def _gather(self, buffer: np.ndarray, owned: tuple[int, int], p: int) -> None:
        """The allgather levels, in reverse: pairs swap the ranges they own until all own everything."""
        low, high = owned
        distance = p // 2
        ranges = self._ranges(buffer.size, p)
        while distance >= 1:
            peer = self.rank ^ distance
            peer_low, peer_high = ranges[peer][self._level(distance)]
            self._exchange(buffer[low:high], buffer[peer_low:peer_high], peer, _TAG_GATHER)
            low, high = min(low, peer_low), max(high, peer_high)
            distance //= 2
        assert (low, high) == (0, buffer.size), (low, high)

    @staticmethod
    def _level(distance: int) -> int:
        return distance.bit_length() - 1

    @staticmethod
    def _ranges(count: int, p: int) -> list[list[tuple[int, int]]]:
        """For every rank of ``p``, the range it holds after each halving level (index = level)."""
        ranges = []
        for rank in range(p):
            low, high, held = 0, count, []
            distance = 1
            while distance < p:
                middle = low + (high - low) // 2
                low, high = (low, middle) if rank & distance == 0 else (middle, high)
                held.append((low, high))
                distance *= 2
            ranges.append(held)
        return ranges

"""Host allreduce through shared memory, for jobs whose ranks all run on one host.

MPICH reduces host buffers between the processes of one host through its own shared-memory
queues. Reducing in a window that every rank maps (MPI-3 ``MPI_Win_allocate_shared``) moves fewer
bytes: each rank copies in only the parts its peers reduce, reduces one part, and copies out the
others. Measured here against MPI's path for the same buffers, both through
:class:`hvdlite.core.transport.mpi.MpiTransport` in the same run (2 cores, float32): np=2 1.31 at 8 KB,
0.87 at 16 KB, 0.93 at 32 KB, 0.65 at 64 KB; np=3 (oversubscribed) 1.43, 0.94, 0.78, 0.66. Hence
``HVDLITE_SHM_MIN_BYTES`` = 32 KiB: below it MPICH's eager path is faster. Larger buffers: see
``bench/README.md``.

Each rank owns two slots of :data:`SLOT_BYTES` in the window. A reduction goes slot-sized chunk
by chunk. A chunk is split into one part per rank; rank r owns part r:

1. every rank copies the parts of its input that its peers own into its current slot;
2. barrier;
3. rank r reduces part r (its own input, then each peer's slot in rank order) into its slot,
   applies the post-scale there, and copies the result into its output;
4. barrier;
5. every rank copies each peer's part from that peer's slot into its output.

Every element is reduced and scaled by exactly one rank, so every rank gets bitwise the same
result. Consecutive chunks alternate slots: a rank may start chunk k+1 while a slower peer still
reads chunk k, and that slot is written again only at k+2, after a barrier the slow peer reaches
once it has read. The barriers are flags in shared memory (:class:`SharedSegments`), polled with
the job's deadline.

The negotiation's bitwise AND goes through shared memory too (:class:`SharedMemoryBand`). Measured
in a loop against the MPI channel's nonblocking all-reduce: np=2 6.8-7.8 us against 8.5-18 us;
np=3 30-48 us against 31-3,300 us. MPI's needs every rank's progress calls, and a rank whose wait
went to sleep (as negotiation waits do, to spare the CPU) delays the others by its sleep; here a
rank needs only its peers' arrival.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...errors import HvdliteError
from ...ops import ReduceOp

if TYPE_CHECKING:  # importing mpi4py's MPI starts MPI: only hvdlite.init() may (hvdlite.core.mpi_start)
    from mpi4py import MPI

# Measured with a prototype, np=2, 1-16 MB buffers, against MPICH: 1 MB slots 0.68-0.80 of its time,
# 2 MB slots 0.66-0.72, 4 MB slots 0.71-0.89.
SLOT_BYTES = 2 * 1024 * 1024
_ALIGN = 64  # part boundaries on cache lines
_HEADER = 64  # a segment's barrier generation, alone on its cache line
UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,  # the division is the post-scale
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


class SharedSegments:
    """Every rank's segment of one MPI-3 shared window, and a barrier on flags inside them.

    A segment is a 64-byte header, whose first word is the rank's barrier generation, then
    ``slots`` slots of ``slot_bytes``. The barrier is a store and loads in shared memory: each rank
    bumps its generation and waits until every peer's reached it, with no MPI progress needed from
    anyone (a 16 KB reduction with two of them measured 24 us, against 27 us with a polled
    ``MPI_Ibarrier`` each). ``MPI_Win_sync`` on both sides makes the slots' stores visible to
    peers' loads, as the MPI-3 shared-memory model requires.
    """

    def __init__(self, node: MPI.Comm, window: MPI.Win, slots: int, slot_bytes: int,
                 wait_for: Callable[[Callable[[], bool]], None]) -> None:
        self._node = node
        self._window = window
        self._wait_for = wait_for
        self.rank, self.size = node.Get_rank(), node.Get_size()
        self.slot_bytes = slot_bytes
        memory = [np.frombuffer(window.Shared_query(r)[0], dtype=np.uint8) for r in range(self.size)]
        # Flags as memoryviews: indexing one gives a Python int, several times cheaper than NumPy's scalars.
        flags = [memoryview(m[:8]).cast("q") for m in memory]
        self._own_flag = flags[self.rank]
        self._peer_flags = [flag for r, flag in enumerate(flags) if r != self.rank]
        self.slots = [[m[_HEADER + i * slot_bytes : _HEADER + (i + 1) * slot_bytes] for m in memory]
                      for i in range(slots)]
        self._generation = 0

    @classmethod
    def allocate(cls, comm: MPI.Comm, slots: int, slot_bytes: int,
                 wait_for: Callable[[Callable[[], bool]], None]) -> SharedSegments | None:
        """Segments for ``comm``, or None unless all of its ranks (two or more) share one host.

        Collective over ``comm``: every rank reaches the same answer, because a host that holds
        only some of the ranks gives each of them a node communicator smaller than ``comm``.
        """
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        if comm.Get_size() < 2 or node.Get_size() != comm.Get_size():
            node.Free()
            return None
        nbytes = _HEADER + slots * slot_bytes
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # each rank's segment in memory near it
        try:
            window = MPI.Win.Allocate_shared(nbytes, 1, info=info, comm=node)
        except MPI.Exception as exc:
            raise HvdliteError(
                f"rank {comm.Get_rank()} could not allocate {nbytes} bytes of shared memory "
                f"({exc.Get_error_string()}); give /dev/shm more room, or set HVDLITE_SHM=0") from None
        finally:
            info.Free()
        own = window.Shared_query(node.Get_rank())[0]
        np.frombuffer(own, dtype=np.int64, count=1)[0] = 0  # generation 0, before any peer looks
        node.Barrier()
        window.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for the whole job: Win_sync needs one
        return cls(node, window, slots, slot_bytes, wait_for)

    def barrier(self) -> None:
        """Return once every rank called it as often as this one; peers then see this rank's stores."""
        self._generation = generation = self._generation + 1
        self._window.Sync()
        self._own_flag[0] = generation
        peers = self._peer_flags
        for flag in peers:  # a loop, not all(): no generator frame on the path of every small op
            if flag[0] < generation:
                self._wait_for(lambda: all(peer[0] >= generation for peer in peers))
                break
        self._window.Sync()

    def close(self) -> None:
        """Free the window and the node communicator (collective: every rank calls it)."""
        self.slots, self._own_flag, self._peer_flags = [], None, []  # the views go before the window
        self._window.Unlock_all()
        self._window.Free()
        self._node.Free()


class SharedMemoryAllreduce:
    """Allreduce of host arrays through shared segments; build it with :meth:`create`."""

    def __init__(self, segments: SharedSegments, min_bytes: int) -> None:
        self._segments = segments
        self.min_bytes = min_bytes
        self.rank, self.size = segments.rank, segments.size
        self._next_slot = 0

    @classmethod
    def create(cls, comm: MPI.Comm, min_bytes: int,
               wait_for: Callable[[Callable[[], bool]], None]) -> SharedMemoryAllreduce | None:
        """The reducer for ``comm``, or None unless all of its ranks share one host (collective)."""
        segments = SharedSegments.allocate(comm, 2, SLOT_BYTES, wait_for)
        return None if segments is None else cls(segments, min_bytes)

    def handles(self, recv: np.ndarray, op: ReduceOp) -> bool:
        """True if this reducer should run the allreduce of ``recv`` (large enough, a known op)."""
        return recv.nbytes >= self.min_bytes and op in UFUNCS

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: ReduceOp,
                  finish_part: Callable[[np.ndarray], None] | None = None) -> None:
        """Reduce ``send`` (or ``recv`` in place, if None) into ``recv`` across every rank.

        ``finish_part`` (element-wise, e.g. the post-scale) runs once per element, on its owner.
        """
        ufunc = UFUNCS[op]
        step = SLOT_BYTES // recv.itemsize
        # Overflow to inf is a result here, as in MPI, not a warning.
        with np.errstate(over="ignore", invalid="ignore"):
            for at in range(0, recv.size, step):
                out = recv[at : at + step]
                self._chunk(out if send is None else send[at : at + step], out, ufunc, finish_part)

    def _chunk(self, source: np.ndarray, out: np.ndarray, ufunc: np.ufunc,
               finish_part: Callable[[np.ndarray], None] | None) -> None:
        count, rank = out.size, self.rank
        segments = self._segments
        nbytes = count * out.itemsize
        slots = [slot[:nbytes].view(out.dtype) for slot in segments.slots[self._next_slot]]
        self._next_slot ^= 1
        bounds = _part_bounds(count, self.size, out.itemsize)
        low, high = bounds[rank], bounds[rank + 1]
        mine = slots[rank]
        mine[:low] = source[:low]
        mine[high:] = source[high:]
        segments.barrier()
        part = mine[low:high]
        first = True
        for peer, slot in enumerate(slots):
            if peer != rank:
                ufunc(source[low:high] if first else part, slot[low:high], out=part)
                first = False
        if finish_part is not None:
            finish_part(part)
        out[low:high] = part
        segments.barrier()
        for peer, slot in enumerate(slots):
            if peer != rank:
                out[bounds[peer] : bounds[peer + 1]] = slot[bounds[peer] : bounds[peer + 1]]

    def close(self) -> None:
        """Free the shared window (collective: every rank calls it)."""
        self._segments.close()


class SharedMemoryBand:
    """The negotiation's bitwise-AND all-reduce of a short byte string, through shared segments.

    One barrier per call: each rank writes its vector into its slot, passes the barrier, and ANDs
    every rank's slot itself. Calls alternate two slots, so a rank writes a slot again only after
    the next call's barrier, which every peer passes only once it has read this call's vectors.
    """

    def __init__(self, segments: SharedSegments) -> None:
        self._segments = segments
        self._slots = [[memoryview(slot) for slot in slots] for slots in segments.slots]
        self._next_slot = 0
        self._carriers: list[SharedMemoryCarrier] = []  # their arrays look into the window: dropped at close

    @classmethod
    def create(cls, comm: MPI.Comm, max_bytes: int,
               wait_for: Callable[[Callable[[], bool]], None]) -> SharedMemoryBand | None:
        """The channel for ``comm``, or None unless all of its ranks share one host (collective)."""
        segments = SharedSegments.allocate(comm, 2, max_bytes, wait_for)
        return None if segments is None else cls(segments)

    def fits(self, vector: bytes) -> bool:
        return len(vector) <= self._segments.slot_bytes

    def band(self, vector: bytes) -> bytes:
        """The AND of every rank's ``vector`` (all of one length), byte by byte."""
        slots = self._slots[self._next_slot]
        self._next_slot ^= 1
        width = len(vector)
        slots[self._segments.rank][:width] = vector
        self._segments.barrier()
        return _and(slots, width)

    def band_carrying(self, vector: bytes, payload: memoryview) -> tuple[bytes, list[memoryview]]:
        """:meth:`band`, with ``payload`` written beside the vector: returns the AND and every
        rank's payload, in rank order (views valid until this rank's next call but one).

        Every rank must pass a payload of the same length, and read a peer's only if every rank
        said it carries one (the negotiation's vector says so): a rank that did not carry left
        stale bytes there.
        """
        slots = self._slots[self._next_slot]
        self._next_slot ^= 1
        width = len(vector)
        start = -(-width // _ALIGN) * _ALIGN
        end = start + len(payload)
        own = slots[self._segments.rank]
        own[:width] = vector
        own[start:end] = payload
        self._segments.barrier()
        payloads = [slot[start:end] for slot in slots]
        if all(slot[:width] == vector for slot in slots):  # the steady state: no AND to compute
            return vector, payloads
        return _and(slots, width), payloads

    def carries(self, vector_bytes: int, payload_bytes: int) -> bool:
        """True if a vector and a payload of these lengths fit in a slot."""
        return -(-vector_bytes // _ALIGN) * _ALIGN + payload_bytes <= self._segments.slot_bytes

    def carrier(self, vector_bytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> SharedMemoryCarrier | None:
        """:meth:`band_carrying` for one tensor of ``dtype`` and ``shape``, with its place in every
        slot built once (the small-op path); None if it does not fit beside the vector."""
        count = math.prod(shape)
        if not self.carries(vector_bytes, count * dtype.itemsize):
            return None
        start = -(-vector_bytes // _ALIGN) * _ALIGN
        places = [[np.frombuffer(slot, dtype, count, start).reshape(shape) for slot in slots] for slots in self._slots]
        carrier = SharedMemoryCarrier(self, vector_bytes, places)
        self._carriers.append(carrier)
        return carrier

    def close(self) -> None:
        """Free the shared window (collective: every rank calls it)."""
        for carrier in self._carriers:
            carrier.release()
        self._slots, self._carriers = [], []  # the views go before the window they look into
        self._segments.close()


class SharedMemoryCarrier:
    """:meth:`SharedMemoryBand.band_carrying` of one tensor's shape and dtype, with no per-call
    slicing: the tensor goes straight into its place in this rank's slot, and every rank's copy is
    handed back as an array over its slot (the same bytes, at the same offsets, as band_carrying's,
    so a peer using either agrees)."""

    def __init__(self, band: SharedMemoryBand, vector_bytes: int, places: list[list[np.ndarray]]) -> None:
        self._band = band
        rank = band._segments.rank
        self._peers = band._segments.size - 1
        # Per slot of the band: where this rank's vector goes, where the peers' are, every rank's
        # tensor, and this rank's.
        self._views = [(slots[rank][:vector_bytes], [slot[:vector_bytes] for r, slot in enumerate(slots) if r != rank],
                        places[index], places[index][rank]) for index, slots in enumerate(band._slots)]

    def exchange(self, vector: bytes, tensor: np.ndarray) -> tuple[bytes, list[np.ndarray] | None]:
        """See :meth:`hvdlite.core.transport.base.Carrier.exchange`."""
        band = self._band
        index = band._next_slot
        band._next_slot = index ^ 1
        own, theirs, places, mine = self._views[index]
        own[:] = vector
        mine[...] = tensor
        band._segments.barrier()
        if theirs == [vector] * self._peers:  # every peer's vector compared in one C loop
            return vector, places
        return _and(band._slots[index], len(vector)), None

    def release(self) -> None:
        """Drop the views into the band's window (before it is freed)."""
        self._views = []


def _and(slots: list[memoryview], width: int) -> bytes:
    """The bitwise AND of the first ``width`` bytes of every slot."""
    result = -1
    for slot in slots:
        result &= int.from_bytes(slot[:width], "little")
    return (result & ((1 << (8 * width)) - 1)).to_bytes(width, "little")


def _part_bounds(count: int, parts: int, itemsize: int) -> list[int]:
    """Where each rank's part of ``count`` elements starts, and the end: equal shares of whole
    cache lines (the last part takes the remainder)."""
    per_line = max(1, _ALIGN // itemsize)
    lines = -(-count // per_line)
    return [min(count, lines * r // parts * per_line) for r in range(parts)] + [count]

"""MPI transport (mpi4py): the negotiation channel and the host-memory data transport.

Every call is nonblocking and polled (see :mod:`hvdlite.utils.polling`). Negotiation waits are on
*other ranks' user code*, so they spin briefly and then sleep. Data transfers start only after
negotiation agreed that every rank is ready, so they spin longer: MPICH progresses a nonblocking
collective only inside test calls, and sleeping between them was measured to triple the time of
a 64 MB reduction. Large reductions go in ``chunk_bytes`` pieces, one after another (measured
faster than one huge message, whose shared-memory bandwidth drops above ~16 MB).

Reductions can be pipelined (``max_in_flight``, ``HVDLITE_PIPELINE_DEPTH``): the next piece (of
the same tensor, or of the next tensor the executor hands over) starts before the previous one is
waited for and scaled. MPICH progresses every outstanding request inside each test call, so the
peer's copies of piece k+1 can move while this rank scales piece k. A bare mpi4py loop over 100
distinct 2 MB arrays gained from it here (np=2: 106-117 ms with two in flight, 119-124 ms one at a
time), but through hvdlite the size sweep, the 220-tensor mix and the training step showed no
consistent difference between 1 and 2 in three alternating runs each, so the default is 1.

When every rank runs on one host, allreduces of ``HVDLITE_SHM_MIN_BYTES`` or more go through a
shared-memory window instead of MPI's own reduction (:mod:`hvdlite.core.transport.shm`); they need no
quiesce barrier, as no peer depends on this rank's MPI progress for them.

Every wait has the job's communication deadline (``HVDLITE_COMM_TIMEOUT_SECONDS``): MPI itself
would wait for a peer behind a dead link until the kernel gives up on TCP (~15 minutes).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ...ops import ReduceOp
from ...utils.polling import WaitTimeout, wait_until
from .adasum import AdasumExchange
from .base import Carrier, SoleRankCarrier
from .shm import SharedMemoryAllreduce, SharedMemoryBand

_MPI_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}
_CONTROL_SPIN_SECONDS = 200e-6
_DATA_SPIN_SECONDS = 0.05
_LARGE_BYTES = 64 * 1024  # above MPICH's shared-memory eager limit: the transfer needs both ranks' progress
_PROBE_TAG = 7_001  # point-to-point on the control communicator: never matches its collectives
_PROBE_POLL_SECONDS = 0.005
_BAND_SLOT_BYTES = 64 * 1024  # the negotiation vector of a response cache of up to ~260,000 entries


class PeerTimeoutWatch:
    """A wait's probe (see :func:`~hvdlite.utils.polling.wait_until`): ends this rank's waits as soon
    as a peer's wait timed out and that peer probes the job (:meth:`MpiControlChannel.reachable_peers`).

    Every live rank then probes at once, however far apart their own deadlines were. Without it a
    rank that came to the stuck collective later than a peer by more than the probe window (a
    straggler, a loaded machine) probed after the peer's window had closed: each took the other for
    unreachable, and in an elastic job both sides of a split could lose their quorum. Looks every
    ``every`` seconds (an ``MPI_Iprobe``, which leaves the message for the probe's receive), then
    asks ``then`` (the elastic :class:`~hvdlite.utils.failed_peers.DeathWatch`), if any.
    """

    def __init__(self, control: MPI.Comm, timeout: float, then: Callable[[], None] | None = None,
                 every: float = _PROBE_POLL_SECONDS) -> None:
        self._control, self._timeout, self._then, self._every = control, timeout, then, every
        self._status = MPI.Status()
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._every
            if self._control.Iprobe(source=MPI.ANY_SOURCE, tag=_PROBE_TAG, status=self._status):
                raise WaitTimeout(self._timeout, peer=self._status.Get_source())
        if self._then is not None:
            self._then()


def _poller(spin: float, max_sleep: float, timeout: float | None,
            probe: Callable[[], None] | None) -> Callable[[Callable[[], bool]], None]:
    """A wait for a condition: spin ``spin`` seconds, then sleep up to ``max_sleep``, within ``timeout``
    (``probe``: see :func:`~hvdlite.utils.polling.wait_until`)."""
    def wait_for(done: Callable[[], bool]) -> None:
        wait_until(done, spin, max_sleep, timeout, probe)

    return wait_for


def _waiter(poll: Callable[[Callable[[], bool]], None]) -> Callable[[MPI.Request], None]:
    def wait(request: MPI.Request) -> None:
        poll(request.Test)

    return wait


def _displacements(counts: list[int]) -> list[int]:
    return [0, *np.cumsum(counts[:-1]).tolist()] if counts else []


class MpiControlChannel:
    """Negotiation collectives on a private duplicate of the job's communicator."""

    def __init__(self, comm: MPI.Comm, poll_seconds: float, timeout: float | None = None,
                 shared_memory: bool = False, probe: Callable[[], None] | None = None) -> None:
        """``shared_memory``: run :meth:`band` through shared memory when every rank runs on this
        host (:class:`hvdlite.core.transport.shm.SharedMemoryBand`). Collective when True."""
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        poll = _poller(_CONTROL_SPIN_SECONDS, poll_seconds, timeout, probe)
        self._wait = _waiter(poll)
        self._shm = SharedMemoryBand.create(comm, _BAND_SLOT_BYTES, poll) if shared_memory else None
        self._abandoned: list = []  # probe sends a dead peer never takes: their buffers must stay alive

    def reachable_peers(self, window: float) -> set[int]:
        """The ranks (this one included) whose probe message arrives within ``window`` seconds.

        Called by every rank after a timed-out wait; a peer that answers ran into the same wait.
        """
        token = np.zeros(1, dtype=np.uint8)
        peers = [r for r in range(self.size) if r != self.rank]
        inbox = {r: np.empty(1, dtype=np.uint8) for r in peers}
        receives = {}
        try:
            receives = {r: self._comm.Irecv(inbox[r], source=r, tag=_PROBE_TAG) for r in peers}
            sends = [self._comm.Isend(token, dest=r, tag=_PROBE_TAG) for r in peers]
        except MPI.Exception:  # the transport itself reports the failure: nobody is known to answer
            return {self.rank}
        self._abandoned.append((token, inbox, sends, receives))
        answered = {self.rank}
        deadline = time.monotonic() + window
        while True:
            for rank, request in receives.items():
                try:
                    if rank not in answered and request.Test():
                        answered.add(rank)
                except MPI.Exception:
                    continue
            if len(answered) == self.size or time.monotonic() > deadline:
                return answered
            time.sleep(_PROBE_POLL_SECONDS)

    def band(self, vector: bytes) -> bytes | bytearray:
        if self.size == 1:  # the AND over one rank: nothing to send (a blocking call's every cycle)
            return vector
        if self._shm is not None and self._shm.fits(vector):  # the same on every rank: one length
            return self._shm.band(vector)
        result = bytearray(len(vector))
        self._wait(self._comm.Iallreduce([vector, MPI.BYTE], [result, MPI.BYTE], MPI.BAND))
        return result

    def carries(self, vector_bytes: int, payload_bytes: int) -> bool:
        """True if :meth:`band_carrying` can carry a payload this long (the same on every rank)."""
        return self._shm is not None and self._shm.carries(vector_bytes, payload_bytes)

    def band_carrying(self, vector: bytes, payload: memoryview) -> tuple[bytes, list[memoryview]]:
        """:meth:`band`, with every rank's ``payload`` handed to every rank (only if :meth:`carries`)."""
        return self._shm.band_carrying(vector, payload)

    def carrier(self, vector_bytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> Carrier | None:
        """See :meth:`hvdlite.core.transport.base.ControlChannel.carrier`: shared memory only."""
        if self.size == 1:
            return SoleRankCarrier()
        return None if self._shm is None else self._shm.carrier(vector_bytes, dtype, shape)

    def gather_to_root(self, payload: bytes) -> list[bytes] | None:
        sizes = np.zeros(self.size, dtype=np.int64)
        self._wait(self._comm.Igather(np.array([len(payload)], dtype=np.int64), sizes, root=0))
        send = np.frombuffer(payload, dtype=np.uint8)
        if self.rank != 0:
            self._wait(self._comm.Igatherv(send, None, root=0))
            return None
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._wait(self._comm.Igatherv(send, [recv, sizes.tolist()], root=0))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return [recv[offsets[r] : offsets[r + 1]].tobytes() for r in range(self.size)]

    def broadcast_from_root(self, payload: bytes | None) -> bytes:
        size = np.array([len(payload) if payload is not None else 0], dtype=np.int64)
        self._wait(self._comm.Ibcast(size, root=0))
        buffer = np.frombuffer(payload, dtype=np.uint8).copy() if self.rank == 0 else np.empty(int(size[0]), np.uint8)
        self._wait(self._comm.Ibcast(buffer, root=0))
        return buffer.tobytes()

    def close(self) -> None:
        """Free the shared-memory window, if any (collective: every rank calls it at shutdown)."""
        if self._shm is not None:
            self._shm.close()
            self._shm = None


class _Piece(NamedTuple):
    """One started reduction: what to do once its request completes."""

    request: MPI.Request
    recv: np.ndarray
    finish: Callable[[np.ndarray], None] | None
    done: Callable[[], None] | None  # set on a call's last piece only


class MpiTransport:
    """Host (NumPy) buffers over MPI on a private duplicate of the job's communicator."""

    name = "MPI"

    def __init__(self, comm: MPI.Comm, chunk_bytes: int, poll_seconds: float, timeout: float | None = None,
                 max_in_flight: int = 1, shm_min_bytes: int | None = None,
                 probe: Callable[[], None] | None = None) -> None:
        """``shm_min_bytes``: reduce buffers of at least this size through shared memory when every
        rank runs on this host (:mod:`hvdlite.core.transport.shm`); None never does. Collective: every rank
        of ``comm`` builds its transport at the same point, with the same value."""
        self._comm = comm
        self.chunk_bytes = chunk_bytes
        self.max_in_flight = max_in_flight
        poll = _poller(_DATA_SPIN_SECONDS, poll_seconds, timeout, probe)
        self._wait = _waiter(poll)
        self._shm = None if shm_min_bytes is None else SharedMemoryAllreduce.create(comm, shm_min_bytes, poll)
        self._in_flight: deque[_Piece] = deque()
        self._moved_large = False  # a large transfer ran since the last quiesce()

    @property
    def shared_memory(self) -> bool:
        """True if large allreduces go through the shared-memory window (every rank on this host)."""
        return self._shm is not None

    def allreduce(self, send: np.ndarray | None, recv: np.ndarray, op: ReduceOp,
                  finish_piece: Callable[[np.ndarray], None] | None = None,
                  done: Callable[[], None] | None = None) -> None:
        if self._shm is not None and self._shm.handles(recv, op):
            self.flush()  # results are delivered in the order reductions started
            self._shm.allreduce(send, recv, op, finish_piece)
            if done is not None:
                done()
            return
        mpi_op = _MPI_OPS[op]
        step = max(1, self.chunk_bytes // recv.itemsize)
        if recv.size <= step:  # one piece, as most tensors: no slicing
            pieces = [(send, recv)]
        else:
            pieces = [(None if send is None else send[at : at + step], recv[at : at + step])
                      for at in range(0, recv.size, step)]
        last = len(pieces) - 1
        for index, (source, target) in enumerate(pieces):
            request = self._comm.Iallreduce(MPI.IN_PLACE if source is None else source, target, mpi_op)
            self._moved_large |= target.nbytes >= _LARGE_BYTES
            self._in_flight.append(_Piece(request, target, finish_piece, done if index == last else None))
            # Retire the oldest only now, with the new piece already started: see the module docstring.
            while len(self._in_flight) >= max(self.max_in_flight, 1):
                self._retire_oldest()
        if done is None:
            self.flush()

    def flush(self) -> None:
        """Finish every reduction still in flight, oldest first, running their callbacks."""
        while self._in_flight:
            self._retire_oldest()

    def quiesce(self) -> None:
        """Finish everything in flight; after a large transfer, also wait until every peer finished.

        MPICH can complete a large reduction on one rank while the peer still needs that rank's
        progress calls to finish its side. A rank that then goes idle (its engine asleep, its
        training thread computing) leaves the peer crawling: measured as steps of up to 2.4 s
        instead of 0.2 s in the training benchmark, whose ranks are not kept in step by anything
        else. Waiting on a barrier keeps this rank's progress engine turning until the peer is done.
        Whether to wait depends only on sizes every rank shares, so every rank calls the barrier.
        """
        if self._in_flight:
            self.flush()
        if self._moved_large:
            self._moved_large = False
            self._wait(self._comm.Ibarrier())

    def _retire_oldest(self) -> None:
        piece = self._in_flight[0]
        self._wait(piece.request)
        self._in_flight.popleft()  # only once finished: a timed-out piece stays owned by the transport
        if piece.finish is not None:
            piece.finish(piece.recv)
        if piece.done is not None:
            piece.done()

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        self.flush()
        self._moved_large |= recv.nbytes >= _LARGE_BYTES
        self._wait(self._comm.Iallgatherv(send, [recv, (counts, _displacements(counts))]))

    def broadcast(self, buffer: np.ndarray, root: int) -> None:
        self.flush()
        self._moved_large |= buffer.nbytes >= _LARGE_BYTES
        self._wait(self._comm.Ibcast(buffer, root=root))

    def alltoallv(self, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]) -> None:
        self.flush()
        self._wait(self._comm.Ialltoallv([send, (send_counts, _displacements(send_counts))],
                                         [recv, (recv_counts, _displacements(recv_counts))]))

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts: list[int], op: ReduceOp) -> None:
        self.flush()
        self._moved_large |= send.nbytes >= _LARGE_BYTES
        self._wait(self._comm.Ireduce_scatter(send, recv, counts, _MPI_OPS[op]))

    def barrier(self) -> None:
        self.flush()
        self._wait(self._comm.Ibarrier())

    def adasum(self, buffer: np.ndarray) -> None:
        self.flush()
        self._moved_large |= buffer.nbytes >= _LARGE_BYTES
        AdasumExchange(self._comm, self._wait).reduce(buffer)

    def close(self) -> None:
        """Free the shared-memory window, if any (collective: every rank calls it at shutdown)."""
        if self._shm is not None:
            self._shm.close()
            self._shm = None

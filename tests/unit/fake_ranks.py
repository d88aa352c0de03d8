"""An in-process fake of N ranks: threads exchanging values through a barrier, no MPI.

It implements the engine's ControlChannel and Transport interfaces, so the real Engine,
negotiation, cache and fusion code run unchanged with N engines in one process.
"""

from __future__ import annotations

import threading

import numpy as np

from hvdlite.core.engine import Engine
from hvdlite.core.pipeline.cache import band
from hvdlite.core.pipeline.execute import Executor
from hvdlite.ops import ReduceOp
from hvdlite.settings.config import Config

_NUMPY_OPS = {ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.MIN: np.minimum,
              ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}


class World:
    def __init__(self, size: int, carry: bool = False) -> None:
        self.size = size
        self.carry = carry  # whether the control channel carries small tensors with its vector
        self.carried = 0  # cycles in which rank 0 sent its tensor with the vector
        self.transfers = 0  # allreduces through the data transport (counted by rank 0)
        self._barrier = threading.Barrier(size, timeout=20)
        self._slots: list = [None] * size
        self.rounds = 0  # coordinator rounds (gathers) seen by rank 0
        self.steady = 0  # small-op calls (a carrier's exchanges) by rank 0

    def exchange(self, rank: int, value) -> list:
        self._slots[rank] = value
        self._barrier.wait()
        values = list(self._slots)
        self._barrier.wait()
        return values


class FakeControl:
    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank, self.size = world, rank, world.size

    def band(self, vector):
        return self._band(vector, None)[0]

    def carries(self, vector_bytes, payload_bytes):
        return self.world.carry

    def band_carrying(self, vector, payload):
        return self._band(vector, bytes(payload))

    def _band(self, vector, payload):
        """One exchange, as shared memory does it: a rank that carries nothing leaves stale bytes
        (here 0xff) where its payload would be."""
        values = self.world.exchange(self.rank, (bytes(vector), payload))
        if payload is not None and self.rank == 0:
            self.world.carried += 1
        width = len(payload) if payload is not None else 0
        stale = b"\xff" * width
        return band([v for v, _ in values]), [memoryview(p if p is not None else stale) for _, p in values]

    def carrier(self, vector_bytes, dtype, shape):
        return FakeCarrier(self, dtype, shape) if self.world.carry else None

    def gather_to_root(self, payload):
        values = self.world.exchange(self.rank, payload)
        if self.rank == 0:
            self.world.rounds += 1
            return values
        return None

    def broadcast_from_root(self, payload):
        return self.world.exchange(self.rank, payload)[0]

    def reachable_peers(self, window):
        return set(range(self.size))

    def close(self):
        pass


class FakeCarrier:
    """The small-op path's exchange (hvdlite.core.transport.base.Carrier) over :meth:`FakeControl._band`:
    the same exchange as band_carrying, so a rank taking either path agrees with the others."""

    def __init__(self, control: FakeControl, dtype, shape) -> None:
        self.control, self.dtype, self.shape = control, dtype, shape

    def exchange(self, vector, tensor):
        if self.control.rank == 0:
            self.control.world.steady += 1
        reduced, payloads = self.control._band(vector, np.ascontiguousarray(tensor).tobytes())
        if reduced != vector:
            return reduced, None
        return vector, [np.frombuffer(p, self.dtype).reshape(self.shape) for p in payloads]


class FakeData:
    name = "fake"
    chunk_bytes = 4 * 1024 * 1024

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank = world, rank

    def enabled_for(self, array):
        return True

    def allreduce(self, send, recv, op, finish_piece=None, done=None):
        source = recv if send is None else send
        if self.rank == 0:
            self.world.transfers += 1
        values = self.world.exchange(self.rank, source.copy())
        with np.errstate(over="ignore", invalid="ignore"):  # as MPI: inf is a result, not a warning
            recv[...] = _NUMPY_OPS[op].reduce(np.stack(values), axis=0)
        if finish_piece is not None:
            finish_piece(recv)
        if done is not None:
            done()

    def flush(self):
        pass

    def quiesce(self):
        pass

    def allgatherv(self, send, recv, counts):
        recv[...] = np.concatenate(self.world.exchange(self.rank, send.copy()))

    def broadcast(self, buffer, root):
        buffer[...] = self.world.exchange(self.rank, buffer.copy())[root]

    def barrier(self):
        self.world.exchange(self.rank, None)

    def close(self):
        pass


def _no_abort(code: int) -> None:
    raise AssertionError(f"the engine failed and asked to abort the job with code {code}")


def start_engines(size: int, control=FakeControl, data=FakeData, carry: bool = False,
                  **config) -> tuple[World, list[Engine]]:
    """``size`` engines on fakes; ``control`` / ``data`` are the fake classes (subclass them to inject
    faults); ``carry``: the control channel carries small tensors (as shared memory does)."""
    world = World(size, carry)
    settings = Config(**{"idle_cycle_seconds": 0.05, "poll_time_ms": 0.5, **config})
    engines = [Engine(settings, control(world, r), Executor(data(world, r), r, size), abort=_no_abort)
               for r in range(size)]
    for engine in engines:
        engine.start()
    return world, engines


def stop_engines(engines: list[Engine]) -> None:
    threads = [threading.Thread(target=e.shutdown, args=(20,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

"""Segmented requests (a bucket of arrays reduced as one tensor) and the pipelined MPI backend."""

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from hvdlite import errors
from hvdlite.core.transport.mpi import MpiTransport
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.core.work.segments import Segments
from hvdlite.ops import Collective, ReduceOp

from .fake_ranks import start_engines, stop_engines


def pieces(rank, dtype=np.float32, sizes=(5, 1, 0, 7)):
    return [np.arange(n, dtype=np.float64).astype(dtype) + rank for n in sizes]


def test_pieces_are_resolved_once_and_written_back():
    calls = []
    arrays = pieces(0)
    segments = Segments("b", np.float32, 13, lambda: calls.append(1) or arrays)
    assert segments.arrays() is segments.arrays() and calls == [1]
    segments.scatter(np.arange(13, dtype=np.float64) * 2)
    np.testing.assert_array_equal(np.concatenate(arrays), np.arange(13) * 2)


@pytest.mark.parametrize("bad, expected", [
    (lambda: pieces(0, np.float64), r"13 elements of float32 .* got 13 elements \(piece 0: float64"),
    (lambda: pieces(0)[:2], r"got 6 elements"),
    (lambda: [np.zeros((4, 4), np.float32)[:, :2].reshape(-1)[:0], np.zeros((3, 5), np.float32).T],
     r"got 15 elements \(piece 1: float32, not contiguous\)"),
])
def test_wrong_pieces_name_the_tensor_and_what_was_wrong(bad, expected):
    with pytest.raises(errors.UnsupportedOperationError, match="tensor 'b' was described as .*" + expected):
        Segments("b", np.float32, 13, bad).arrays()


def submit_segments(engine, rank, name, dtype, op):
    arrays = pieces(rank, dtype)
    total = sum(a.size for a in arrays)
    segments = Segments(name, np.dtype(dtype), total, lambda: arrays)
    meta = RequestMeta(name, Collective.ALLREDUCE, np.dtype(dtype).name, (total,), op)
    request = Request(meta, segments, Handle(name), segments)
    engine.submit([request])
    return request.handle, arrays


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype, op", [(np.float32, ReduceOp.AVERAGE), (np.int64, ReduceOp.SUM),
                                       (np.float16, ReduceOp.SUM), (ml_dtypes.bfloat16, ReduceOp.MAX)])
def test_segments_are_reduced_in_their_own_memory(size, dtype, op):
    _, ranks = start_engines(size)
    try:
        for step in range(3):  # the second and later steps are answered from the response cache
            submitted = [submit_segments(e, r, f"bucket.{dtype.__name__}", dtype, op) for r, e in enumerate(ranks)]
            rank_values = [np.concatenate(pieces(r, np.float64)) for r in range(size)]
            want = {ReduceOp.AVERAGE: np.mean, ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max}[op](rank_values, axis=0)
            for handle, arrays in submitted:
                assert isinstance(handle.wait(10), Segments), step
                got = np.concatenate([a.astype(np.float64) for a in arrays])
                np.testing.assert_allclose(got, want, rtol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-6)
    finally:
        stop_engines(ranks)


def test_the_pipelined_backend_delivers_in_order_and_flushes_before_other_collectives():
    backend = MpiTransport(MPI.COMM_SELF.Dup(), chunk_bytes=16, poll_seconds=0.001, timeout=10, max_in_flight=2)
    done = []
    buffers = [np.arange(10, dtype=np.float32) for _ in range(3)]  # 40 bytes: three pieces each
    for index, buffer in enumerate(buffers):
        backend.allreduce(None, buffer, ReduceOp.SUM, lambda piece: np.multiply(piece, 2, out=piece),
                          done=lambda index=index: done.append(index))
    assert done == [0, 1]  # the last piece of buffer 2 is still in flight
    backend.barrier()  # any other collective finishes what is in flight first
    assert done == [0, 1, 2]
    for buffer in buffers:
        np.testing.assert_array_equal(buffer, np.arange(10) * 2)  # every piece scaled exactly once
    synchronous = np.ones(9, dtype=np.float32)
    backend.allreduce(None, synchronous, ReduceOp.SUM, lambda piece: np.multiply(piece, 3, out=piece))
    np.testing.assert_array_equal(synchronous, np.full(9, 3.0))  # without done: finished on return


def test_quiesce_waits_for_peers_only_after_a_large_transfer():
    backend = MpiTransport(MPI.COMM_SELF.Dup(), chunk_bytes=1 << 20, poll_seconds=0.001, timeout=10)
    barriers = []
    real_wait = backend._wait
    backend._wait = lambda request: barriers.append(type(request).__name__) or real_wait(request)
    backend.allreduce(None, np.ones(100, np.float32), ReduceOp.SUM)  # 400 B: eager, nothing to wait for
    barriers.clear()
    backend.quiesce()
    assert barriers == []
    backend.allreduce(None, np.ones(1 << 15, np.float32), ReduceOp.SUM)  # 128 KiB: the peer may need us
    barriers.clear()
    backend.quiesce()
    backend.quiesce()  # once per large transfer, not again
    assert barriers == ["Request"]


def test_pieces_that_cannot_be_read_mid_collective_end_the_job_with_the_reason():
    aborted = []
    world, (engine,) = start_engines(1)
    engine._abort = aborted.append  # the real engine ends the job here (peers are inside the collective)
    segments = Segments("bad", np.float32, 4, lambda: [np.zeros(3, np.float32)])
    meta = RequestMeta("bad", Collective.ALLREDUCE, "float32", (4,), ReduceOp.SUM)
    request = Request(meta, segments, Handle("bad"), segments)
    engine.submit([request])
    with pytest.raises(errors.HvdliteShutdownError,
                       match=r"rank 0 cannot read the pieces of 'bad' for a reduction its peers have started: "
                             r"tensor 'bad' was described as 4 elements of float32 .* got 3 elements"):
        request.handle.wait(10)
    engine._thread.join(10)
    assert aborted == [1]

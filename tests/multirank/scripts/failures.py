"""Error behaviour with real ranks. Usage: failures.py CASE. Prints 'caught: <message>' lines."""

import os
import signal
import sys
import time

import numpy as np

import hvdlite as hvd


def expect(error_type, fn):
    try:
        fn()
    except error_type as exc:
        print(f"caught {type(exc).__name__}: {exc}", flush=True)
        return exc
    raise AssertionError(f"expected {error_type.__name__}")


def mismatch(rank):
    """Each mismatch is an error on every rank; the job goes on afterwards."""
    shape = (2, 3) if rank == 0 else (3, 2)
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(shape, np.float32), name="w.shape"))
    dtype = np.float32 if rank == 0 else np.float64
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(4, dtype), name="w.dtype"))
    op = hvd.Sum if rank == 0 else hvd.Max
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(4), op=op, name="w.op"))
    scale = 1.0 if rank == 0 else 0.5
    expect(hvd.TensorMismatchError, lambda: hvd.allreduce(np.ones(4), prescale_factor=scale, name="w.prescale"))
    expect(hvd.TensorMismatchError, lambda: hvd.broadcast(np.ones(4), root_rank=min(rank, 1), name="w.root"))
    expect(hvd.TensorMismatchError, lambda: hvd.allgather(np.ones((2, rank + 1)), name="w.gather"))
    # the same name with a new shape on every rank is fine (the cache entry is replaced)
    hvd.allreduce(np.ones(3), name="w.reuse")
    assert hvd.allreduce(np.ones(5), name="w.reuse", op=hvd.Sum).tolist() == [hvd.size()] * 5
    print("job continues", flush=True)


def duplicate(rank):
    handle = hvd.allreduce_async(np.ones(2), name="dup")
    expect(hvd.DuplicateNameError, lambda: hvd.allreduce_async(np.ones(2), name="dup"))
    hvd.synchronize(handle)
    expect(hvd.UnsupportedOperationError, lambda: hvd.broadcast(np.ones(2), root_rank=hvd.size(), name="badroot"))
    expect(hvd.UnsupportedOperationError, lambda: hvd.alltoall(np.ones(5), splits=[5] + [1] * (hvd.size() - 1)))
    expect(hvd.UnsupportedOperationError, lambda: hvd.allreduce(np.ones(2, bool), op=hvd.Sum, prescale_factor=2.0))
    expect(hvd.UnsupportedOperationError, lambda: hvd.allreduce(np.array(["a"])))
    print("job continues", flush=True)


def stall(rank):
    """Rank 0 waits on a tensor nobody else submits: every rank ends with StallError naming it."""
    if rank == 0:
        expect(hvd.StallError, lambda: hvd.allreduce(np.ones(2), name="lonely"))
    else:
        time.sleep(6)  # idle, as a rank doing something else would be
        expect(hvd.StallError, lambda: hvd.allreduce(np.ones(2), name="later"))
    # after the fatal error, every operation raises instead of blocking
    expect(hvd.StallError, lambda: hvd.barrier())


def cached_stall(rank):
    """Same, but the waiting tensor is answered from the response cache (hidden from the coordinator)."""
    for _ in range(2):
        hvd.allreduce(np.ones(2), name="step")
    if rank == 0:
        expect(hvd.StallError, lambda: hvd.allreduce(np.ones(2), name="step"))
    else:
        time.sleep(6)
        expect(hvd.StallError, lambda: hvd.allreduce(np.ones(2), name="later"))
    expect(hvd.StallError, lambda: hvd.barrier())


def shutdown_peer(rank):
    if rank == 1:
        hvd.shutdown()
        return
    expect(hvd.HvdliteShutdownError, lambda: hvd.allreduce(np.ones(2), name="after.peer.shutdown"))


def uncaught(rank):
    hvd.allreduce(np.ones(2), name="warmup")
    if rank == 1:
        raise RuntimeError("boom from the user's training loop")
    hvd.allreduce(np.ones(2), name="never")  # would hang without the abort


def killed(rank):
    hvd.allreduce(np.ones(2), name="warmup")
    if rank == 1:
        time.sleep(0.5)  # mid-training: the others are already waiting in the next allreduce
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.ones(2), name="never")


def unnamed_sequence(rank):
    """A call that fails on one rank only gives its generated name back; ranks that are nevertheless at
    different points of the unnamed sequence get an immediate error saying so, not a hang."""
    size = hvd.size()
    if rank == 0:  # a scalar cannot be gathered: an error here, before any peer is involved
        expect(hvd.UnsupportedOperationError, lambda: hvd.allgather(np.float64(1.0)))
    assert hvd.allgather(np.full(1, float(rank))).tolist() == [float(r) for r in range(size)]
    start = time.monotonic()
    # As if the ranks had called different numbers of unnamed allgathers before: #7 on rank 0, #8 on rank 1...
    error = expect(hvd.TensorMismatchError, lambda: hvd.allgather(np.ones(1), name=f"allgather.noname.{7 + rank}"))
    assert "ranks called different sequences of unnamed allgather collectives: rank 0 at allgather #7" in str(error)
    assert time.monotonic() - start < 20, "the divergence was not reported at once"
    assert hvd.allgather(np.ones(1)).tolist() == [1.0] * size  # the sequence still agrees afterwards
    print("unnamed sequence ok", flush=True)


def join_others(rank):
    """While a rank has joined, every collective but allreduce fails at once on the others, naming it."""
    size = hvd.size()
    if rank == size - 1:
        print(f"join returned {hvd.join()}", flush=True)
        return
    start = time.monotonic()
    for what, call in [("allgather", lambda: hvd.allgather(np.ones((1, 2)), name="j.ag")),
                       ("broadcast", lambda: hvd.broadcast(np.ones(2), 0, name="j.bc")),
                       ("alltoall", lambda: hvd.alltoall(np.ones(size), name="j.a2a")),
                       ("reducescatter", lambda: hvd.reducescatter(np.ones((size, 1)), name="j.rs"))]:
        error = expect(hvd.UnsupportedOperationError, call)
        assert f"{what} of tensor 'j." in str(error) and f"rank(s) [{size - 1}] have called join()" in str(error)
    assert time.monotonic() - start < 20, "the errors were not immediate"
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="j.ar").tolist() == [size - 1]  # the joined rank adds zeros
    print(f"join returned {hvd.join()}", flush=True)


def join(rank):
    """Rank r has r + 2 batches; ranks out of data join, the rest keep reducing with zeros for them."""
    size = hvd.size()
    for step in range(rank + 2):
        active = [r for r in range(size) if step < r + 2]
        got = hvd.allreduce(np.full(3, float(rank + 1)), op=hvd.Sum, name=f"grad.{step}")
        assert got.tolist() == [float(sum(r + 1 for r in active))] * 3, (step, got)
        avg = hvd.allreduce(np.full(2, float(rank + 1)), op=hvd.Average, name=f"avg.{step}")
        assert np.allclose(avg, sum(r + 1 for r in active) / size), avg  # joined ranks count as zeros
    last = hvd.join()
    assert last == size - 1, last
    print(f"join returned {last}", flush=True)
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="after.join").tolist() == [size]


def subset(rank):
    """init(comm=[0, 1]) on a bigger job: ranks 0 and 1 form their own hvdlite world."""
    hvd.shutdown()
    if rank >= 2:
        expect(hvd.HvdliteError, lambda: hvd.init(comm=[0, 1]))
        return
    hvd.init(comm=[0, 1])
    assert hvd.size() == 2 and hvd.rank() == rank
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="pair").tolist() == [2.0]
    hvd.shutdown()


def main():
    case = sys.argv[1]
    hvd.init()
    globals()[case](hvd.rank())
    print(f"rank {hvd.rank() if hvd.is_initialized() else '-'} done", flush=True)


if __name__ == "__main__":
    main()

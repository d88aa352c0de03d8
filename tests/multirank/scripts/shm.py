"""Host allreduces through the shared-memory window: every op, dtype and output form, at sizes
from one element (parts of zero elements) to several slots. Usage: CASE.

check     every combination against a local reduction of every rank's input, results bitwise equal across
          ranks; prints which path ran (``shm on`` / ``shm off``) so the test knows what it covered
"""

import functools
import hashlib
import sys

import numpy as np
from mpi4py import MPI

import hvdlite as hvd
from hvdlite.core.runtime import current
from hvdlite.core.transport.shm import SLOT_BYTES
from hvdlite.utils.dtypes import SUPPORTED

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


@functools.cache
def inputs(dtype: np.dtype, count: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input: small values (products stay finite), different on every rank.
    Made once per dtype and size (every op and output form reads it), read-only."""
    values = (np.arange(count) * 7 + rank * 3) % 5 + 1 - (rank == 1) * 2
    if dtype == np.bool_:
        values = (values % 2 == 0) if rank else np.ones(count, dtype=bool)
    elif dtype.kind == "u":
        values = np.abs(values)
    values = values.astype(dtype)
    values.flags.writeable = False
    return values


@functools.cache
def every_rank(dtype: np.dtype, count: int) -> np.ndarray:
    return np.stack([inputs(dtype, count, r) for r in range(SIZE)])


def expected(dtype: np.dtype, count: int, op: str) -> np.ndarray:
    stack = every_rank(dtype, count)
    if dtype == np.bool_:
        return stack.any(0) if op in ("Sum", "Max") else stack.all(0)
    wide = stack.astype(np.float64) if dtype.kind == "f" or dtype.name == "bfloat16" else stack
    with np.errstate(over="ignore"):
        result = {"Sum": np.sum, "Average": np.sum, "Min": np.min, "Max": np.max, "Product": np.prod}[op](wide, 0)
    if op == "Average":
        result = result / SIZE if wide.dtype == np.float64 else np.trunc(result / SIZE)
    return result.astype(stack.dtype)


def cases():
    """(dtype, count, op name): every op at the counts within one slot; at the counts of a slot and
    more (chunks that alternate slots) the sum and the average only. The chunking is the same for
    every op but for the average's post-scale of each chunk (``finish_part``), and those counts
    were most of this check's CPU (the job at np=2: 14.2 CPU s with every op, 2.4 without them,
    9.6 now)."""
    small, large = [1, SIZE - 1, SIZE + 1, 17, 1000], [SLOT_BYTES // 4 + 5, SLOT_BYTES // 2 * 3 + 3]
    for dtype in SUPPORTED.values():
        for count in small + (large if dtype.itemsize <= 4 else large[:1]):
            for op_name in OPS if count in small else ("Sum", "Average"):
                if not (dtype == np.bool_ and op_name == "Average"):
                    yield dtype, count, op_name


def check() -> None:
    print("shm on" if current().engine.pipeline.executor.transport.shared_memory else "shm off", flush=True)
    digest = hashlib.sha256()
    for dtype, count, op_name in cases():
        op = OPS[op_name]
        want = expected(dtype, count, op_name)
        exact = dtype.kind in "biu" or op_name in ("Min", "Max")
        mine = inputs(dtype, count, RANK)
        name = f"{dtype.name}.{count}.{op_name}"
        fresh = hvd.allreduce(mine, op=op, name=name)
        into = np.empty_like(mine)
        hvd.synchronize(hvd.allreduce_async(mine, op=op, name=name + ".into", output=into))
        in_place = mine.copy()
        hvd.synchronize(hvd.allreduce_async(in_place, op=op, name=name + ".inplace", output=in_place))
        for label, got in (("fresh", fresh), ("output=", into), ("in place", in_place)):
            assert got.dtype == dtype and got.shape == (count,), f"{name} {label}: {got.dtype} {got.shape}"
            if exact:
                ok = np.array_equal(got, want)
            else:
                tolerance = 1e-2 if dtype.itemsize == 2 else 1e-5
                ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tolerance)
            assert ok, f"rank {RANK}: {name} {label} gave {got[:8]}, expected {want[:8]}"
            digest.update(got.tobytes())
    digests = MPI.COMM_WORLD.allgather(digest.hexdigest())
    assert len(set(digests)) == 1, f"results differ across ranks: {digests}"
    print("ok check", flush=True)


if __name__ == "__main__":
    {"check": check}[sys.argv[1]]()
    hvd.shutdown()

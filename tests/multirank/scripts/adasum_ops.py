"""Adasum allreduce on real ranks against hvdlite.core.transport.adasum_math.reference of every rank's inputs.

Usage: adasum_ops.py (under hvdliterun, any -np). Each rank rebuilds every rank's input from shared
seeds, so each can compute the reference itself. Cases: parallel, orthogonal and random vectors in
float16, bfloat16, float32 and float64, through the core (NumPy) and torch (blocking, async, grouped,
in place); tiny parallel and orthogonal gradients (magnitudes near each dtype's smallest normal); a process set of the even ranks; and the refusals (integers, scale factors,
reducescatter), which every rank must raise. Prints "ok adasum <case>" per case.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
from checks import expect_error

import hvdlite as hvd
import hvdlite.torch as hvd_torch
from hvdlite.core.transport import adasum_math as adasum

DTYPES = {"float16": (np.float16, 3e-3), "bfloat16": (ml_dtypes.bfloat16, 2e-2), "float32": (np.float32, 1e-5),
          "float64": (np.float64, 1e-12)}
COUNT = 37  # odd: the halving splits unevenly


def inputs(kind: str, size: int, dtype) -> list[np.ndarray]:
    """Every rank's vector (index = rank)."""
    base = np.random.default_rng(7).standard_normal(COUNT)
    if kind == "parallel":
        return [(base * (rank + 1)).astype(dtype) for rank in range(size)]
    if kind == "orthogonal":  # disjoint supports
        return [np.where(np.arange(COUNT) % size == rank, base, 0.0).astype(dtype) for rank in range(size)]
    return [np.random.default_rng(100 + rank).standard_normal(COUNT).astype(dtype) for rank in range(size)]


def expected(vectors: list[np.ndarray]) -> np.ndarray:
    """The reference in float64 on the inputs as they are (16-bit ones widened exactly)."""
    return adasum.reference([v.astype(np.float64) for v in vectors])


def close(got, want: np.ndarray, tolerance: float, what: str) -> None:
    got = np.asarray(got, dtype=np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    assert np.abs(got - want).max() <= tolerance * scale, f"{what}: {got} != {want}"


def case_core(rank: int, size: int) -> None:
    for kind in ("parallel", "orthogonal", "random"):
        for dtype_name, (dtype, tolerance) in DTYPES.items():
            vectors = inputs(kind, size, dtype)
            got = hvd.allreduce(vectors[rank], op=hvd.Adasum, name=f"core.{kind}.{dtype_name}")
            assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
            close(got, expected(vectors), tolerance, f"{kind} {dtype_name}")
            every = hvd.allgather(got[None].astype(np.float64), name=f"same.{kind}.{dtype_name}")
            assert (every == every[0]).all(), f"{kind} {dtype_name}: ranks differ"
    if size > 1:
        parallel = inputs("parallel", size, np.float64)
        close(hvd.allreduce(parallel[rank], op=hvd.Adasum, name="avg"), np.mean(parallel, axis=0) if size in (2, 4)
              else expected(parallel), 1e-12, "parallel gradients are averaged")
        orthogonal = inputs("orthogonal", size, np.float64)
        close(hvd.allreduce(orthogonal[rank], op=hvd.Adasum, name="sum"), np.sum(orthogonal, axis=0), 1e-12,
              "orthogonal gradients are added")


def case_torch(rank: int, size: int) -> None:
    vectors = inputs("random", size, np.float32)
    want = expected(vectors)
    mine = torch.from_numpy(vectors[rank].copy())
    close(hvd_torch.allreduce(mine, op=hvd.Adasum, name="t.blocking"), want, 1e-5, "torch blocking")
    close(hvd_torch.synchronize(hvd_torch.allreduce_async(mine, op=hvd.Adasum, name="t.async")), want, 1e-5, "async")
    grouped = hvd_torch.grouped_allreduce([mine, mine * 2], op=hvd.Adasum, name="t.group")
    close(grouped[0], want, 1e-5, "grouped member 0")
    close(grouped[1], expected([v * 2 for v in vectors]), 1e-5, "grouped member 1 (its own dot products)")
    in_place = mine.clone()
    assert hvd_torch.allreduce_(in_place, op=hvd.Adasum, name="t.inplace") is in_place
    close(in_place, want, 1e-5, "in place")
    close(mine, vectors[rank], 0.0, "the input is left as it was")
    half = torch.from_numpy(vectors[rank].astype(np.float16))
    close(hvd_torch.allreduce(half, op=hvd.Adasum, name="t.half"), expected([v.astype(np.float16) for v in vectors]),
          3e-3, "torch float16")


def tiny_inputs(size: int, dtype, parallel: bool) -> list[np.ndarray]:
    """Every rank's 1024 values of magnitude near ``dtype``'s smallest normal number: parallel (one draw
    times 2**rank, exact in any dtype) or orthogonal (the draw's disjoint parts)."""
    draw = np.random.default_rng(11).normal(0.0, float(ml_dtypes.finfo(dtype).tiny), 1024).astype(dtype)
    if parallel:
        return [draw * dtype(2.0 ** rank) for rank in range(size)]
    return [np.where(np.arange(1024) % size == rank, draw, 0).astype(dtype) for rank in range(size)]


def case_tiny(rank: int, size: int) -> None:
    """Tiny gradients (torch, in place, as Horovod users call it): parallel ones averaged (at a power of
    two; the reference's tree otherwise), orthogonal ones added: their squared norms underflow float32."""
    for dtype, torch_dtype in ((np.float64, torch.float64), (np.float32, torch.float32), (np.float16, torch.float16),
                               (ml_dtypes.bfloat16, torch.bfloat16)):
        parallel = tiny_inputs(size, dtype, parallel=True)
        wide = [v.astype(np.float64) for v in parallel]
        want = np.mean(wide, axis=0) if size in (2, 4) else adasum.reference(wide)
        mine = torch.from_numpy(parallel[rank].astype(np.float64)).to(torch_dtype)
        hvd_torch.allreduce_(mine, op=hvd.Adasum, name=f"tiny.parallel.{dtype.__name__}")
        up = 2.0 ** 600 if dtype is np.float64 else 1.0  # float64's tiny values' squares underflow: norms scaled
        error = np.linalg.norm((mine.double().numpy() - want) * up) / np.linalg.norm(want * up)
        assert error <= max(float(ml_dtypes.finfo(dtype).eps), 1e-6), (dtype, error)  # added: about 0.5 to 1.5
        orthogonal = tiny_inputs(size, dtype, parallel=False)
        mine = torch.from_numpy(orthogonal[rank].astype(np.float64)).to(torch_dtype)
        hvd_torch.allreduce_(mine, op=hvd.Adasum, name=f"tiny.orthogonal.{dtype.__name__}")
        want = np.sum([v.astype(np.float64) for v in orthogonal], axis=0)
        np.testing.assert_array_equal(mine.double().numpy(), want)


def case_process_set(rank: int, size: int, evens: hvd.ProcessSet) -> None:
    vectors = inputs("random", size, np.float64)
    if evens.included():
        members = [vectors[r] for r in evens.ranks]
        close(hvd.allreduce(vectors[rank], op=hvd.Adasum, name="set", process_set=evens), expected(members), 1e-12,
              "process set of the even ranks")


def case_errors(rank: int, size: int) -> None:
    expect_error(hvd.UnsupportedOperationError, "Adasum needs a floating-point",
                 lambda: hvd.allreduce(np.ones(3, np.int32), op=hvd.Adasum, name="e.int"), "integers")
    expect_error(hvd.UnsupportedOperationError, "Adasum takes no prescale_factor",
                 lambda: hvd.allreduce(np.ones(3), op=hvd.Adasum, prescale_factor=2.0, name="e.scale"), "scale")
    expect_error(hvd.UnsupportedOperationError, "supports Sum and Average, not ADASUM",
                 lambda: hvd.reducescatter(np.ones((size, 2)), op=hvd.Adasum, name="e.rs"), "reducescatter")
    assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.errors").tolist() == [size, size]


def main() -> None:
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, size, 2))) if size > 2 else hvd.global_process_set
    case_core(rank, size)
    print("ok adasum core", flush=True)
    case_torch(rank, size)
    print("ok adasum torch", flush=True)
    case_tiny(rank, size)
    print("ok adasum tiny", flush=True)
    case_process_set(rank, size, evens)
    print("ok adasum process set", flush=True)
    case_errors(rank, size)
    print("ok adasum errors", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""Aligned output buffers: every result the executor hands back starts on a 64-byte boundary."""

import ml_dtypes
import numpy as np
import pytest

from hvdlite.core.pipeline.execute import Executor
from hvdlite.core.work.item import WorkItem
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.core.work.response import Response
from hvdlite.ops import Collective, ReduceOp
from hvdlite.utils.buffers import ALIGNMENT, aligned_copy, aligned_empty, padded_count

from .fake_ranks import FakeData, World


def aligned(array):
    return array.ctypes.data % ALIGNMENT == 0


@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (0, 4), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_aligned_empty_and_copy(shape, dtype):
    for _ in range(5):  # several allocations, so a lucky malloc cannot pass alone
        out = aligned_empty(shape, dtype)
        assert aligned(out) and out.dtype == np.dtype(dtype) and out.flags.c_contiguous
        assert out.shape == ((shape,) if isinstance(shape, int) else shape)
    source = np.arange(np.prod(out.shape)).reshape(out.shape).astype(np.float32)
    copy = aligned_copy(source, dtype)
    assert aligned(copy) and copy.dtype == np.dtype(dtype) and np.array_equal(copy.astype(np.float32), source)


def test_padded_count_keeps_the_next_member_aligned():
    assert [padded_count(n, 4) for n in (0, 1, 16, 17)] == [0, 16, 16, 32]
    assert [padded_count(n, 8) for n in (1, 8, 9)] == [8, 8, 16]
    assert padded_count(3, 1) == 64 and padded_count(5, 64) == 5


def executor():
    return Executor(FakeData(World(1), 0), 0, 1)


def run(meta_list, arrays, fused=False):
    local = {m.name: Request(m, a, Handle(m.name)) for m, a in zip(meta_list, arrays, strict=True)}
    item = WorkItem(tuple(Response(m, per_rank=(a.shape[0],) if m.collective is Collective.ALLGATHER else ())
                          for m, a in zip(meta_list, arrays, strict=True)), fused=fused)
    return [result for _, result, _ in executor().run(item, local)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8])
def test_fused_members_are_aligned_and_correct(dtype):
    sizes = [1, 3, 17, 5, 64, 2]  # odd sizes: unpadded packing would misalign every later member
    arrays = [np.arange(n).astype(dtype) for n in sizes]
    metas = [RequestMeta(f"t{i}", Collective.ALLREDUCE, np.dtype(dtype).name, (n,), ReduceOp.SUM)
             for i, n in enumerate(sizes)]
    results = run(metas, arrays, fused=True)
    for array, result in zip(arrays, results, strict=True):
        assert aligned(result) and result.dtype == array.dtype and np.array_equal(result, array)


def test_other_collectives_return_aligned_arrays():
    x = np.arange(1, 12, dtype=np.float32)[1:].reshape(5, 2)  # an unaligned input view
    (gathered,) = run([RequestMeta("g", Collective.ALLGATHER, "float32", x.shape)], [x])
    (cast,) = run([RequestMeta("h", Collective.ALLREDUCE, "float16", x.shape, ReduceOp.SUM)], [x.astype(np.float16)])
    (bcast,) = run([RequestMeta("b", Collective.BROADCAST, "float32", x.shape, root_rank=0)], [x])
    for result in (gathered, cast, bcast):
        assert aligned(result) and np.array_equal(result.astype(np.float32), x)


def test_fused_members_of_different_dtypes_keep_their_own_dtype():
    """float16, bfloat16 and float32 share a float32 fusion buffer; each result keeps its dtype."""
    arrays = [np.full(3, 1.5, ml_dtypes.bfloat16), np.full(5, 2.5, np.float32), np.full(2, 3.5, np.float16)]
    metas = [RequestMeta(f"m{i}", Collective.ALLREDUCE, a.dtype.name, a.shape, ReduceOp.SUM) for i, a in enumerate(arrays)]
    results = run(metas, arrays, fused=True)
    for array, result in zip(arrays, results, strict=True):
        assert result.dtype == array.dtype and np.array_equal(result, array) and aligned(result)


def test_large_buffers_are_recycled_only_once_every_array_using_them_is_gone():
    from hvdlite.utils import buffers

    pool = buffers._Pool(max_bytes=8 << 20)
    first = pool.lend(1 << 20, (1 << 20,), np.dtype(np.uint8))
    address = first.ctypes.data
    view = first[100:].view(np.uint32)  # a view keeps the storage lent out
    del first
    assert pool.cached_bytes == 0
    second = pool.lend(1 << 20, (1 << 20,), np.dtype(np.uint8))
    assert second.ctypes.data != address  # still in use through `view`: not handed out again
    del view
    assert pool.cached_bytes >= 1 << 20
    third = pool.lend(1 << 20, (1 << 20,), np.dtype(np.uint8))
    assert third.ctypes.data == address and pool.cached_bytes == 0  # reused, not faulted in afresh
    assert third.flags.writeable and second.flags.writeable


def test_the_pool_keeps_at_most_its_limit():
    from hvdlite.utils import buffers

    pool = buffers._Pool(max_bytes=3 << 20)
    arrays = [pool.lend(1 << 20, (1 << 20,), np.dtype(np.uint8)) for _ in range(5)]
    del arrays
    assert 2 << 20 <= pool.cached_bytes <= 3 << 20


@pytest.mark.parametrize("shape", [(16384,), (300, 301), (1 << 20,)])
def test_pooled_results_are_aligned_and_survive_reuse(shape):
    import torch

    a = aligned_empty(shape, np.float32)
    assert a.nbytes >= 64 * 1024 and aligned(a)
    a[...] = 3.0
    held = torch.from_numpy(a)  # a framework tensor sharing the memory keeps it lent out
    del a
    b = aligned_empty(shape, np.float32)
    b[...] = 5.0
    assert aligned(b) and float(held.min()) == float(held.max()) == 3.0

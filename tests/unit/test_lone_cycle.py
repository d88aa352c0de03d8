"""The cycle of one pending request (a blocking call's steady state), with in-process fake ranks.

A lone small allreduce the cache answers rides with the negotiation's vector when the control
channel carries data (shared memory), and every rank reduces it itself; the vector says whether
every rank carried, so a rank never reads a peer's stale bytes.
"""

import warnings

import numpy as np
import pytest

from hvdlite.core.planes.host import CARRY_MAX_BYTES
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.ops import Collective, ReduceOp

from .fake_ranks import FakeControl, start_engines, stop_engines

_REDUCE = {ReduceOp.SUM: np.add, ReduceOp.AVERAGE: np.add, ReduceOp.MIN: np.minimum,
           ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}


def _step(ranks, name, arrays, op, in_place=False):
    """Every rank submits its array under ``name``; returns the results in rank order."""
    handles = []
    for engine, array in zip(ranks, arrays, strict=True):
        meta = RequestMeta(name, Collective.ALLREDUCE, array.dtype.name, array.shape, op)
        request = Request(meta, array, Handle(name), array if in_place else None)
        engine.submit([request])
        handles.append(request.handle)
    return [h.wait(10) for h in handles]


def _expected(arrays, op):
    total = arrays[0].copy()
    for array in arrays[1:]:
        _REDUCE[op](total, array, out=total)
    if op is ReduceOp.AVERAGE:
        return total / len(arrays) if total.dtype.kind == "f" else np.trunc(total / len(arrays)).astype(total.dtype)
    return total


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", list(_REDUCE))
def test_a_lone_small_allreduce_rides_with_the_vector_and_every_rank_reduces_it(size, dtype, op):
    world, ranks = start_engines(size, carry=True, stall_check=False)
    try:
        for step in range(4):
            arrays = [np.arange(5, dtype=dtype) * (r + 2) - step for r in range(size)]
            expected = _expected(arrays, op)
            results = _step(ranks, "lone", arrays, op, in_place=step % 2 == 1)
            for result in results:
                assert result.dtype == np.dtype(dtype) and result.shape == (5,)
                np.testing.assert_array_equal(result, expected)
        # The first step was new to the cache (a coordinator round, then MPI's transfer); the rest rode
        # along. Rank 0 may carry its tensor in a cycle before a peer submitted (a busy machine), and
        # again in the next: at least once per later step, never another transfer.
        assert world.transfers == 1 and world.carried >= 3, (world.transfers, world.carried)
    finally:
        stop_engines(ranks)


class _RankOneCannotCarry(FakeControl):
    def carries(self, vector_bytes, payload_bytes):
        return self.rank != 1


def test_when_one_rank_does_not_carry_every_rank_uses_the_transport():
    # Rank 1 sends the same cache bit without saying it carries: the others must not read its
    # (stale, here 0xff) payload bytes, and go through the data transport instead.
    world, ranks = start_engines(3, control=_RankOneCannotCarry, carry=True, stall_check=False)
    try:
        for step in range(3):
            arrays = [np.full(4, float(r + step), dtype="float32") for r in range(3)]
            for result in _step(ranks, "mixed", arrays, ReduceOp.SUM):
                np.testing.assert_array_equal(result, np.full(4, 3.0 + 3 * step, dtype="float32"))
        assert world.transfers == 3  # rank 0 offered its tensor in steps 2 and 3, and it was not used
    finally:
        stop_engines(ranks)


def test_tensors_above_the_carry_limit_go_through_the_transport():
    world, ranks = start_engines(2, carry=True, stall_check=False)
    try:
        count = CARRY_MAX_BYTES // 4 + 1
        for _ in range(3):
            arrays = [np.full(count, 1.0 + r, dtype="float32") for r in range(2)]
            for result in _step(ranks, "big", arrays, ReduceOp.SUM):
                assert result.shape == (count,) and np.all(result == 3.0)
        assert (world.transfers, world.carried) == (3, 0)
    finally:
        stop_engines(ranks)


def test_16_bit_floats_and_prescaled_tensors_are_not_carried():
    # They need a wire conversion or scaling before the reduction: the transport path does that.
    world, ranks = start_engines(2, carry=True, stall_check=False)
    try:
        for _ in range(3):
            arrays = [np.full(3, 1.5, dtype="float16") for _ in range(2)]
            for result in _step(ranks, "half", arrays, ReduceOp.SUM):
                assert result.dtype == np.float16 and np.all(result == 3.0)
        assert world.carried == 0
    finally:
        stop_engines(ranks)


def test_a_carried_float_overflow_is_inf_without_a_warning():
    # As through MPI: inf is a result. A warning turned into an error (-W error) must not stop the engine.
    world, ranks = start_engines(2, carry=True, stall_check=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(3):
                arrays = [np.array([3e38, np.inf, 1.0], dtype="float32"),
                          np.array([3e38, -np.inf, 2.0], dtype="float32")]
                for result in _step(ranks, "overflow", arrays, ReduceOp.SUM):
                    assert result[0] == np.inf and np.isnan(result[1]) and result[2] == 3.0
        assert world.carried == 2
    finally:
        stop_engines(ranks)

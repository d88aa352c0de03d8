"""The real engine with N in-process fake ranks: cache fast path, invalidation, errors, join."""

import threading

import numpy as np
import pytest

from hvdlite import errors
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.ops import Collective, ReduceOp
from hvdlite.utils.polling import WaitTimeout

from .fake_ranks import FakeControl, FakeData, start_engines, stop_engines


def submit(engine, name, array, op=ReduceOp.SUM, collective=Collective.ALLREDUCE):
    meta = RequestMeta(name, collective, array.dtype.name, array.shape, op)
    request = Request(meta, array, Handle(name))
    engine.submit([request])
    return request.handle


@pytest.fixture(params=[2, 3])
def engines(request):
    world, engines = start_engines(request.param)
    yield world, engines
    stop_engines(engines)


def test_steady_state_needs_no_coordinator_round(engines):
    world, ranks = engines
    size = len(ranks)
    for step in range(5):
        handles = [submit(e, f"grad.{i}", np.full(3, float(r + step))) for r, e in enumerate(ranks) for i in range(4)]
        results = [h.wait(10) for h in handles]
        assert all(np.allclose(x, sum(r + step for r in range(size))) for x in results)
        if step == 0:
            rounds_after_first_step = world.rounds
    # steps 2..5 were answered by the bit-vector all-reduce alone
    assert world.rounds == rounds_after_first_step


def test_changed_shape_invalidates_the_cache_entry(engines):
    world, ranks = engines
    for shape in [(3,), (3,), (5,)]:
        handles = [submit(e, "w", np.ones(shape)) for e in ranks]
        assert [h.wait(10).shape for h in handles] == [shape] * len(ranks)


def test_mismatch_is_an_error_on_every_rank(engines):
    _, ranks = engines
    handles = [submit(e, "m", np.ones(r + 2)) for r, e in enumerate(ranks)]
    for handle in handles:
        with pytest.raises(errors.TensorMismatchError, match="Mismatched shape for allreduce of tensor 'm'"):
            handle.wait(10)


def test_duplicate_in_flight_name_is_rejected_locally():
    world, ranks = start_engines(2)
    try:
        first = submit(ranks[0], "d", np.ones(2))
        with pytest.raises(errors.DuplicateNameError, match=r"\['d'\] already in flight on rank 0"):
            submit(ranks[0], "d", np.ones(2))
        second = submit(ranks[1], "d", np.ones(2))
        assert first.wait(10).tolist() == second.wait(10).tolist() == [2.0, 2.0]
    finally:
        stop_engines(ranks)


def test_join_lets_others_reduce_with_zeros():
    world, ranks = start_engines(3)
    try:
        join = Request(RequestMeta("join", Collective.JOIN), None, Handle("join"))
        ranks[2].submit([join])
        handles = [submit(e, "late", np.full(2, 5.0)) for e in ranks[:2]]
        assert [h.wait(10).tolist() for h in handles] == [[10.0, 10.0]] * 2
        joins = [Request(RequestMeta("join", Collective.JOIN), None, Handle("join")) for _ in range(2)]
        for engine, request in zip(ranks[:2], joins, strict=True):
            engine.submit([request])
        lasts = {join.handle.wait(10)} | {r.handle.wait(10) for r in joins}
        assert len(lasts) == 1 and lasts <= {0, 1}  # every rank agrees; rank 2 joined first
    finally:
        stop_engines(ranks)


def test_after_shutdown_new_work_is_refused():
    world, ranks = start_engines(2)
    stop_engines(ranks)
    with pytest.raises(errors.HvdliteShutdownError):
        submit(ranks[0], "x", np.ones(1))


def submit_in_place(engine, name, array, op=ReduceOp.SUM, collective=Collective.ALLREDUCE, root=-1):
    meta = RequestMeta(name, collective, array.dtype.name, array.shape, op, root_rank=root)
    request = Request(meta, array, Handle(name), output=array)
    engine.submit([request])
    return request.handle


@pytest.mark.parametrize("shape", [(3,), (40000,)])  # packed into a fusion buffer / reduced on its own
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # float16 is widened: a copy back is needed
def test_in_place_results_land_in_the_callers_array(engines, shape, dtype):
    _, ranks = engines
    arrays = [np.full(shape, r + 1, dtype=dtype) for r in range(len(ranks))]
    handles = [submit_in_place(e, "inplace", a, ReduceOp.AVERAGE) for e, a in zip(ranks, arrays, strict=True)]
    want = sum(range(1, len(ranks) + 1)) / len(ranks)
    for handle, array in zip(handles, arrays, strict=True):
        assert handle.wait(10) is array
        assert np.allclose(array, want, rtol=1e-3)


def test_in_place_broadcast_overwrites_non_roots_only(engines):
    _, ranks = engines
    arrays = [np.full(4, r, dtype=np.int64) for r in range(len(ranks))]
    handles = [submit_in_place(e, "bcast", a, collective=Collective.BROADCAST, root=1)
               for e, a in zip(ranks, arrays, strict=True)]
    for handle, array in zip(handles, arrays, strict=True):
        assert handle.wait(10) is array and array.tolist() == [1] * 4


class _SilentRankOne(FakeControl):
    """Rank 1 is behind a dead link: the others' negotiation never completes, and it never answers."""

    link_restored = threading.Event()

    def band(self, vector):
        if self.rank == 1:  # rank 1's engine just stops, as a process behind a dead link looks
            self.link_restored.wait(30)
        raise WaitTimeout(2.5)

    def reachable_peers(self, window):
        return {0, 2}


class _StuckData(FakeData):
    def allreduce(self, send, recv, op, finish_piece=None, done=None):
        raise WaitTimeout(2.5)


def test_a_negotiation_timeout_names_the_ranks_that_did_not_answer():
    _, ranks = start_engines(3, control=_SilentRankOne, comm_timeout_seconds=2.5)
    for rank in (0, 2):
        with pytest.raises(errors.CommTimeoutError) as info:
            submit(ranks[rank], "g", np.ones(2)).wait(10)
        assert str(info.value) == (
            f"rank {rank}: negotiation made no progress for 2.5 s (HVDLITE_COMM_TIMEOUT_SECONDS=2.5); rank(s) [1] "
            "did not answer a probe within 1.05 s (unreachable, or stopped answering); rank(s) [0, 2] did; "
            "the job cannot continue")
        with pytest.raises(errors.CommTimeoutError):  # the engine is done: later work fails at once
            submit(ranks[rank], "h", np.ones(2))
        assert isinstance(ranks[rank].fatal, errors.HorovodInternalError)
    _SilentRankOne.link_restored.set()


def test_a_transfer_timeout_names_the_tensors_and_says_every_rank_answered():
    _, ranks = start_engines(2, data=_StuckData, comm_timeout_seconds=2.5)
    handles = [submit(engine, "grad.w", np.ones(2)) for engine in ranks]
    for rank, handle in enumerate(handles):
        with pytest.raises(errors.CommTimeoutError, match=rf"rank {rank}: allreduce of \['grad.w'\] made no progress "
                           r"for 2.5 s .*; every rank answered afterwards, so one made no progress; raise "
                           r"HVDLITE_COMM_TIMEOUT_SECONDS=2.5 if a step needs longer"):
            handle.wait(10)

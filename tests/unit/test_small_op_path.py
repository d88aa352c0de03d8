"""The small-op path (hvdlite.core.pipeline.lone) with in-process fake ranks: a blocking, named, small
allreduce run by its caller in one exchange, agreeing with the regular path bit for bit, and handing
over to it whenever a peer wants something else."""

import signal
import threading

import numpy as np
import pytest

from hvdlite import errors
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.ops import Collective, ReduceOp
from hvdlite.utils.polling import WaitTimeout

from .fake_ranks import FakeCarrier, FakeControl, start_engines, stop_engines

_OPS = [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]


def _key(name, array, op):
    return (name, array.dtype, array.shape, op, None, 1.0, 1.0)


def _regular(engine, name, array, op):
    """The regular path's blocking call (what hvdlite.api.allreduce falls back to)."""
    meta = RequestMeta(name, Collective.ALLREDUCE, array.dtype.name, array.shape, op)
    request = Request(meta, array, Handle(name))
    engine.submit([request], wake=False)
    return request.handle.wait(20)


def _call(engine, name, array, op, taken=None):
    """As hvdlite.api.allreduce calls it: the small-op path, else the regular one."""
    result = engine.lone_allreduce(array, _key(name, array, op))
    if result is None:
        return _regular(engine, name, array, op)
    if taken is not None:
        taken.append(name)
    return result


def _on_every_rank(engines, work):
    """``work(rank, engine)`` on one thread per rank; returns the results in rank order."""
    results, failures = [None] * len(engines), []

    def run(rank):
        try:
            results[rank] = work(rank, engines[rank])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if failures:
        raise failures[0]
    return results


def _inputs(size, dtype, step):
    rng = np.random.default_rng(step)
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(3).astype(dtype) for _ in range(size)]
    return [rng.integers(-9, 9, 3).astype(dtype) for _ in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", _OPS)
def test_steady_calls_take_the_path_and_give_the_regular_paths_bits(size, dtype, op):
    world, engines = start_engines(size, carry=True, stall_check=False)
    try:
        def work(rank, engine):
            taken, pairs = [], []
            for step in range(6):
                mine = _inputs(size, dtype, step)[rank]
                regular = _regular(engine, "regular", mine, op)  # the same inputs, through the engine's cycle
                pairs.append((regular, _call(engine, "small", mine, op, taken)))
            return taken, pairs

        results = _on_every_rank(engines, work)
        for step in range(6):
            firsts = [pairs[step][1] for _, pairs in results]
            for regular, small in (pairs[step] for _, pairs in results):
                assert small.dtype == np.dtype(dtype) and small.shape == (3,)
                np.testing.assert_array_equal(small, regular)  # bit for bit: same order, same scaling
                np.testing.assert_array_equal(small, firsts[0])  # and the same on every rank
        # The first call is new to the cache (the regular path); later ones ride the small-op path,
        # unless a peer's idle cycle came in between (then the call finished as a pending request).
        assert all(len(taken) >= 3 for taken, _ in results), [len(t) for t, _ in results]
        assert world.steady >= 3
    finally:
        stop_engines(engines)


def test_overflow_is_inf_without_a_warning():
    import warnings

    world, engines = start_engines(2, carry=True, stall_check=False)
    try:
        def work(rank, engine):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                values = np.array([3e38, np.inf if rank == 0 else -np.inf], np.float32)  # overflow; inf - inf
                return [_call(engine, "big", values, ReduceOp.SUM) for _ in range(4)]

        for results in _on_every_rank(engines, work):
            for result in results:
                assert result[0] == np.inf and np.isnan(result[1])
        assert world.steady >= 2
    finally:
        stop_engines(engines)


def test_a_peer_wanting_something_else_turns_the_call_into_a_pending_request():
    world, engines = start_engines(2, carry=True, stall_check=False)
    b_queued = threading.Event()
    adopted = []
    lone = engines[0].pipeline.lone
    adopt = lone._adopt
    lone._adopt = lambda *args: adopted.append(args[0].meta.name) or adopt(*args)
    try:
        def work(rank, engine):
            a, b = np.full(2, rank + 1.0), np.full(2, 10.0 * (rank + 1))
            for _ in range(2):  # both names cached on both ranks
                _call(engine, "a", a, ReduceOp.SUM)
                _call(engine, "b", b, ReduceOp.SUM)
            if rank == 1:  # rank 1 queues b first, then waits on a: never a lone, carried vector for a
                request = Request(RequestMeta("b", Collective.ALLREDUCE, "float64", (2,), ReduceOp.SUM), b,
                                  Handle("b"))
                engine.submit([request])
                b_queued.set()
                return _call(engine, "a", a, ReduceOp.SUM), request.handle.wait(20)
            b_queued.wait(20)
            return _call(engine, "a", a, ReduceOp.SUM), _call(engine, "b", b, ReduceOp.SUM)

        for a, b in _on_every_rank(engines, work):
            assert a.tolist() == [3.0, 3.0] and b.tolist() == [30.0, 30.0]
        assert "a" in adopted  # rank 0's exchange for a met rank 1's other vector: a pending request
    finally:
        stop_engines(engines)


def test_ranks_on_either_path_keep_one_cache():
    # A cache of two entries: every call of a third name evicts the least recently used one, which must
    # be the same on every rank. Rank 0 takes the small-op path, rank 1 the regular one; if either
    # path forgot to mark its entry as used, the ranks would evict different names, their cache bits
    # would mean different tensors, and the next cached call would never agree: a hang here (with the
    # stall inspector on, its flush of the cache would hide the fault).
    world, engines = start_engines(2, carry=True, stall_check=False, cache_capacity=2)
    try:
        def work(rank, engine):
            call = _call if rank == 0 else _regular
            sums = []
            for step in range(4):
                for name in ("a", "b", "a", "c", "a", "c", "b"):
                    sums.append(call(engine, name, np.full(2, float(rank + step)), ReduceOp.SUM)[0])
            return sums

        results = _on_every_rank(engines, work)
        expected = [float(2 * step + 1) for step in range(4) for _ in range(7)]
        assert results == [expected, expected]
        assert world.steady >= 4
    finally:
        stop_engines(engines)


def test_while_a_timeline_records_every_call_takes_the_regular_path():
    world, engines = start_engines(1, carry=True, stall_check=False)
    (engine,) = engines
    try:
        x = np.ones(2)
        _regular(engine, "x", x, ReduceOp.SUM)
        assert engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM)).tolist() == [1.0, 1.0]
        engine.pipeline.timeline = object()  # only its presence is read before the exchange
        assert engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM)) is None
        engine.pipeline.timeline = None
    finally:
        stop_engines(engines)


def test_ranks_waiting_on_different_cached_names_get_a_stall_error_not_a_hang():
    world, engines = start_engines(2, carry=True, stall_check=True, stall_check_seconds=0.2,
                                   stall_shutdown_seconds=1.0)
    try:
        def work(rank, engine):
            x = np.ones(2)
            for _ in range(2):
                _call(engine, "a", x, ReduceOp.SUM)
                _call(engine, "b", x, ReduceOp.SUM)
            with pytest.raises(errors.StallError) as caught:
                _call(engine, "a" if rank == 0 else "b", x, ReduceOp.SUM)
            return str(caught.value)

        for message in _on_every_rank(engines, work):
            assert "tensor 'a'" in message and "missing on rank(s) [1]" in message, message
            assert "tensor 'b'" in message and "missing on rank(s) [0]" in message, message
    finally:
        stop_engines(engines)


class _TimingOut(FakeCarrier):
    def exchange(self, vector, tensor):
        raise WaitTimeout(3.0)


class _ControlTimingOut(FakeControl):
    def carrier(self, vector_bytes, dtype, shape):
        return _TimingOut(self, dtype, shape)


def test_a_failed_exchange_fails_the_call_and_every_later_one_with_what_happened():
    world, engines = start_engines(1, control=_ControlTimingOut, carry=True, stall_check=False)
    (engine,) = engines
    try:
        x = np.ones(2)
        assert _regular(engine, "x", x, ReduceOp.SUM).tolist() == [1.0, 1.0]  # cached, by the regular path
        with pytest.raises(errors.CommTimeoutError) as first:
            engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM))
        assert "no progress for 3 s" in str(first.value) or "3 s" in str(first.value), first.value
        assert engine.fatal is not None
        assert engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM)) is None  # the engine stopped: no exchange
        with pytest.raises(errors.CommTimeoutError):
            _regular(engine, "x", x, ReduceOp.SUM)
    finally:
        engine.abandon(errors.HvdliteShutdownError("test over"))


class _Interrupted(FakeCarrier):
    events: list[str] = []

    def exchange(self, vector, tensor):
        signal.raise_signal(signal.SIGINT)  # held back: this rank is in the middle of a cycle
        exchanged = super().exchange(vector, tensor)
        self.events.append("exchange finished")
        return exchanged


class _ControlInterrupted(FakeControl):
    def carrier(self, vector_bytes, dtype, shape):
        return _Interrupted(self, dtype, shape)


def test_ctrl_c_during_a_call_arrives_once_its_cycle_is_over():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    world, engines = start_engines(1, control=_ControlInterrupted, carry=True, stall_check=False)
    (engine,) = engines
    try:
        x = np.ones(2)
        _regular(engine, "x", x, ReduceOp.SUM)
        with pytest.raises(KeyboardInterrupt):
            engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM))
        assert _Interrupted.events == ["exchange finished"]
        assert engine.fatal is None and not engine._driving.locked()  # the cycle ended; nothing broke
        assert _regular(engine, "x", x, ReduceOp.SUM).tolist() == [1.0, 1.0]
    finally:
        stop_engines(engines)
        signal.signal(signal.SIGINT, before)


def test_calls_that_cannot_ride_along_take_the_regular_path():
    world, engines = start_engines(2, carry=True, stall_check=False)
    try:
        def work(rank, engine):
            half = np.ones(3, np.float16)  # reduced in float32 on the wire: not carried
            big = np.ones(40_000, np.float32)  # above the carry limit
            declined = []
            for name, array in (("half", half), ("big", big)):
                for _ in range(3):
                    declined.append(engine.lone_allreduce(array, _key(name, array, ReduceOp.SUM)) is None)
                    _regular(engine, name, array, ReduceOp.SUM)
            prescaled = np.ones(2)
            key = ("scaled", prescaled.dtype, prescaled.shape, ReduceOp.SUM, None, 2.0, 1.0)
            declined.append(engine.lone_allreduce(prescaled, key) is None)
            return declined

        assert all(all(declined) for declined in _on_every_rank(engines, work))
        assert world.steady == 0
    finally:
        stop_engines(engines)


def test_a_call_finding_the_engine_thread_in_a_cycle_waits_for_it_and_runs_itself():
    # Handed over, the call would run at the engine thread's low priority, and the next one, finding
    # the thread still finishing that cycle, would be handed over too (seen at np=3 on two cores:
    # runs of 10-15 ms calls). It waits for the cycle lock instead, and runs on its own thread.
    world, engines = start_engines(1, carry=True, stall_check=False)
    (engine,) = engines
    held, go = threading.Event(), threading.Event()

    def engine_thread_cycle():
        with engine._driving:  # as the engine thread holds it for a cycle
            held.set()
            go.wait(20)

    try:
        x = np.ones(2)
        _regular(engine, "x", x, ReduceOp.SUM)
        cycle = threading.Thread(target=engine_thread_cycle)
        cycle.start()
        held.wait(20)
        threading.Timer(0.2, go.set).start()
        result = engine.lone_allreduce(x, _key("x", x, ReduceOp.SUM))
        cycle.join(20)
        assert result is not None and result.tolist() == [1.0, 1.0]
    finally:
        go.set()
        stop_engines(engines)

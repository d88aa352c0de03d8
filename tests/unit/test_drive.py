"""Blocking calls run the engine's cycle on the waiting thread (Engine.drive), with fake ranks."""

import signal
import sys
import threading
import time

import numpy as np
import pytest

from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.ops import Collective, ReduceOp
from hvdlite.utils import interrupts

from .fake_ranks import start_engines, stop_engines


def _request(rank: int, name: str) -> Request:
    array = np.full(4, float(rank + 1))
    return Request(RequestMeta(name, Collective.ALLREDUCE, "float64", (4,), ReduceOp.SUM), array, Handle(name))


def _record_cycles(engine) -> list[str]:
    threads: list[str] = []
    cycle = engine._cycle

    def recorded():
        threads.append(threading.current_thread().name)
        return cycle()

    engine._cycle = recorded
    return threads


def _wait_until_asleep(engines) -> None:
    """Wait until every engine thread sleeps on its wake-up event. A thread that starts after the
    first submit finds the work queued and rightly runs the cycle itself (seen on a loaded machine)."""
    deadline = time.monotonic() + 60  # a hang guard, not a timing bound
    for engine in engines:
        while not _in_sleep(engine._thread.ident):
            assert time.monotonic() < deadline, "an engine thread never went to sleep"
            time.sleep(0.001)


def _in_sleep(ident: int | None) -> bool:
    frame = sys._current_frames().get(ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "_sleep_until_work" in names and "_doze" not in names and names[0] == "wait"


def _wait_on_threads(handles: list[Handle]) -> list:
    results = [None] * len(handles)

    def wait(index: int) -> None:
        results[index] = handles[index].wait()

    threads = [threading.Thread(target=wait, args=(i,), name=f"caller-{i}") for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a waiting caller hung"
    return results


@pytest.mark.parametrize("size", [2, 3])
def test_waiting_callers_run_the_cycles_and_the_engine_thread_sleeps(size):
    _, engines = start_engines(size, idle_cycle_seconds=30.0)  # no heartbeat cycles during the test
    try:
        seen = [_record_cycles(e) for e in engines]
        _wait_until_asleep(engines)
        for step in range(3):
            requests = [_request(r, f"x{step}") for r in range(size)]
            for engine, request in zip(engines, requests, strict=True):
                engine.submit([request], wake=False)
            results = _wait_on_threads([r.handle for r in requests])
            expected = sum(range(1, size + 1))
            assert all(np.array_equal(x, np.full(4, float(expected))) for x in results)
        for rank, threads in enumerate(seen):
            assert threads and all(name == f"caller-{rank}" for name in threads), (rank, threads)
    finally:
        stop_engines(engines)


def test_the_engine_thread_starts_no_cycle_while_a_caller_drives():
    # The engine threads wake every 5 ms; rank 1 submits 0.2 s late, so rank 0's caller drives (and
    # backs off) all that while. Before, a wake-up took the cycles over at the engine's priority.
    _, engines = start_engines(2, idle_cycle_seconds=0.005)
    try:
        started = []  # (rank, thread name, callers driving that rank when the cycle started)
        for rank, engine in enumerate(engines):
            cycle = engine._cycle

            def recorded(rank=rank, engine=engine, cycle=cycle):
                started.append((rank, threading.current_thread().name, bool(engine._drivers)))
                return cycle()

            engine._cycle = recorded
        for step in range(3):
            requests = [_request(r, f"late{step}") for r in range(2)]
            engines[0].submit([requests[0]], wake=False)
            late = threading.Timer(0.2, lambda r=requests[1]: engines[1].submit([r], wake=False))
            late.start()
            results = _wait_on_threads([r.handle for r in requests])
            late.join()
            assert all(x.tolist() == [3.0] * 4 for x in results)
        on_engine_while_driven = [s for s in started if s[1] == "hvdlite-engine" and s[2]]
        assert not on_engine_while_driven
        assert sum(1 for s in started if s[0] == 0 and s[1] == "caller-0") >= 3  # rank 0 drove and backed off
    finally:
        stop_engines(engines)


def test_a_caller_that_cannot_drive_hands_over_to_the_engine_thread():
    _, engines = start_engines(2, idle_cycle_seconds=30.0)
    try:
        seen = [_record_cycles(e) for e in engines]
        requests = [_request(r, "busy") for r in range(2)]
        engines[0]._driving.acquire()  # as if rank 0's engine thread were in the middle of a cycle
        for engine, request in zip(engines, requests, strict=True):
            engine.submit([request], wake=False)
        waiter = threading.Thread(target=lambda: _wait_on_threads([r.handle for r in requests]))
        waiter.start()
        waiter.join(0.5)
        assert not requests[0].handle.done()
        engines[0]._driving.release()
        waiter.join(20)
        assert requests[0].handle.wait().tolist() == [3.0] * 4
        assert "hvdlite-engine" in seen[0]  # the caller woke the engine thread, which finished the work
    finally:
        stop_engines(engines)


@pytest.fixture
def default_sigint():
    """Python's default SIGINT handler for the test, whatever this process started with: a shell starts
    background commands with SIGINT ignored, and these tests are about the handler a program has."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def ignored_sigint():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_during_a_driven_cycle_arrives_after_it(default_sigint):
    events = []
    guard = interrupts.SigintGuard()

    def cycle():
        signal.raise_signal(signal.SIGINT)
        events.append("cycle finished")
        return 7

    try:
        with pytest.raises(KeyboardInterrupt):
            guard.run(cycle)
        assert events == ["cycle finished"]
        assert guard.run(lambda: 8) == 8  # nothing left held from the previous cycle
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_sigint_interrupts_at_once(default_sigint):
    events = []
    guard = interrupts.SigintGuard()

    def cycle():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        events.append("not reached")

    try:
        with pytest.raises(KeyboardInterrupt):
            guard.run(cycle)
    finally:
        guard.uninstall()
    assert events == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_between_cycles_sigint_reaches_the_program_at_once_and_a_new_handler_is_respected(default_sigint):
    guard = interrupts.SigintGuard()
    seen = []
    try:
        guard.run(lambda: None)  # the guard stays installed after a cycle ...
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # ... and passes a SIGINT between cycles on at once
        signal.signal(signal.SIGINT, lambda signum, frame: seen.append("program's own handler"))
        guard.run(lambda: signal.raise_signal(signal.SIGINT) or seen.append("cycle finished"))
        assert seen == ["cycle finished", "program's own handler"]  # held back, then the program's handler
        guard.uninstall()
        assert signal.getsignal(signal.SIGINT) is not guard._handler  # the program's handler is back
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_program_started_with_sigint_ignored_keeps_it_ignored(ignored_sigint):
    guard = interrupts.SigintGuard()
    events = []

    def cycle():
        signal.raise_signal(signal.SIGINT)  # ignored: nothing is held, nothing raised later
        events.append("cycle finished")
        return 3

    assert guard.run(cycle) == 3
    assert guard.run(lambda: signal.raise_signal(signal.SIGINT)) is None
    guard.uninstall()
    assert events == ["cycle finished"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_off_the_main_thread_nothing_is_held_back():
    results = []
    thread = threading.Thread(target=lambda: results.append(interrupts.SigintGuard().run(lambda: 5)))
    thread.start()
    thread.join(5)
    assert results == [5]

"""Stream-ordered completion of device collectives (hvdlite.gpu.completion), with stand-in events:
what a handle's wait does, and how work in flight is released, failed and drained."""

from __future__ import annotations

import pytest

from hvdlite.core.work.request import Handle, RequestMeta
from hvdlite.errors import CommTimeoutError
from hvdlite.gpu import completion
from hvdlite.ops import Collective

META = RequestMeta("grad", Collective.ALLREDUCE)


class Event:
    """Stands in for a cupy Event: ``done`` once ``fire()`` was called."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.ptr = id(self)

    def fire(self) -> None:
        self.done = True


def test_waiting_on_a_handle_hands_the_completion_to_the_current_stream_on_every_wait(monkeypatch) -> None:
    waits = []
    monkeypatch.setattr(completion, "stream_waits", lambda stream, event: waits.append((stream, event)))
    event = Event()
    handle = Handle("grad")
    handle.completion = completion.Completion(event, 3, lambda device: 1000 + device, 1.0, 0.001, META)
    handle.set_result("result")
    assert handle.wait() == "result" and waits == [(1003, event)]
    handle.wait()  # another wait (another stream, maybe) orders that caller too
    assert waits == [(1003, event), (1003, event)]


def test_a_handle_that_failed_raises_without_touching_the_gpu(monkeypatch) -> None:
    monkeypatch.setattr(completion, "stream_waits", lambda *args: pytest.fail("waited on a failed handle"))
    handle = Handle("grad")
    handle.completion = completion.Completion(Event(), 0, lambda device: 1, 1.0, 0.001, META)
    handle.set_error(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        handle.wait()


def test_without_a_framework_stream_the_host_waits_for_the_event_and_times_out_naming_the_work() -> None:
    meta = RequestMeta("w", Collective.BROADCAST)
    fired = completion.Completion(Event(done=True), 0, None, 1.0, 0.001, meta)
    fired.consume()
    stuck = completion.Completion(Event(), 0, None, 0.05, 0.001, meta)
    with pytest.raises(CommTimeoutError, match="broadcast of 'w' did not finish on the GPU within 0.05 s"):
        stuck.consume()


def test_work_in_flight_is_released_in_order_once_its_event_fired() -> None:
    in_flight = completion.InFlight(lambda: "", timeout=None)
    first, second = Event(), Event()
    in_flight.add(first, ["inputs 1"], "allreduce of ['a']")
    in_flight.add(second, ["inputs 2"], "allreduce of ['b']")
    second.fire()  # cannot happen on one stream before the first, but must not release the first
    in_flight.reap()
    assert len(in_flight) == 2
    first.fire()
    assert in_flight.check() == "" and len(in_flight) == 0


class CountedEvent:
    """A stand-in event that counts how often it was asked whether it fired."""

    def __init__(self) -> None:
        self.fired = False
        self.asked = 0

    @property
    def done(self) -> bool:
        self.asked += 1
        return self.fired


def test_work_that_holds_nothing_is_reaped_in_batches_with_one_query_of_the_newest() -> None:
    in_flight = completion.InFlight(lambda: "", timeout=None)
    events = [CountedEvent() for _ in range(completion.REAP_BATCH)]
    for event in events[:-1]:
        in_flight.add(event, (), "allreduce of ['x']")  # a blocking call's: nothing to release
        event.fired = True
        assert in_flight.check() == ""
    assert len(in_flight) == completion.REAP_BATCH - 1 and not any(e.asked for e in events), \
        "a cycle asked CUDA about work that holds nothing, before the batch filled"
    in_flight.add(events[-1], (), "allreduce of ['x']")
    events[-1].fired = True
    assert in_flight.check() == "" and len(in_flight) == 0
    assert events[-1].asked == 1 and sum(e.asked for e in events) == 1, "the newest fired: every older one did"


def test_work_that_holds_memory_is_reaped_every_cycle_oldest_first() -> None:
    in_flight = completion.InFlight(lambda: "", timeout=None)
    blocking, held = CountedEvent(), CountedEvent()
    in_flight.add(blocking, (), "allreduce of ['b']")
    in_flight.add(held, ["inputs"], "allreduce of ['h']")
    blocking.fired = True
    assert in_flight.check() == "" and len(in_flight) == 1  # the held one has not fired: only the first goes
    held.fired = True
    assert in_flight.check() == "" and len(in_flight) == 0


def test_work_that_holds_nothing_is_still_watched_once_quiet_seconds_old(monkeypatch) -> None:
    stuck = completion.InFlight(lambda: "", timeout=0.0)
    stuck.add(CountedEvent(), (), "allreduce of ['s']")
    monkeypatch.setattr(completion, "QUIET_SECONDS", 0.0)
    assert stuck.check().startswith("allreduce of ['s'] has not finished on the GPU after")


def test_an_nccl_error_or_the_deadline_is_reported_for_the_oldest_work_in_flight(monkeypatch) -> None:
    failures = [""]
    asked = []
    in_flight = completion.InFlight(lambda: asked.append(1) or failures[0], timeout=None)
    in_flight.add(Event(), [], "allreduce of ['a']")
    failures[0] = "remote process exited"
    # Work younger than QUIET_SECONDS is not asked about: a cycle then costs no call into NCCL.
    monkeypatch.setattr(completion, "QUIET_SECONDS", 3600.0)
    assert in_flight.check() == "" and not asked
    monkeypatch.setattr(completion, "QUIET_SECONDS", 0.0)
    failures[0] = ""
    assert in_flight.check() == "" and asked
    failures[0] = "remote process exited"
    assert in_flight.check() == "NCCL failed during allreduce of ['a']: remote process exited"
    late = completion.InFlight(lambda: "", timeout=0.0)
    late.add(Event(), [], "allgather of ['g']")  # QUIET_SECONDS is 0 here
    assert late.check().startswith("allgather of ['g'] has not finished on the GPU after")
    assert "HVDLITE_COMM_TIMEOUT_SECONDS=0" in late.check()


def test_draining_waits_for_the_newest_work_and_releases_everything() -> None:
    in_flight = completion.InFlight(lambda: "", timeout=1.0)
    in_flight.add(Event(done=True), [], "a")
    in_flight.add(Event(done=True), [], "b")
    in_flight.drain(0.001)
    assert len(in_flight) == 0
    stuck = completion.InFlight(lambda: "", timeout=0.05)
    stuck.add(Event(), [], "allreduce of ['c']")
    with pytest.raises(CommTimeoutError, match="allreduce of \\['c'\\]"):
        stuck.drain(0.001)


def test_events_come_from_a_per_device_pool_and_go_back_when_the_last_reference_goes(monkeypatch) -> None:
    made = iter(range(100, 200))
    monkeypatch.setattr(completion, "_create_event", lambda device: next(made))
    monkeypatch.setattr(completion, "_POOLS", {})
    first = completion.Event(0)
    assert first.ptr == 100
    held = completion.Event(0)  # a second event while the first is alive: a new one
    assert held.ptr == 101
    del first
    assert completion.Event(0).ptr == 100  # recycled (and given back again at once)
    assert completion.Event(1).ptr == 102  # events belong to their device
    assert completion._POOLS == {0: [100], 1: [102]}


def test_a_handle_is_done_for_poll_only_once_the_gpu_finished_but_delivered_at_once() -> None:
    event = Event()
    handle = Handle("grad")
    handle.completion = completion.Completion(event, 0, lambda device: 1, 1.0, 0.001, META)
    handle.set_result("result")
    assert handle.delivered and not handle.done()
    event.fire()
    assert handle.done()


def test_the_inputs_are_released_once_their_own_stream_waits_or_the_host_waited(monkeypatch) -> None:
    monkeypatch.setattr(completion, "stream_waits", lambda stream, event: None)
    same = completion.Completion(Event(), 0, lambda device: 7, 1.0, 0.001, META, keep=("in", "out"), source_stream=7)
    same.consume()
    assert same.keep is None
    other = completion.Completion(Event(), 0, lambda device: 8, 1.0, 0.001, META, keep=("in", "out"), source_stream=7)
    other.consume()  # waited on another stream: the allocator could hand the memory to stream 7's work
    assert other.keep == ("in", "out")
    host = completion.Completion(Event(done=True), 0, None, 1.0, 0.001, META, keep=("in", "out"))
    host.consume()
    assert host.keep is None

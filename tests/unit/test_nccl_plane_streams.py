"""Which CUDA stream the NCCL plane launches on, and how launches on different streams are ordered,
with a stand-in CUDA runtime and communicator that record every call (no GPU needed).

A blocking call's lone in-place allreduce runs on the stream its tensor is complete on (one NCCL
call, one event, no stream waits); anything else runs on the plane's stream after the inputs'
ready events; a launch on another stream than the previous one waits for the previous one's event.
"""

from __future__ import annotations

import itertools
import sys
import types

import numpy as np
import pytest

from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.core.work.response import Response
from hvdlite.gpu.arrays import DeviceArray
from hvdlite.ops import Collective, ReduceOp

PLANE_STREAM, CALLER_STREAM, OTHER_STREAM = 70, 80, 90


class Runtime:
    """Records eventRecord / streamWaitEvent; events are fresh integers."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self._ids = itertools.count(1000)

    def getDevice(self) -> int:
        return 0

    def setDevice(self, device: int) -> None:
        self.calls.append(("setDevice", device))

    def eventCreateWithFlags(self, flags: int) -> int:
        return next(self._ids)

    def eventRecord(self, event: int, stream: int) -> None:
        self.calls.append(("record", event, stream))

    def eventQuery(self, event: int) -> int:
        return 600  # not ready: every launch stays in flight

    def streamWaitEvent(self, stream: int, event: int, flags: int) -> None:
        self.calls.append(("wait", stream, event))


class Stream:
    ptr = PLANE_STREAM

    def __init__(self, **kwargs) -> None:
        pass

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> bool:
        return False


class Communicator:
    size, rank, aborted = 2, 0, False

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def allreduce(self, send: int, recv: int, count: int, dtype: str, op: ReduceOp, stream: int,
                  scale: float = 1.0) -> None:
        self.calls.append(("allreduce", send, stream, scale))

    def async_error(self) -> str:
        return ""


@pytest.fixture
def plane(monkeypatch):
    """An NcclPlane on the stand-ins; ``plane.calls`` lists what it asked of CUDA and NCCL, in order."""
    calls: list = []
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=Runtime(calls), Device=lambda device: Stream(), Stream=Stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    from hvdlite.core.planes.nccl import NcclPlane
    from hvdlite.gpu import completion

    monkeypatch.setattr(completion, "_POOLS", {})
    monkeypatch.setattr(completion, "_runtime", None)  # bound to this test's stand-in by its first event
    made = NcclPlane(Communicator(calls), 0, timeout=60.0, poll_seconds=0.001)
    made.calls = calls
    return made


def submit(name: str, stream: int, blocking: bool, op: ReduceOp = ReduceOp.SUM,
           ptr: int = 4096) -> tuple[tuple[Response, ...], dict[str, Request]]:
    """One in-place float32 allreduce request, as the torch adapter builds it (``blocking``: no ready event)."""
    array = DeviceArray.of_framework(ptr, (4,), np.dtype(np.float32), 0, object(), stream, lambda device: stream,
                                     record=not blocking)
    meta = RequestMeta(name, Collective.ALLREDUCE, "float32", (4,), op, device="cuda")
    request = Request(meta, array, Handle(name), array)
    return (Response(meta),), {name: request}


def test_a_blocking_in_place_allreduce_runs_on_its_callers_stream_with_one_event_and_no_waits(plane) -> None:
    responses, local = submit("a", CALLER_STREAM, blocking=True)
    results = plane.dispatch(responses, local)
    assert results == [local["a"].output]
    kinds = [call[0] for call in plane.calls]
    assert kinds == ["allreduce", "record"], plane.calls
    assert plane.calls[0][2] == CALLER_STREAM and plane.calls[1][2] == CALLER_STREAM
    assert local["a"].handle.completion is None  # the caller's stream already follows the collective
    assert len(plane._in_flight) == 1  # still watched for NCCL's errors and the deadline


def test_an_async_allreduce_runs_on_the_plane_stream_after_its_ready_event(plane) -> None:
    responses, local = submit("a", CALLER_STREAM, blocking=False)
    plane.calls.clear()  # the ready event, recorded at submission on the caller's stream
    plane.dispatch(responses, local)
    ready = local["a"].tensor.ready.ptr
    assert plane.calls[0] == ("wait", PLANE_STREAM, ready)
    assert plane.calls[1][0] == "allreduce" and plane.calls[1][2] == PLANE_STREAM
    assert plane.calls[2][0] == "record" and plane.calls[2][2] == PLANE_STREAM
    assert local["a"].handle.completion is not None  # the caller's stream waits when it takes the result


def test_a_launch_on_another_stream_waits_for_the_previous_launch(plane) -> None:
    plane.dispatch(*submit("a", CALLER_STREAM, blocking=True))
    first_event = plane.calls[-1][1]
    plane.calls.clear()
    plane.dispatch(*submit("b", CALLER_STREAM, blocking=True))
    assert [call[0] for call in plane.calls] == ["allreduce", "record"], "same stream: nothing to wait for"
    second_event = plane.calls[-1][1]
    plane.calls.clear()
    responses, local = submit("c", CALLER_STREAM, blocking=False)
    plane.calls.clear()
    plane.dispatch(responses, local)
    assert plane.calls[0] == ("wait", PLANE_STREAM, second_event) and first_event != second_event
    plane_event = plane.calls[-1][1]
    plane.calls.clear()
    plane.dispatch(*submit("d", OTHER_STREAM, blocking=True))
    assert plane.calls[0] == ("wait", OTHER_STREAM, plane_event)
    assert plane.calls[1][0] == "allreduce" and plane.calls[1][2] == OTHER_STREAM


def test_a_blocking_float_average_is_one_premultiplied_sum_on_the_callers_stream(plane) -> None:
    responses, local = submit("a", CALLER_STREAM, blocking=True, op=ReduceOp.AVERAGE)
    plane.dispatch(responses, local)
    assert plane.calls[0] == ("allreduce", 4096, CALLER_STREAM, 0.5)  # 1 / size, folded into NCCL's sum


def test_a_blocking_tensors_ready_event_is_recorded_once_where_another_stream_needs_it(plane) -> None:
    _, local = submit("a", CALLER_STREAM, blocking=True)
    tensor = local["a"].tensor
    assert tensor.ready is None and plane.calls == []
    event = tensor.ready_event()
    assert plane.calls == [("record", event.ptr, CALLER_STREAM)]
    assert tensor.ready_event() is event and not tensor.on_its_stream

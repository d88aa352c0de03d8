"""The pipeline's stages one at a time, in process: the queue, completion, and the executor's choice of plane."""

import numpy as np
import pytest

from hvdlite import errors
from hvdlite.core.pipeline.complete import complete
from hvdlite.core.pipeline.execute import Executor
from hvdlite.core.pipeline.queue import RequestQueue
from hvdlite.core.work.item import WorkItem
from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.core.work.response import Response
from hvdlite.ops import Collective, ReduceOp


def _request(name: str, collective: Collective = Collective.ALLREDUCE, device: str = "cpu") -> Request:
    meta = RequestMeta(name, collective, "float32", (2,), ReduceOp.SUM, device=device)
    return Request(meta, np.zeros(2, np.float32), Handle(name))


def test_a_group_is_queued_whole_or_not_at_all():
    queue = RequestQueue(rank=1)
    queue.put([_request("a")])
    with pytest.raises(errors.DuplicateNameError, match=r"\['a'\] already in flight on rank 1"):
        queue.put([_request("b"), _request("a")])
    assert [r.meta.name for r in queue.take_arrived()] == ["a"] and queue.in_flight == 1


def test_released_names_can_be_submitted_again_and_unknown_names_are_skipped():
    queue = RequestQueue(rank=0)
    request = _request("a")
    queue.put([request])
    queue.take_arrived()
    released = queue.release([(Response(request.meta), "result", None), (Response(_request("x").meta), 1, None)])
    assert released == [(request, "result", None)] and not queue.has_work and queue.in_flight == 0
    queue.put([_request("a")])  # the name is free again


def test_joins_are_counted_while_pending():
    queue = RequestQueue(rank=0)
    join = _request("join", Collective.JOIN)
    queue.put([join])
    queue.take_arrived()
    assert queue.joins == 1
    queue.release([(Response(join.meta), 0, None)])
    assert queue.joins == 0


def test_after_a_failure_every_request_and_every_later_put_get_the_error():
    queue = RequestQueue(rank=0)
    waiting, arrived = _request("w"), _request("n")
    queue.put([waiting])
    queue.take_arrived()
    queue.put([arrived])
    queue.fail_all(errors.StallError("stalled"))
    for request in (waiting, arrived):
        with pytest.raises(errors.StallError, match="stalled"):
            request.handle.wait(1)
    with pytest.raises(errors.StallError):
        queue.put([_request("later")])


def test_a_closed_queue_refuses_new_requests():
    queue = RequestQueue(rank=0)
    queue.close()
    with pytest.raises(errors.HvdliteShutdownError, match="shutting down"):
        queue.put([_request("a")])


def test_complete_hands_results_and_errors_to_the_waiting_handles():
    queue = RequestQueue(rank=0)
    good, bad = _request("good"), _request("bad")
    queue.put([good, bad])
    queue.take_arrived()
    failure = errors.TensorMismatchError("mismatch")
    complete(queue, [(Response(good.meta), 42, None), (Response(bad.meta), None, failure)], None)
    assert good.handle.wait(1) == 42
    with pytest.raises(errors.TensorMismatchError, match="mismatch"):
        bad.handle.wait(1)


class _Transport:
    chunk_bytes = 1 << 20

    def __init__(self) -> None:
        self.calls: list[str] = []

    def flush(self) -> None:
        self.calls.append("flush")

    def quiesce(self) -> None:
        self.calls.append("quiesce")

    def barrier(self) -> None:
        self.calls.append("barrier")

    def close(self) -> None:
        self.calls.append("close")


def test_each_item_runs_on_the_first_plane_enabled_for_it():
    transport = _Transport()
    executor = Executor(transport, rank=0, size=1)
    host_item = WorkItem((Response(_request("b", Collective.BARRIER).meta),))
    device_item = WorkItem((Response(_request("d", device="cuda").meta),))
    assert executor.plane_for(host_item).name == "host"
    assert executor.plane_for(device_item).name == "gpu"
    outcomes = []
    executor.start(host_item, {}, outcomes.append)
    assert transport.calls == ["flush", "barrier"] and outcomes == [[(host_item.responses[0], None, None)]]


def test_an_error_response_is_delivered_as_its_error_without_any_plane():
    transport = _Transport()
    meta = _request("e").meta
    response = Response(meta, error="Mismatched shape", error_type="TensorMismatchError")
    outcomes = []
    Executor(transport, rank=0, size=1).start(WorkItem((response,)), {}, outcomes.append)
    (((_, result, error),),) = outcomes
    assert result is None and isinstance(error, errors.TensorMismatchError) and transport.calls == []

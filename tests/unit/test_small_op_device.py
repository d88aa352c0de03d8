"""The small-op path for a device tensor (hvdlite.core.pipeline.lone): a blocking, named, in-place
allreduce of a CUDA tensor on its caller's stream exchanges the vector alone and launches NCCL on that
stream, exactly as the regular path's lone in-place launch does; with fake ranks and a stand-in CUDA
runtime and NCCL communicator that record every call (no GPU needed)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from hvdlite.core.work.request import Handle, Request, RequestMeta
from hvdlite.gpu.arrays import DeviceArray
from hvdlite.ops import Collective, ReduceOp

from .fake_ranks import start_engines, stop_engines
from .test_nccl_plane_streams import CALLER_STREAM, Communicator, Runtime, Stream
from .test_small_op_path import _on_every_rank


class _Runtime(Runtime):
    def eventQuery(self, event: int) -> int:
        return 0  # done: shutdown drains the plane's work in flight


class _Communicator(Communicator):
    def destroy(self) -> None:
        self.calls.append(("destroy",))


@pytest.fixture
def gpu_engines(monkeypatch):
    """Two fake ranks whose GPU plane is an NcclPlane on the stand-ins; ``calls[r]`` is rank r's record."""
    calls = [[], []]
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=_Runtime([]), Device=lambda device: Stream(), Stream=Stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    from hvdlite.core.planes.nccl import NcclPlane
    from hvdlite.gpu import completion

    monkeypatch.setattr(completion, "_POOLS", {})
    monkeypatch.setattr(completion, "_runtime", None)

    def chooser(rank):
        def choose(executor, item, local):
            plane = NcclPlane(_Communicator(calls[rank]), 0, timeout=60.0, poll_seconds=0.001)
            plane._runtime = _Runtime(calls[rank])  # this rank's own record of CUDA calls
            return plane
        return choose

    world, engines = start_engines(2, carry=True, stall_check=False)
    for rank, engine in enumerate(engines):
        engine.pipeline.executor._planes[1]._choose = chooser(rank)
    yield engines, calls
    stop_engines(engines)
    assert all(("destroy",) in rank_calls for rank_calls in calls)  # shut down cleanly, nothing left running


def _array(ptr: int) -> DeviceArray:
    """A blocking call's CUDA tensor, as hvdlite.torch's own_device_array makes it (no ready event)."""
    return DeviceArray.of_blocking_call(ptr, (4,), np.dtype(np.float32), 0, object(), CALLER_STREAM,
                                        lambda device: CALLER_STREAM)


def _key(name, array, op=ReduceOp.SUM):
    return (name, array.dtype, array.shape, op, None, 1.0, 1.0, array.device)


def _regular(engine, name, array, op=ReduceOp.SUM):
    meta = RequestMeta(name, Collective.ALLREDUCE, "float32", (4,), op, device="cuda")
    request = Request(meta, array, Handle(name), array)
    engine.submit([request], wake=False)
    return request.handle.wait(20)


def test_a_steady_device_call_launches_on_its_callers_stream_like_the_regular_path(gpu_engines):
    engines, calls = gpu_engines

    def work(rank, engine):
        array = _array(4096 + rank)
        assert _regular(engine, "g", array) is array  # the first call: the job chooses its GPU plane
        regular = list(calls[rank])
        calls[rank].clear()
        taken = [engine.lone_allreduce(array, _key("g", array)) for _ in range(5)]
        return regular, taken

    for rank, (regular, taken) in enumerate(_on_every_rank(engines, work)):
        assert [c[0] for c in regular] == ["allreduce", "record"], regular
        assert all(result is not None for result in taken[1:]), taken  # (an idle cycle may take the first)
        launches = [c for c in calls[rank] if c[0] == "allreduce"]
        assert launches and all(c == ("allreduce", 4096 + rank, CALLER_STREAM, 1.0) for c in launches), calls[rank]
        assert [c[0] for c in calls[rank] if c[0] != "setDevice"] == ["allreduce", "record"] * len(launches)
        assert not any(c[0] == "wait" for c in calls[rank])  # one stream: nothing to wait for


def test_a_float_average_is_one_premultiplied_sum(gpu_engines):
    engines, calls = gpu_engines

    def work(rank, engine):
        array = _array(8192)
        _regular(engine, "avg", array, ReduceOp.AVERAGE)
        calls[rank].clear()
        return [engine.lone_allreduce(array, _key("avg", array, ReduceOp.AVERAGE)) for _ in range(3)]

    for rank, steady in enumerate(_on_every_rank(engines, work)):
        assert all(result is not None for result in steady[1:])
        assert ("allreduce", 8192, CALLER_STREAM, 0.5) in calls[rank]  # 1 / size, folded into NCCL's sum


def test_a_tensor_not_on_its_callers_stream_takes_the_regular_path():
    from hvdlite import api

    pending = _array(8192)
    pending.ready = object()  # as if a ready event was recorded: the plane's stream, after it
    assert api.small_allreduce_in_place(pending, None, "x", ReduceOp.SUM, 1.0, 1.0) is False
    assert api.small_allreduce_in_place(_array(8192), None, None, ReduceOp.SUM, 1.0, 1.0) is False  # unnamed


def test_a_peer_on_the_regular_path_agrees_with_a_steady_device_call(gpu_engines):
    # Both send the lone cycle's vector for this request (not carried: device memory stays put), so
    # the exchange matches and rank 0's calls take the small-op path while rank 1's take the regular one.
    engines, calls = gpu_engines
    adopted = []
    lone = engines[0].pipeline.lone
    adopt = lone._adopt
    lone._adopt = lambda *args: adopted.append(args[0].meta.name) or adopt(*args)

    def work(rank, engine):
        array = _array(4096)
        _regular(engine, "mixed", array)
        if rank == 1:
            return [_regular(engine, "mixed", array) for _ in range(6)]
        return [engine.lone_allreduce(array, _key("mixed", array)) for _ in range(6)]

    taken, regular = _on_every_rank(engines, work)
    assert all(result is not None for result in taken) and all(r is not None for r in regular)
    # The exchange matched: no call became a pending request (a peer's idle cycle may turn one or two).
    assert len(adopted) <= 2, adopted

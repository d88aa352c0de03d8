"""What hvdlite's own Python costs a blocking CUDA allreduce, measured on any machine, GPU or not.

Run:  hvdliterun -np 1 python bench/gpu_host_cost.py [--calls 20000] [--reps 7]

The target is <= 25 us per blocking allreduce of a small CUDA tensor at np=1; the GPU adds
only a few microseconds of CUDA and NCCL calls (bare NCCL enqueues in under 1 us), so the rest is
this host path: submit, negotiation, the NCCL plane's bookkeeping, completion. GPU machines are
lent for minutes; this measures that path everywhere, with cupy's runtime and the NCCL library
replaced by stand-ins that return at once (nothing runs, results are not checked: the figure is
host cost only, without the CUDA calls and ctypes' argument conversion, about 0.6 us a launch).

It times blocking in-place allreduces of a 4 B float32 device array built as the torch adapter
builds a CUDA tensor's (``hvdlite.torch.collectives.tensors``), through the core API and the real NcclPlane
on the caller's stream, against the CPU path's blocking allreduce of a 4 B NumPy array in the
same process (the baseline), interleaved rep by rep. Also the Python bytecodes each executes per
call (the same on every run, so a change's effect shows even on a noisy machine), and the CUDA and
NCCL calls a GPU-path call makes, which a GPU adds to the host cost.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import statistics
import sys
import time
import types
from typing import Any

import numpy as np
from bytecodes import bytecodes_per_call

CALLS: collections.Counter = collections.Counter()  # the CUDA and NCCL calls the stand-ins took, by name
COUNTING = [False]  # counted only in a pass of their own: counting costs time


class StandInRuntime:
    """cupy.cuda.runtime's calls the NCCL plane makes; events are fresh integers, always fired."""

    def __init__(self) -> None:
        self._events = iter(range(1000, 1 << 62))

    def getDevice(self) -> int:
        return 0

    def setDevice(self, device: int) -> None:
        pass

    def getDeviceCount(self) -> int:
        return 1

    def eventCreateWithFlags(self, flags: int) -> int:
        return next(self._events)

    def eventRecord(self, event: int, stream: int) -> None:
        if COUNTING[0]:
            CALLS["cudaEventRecord"] += 1

    def eventQuery(self, event: int) -> int:
        if COUNTING[0]:
            CALLS["cudaEventQuery"] += 1
        return 0

    def streamWaitEvent(self, stream: int, event: int, flags: int) -> None:
        if COUNTING[0]:
            CALLS["cudaStreamWaitEvent"] += 1


class StandInStream:
    ptr = 0x70

    def __init__(self, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> StandInStream:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class StandInNccl:
    """The NCCL library calls a blocking allreduce makes (through hvdlite.gpu.nccl.Communicator)."""

    def ncclAllReduce(self, *args: Any) -> int:
        if COUNTING[0]:
            CALLS["ncclAllReduce"] += 1
        return 0

    def ncclCommDestroy(self, handle: Any) -> int:
        return 0


def install_stand_ins() -> None:
    """A stand-in ``cupy`` module, NCCL library and GPU plane chooser, before hvdlite is initialized."""
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=StandInRuntime(), Device=lambda device: StandInStream(),
                                      Stream=StandInStream)
    sys.modules["cupy"] = cupy
    from hvdlite.core import runtime
    from hvdlite.core.planes.nccl import NcclPlane
    from hvdlite.gpu import nccl

    nccl._library = StandInNccl  # the library replaced, as the unit tests do

    def chooser(config: Any, data_comm: Any, hosts: list[str], local_rank: int):
        def choose(executor: Any, item: Any, local: Any) -> NcclPlane:
            comm = nccl.Communicator(ctypes.c_void_p(0x5000), executor.size, executor.rank)
            return NcclPlane(comm, 0, config.comm_timeout, config.poll_time_ms / 1000)
        return choose

    runtime._gpu_plane_chooser = chooser


def device_allreduce(hvd: Any) -> Any:
    """One blocking in-place 4 B allreduce of a device array, as ``hvdlite.torch.allreduce_`` submits
    it: the small-op path first (``api.small_allreduce_in_place``), the regular path if it declines."""
    from hvdlite import api
    from hvdlite.core.runtime import caller_waits
    from hvdlite.core.work.request import MappedHandle
    from hvdlite.gpu.arrays import DeviceArray
    from hvdlite.process_sets import global_process_set

    float32, owner = np.dtype(np.float32), object()

    def stream(device: int) -> int:
        return 0x80

    def small() -> bool:  # hvdlite.torch's own_device_array: a blocking call's tensor, no ready event
        device = DeviceArray.of_blocking_call(0x1000, (1,), float32, 0, owner, stream(0), stream)
        return api.small_allreduce_in_place(device, None, "small", hvd.Sum, 1.0, 1.0, global_process_set)

    def start() -> MappedHandle:  # hvdlite.torch's to_numpy, then allreduce_async_
        device = DeviceArray.of_framework(0x1000, (1,), float32, 0, owner, stream(0), stream,
                                          record=not caller_waits())
        return MappedHandle(api.allreduce_async(device, None, "small", hvd.Sum, output=device,
                                                process_set=global_process_set), lambda result: owner)

    def call() -> Any:
        if small():
            return owner
        return api.synchronize(api.blocking(start))
    return call


def per_call(fn: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def cuda_calls_per_call(fn: Any, calls: int) -> dict[str, float]:
    """The stand-ins' calls per call of ``fn``, by name."""
    CALLS.clear()
    COUNTING[0] = True
    try:
        for _ in range(calls):
            fn()
    finally:
        COUNTING[0] = False
    return {name: count / calls for name, count in sorted(CALLS.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    install_stand_ins()
    import hvdlite as hvd

    hvd.init()
    host = np.ones(1, np.float32)
    ways = {"GPU path (stand-in CUDA and NCCL)": device_allreduce(hvd),
            "CPU path (baseline)": lambda: hvd.allreduce(host, name="small.host", op=hvd.Sum)}
    for fn in ways.values():
        per_call(fn, 2000)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.reps):
        for name, fn in ways.items():
            times[name].append(per_call(fn, args.calls))
    calls = cuda_calls_per_call(next(iter(ways.values())), args.calls)
    codes = {name: bytecodes_per_call(fn) for name, fn in ways.items()}
    if hvd.rank() == 0:
        print(f"blocking 4 B float32 allreduce, np={hvd.size()}, {args.reps} reps x {args.calls} calls, "
              "us a call, median [min-max]; Python bytecodes a call:")
        for name, values in times.items():
            print(f"  {name}: {statistics.median(values) * 1e6:.2f} [{min(values) * 1e6:.2f}-{max(values) * 1e6:.2f}]"
                  f"; {codes[name]:.0f} bytecodes")
        gpu, cpu = (statistics.median(values) for values in times.values())
        print(f"GPU path / CPU path: {gpu / cpu:.2f}")
        print("CUDA and NCCL calls a GPU-path call: " + ", ".join(f"{name} {count:.3f}" for name, count in calls.items()))
    hvd.shutdown()


if __name__ == "__main__":
    main()

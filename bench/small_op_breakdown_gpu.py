"""Where the time of one small blocking allreduce of a CUDA tensor goes, stage by stage, against bare NCCL.

Run:  hvdliterun -np 1 python bench/small_op_breakdown.py --device cuda [--bytes 4] [--calls 2000] [--reps 5]

Each rep times ``--calls`` blocking ``hvd.allreduce_`` calls (torch, in place, Sum, one name: the
response cache answers every call after the first) on a float32 CUDA tensor of ``--bytes`` bytes,
then ``torch.cuda.synchronize()``, and divides by the calls; interleaved with the same number of
bare NCCL allreduces (``cupy.cuda.nccl`` on its own communicator, torch's current stream), once
only enqueued (what a stream-ordered blocking call costs, as hvdlite's default completion) and once
with a stream synchronization after each call (what a host-synchronized one costs).

The instrumented pass wraps the entry points of each stage with timers (as the CPU variant does;
rows are exclusive and add up to the call):

- submit, torch side: the tensor described for the core and its ready event (``tensors.to_numpy``)
- submit, core: ``api.allreduce_async``; negotiate; fuse; execute (the executor and the planes' glue)
- device plane: ``NcclPlane.dispatch`` and its allreduce, less the rows below
- CUDA events: creating and recording the ready and completion events
- cudaStreamWaitEvent: NCCL's stream waiting for the input, and the caller's stream for the result
- NCCL launch: ``ncclAllReduce`` through ctypes
- completion, handle side: ``Completion.consume``; host wait: ``NcclPlane._wait_finished`` (only
  with ``HVDLITE_ASYNC_COMPLETION=0``)
- complete; cycle (the pipeline's glue between the stages); the rest of the call (handle, drive
  loop, Ctrl-C deferral).

A blocking ``allreduce_`` runs on the caller's stream (hvdlite.core.planes.nccl): no ready event and no
stream waits, so those rows read 0 unless another stream's launch came just before.

``--profile`` prints a cProfile of the plain calls first. Then the same timing with host-synchronized completion (Horovod's default), and the CPU this
process burns while a blocking allreduce waits 0.5 s for a busy GPU, in each completion mode.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from mpi4py import MPI
from stage_timers import SPENT, instrument_pipeline, wrap

STAGES = ("submit, torch side", "submit, core", "negotiate", "fuse", "execute", "device plane", "CUDA events",
          "cudaStreamWaitEvent", "NCCL launch", "completion, handle side", "host wait", "complete", "cycle")


def instrument() -> None:
    """Timers on each stage's entry points (exclusive: nested timed calls are subtracted)."""
    from hvdlite.core.planes.nccl import NcclPlane
    from hvdlite.gpu import completion, nccl
    from hvdlite.torch.collectives import async_ops

    instrument_pipeline("submit, core")
    wrap(async_ops, "to_numpy", "submit, torch side")
    wrap(NcclPlane, "dispatch", "device plane")
    wrap(completion, "record", "CUDA events")  # a ready event (submitted asynchronously)
    wrap(NcclPlane, "_event_on", "CUDA events")  # the completion event of a launch
    wrap(completion, "stream_waits", "cudaStreamWaitEvent")
    wrap(nccl.Communicator, "allreduce", "NCCL launch")
    wrap(completion.Completion, "consume", "completion, handle side")
    wrap(NcclPlane, "_wait_finished", "host wait")


def nccl_plane():
    """This rank's NCCL plane (built by the first device collective)."""
    from hvdlite.core.runtime import current

    return current().engine.pipeline.executor._planes[1]._plane


def timed_gpu(torch, fn, calls: int, comm: MPI.Comm) -> float:
    """Mean seconds per call, the GPU drained before and after, on the slowest rank."""
    torch.cuda.synchronize()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def waiting_cpu(torch, hvd, x, busy_cycles: int) -> tuple[float, float]:
    """(seconds the blocking allreduce took, CPU share of this process meanwhile) while the GPU is busy
    about 0.5 s before the tensor is produced."""
    y = x * 1
    hvd.allreduce_(y, op=hvd.Sum, name="small.busy")  # the name negotiated once: the cached path is timed
    torch.cuda.synchronize()
    torch.cuda._sleep(busy_cycles)
    y = x * 1  # produced after the busy kernel: its ready event fires only then
    before_wall, before_cpu = time.perf_counter(), cpu_seconds()
    hvd.allreduce_(y, op=hvd.Sum, name="small.busy")
    wall = time.perf_counter() - before_wall
    share = (cpu_seconds() - before_cpu) / wall
    torch.cuda.synchronize()
    return wall, share


def busy_cycles_for(torch, seconds: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that keep the GPU busy about ``seconds``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * seconds / (start.elapsed_time(end) / 1e3))


def bare_nccl(torch, hvd, x):
    """(enqueue only, enqueue + stream sync): bare NCCL allreduces of ``x`` on torch's current stream."""
    import cupy
    from cupy.cuda import nccl as cupy_nccl

    size, rank = hvd.size(), hvd.rank()
    uid = hvd.broadcast_object(cupy_nccl.get_unique_id() if rank == 0 else None, root_rank=0, name="bare.uid")
    bare = cupy_nccl.NcclCommunicator(size, uid, rank)
    stream = torch.cuda.current_stream().cuda_stream
    ptr, count = x.data_ptr(), x.numel()

    def enqueue() -> None:
        bare.allReduce(ptr, ptr, count, cupy_nccl.NCCL_FLOAT32, cupy_nccl.NCCL_SUM, stream)

    def synced() -> None:
        enqueue()
        cupy.cuda.runtime.streamSynchronize(stream)
    return enqueue, synced


def measure(torch, hvd, x, args: argparse.Namespace, comm: MPI.Comm) -> dict[str, list[float]]:
    """Per-call seconds of each way, rep by rep, interleaved."""
    enqueue, synced = bare_nccl(torch, hvd, x)
    ways = {"hvdlite allreduce_": lambda: hvd.allreduce_(x, op=hvd.Sum, name="small"),
            "bare NCCL, enqueued": enqueue, "bare NCCL + stream sync": synced}
    for fn in ways.values():
        timed_gpu(torch, fn, 200, comm)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.reps):
        for name, fn in ways.items():
            times[name].append(timed_gpu(torch, fn, args.calls, comm))
    nccl_plane()._async = False  # Horovod's default completion, in the same process
    ours = lambda: hvd.allreduce_(x, op=hvd.Sum, name="small")  # noqa: E731
    times["hvdlite allreduce_, host-synchronized"] = [timed_gpu(torch, ours, args.calls, comm)
                                                     for _ in range(args.reps)]
    nccl_plane()._async = True
    return times


def main(args: argparse.Namespace) -> None:
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    comm = MPI.COMM_WORLD
    x = torch.ones(max(1, args.bytes // 4), device="cuda")
    hvd.allreduce_(x, op=hvd.Sum, name="small")  # builds the NCCL plane
    if nccl_plane().name != "NCCL":
        raise SystemExit(f"the GPU plane is {nccl_plane().name}, not NCCL: run one rank per GPU")
    nccl_plane()._callers_stream = not args.plane_stream
    times = measure(torch, hvd, x, args, comm)
    if args.profile:
        profile(torch, hvd, x, args.calls, comm)
    instrument()
    SPENT.clear()
    total = timed_gpu(torch, lambda: hvd.allreduce_(x, op=hvd.Sum, name="small"), args.calls, comm)
    spent = dict(SPENT)  # before the waits below add their own
    cycles = busy_cycles_for(torch, 0.5)
    waits = {"stream-ordered (default)": waiting_cpu(torch, hvd, x, cycles)}
    nccl_plane()._async = False
    waits["host-synchronized"] = waiting_cpu(torch, hvd, x, cycles)
    nccl_plane()._async = True
    if hvd.rank() == 0:
        report(args, hvd.size(), times, total, spent, waits)
    hvd.shutdown()


def report(args: argparse.Namespace, size: int, times: dict[str, list[float]], total: float, spent: dict[str, int],
           waits: dict[str, tuple[float, float]]) -> None:
    print(f"{args.bytes} B float32 CUDA allreduce, np={size}, {args.reps} reps x {args.calls} calls, "
          "us a call, median [min-max]:")
    for name, values in times.items():
        print(f"  {name}: {statistics.median(values) * 1e6:.1f} [{min(values) * 1e6:.1f}-{max(values) * 1e6:.1f}]")
    per_call = {stage: ns / args.calls / 1e3 for stage, ns in spent.items()}
    print(f"\ninstrumented pass (stream-ordered completion): {total * 1e6:.1f} us a call (rank 0's split)")
    print("| stage | us a call | share |")
    print("|---|---|---|")
    for stage in STAGES:
        print(f"| {stage} | {per_call.get(stage, 0.0):.1f} | {per_call.get(stage, 0.0) / (total * 1e6):.0%} |")
    rest = total * 1e6 - sum(per_call.values())
    print(f"| rest (handle, drive loop, Ctrl-C deferral) | {rest:.1f} | {rest / (total * 1e6):.0%} |")
    print("\na blocking allreduce_ of a tensor produced behind 0.5 s of GPU work:")
    for mode, (wall, share) in waits.items():
        print(f"  {mode}: returned after {wall * 1e3:.2f} ms; this process's CPU meanwhile {share:.1%} of a core")


def profile(torch, hvd, x, calls: int, comm: MPI.Comm) -> None:
    """``--profile``: cProfile of ``calls`` blocking calls, the functions with the most own time (rank 0)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    timed_gpu(torch, lambda: hvd.allreduce_(x, op=hvd.Sum, name="small"), calls, comm)
    profiler.disable()
    if hvd.rank() == 0:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(28)

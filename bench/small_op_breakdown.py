"""Where the time of one small blocking allreduce goes, stage by stage, against raw mpi4py.

Run:  hvdliterun -np 2 python bench/small_op_breakdown.py [--bytes 4] [--calls 4000] [--reps 5]
      hvdliterun -np 1 python bench/small_op_breakdown.py --device cuda [--plane-stream]   (a CUDA tensor on NCCL:
      bench/small_op_breakdown_gpu.py, whose docstring lists its stages)

Each rep times ``--calls`` blocking ``hvdlite.allreduce`` calls on a float32 array of ``--bytes``
bytes (Sum, one name: the response cache answers every call after the first, so a call takes the
small-op path, ``hvdlite/core/pipeline/lone.py``), and the same number of raw mpi4py ``Allreduce``
calls, interleaved rep by rep. A second pass wraps the stages' entry points with timers
(``perf_counter_ns``, about 0.2 us a wrapper) and reports, on rank 0, the mean microseconds per call
spent in each, exclusive of the timed calls inside it (the rows add up to the call):

The small-op path, where a steady call goes:

- entry: ``LonePath.allreduce`` (the call's remembered entry, the idle checks, the cycle lock, Ctrl-C
  deferral)
- negotiate: ``Negotiator.steady_exchange`` (the cache's answer, the vector)
- exchange: the carrier's ``exchange`` (vector and tensor into this rank's slot, the peers' vectors
  compared), less "waiting for peers": the shared-memory barrier
- reduce: the entry's ``finish`` (every rank's copy summed in rank order into a fresh array)

The regular path, where a call goes when the steady state does not hold (its first call, a peer
that wanted something else meanwhile): submit (``api.allreduce_async``), its negotiation
(``agree`` / ``lone_vector`` / ``agree_lone``), fuse, execute (less "execute: MPI", the transport's
waits), complete, and cycle (``Engine._turn`` less the stages above).

The rest: ``hvdlite.allreduce`` itself, and on the regular path the handle and the drive loop.
The instrumented pass is slower than the plain one by the wrappers' cost; its split is what matters.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from allreduce_vs_mpi4py import timed
from mpi4py import MPI
from stage_timers import SPENT, instrument_pipeline, wrap

import hvdlite as hvd
from hvdlite.core.pipeline import negotiate
from hvdlite.core.planes.host import HostPlane
from hvdlite.core.runtime import current


def instrument() -> None:
    """Timers on each stage's entry points, and on the two places a rank waits for its peers."""
    instrument_pipeline("regular: submit", "regular: ")
    wrap(HostPlane, "reduce_carried", "regular: execute")
    pipeline = current().engine.pipeline
    wrap(pipeline.executor.transport, "_wait", "regular: execute: MPI")
    wrap(current().engine, "lone_allreduce", "entry")  # the engine's bound LonePath.allreduce
    wrap(negotiate.Negotiator, "steady_exchange", "negotiate")
    for entry in pipeline.lone.entries.values():  # each remembered call's carrier and reduction
        if entry:
            wrap(entry.carrier, "exchange", "exchange")
            wrap(entry, "finish", "reduce")
    band = getattr(pipeline.negotiator._control, "_shm", None)
    if band is not None:
        wrap(band._segments, "barrier", "waiting for peers")
    else:
        wrap(pipeline.negotiator._control, "_wait", "waiting for peers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--profile", action="store_true", help="with --device cuda: a cProfile of the calls")
    parser.add_argument("--plane-stream", action="store_true",
                        help="with --device cuda: blocking calls on the plane's stream, not the caller's")
    args = parser.parse_args()
    if args.device == "cuda":
        import small_op_breakdown_gpu

        small_op_breakdown_gpu.main(args)
        return
    hvd.init()
    comm = MPI.COMM_WORLD
    x = np.ones(max(1, args.bytes // 4), np.float32)
    out = np.empty_like(x)
    for _ in range(500):
        hvd.allreduce(x, name="small", op=hvd.Sum)
    ours, raw = [], []
    for _ in range(args.reps):
        ours.append(timed(lambda: hvd.allreduce(x, name="small", op=hvd.Sum), args.calls, comm))
        raw.append(timed(lambda: comm.Allreduce(x, out), args.calls, comm))
    instrument()
    SPENT.clear()
    total = timed(lambda: hvd.allreduce(x, name="small", op=hvd.Sum), args.calls, comm)
    if hvd.rank() == 0:
        report(args, ours, raw, total)
    hvd.shutdown()


def report(args: argparse.Namespace, ours: list[float], raw: list[float], total: float) -> None:
    ratio = statistics.median(ours) / statistics.median(raw)
    print(f"{x_bytes(args.bytes)} allreduce, np={hvd.size()}, {args.reps} reps x {args.calls} calls: "
          f"hvdlite {statistics.median(ours) * 1e6:.1f} us [{min(ours) * 1e6:.1f}-{max(ours) * 1e6:.1f}], "
          f"raw mpi4py {statistics.median(raw) * 1e6:.1f} us [{min(raw) * 1e6:.1f}-{max(raw) * 1e6:.1f}], "
          f"hvdlite / raw {ratio:.1f}")
    per_call = {stage: ns / args.calls / 1e3 for stage, ns in SPENT.items()}
    print(f"\ninstrumented pass: {total * 1e6:.1f} us a call (rank 0's split)")
    print("| stage | us a call | share |")
    print("|---|---|---|")
    for stage in ("entry", "negotiate", "exchange", "waiting for peers", "reduce", "regular: submit",
                  "regular: negotiate", "regular: fuse", "regular: execute", "regular: execute: MPI", "regular: complete",
                  "regular: cycle"):
        print(f"| {stage} | {per_call.get(stage, 0.0):.1f} | {per_call.get(stage, 0.0) / (total * 1e6):.0%} |")
    rest = total * 1e6 - sum(per_call.values())
    print(f"| rest (hvdlite.allreduce; on the regular path the handle and drive loop) | {rest:.1f} | "
          f"{rest / (total * 1e6):.0%} |")


def x_bytes(nbytes: int) -> str:
    return f"{nbytes} B" if nbytes < 1024 else f"{nbytes // 1024} KB"


if __name__ == "__main__":
    main()

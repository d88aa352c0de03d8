"""hvdlite allreduce vs raw mpi4py Allreduce, measured in the same run, interleaved rep by rep.

Run:  hvdliterun -np 2 python bench/allreduce_vs_mpi4py.py
Prints, on rank 0, the 4-byte latency and the 64 MB time (median and min-max over reps) and their
ratio to raw mpi4py, then the CPU a rank burns while it waits 2 s inside an allreduce.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvdlite as hvd


def timed(fn, iters: int) -> float:
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD
    rows = []
    for label, nbytes, iters in (("4 B", 4, 500), ("1 MB", 1 << 20, 50), ("64 MB", 64 << 20, 3)):
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        raw, ours = [], []
        for _ in range(args.reps):  # interleaved so drift affects both alike
            raw.append(timed(lambda x=x, out=out: comm.Allreduce(x, out), iters))
            ours.append(timed(lambda x=x, label=label: hvd.allreduce(x, op=hvd.Sum, name=f"bench.{label}"), iters))
        rows.append((label, raw, ours))
    # A waiting rank: rank 0 arrives 2 s late; the others wait inside the allreduce.
    comm.Barrier()
    before_wall, before_cpu = time.perf_counter(), cpu_seconds()
    if hvd.rank() == 0:
        time.sleep(2.0)
    hvd.allreduce(np.ones(1), name="bench.wait")
    waited_cpu = (cpu_seconds() - before_cpu) / (time.perf_counter() - before_wall)
    cpu = comm.gather(waited_cpu, root=0)
    if hvd.rank() == 0:
        print(f"hvdlite vs mpi4py Allreduce, np={hvd.size()}, float32, {args.reps} reps (median [min-max])")
        print(f"{'size':>6} | {'mpi4py':>26} | {'hvdlite':>26} | ratio")
        for label, raw, ours in rows:
            def fmt(v):
                return f"{statistics.median(v) * 1e6:9.1f} us [{min(v) * 1e6:.0f}-{max(v) * 1e6:.0f}]"
            print(f"{label:>6} | {fmt(raw):>26} | {fmt(ours):>26} | {statistics.median(ours) / statistics.median(raw):5.2f}")
        waiting = ", ".join(f"rank {r}: {c * 100:.1f} %" for r, c in enumerate(cpu) if r != 0)
        print(f"CPU of a rank waiting 2 s inside an allreduce (process total, all threads): {waiting}")
    hvd.shutdown()


if __name__ == "__main__":
    main()

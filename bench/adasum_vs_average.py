"""The cost of an Adasum allreduce against Average, at 4 B, 1 MB and 64 MB, in one job.

Run:  hvdliterun -np 2 python bench/adasum_vs_average.py [--reps 5]   (also -np 3 / -np 4)

Each rep times blocking ``hvdlite.allreduce`` calls of a float32 array with ``op=Adasum`` and with
``op=Average`` (one name each: the response cache answers every call after the first), interleaved
rep by rep; reported on rank 0 as the median over reps of the slowest rank's mean per call, and
Adasum / Average. Adasum is never fused and moves its halves point to point (recursive halving,
then an allgather; :mod:`hvdlite.core.transport.adasum`), where Average takes MPI's or the shared-memory
allreduce.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from allreduce_vs_mpi4py import timed
from mpi4py import MPI

import hvdlite as hvd

SIZES = (4, 1 << 20, 64 << 20)


def calls_for(nbytes: int) -> int:
    return 2000 if nbytes <= 4 else 50 if nbytes <= 1 << 20 else 4


def measure(nbytes: int, reps: int, comm: MPI.Comm) -> tuple[float, float]:
    """(Adasum, Average) seconds per call for a float32 array of ``nbytes``, reps interleaved."""
    x = np.random.default_rng(hvd.rank()).standard_normal(max(1, nbytes // 4)).astype(np.float32)
    calls = {name: (lambda op=op, name=name: hvd.allreduce(x, op=op, name=f"{name}.{nbytes}"))
             for name, op in (("Adasum", hvd.Adasum), ("Average", hvd.Average))}
    for call in calls.values():  # warm-up: names negotiated, buffers allocated
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(timed(call, calls_for(nbytes), comm))
    return statistics.median(times["Adasum"]), statistics.median(times["Average"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD
    rows = [(nbytes, *measure(nbytes, args.reps, comm)) for nbytes in SIZES]
    if hvd.rank() == 0:
        print(f"Adasum vs Average, float32, np={hvd.size()}, {args.reps} reps, median of the slowest rank's mean")
        print("| size | Adasum us | Average us | Adasum / Average |")
        print("|---|---|---|---|")
        for nbytes, ours, average in rows:
            label = f"{nbytes} B" if nbytes < 1024 else f"{nbytes >> 20} MB"
            print(f"| {label} | {ours * 1e6:,.1f} | {average * 1e6:,.1f} | {ours / average:.2f} |")
    hvd.shutdown()


if __name__ == "__main__":
    main()

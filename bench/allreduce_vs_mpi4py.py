"""hvdlite's collectives vs raw mpi4py, measured in the same run, interleaved rep by rep.

Run:  hvdliterun -np 2 python bench/allreduce_vs_mpi4py.py [--update-readme] [--plot docs/assets/bench/allreduce.png]

Prints five tables on rank 0 (median and min-max over reps; each rep is the slowest rank's mean):

0. Small allreduces (4 B, 64 B, 1 KB float32, one name each, so the response cache answers):
   blocking ``allreduce`` and ``allreduce_async`` + ``synchronize`` against mpi4py ``Allreduce``.
1. Size sweep, 4 B ... 64 MB float32: hvdlite ``allreduce`` vs mpi4py ``Allreduce`` (the same
   input and a separate output), with algbw (bytes / time) and busbw as nccl-tests defines it for
   allreduce (algbw x 2(n-1)/n), and the ratio hvdlite / mpi4py.
2. The many-tensor mix (200 x 10 K + 20 x 1 M float32, 88 MB): raw ``Allreduce`` one by one vs
   hvdlite's ``grouped_allreduce`` and ``allreduce_async`` + ``synchronize``, each returning fresh
   arrays and writing into preallocated ones (``outputs=`` / ``output=``).
3. CPU a rank burns while it waits 2 s inside an allreduce (rank 0 arrives late).
4. Memory: RSS growth over 10,000 small allreduces, and requests left in the engine afterwards.

Then the performance targets, each marked met or not. ``--update-readme`` also writes the tables into
``bench/README.md`` between the markers for this rank count, so the numbers there are the
script's, not typed. ``--plot PATH`` draws the size sweep's latency and bus bandwidth, hvdlite and
mpi4py, from the same run into a PNG (needs matplotlib: ``pip install hvdlite[bench]``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import numpy as np
from bytecodes import bytecodes_per_call
from jobs import timed
from mpi4py import MPI
from readme import replace_block

import hvdlite as hvd
from hvdlite.core.runtime import current

SIZES = [4, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
SECTIONS = ("small", "sweep", "mix", "waiting", "memory")


def label(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def spread(values: list[float], scale: float = 1e6) -> str:
    return f"{statistics.median(values) * scale:,.1f} [{min(values) * scale:,.1f}-{max(values) * scale:,.1f}]"


Samples = dict[int, tuple[list[float], list[float]]]  # size -> (mpi4py, hvdlite) per-rep seconds per call


def size_sweep(comm: MPI.Comm, reps: int) -> tuple[list[str], dict[int, float], float, Samples]:
    """The table, hvdlite / mpi4py per size, hvdlite's 4-byte median in seconds, and the per-rep times."""
    size = comm.Get_size()
    lines = ["| size | mpi4py us | hvdlite us | hvdlite / mpi4py | hvdlite algbw GB/s | hvdlite busbw GB/s |",
             "|---|---|---|---|---|---|"]
    ratios = {}
    samples: Samples = {}
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        iters = max(3, min(500, int(0.05 / (1e-5 + nbytes / 1e9))))  # about 0.05 s per rep and size
        raw, ours = [], []
        for _ in range(reps):  # interleaved, so drifting load affects both alike
            raw.append(timed(lambda x=x, out=out: comm.Allreduce(x, out), iters, comm))
            ours.append(timed(lambda x=x, n=nbytes: hvd.allreduce(x, op=hvd.Sum, name=f"sweep.{n}"), iters, comm))
        ratios[nbytes] = statistics.median(ours) / statistics.median(raw)
        samples[nbytes] = (raw, ours)
        if nbytes == 4:
            latency = statistics.median(ours)
        algbw = nbytes / statistics.median(ours) / 1e9
        lines.append(f"| {label(nbytes)} | {spread(raw)} | {spread(ours)} | {ratios[nbytes]:.2f} | {algbw:.2f} | "
                     f"{algbw * 2 * (size - 1) / size:.2f} |")
    return lines, ratios, latency, samples


SMALL_SIZES = [4, 64, 1 << 10]
# Small allreduces within this many times raw mpi4py, by rank count: blocking (the small-op path), async.
LATENCY_TARGET = {"blocking": {2: 5.0, 3: 4.0}, "async": {2: 10.0, 3: 6.0}}
BYTECODE_TARGET = 400  # Python bytecodes a blocking small allreduce executes (the wait for peers left out)


def small_latency(comm: MPI.Comm, reps: int) -> tuple[list[str], dict[tuple[int, str], float]]:
    """Small allreduces, blocking and ``allreduce_async`` + ``synchronize``, against raw mpi4py:
    the table, and hvdlite / mpi4py per (size, form), with ``(size, "bytecodes")`` the Python
    bytecodes a blocking call executes on the slowest rank (the wait for peers left out). Each name
    repeats, so the cache answers (a blocking call then takes the small-op path)."""
    lines = ["| size | mpi4py us | hvdlite blocking us | / mpi4py | bytecodes a blocking call | hvdlite async us "
             "| / mpi4py |", "|---|---|---|---|---|---|---|"]
    ratios = {}
    for nbytes in SMALL_SIZES:
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        times: dict[str, list[float]] = {"raw": [], "blocking": [], "async": []}
        for _ in range(reps):  # interleaved, so drifting load affects all three alike
            times["raw"].append(timed(lambda x=x, out=out: comm.Allreduce(x, out), 2000, comm))
            times["blocking"].append(timed(lambda x=x: hvd.allreduce(x, op=hvd.Sum, name="small"), 2000, comm))
            times["async"].append(timed(
                lambda x=x: hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="small.async")), 2000, comm))
        raw = statistics.median(times["raw"])
        for form in ("blocking", "async"):
            ratios[nbytes, form] = statistics.median(times[form]) / raw
        comm.Barrier()
        codes = bytecodes_per_call(lambda x=x: hvd.allreduce(x, op=hvd.Sum, name="small"), 500)
        ratios[nbytes, "bytecodes"] = comm.allreduce(codes, op=MPI.MAX)
        lines.append(f"| {label(nbytes)} | {spread(times['raw'])} | {spread(times['blocking'])} | "
                     f"{ratios[nbytes, 'blocking']:.1f} | {ratios[nbytes, 'bytecodes']:.0f} | "
                     f"{spread(times['async'])} | {ratios[nbytes, 'async']:.1f} |")
    return lines, ratios


def latency_targets(size: int, ratios: dict[tuple[int, str], float]) -> list[tuple[str, bool, str]]:
    """The small-allreduce targets at this rank count (none where none is set)."""
    targets = [(f"allreduce {label(nbytes)} {form} <= {limits[size]:g}x mpi4py", ratios[nbytes, form] <= limits[size],
                f"{ratios[nbytes, form]:.1f}x")
               for form, limits in LATENCY_TARGET.items() if size in limits for nbytes in (4, 1 << 10)]
    if size <= 2:
        targets.append((f"bytecodes a blocking 4 B allreduce <= {BYTECODE_TARGET}",
                        ratios[4, "bytecodes"] <= BYTECODE_TARGET, f"{ratios[4, 'bytecodes']:.0f}"))
    return targets


def tensor_mix(comm: MPI.Comm, reps: int) -> tuple[list[str], dict[str, float]]:
    tensors = [np.ones(10_000, np.float32) for _ in range(200)] + [np.ones(1 << 20, np.float32) for _ in range(20)]
    outputs = [np.empty_like(t) for t in tensors]
    names = [f"mix.{i}" for i in range(len(tensors))]

    def raw() -> None:
        for t, o in zip(tensors, outputs, strict=True):
            comm.Allreduce(t, o)

    def grouped() -> None:
        hvd.grouped_allreduce(tensors, op=hvd.Sum, name="mix.group")

    def async_sync() -> None:
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=n) for t, n in zip(tensors, names, strict=True)]
        for h in handles:
            hvd.synchronize(h)

    # The same, with results written into preallocated arrays (what the framework adapters do, and
    # what the raw loop does): no fresh 88 MB to fault in per call.
    def grouped_into() -> None:
        for h in hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="mix.group.into", outputs=outputs):
            hvd.synchronize(h)

    def async_into() -> None:
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=n + ".into", output=o)
                   for t, n, o in zip(tensors, names, outputs, strict=True)]
        for h in handles:
            hvd.synchronize(h)

    modes = {"raw one by one": raw, "grouped_allreduce": grouped, "allreduce_async": async_sync,
             "grouped_allreduce, outputs=": grouped_into, "allreduce_async, output=": async_into}
    results: dict[str, list[float]] = {key: [] for key in modes}
    for _ in range(reps):
        for key, fn in modes.items():
            results[key].append(timed(fn, 3, comm))
    base = statistics.median(results["raw one by one"])
    lines = ["| 200 x 10 K + 20 x 1 M float32 (88 MB) | ms | vs raw |", "|---|---|---|"]
    lines += [f"| {key} | {spread(v, 1e3)} | {statistics.median(v) / base:.2f} |" for key, v in results.items()]
    ratios = {key: statistics.median(v) / base for key, v in results.items()}
    return lines, ratios


def waiting_cpu(comm: MPI.Comm) -> tuple[list[str], float]:
    for _ in range(3):  # cached: the waiting ranks wait inside the small-op path's exchange
        hvd.allreduce(np.ones(1), name="bench.wait")
    comm.Barrier()
    before_wall, before_cpu = time.perf_counter(), cpu_seconds()
    if comm.Get_rank() == 0:
        time.sleep(2.0)
    hvd.allreduce(np.ones(1), name="bench.wait")
    share = (cpu_seconds() - before_cpu) / (time.perf_counter() - before_wall)
    waiting = comm.allgather(share)[1:]
    return ["CPU of a rank waiting 2 s inside an allreduce (process total, all threads): "
            + ", ".join(f"rank {r}: {c * 100:.1f} %" for r, c in enumerate(waiting, start=1))], max(waiting)


def memory(comm: MPI.Comm) -> tuple[list[str], float, int]:
    x = np.ones(16, np.float32)
    for _ in range(500):  # warm up allocator pools and caches first
        hvd.allreduce(x, name="mem.warm")
    before = rss_bytes()
    for i in range(10_000):
        hvd.allreduce(x, name="mem.small" if i % 2 else "mem.other")
    growth = comm.allreduce(rss_bytes() - before, op=MPI.MAX) / 2**20
    engine = current().engine
    left = comm.allreduce(len(engine.pipeline.queue.pending) + engine.pipeline.queue.in_flight, op=MPI.MAX)
    return [f"RSS growth over 10,000 small allreduces: {growth:.2f} MB (worst rank); requests left in the engine: "
            f"{left}"], growth, left


def plot_sweep(samples: Samples, nranks: int, reps: int, out: str) -> None:
    """Draw the size sweep this run measured (bench/plots.py)."""
    import plots

    sizes = sorted(samples)
    library = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    plots.allreduce_sweep(sizes, [samples[n][1] for n in sizes], [samples[n][0] for n in sizes], nranks,
                          title=f"allreduce, np={nranks}, one host: hvdlite vs mpi4py ({' '.join(library.split())})",
                          note=f"Median of {reps} interleaved reps (each the slowest rank's mean), bars min-max.",
                          out=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--update-readme", action="store_true", help="write the tables into bench/README.md")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (the targets need all)")
    parser.add_argument("--plot", metavar="PNG", help="draw the size sweep (latency, bus bandwidth) into this file")
    args = parser.parse_args()
    sections = args.sections.split(",")
    if set(sections) - set(SECTIONS):
        parser.error(f"unknown section(s) {sorted(set(sections) - set(SECTIONS))}; choose from {SECTIONS}")
    if args.plot and "sweep" not in sections:
        parser.error("--plot draws the size sweep: include 'sweep' in --sections")
    hvd.init()
    comm = MPI.COMM_WORLD
    samples: Samples = {}

    def sweep_table() -> list[str]:
        lines, _, _, measured = size_sweep(comm, args.reps)
        samples.update(measured)
        return lines

    if set(sections) != set(SECTIONS):
        tables = {"small": lambda: small_latency(comm, args.reps)[0],
                  "sweep": sweep_table, "mix": lambda: tensor_mix(comm, args.reps)[0],
                  "waiting": lambda: waiting_cpu(comm)[0], "memory": lambda: memory(comm)[0]}
        text = "\n\n".join("\n".join(tables[name]()) for name in sections)
        if comm.Get_rank() == 0:
            print(text, flush=True)
            if args.plot:
                plot_sweep(samples, comm.Get_size(), args.reps, args.plot)
        hvd.shutdown()
        return
    small, small_ratios = small_latency(comm, args.reps)
    sweep, ratios, latency, samples = size_sweep(comm, args.reps)
    mix, mix_ratios = tensor_mix(comm, args.reps)
    waiting, worst_cpu = waiting_cpu(comm)
    mem, growth, left = memory(comm)
    if comm.Get_rank() == 0:
        targets = latency_targets(comm.Get_size(), small_ratios) + [
            ("allreduce 4 B <= 100 us", latency <= 100e-6, f"{latency * 1e6:.1f} us"),
            ("allreduce 1 MB <= 1.3x mpi4py", ratios[1 << 20] <= 1.3, f"{ratios[1 << 20]:.2f}x"),
            ("allreduce 64 MB <= 1.0x mpi4py", ratios[64 << 20] <= 1.0, f"{ratios[64 << 20]:.2f}x"),
            *((f"mix, {key} <= 1.1x raw one by one", ratio <= 1.1, f"{ratio:.2f}x")
              for key, ratio in mix_ratios.items() if key != "raw one by one"),
            ("a waiting rank <= 5 % of a core", worst_cpu <= 0.05, f"{worst_cpu * 100:.1f} %"),
            ("RSS growth <= 5 MB, nothing left behind", growth <= 5 and left == 0, f"{growth:.2f} MB, {left} left"),
        ]
        library = MPI.Get_library_version().splitlines()[0].strip()
        header = [f"np={comm.Get_size()}, {library}, {os.cpu_count()} cores, {args.reps} reps, median [min-max] "
                  "of per-rep values (each the slowest rank's mean)", ""]
        if comm.Get_size() != 2:  # the other targets are set for np=2 only
            targets = latency_targets(comm.Get_size(), small_ratios)
        text = "\n".join(header + small + [""] + sweep + [""] + mix + [""] + waiting + mem + [""] +
                         ([f"| target (np={comm.Get_size()}) | measured | met |", "|---|---|---|"] +
                          [f"| {name} | {value} | {'yes' if ok else 'NO'} |" for name, ok, value in targets]
                          if targets else ["No targets are set for this rank count; reported only."]))
        print(text, flush=True)
        if args.update_readme:
            replace_block(f"allreduce_vs_mpi4py np={comm.Get_size()}", text)
        if args.plot:
            plot_sweep(samples, comm.Get_size(), args.reps, args.plot)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""GPU training step overhead of hvdlite's DistributedOptimizer against DDP over NCCL, and NCCL allreduce bandwidth.

Run on a GPU machine (one process per GPU; np=1 is enough for the overhead target):

    hvdliterun -np 1 python bench/gpu_training_step.py                          # both sections
    hvdliterun -np 1 python bench/gpu_training_step.py --only step --runs 3     # the target run
    hvdliterun -np 1 python bench/gpu_training_step.py --only step --modes plain,hvdlite
    OMP_NUM_THREADS=1 hvdliterun -np 2 python bench/gpu_training_step.py --device cpu --only step \\
        --width 64 --depth 2 --batch-size 8 --steps 3 --reps 2 --runs 2     # smoke test, no GPU

**Training step** (target: hvdlite / plain <= 1.02, the median of three runs). A model
that keeps the GPU busy: ``--depth`` x ``nn.Linear(--width, --width)`` with ReLU, bfloat16
parameters (float32 with ``--device cpu``), batch ``--batch-size``, SGD. Modes, in one process,
each with its own copy of the model (same seed), built one after another:

- ``plain``: the torch optimizer alone, no communication;
- ``hvdlite``: the optimizer wrapped in hvdlite's ``DistributedOptimizer`` (NCCL through hvdlite);
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over a ``torch.distributed`` process group
  with backend ``nccl`` (``gloo`` with ``--device cpu``), ``device_ids=[this GPU]``;
- ``ddp_bucket_view``: the same with ``gradient_as_bucket_view=True`` (gradients live in DDP's
  buckets instead of beside them).

The process group is set up in this process beside hvdlite: world size ``hvd.size()``, rank
``hvd.rank()``, rendezvous through a ``TCPStore`` that rank 0 opens on a free port and announces
with ``hvd.broadcast_object``; at 127.0.0.1 when every rank is on one host (np=1 included), else at
rank 0's host name, which the other hosts must resolve. ``--modes`` picks a subset. Every mode runs
three warm-up steps right after it is built; then the modes are interleaved rep by rep, the order
rotated by one each rep, each rep ``--steps`` steps of one mode, each step ending with
``torch.cuda.synchronize()``. ``--runs N`` repeats the timed reps N times in the same process.
Reported per run (rank 0): median step time [min-max of per-rep medians], each mode / plain.

**GPU memory per mode** (from torch's caching allocator, rank 0), attributed by difference, since
all modes live at once: *after warm-up* = ``torch.cuda.memory_allocated()`` after the mode's three
warm-up steps minus the same before its model was built (parameters, gradients, optimizer state,
DDP's buckets: what the mode keeps between steps). *Peak during step* = over the mode's timed steps
in a run, ``torch.cuda.max_memory_allocated()`` (peak stats reset just before each rep's steps)
minus ``memory_allocated()`` at that reset, plus the mode's after-warm-up figure: the most the mode
held at once, activations included, with the other modes' constant holdings taken out. A throwaway
step before the first mode allocates cuBLAS's workspaces, so no mode is charged for them. Not seen
by torch's allocator, hence not in these figures: NCCL's own buffers (torch's and hvdlite's), and
hvdlite's device buffers in cupy's memory pool, reported apart (``cupy GiB``: the pool's used bytes
after the mode's warm-up minus before it was built). GiB = 2**30 bytes.

**Allreduce bandwidth.** float32 sizes from 1 MB to 256 MB: hvdlite's ``allreduce_`` on a CUDA
tensor against a bare NCCL allreduce through ``cupy.cuda.nccl`` on its own communicator, same
tensor, interleaved. algbw = bytes / time; busbw = algbw * 2 (n - 1) / n as nccl-tests defines it
(0 at np=1, where NCCL copies locally: algbw is the comparable figure there). GPU only.

Exits with a clear message, not a traceback, where there is no GPU (unless ``--device cpu``).
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

MODES = ("plain", "hvdlite", "ddp", "ddp_bucket_view")
LABELS = {"ddp": "ddp", "ddp_bucket_view": "ddp (bucket view)"}
WARMUP_STEPS = 3
TARGET = 1.02
GIB = float(1 << 30)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("step", "allreduce"), default=None)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke test of the step section (gloo for DDP, no memory figures)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {','.join(MODES)} (default: all)")
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1, help="repeat the timed reps N times in one process")
    args = parser.parse_args()
    chosen = [name for name in args.modes.split(",") if name]
    unknown = sorted(set(chosen) - set(MODES))
    if unknown or not chosen:
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}" if unknown
                     else "--modes: name at least one mode")
    args.modes = [name for name in MODES if name in chosen]  # plain first: the ratios' baseline
    return args


def model(torch, args, device, dtype):
    """The benchmark model, built on ``device`` in ``dtype``; the same weights for every mode."""
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width, device=device, dtype=dtype), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def init_process_group(torch, hvd, device) -> None:
    """torch.distributed beside hvdlite: same ranks, a TCPStore on a free port that rank 0 announces."""
    import torch.distributed as dist

    rank, size = hvd.rank(), hvd.size()
    host = "127.0.0.1" if hvd.local_size() == size else socket.gethostname()  # one host, or rank 0's name
    store = dist.TCPStore(host, 0, size, True, wait_for_workers=False) if rank == 0 else None
    host, port = hvd.broadcast_object((host, store.port) if rank == 0 else None, root_rank=0, name="bench.ddp.store")
    if store is None:
        store = dist.TCPStore(host, port, size, False)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=size)


def build_mode(name: str, torch, hvd, args, device, dtype):
    """The (network, optimizer) pair that ``name`` trains with."""
    net = model(torch, args, device, dtype)
    if name in ("ddp", "ddp_bucket_view"):
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=name == "ddp_bucket_view")
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    if name == "hvdlite":
        opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    return net, opt


@dataclass
class Mode:
    """One mode's objects, its memory figures, and its per-rep median step times of each run."""

    net: Any
    opt: Any
    after_warmup: float | None = None  # bytes, torch's allocator
    cupy: float | None = None  # bytes, cupy's pool
    per_run: list[list[float]] = field(default_factory=list)
    peak_per_run: list[float | None] = field(default_factory=list)


class Bench:
    """The modes, the data, and how to time and measure them on ``device``."""

    def __init__(self, torch, hvd, args, device) -> None:
        self.torch, self.hvd, self.args, self.device = torch, hvd, args, device
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.data = torch.randn(args.batch_size, args.width, device=device, dtype=self.dtype)
        self.modes: dict[str, Mode] = {}

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def step(self, net, opt) -> None:
        opt.zero_grad()
        net(self.data).float().pow(2).mean().backward()
        opt.step()

    def allocated(self) -> tuple[int, int]:
        """Bytes held by torch's caching allocator and by cupy's default pool (hvdlite's device buffers)."""
        if not self.cuda:
            return 0, 0
        import cupy

        return self.torch.cuda.memory_allocated(), cupy.get_default_memory_pool().used_bytes()

    def build(self) -> None:
        """Build every mode in turn, warm it up, and note what it added to the device memory."""
        scratch = self.torch.nn.Linear(self.args.width, self.args.width, device=self.device, dtype=self.dtype)
        self.step(scratch, self.torch.optim.SGD(scratch.parameters(), lr=1e-3))  # cuBLAS workspaces
        del scratch
        for name in self.args.modes:
            gc.collect()
            self.sync()
            torch_before, cupy_before = self.allocated()
            mode = Mode(*build_mode(name, self.torch, self.hvd, self.args, self.device, self.dtype))
            for _ in range(WARMUP_STEPS):  # allocator, cuBLAS plans, NCCL communicators, DDP's buckets
                self.step(mode.net, mode.opt)
            self.sync()
            torch_after, cupy_after = self.allocated()
            if self.cuda:
                mode.after_warmup, mode.cupy = torch_after - torch_before, cupy_after - cupy_before
            self.modes[name] = mode

    def time_rep(self, mode: Mode) -> tuple[float, float | None]:
        """Median step time of ``--steps`` steps, and the mode's peak bytes over them (None on the CPU)."""
        cuda = self.torch.cuda
        if self.cuda:
            held = cuda.memory_allocated()
            cuda.reset_peak_memory_stats()
        times = []
        for _ in range(self.args.steps):
            start = time.perf_counter()
            self.step(mode.net, mode.opt)
            self.sync()
            times.append(time.perf_counter() - start)
        peak = cuda.max_memory_allocated() - held + mode.after_warmup if self.cuda else None
        return statistics.median(times), peak

    def run(self, first_rep: int) -> None:
        """One run: ``--reps`` reps, every mode once per rep, the order rotated by one each rep."""
        names = list(self.modes)
        per_rep: dict[str, list[float]] = {name: [] for name in names}
        peaks: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(first_rep, first_rep + self.args.reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                seconds, peak = self.time_rep(self.modes[name])
                per_rep[name].append(seconds)
                if peak is not None:
                    peaks[name].append(peak)
        for name, mode in self.modes.items():
            mode.per_run.append(per_rep[name])
            mode.peak_per_run.append(max(peaks[name]) if peaks[name] else None)


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def ratio(modes: dict[str, Mode], name: str, run: int) -> float | None:
    """Median step of ``name`` / median step of plain in ``run``; None where either is not measured."""
    if name not in modes or "plain" not in modes:
        return None
    return statistics.median(modes[name].per_run[run]) / statistics.median(modes["plain"].per_run[run])


def print_header(bench: Bench) -> None:
    args, torch = bench.args, bench.torch
    params = sum(p.numel() for p in model(torch, args, "meta", bench.dtype).parameters())
    dtype = str(bench.dtype).removeprefix("torch.")
    print(f"training step: {args.depth} x Linear({args.width}) {dtype} ({params / 1e6:.1f} M parameters), "
          f"batch {args.batch_size}, np={bench.hvd.size()}, {bench.device.type}, {args.runs} run(s) x "
          f"{args.reps} reps x {args.steps} steps, modes interleaved, order rotated each rep")
    if bench.cuda:
        print(f"memory (rank 0, {bench.torch.cuda.get_device_name()}): torch.cuda.memory_allocated after "
              f"warm-up minus before the mode was built; peak = max_memory_allocated over the mode's steps "
              f"less what the other modes hold; cupy = cupy's pool (hvdlite's buffers), after warm-up; "
              f"NCCL's own buffers not included")


def print_run(bench: Bench, run: int) -> None:
    """One run's table and ratios (rank 0)."""
    modes = bench.modes
    print(f"run {run + 1} of {bench.args.runs}")
    print("| mode | step ms median [min-max] | / plain | memory after warm-up GiB | peak during step GiB | cupy GiB |")
    print("|---|---|---|---|---|---|")
    for name, mode in modes.items():
        values = mode.per_run[run]
        share = ratio(modes, name, run)
        print(f"| {LABELS.get(name, name)} | {1e3 * statistics.median(values):.2f} "
              f"[{1e3 * min(values):.2f}-{1e3 * max(values):.2f}] | {'-' if share is None else f'{share:.3f}'} | "
              f"{gib(mode.after_warmup)} | {gib(mode.peak_per_run[run])} | {gib(mode.cupy)} |")
    hvd_ratio = ratio(modes, "hvdlite", run)
    if hvd_ratio is not None:
        print(f"hvdlite / plain: {hvd_ratio:.3f} (target <= {TARGET})")
    ddp = [f"{LABELS[name]} / plain: {ratio(modes, name, run):.3f}" for name in LABELS
           if name in modes and "plain" in modes]
    if ddp:
        print(", ".join(ddp))


def step_bench(args, torch, hvd, device) -> None:
    if any(name.startswith("ddp") for name in args.modes):
        init_process_group(torch, hvd, device)
    bench = Bench(torch, hvd, args, device)
    bench.build()
    if hvd.rank() == 0:
        print_header(bench)
    for run in range(args.runs):
        bench.run(run * args.reps)
        if hvd.rank() == 0:
            print_run(bench, run)
    ratios = [ratio(bench.modes, "hvdlite", run) for run in range(args.runs)]
    if hvd.rank() == 0 and args.runs > 1 and ratios[0] is not None:
        print(f"hvdlite / plain over {args.runs} runs: {', '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f} (target <= {TARGET})")
    bench.modes.clear()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def allreduce_bench(args, torch, hvd, device) -> None:
    import cupy
    from cupy.cuda import nccl as cupy_nccl

    size, rank = hvd.size(), hvd.rank()
    uid = hvd.broadcast_object(cupy_nccl.get_unique_id() if rank == 0 else None, root_rank=0, name="bare.nccl.uid")
    bare = cupy_nccl.NcclCommunicator(size, uid, rank)
    stream = cupy.cuda.Stream(non_blocking=True)
    if rank == 0:
        print(f"allreduce float32, np={size}, {args.reps} reps x 10 calls")
        print("| size | hvdlite us | bare NCCL us | hvdlite algbw GB/s | bare algbw GB/s | hvdlite busbw | ratio |")
        print("|---|---|---|---|---|---|---|")
    for nbytes in (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20):
        tensor = torch.ones(nbytes // 4, device=device)
        timings = {"hvdlite": [], "bare": []}
        for rep in range(args.reps + 1):
            for name in ("hvdlite", "bare"):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(10):
                    if name == "hvdlite":
                        hvd.allreduce_(tensor, op=hvd.Sum, name=f"bw.{nbytes}")
                    else:
                        bare.allReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), cupy_nccl.NCCL_FLOAT32,
                                       cupy_nccl.NCCL_SUM, stream.ptr)
                        stream.synchronize()
                torch.cuda.synchronize()
                if rep:  # the first rep warms both paths
                    timings[name].append((time.perf_counter() - start) / 10)
        if rank == 0:
            ours, theirs = statistics.median(timings["hvdlite"]), statistics.median(timings["bare"])
            algbw = nbytes / ours / 1e9
            print(f"| {nbytes >> 20} MB | {ours * 1e6:.0f} | {theirs * 1e6:.0f} | {algbw:.1f} | "
                  f"{nbytes / theirs / 1e9:.1f} | {algbw * 2 * (size - 1) / size:.1f} | {ours / theirs:.2f} |")


def main() -> None:
    args = parse_args()
    import torch

    if args.device == "cuda":
        from hvdlite.gpu.arrays import device_count

        if not torch.cuda.is_available() or device_count() == 0:
            sys.exit("bench/gpu_training_step.py needs a CUDA GPU visible to torch and cupy "
                     "(pip install 'hvdlite[gpu]'), or --device cpu for a smoke test")
    import hvdlite.torch as hvd

    hvd.init()
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if args.only in (None, "step"):
        step_bench(args, torch, hvd, device)
    if args.only in (None, "allreduce"):
        if device.type == "cuda":
            allreduce_bench(args, torch, hvd, device)
        elif hvd.rank() == 0:
            print("allreduce bandwidth: skipped (GPU only)")
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""GPU training step overhead of hvdlite's DistributedOptimizer, and NCCL allreduce bandwidth.

Run on a GPU machine (one process per GPU; np=1 is enough for the overhead target):

    hvdliterun -np 1 python bench/gpu_training_step.py              # both tables
    hvdliterun -np 1 python bench/gpu_training_step.py --only step   # training step only

**Training step** (issue #7's target: hvdlite's overhead <= 3 %). A model that keeps the GPU busy:
``--depth`` x ``nn.Linear(--width, --width)`` with ReLU, bfloat16 parameters, batch ``--batch-size``.
Two modes in the same process, interleaved rep by rep: ``plain`` (the torch optimizer alone) and
``hvdlite`` (wrapped in ``DistributedOptimizer``, each its own copy of the model). Each step ends
with ``torch.cuda.synchronize()``. Reported: median step time [min-max of per-rep medians] and
hvdlite / plain.

**Allreduce bandwidth.** float32 sizes from 1 MB to 256 MB: hvdlite's ``allreduce_`` on a CUDA
tensor against a bare NCCL allreduce through ``cupy.cuda.nccl`` on its own communicator, same
tensor, interleaved. algbw = bytes / time; busbw = algbw * 2 (n - 1) / n as nccl-tests defines it
(0 at np=1, where NCCL copies locally: algbw is the comparable figure there).

Exits with a clear message, not a traceback, where there is no GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("step", "allreduce"), default=None)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    return parser.parse_args()


def model(torch, width: int, depth: int, device):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device=device, dtype=torch.bfloat16)


def step_bench(args, torch, hvd, device) -> None:
    plain_model, hvd_model = model(torch, args.width, args.depth, device), model(torch, args.width, args.depth, device)
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=1e-3)
    hvd_opt = hvd.DistributedOptimizer(torch.optim.SGD(hvd_model.parameters(), lr=1e-3),
                                       named_parameters=hvd_model.named_parameters())
    data = torch.randn(args.batch_size, args.width, device=device, dtype=torch.bfloat16)

    def step(net, opt) -> None:
        opt.zero_grad()
        net(data).float().pow(2).mean().backward()
        opt.step()

    modes = {"plain": (plain_model, plain_opt), "hvdlite": (hvd_model, hvd_opt)}
    for net, opt in modes.values():  # warm-up: allocator, cuBLAS plans, NCCL communicator
        for _ in range(3):
            step(net, opt)
    torch.cuda.synchronize()
    per_rep = {name: [] for name in modes}
    for rep in range(args.reps):
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        for name in order:
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                step(*modes[name])
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            per_rep[name].append(statistics.median(times))
    if hvd.rank() == 0:
        params = sum(p.numel() for p in plain_model.parameters())
        print(f"training step: {args.depth} x Linear({args.width}) bf16 ({params / 1e6:.0f} M parameters), "
              f"batch {args.batch_size}, np={hvd.size()}, {args.reps} reps x {args.steps} steps")
        print("| mode | step ms (median [min-max]) |")
        print("|---|---|")
        for name, values in per_rep.items():
            print(f"| {name} | {1e3 * statistics.median(values):.2f} [{1e3 * min(values):.2f}-{1e3 * max(values):.2f}] |")
        ratio = statistics.median(per_rep["hvdlite"]) / statistics.median(per_rep["plain"])
        print(f"hvdlite / plain: {ratio:.3f} (target <= 1.03)")


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

    from hvdlite.gpu.arrays import device_count

    if not torch.cuda.is_available() or device_count() == 0:
        sys.exit("bench/gpu_training_step.py needs a CUDA GPU visible to torch and cupy (pip install 'hvdlite[gpu]')")
    import hvdlite.torch as hvd

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    if args.only in (None, "step"):
        step_bench(args, torch, hvd, device)
    if args.only in (None, "allreduce"):
        allreduce_bench(args, torch, hvd, device)
    hvd.shutdown()


if __name__ == "__main__":
    main()

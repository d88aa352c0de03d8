"""A model 1.5x larger than each rank's memory limit: it trains with fully_shard, not unsharded.

Run:  python bench/fully_sharded_memory_limit.py [--np 3] [--limit-mb 600]

Each rank limits its own address space (``RLIMIT_AS``, what ``ulimit -v`` sets) to what it uses
after start-up (Python, torch, MPI, hvdlite's threads) plus ``--limit-mb``, then builds a model whose
training state (fp32 parameters, gradients and Adam's two moments: 16 bytes a parameter) is 1.5x
``--limit-mb``, and takes three Adam steps, in two jobs:

- ``unsharded``: a plain model and ``hvd.DistributedOptimizer``: must fail for want of memory;
- ``fully``: built on the ``meta`` device, ``fully_shard`` per block, ``to_empty`` and each block
  initialised on its own shards: must train (its state is 1/N of the model's).

RLIMIT_AS counts address space, not resident memory, so it is the stricter of the two: everything a
rank maps (allocator arenas, MPI's buffers) counts in full.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

# One thread per rank. Every block of 1 MB or more gets its own mapping, returned when freed: by
# default glibc moves its threshold up to the largest block freed (here 16 MB), after which such
# blocks come from the heap, which only grows (measured: 733 MB of heap for 300 MB of live state).
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
WIDTH, BATCH = 2048, 8


def address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def run_worker(mode: str, limit: int) -> None:
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    hvd.allreduce(torch.zeros(1), name="warm")  # the engine's threads and buffers exist before the limit
    start = address_space()
    resource.setrlimit(resource.RLIMIT_AS, (start + limit, start + limit))
    blocks = round(1.5 * limit / 16 / (WIDTH * WIDTH + WIDTH))
    print(f"rank {hvd.rank()}: limit {limit >> 20} MB over start-up; {blocks} x Linear({WIDTH}): training state "
          f"{16 * blocks * (WIDTH * WIDTH + WIDTH) >> 20} MB", flush=True)
    try:
        if mode == "fully":
            with torch.device("meta"):
                model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(blocks)])
            for block in model:
                hvd.fully_shard(block)
            hvd.fully_shard(model)
            model.to_empty(device="cpu")
            torch.manual_seed(0)
            for block in model:
                block.reset_parameters()  # on the shards: each rank draws its own rows
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        else:
            model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(blocks)])
            optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                                 named_parameters=model.named_parameters())
        data = torch.randn(BATCH, WIDTH)
        for _ in range(3):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
        print(f"rank {hvd.rank()}: {mode} trained 3 steps; address space {(address_space() - start) >> 20} MB over "
              "start-up", flush=True)
    except (MemoryError, RuntimeError) as error:
        print(f"rank {hvd.rank()}: {mode} ran out of memory: {str(error).splitlines()[0][:120]}", flush=True)
        os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=3)
    parser.add_argument("--limit-mb", type=int, default=600)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.limit_mb << 20)
        return
    beside = os.path.join(os.path.dirname(sys.executable), "hvdliterun")
    outcome = {}
    for mode in ("unsharded", "fully"):
        command = [beside, "-np", str(args.np), sys.executable, os.path.abspath(__file__), "--worker", mode,
                   "--limit-mb", str(args.limit_mb)]
        print("$ " + " ".join(command), flush=True)
        proc = subprocess.run(command, env={**os.environ, **RANK_ENV}, capture_output=True, text=True)
        print("\n".join(line for line in proc.stdout.splitlines() if "rank" in line))
        outcome[mode] = proc.returncode == 0
    print(f"\nnp={args.np}, {args.limit_mb} MB per rank (RLIMIT_AS over start-up): unsharded "
          f"{'trained' if outcome['unsharded'] else 'failed'}, fully_shard {'trained' if outcome['fully'] else 'failed'}")
    if outcome["unsharded"] or not outcome["fully"]:
        raise SystemExit("expected: unsharded fails, fully_shard trains")


if __name__ == "__main__":
    main()

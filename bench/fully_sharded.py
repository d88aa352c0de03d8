"""Sharded parameters: hvdlite's fully_shard against torch's FSDP2, DDP and hvdlite's other modes.

Run:  python bench/fully_sharded.py [--np 2] [--reps 5] [--steps 4] [--blocks 24] [--width 2048] [--update-readme]
      python bench/fully_sharded.py --device cuda --np 3   (on a GPU machine: the ranks share its GPUs)

Model: ``--blocks`` residual blocks ``x + relu(Linear(width, width)(x))`` (24 x 2048: 100.7 M
parameters, fp32), ``torch.optim.Adam``, batch 8 per rank, one thread per rank. Modes:

- ``ddp``         torch ``DistributedDataParallel`` (gloo);
- ``fsdp2``       torch's ``fully_shard`` on every block, then on the model (gloo, CPU device mesh);
- ``unsharded``   hvdlite ``DistributedOptimizer`` (gradients allreduced);
- ``zero``        the same with ``shard_optimizer_state=True`` (ZeRO-1/2);
- ``fully``       hvdlite ``fully_shard`` on every block, then on the model (prefetch on: the default);
- ``fully_nopf``  the same with prefetch off (every all-gather waited for where it is needed);
- ``hybrid``      ``fully_shard`` within each host's ranks, shards averaged across hosts
  (``replicate_process_set``; FSDP2's HSDP): run by ``bench/fully_sharded_two_hosts.py``.

Step times: the sharded modes (``fsdp2``, ``fully``, ``fully_nopf``) run in one job, interleaved rep
by rep (a rep's value: the slowest rank's mean step), so their ratios compare like with like; the
replicated modes (``ddp``, ``unsharded``, ``zero``) in a second job (six copies of the model would
not fit in this machine's memory at np=3). Memory: one job per mode, after the timed steps: the model
state each rank holds counted tensor by tensor (parameters + gradients + optimizer state, the
gathered full parameters included if any are held), and each rank's peak RSS (the largest rank's).

``--device cuda``: model, data and optimizer on the GPU (rank r on GPU r mod count; ranks sharing one
take the host-staged plane), each step synchronized, and ``torch.cuda.max_memory_allocated`` per
rank reported too. FSDP2 and DDP then run gloo on CUDA tensors; a job that fails (FSDP2's
reduce-scatter over gloo may not take them) is reported and the other modes run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobs import launch_worker  # noqa: E402
from torch_training_step import RANK_ENV, init_gloo, time_steps  # noqa: E402

SHARDED, REPLICATED = ("fsdp2", "fully", "fully_nopf"), ("ddp", "unsharded", "zero")
TORCH_MODES = ("fsdp2", "ddp")
MODES = SHARDED + REPLICATED
TAG = "FULLY_SHARDED_RESULT "
BATCH = 8


def build_model(blocks: int, width: int, device: str = "cpu") -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.linear(x))

    torch.manual_seed(0)
    with torch.device(device):
        return torch.nn.Sequential(*[Block() for _ in range(blocks)])


def wrap(mode: str, model: Any, device: str = "cpu") -> tuple[Any, Any]:
    """(the module to call, the optimizer) for ``mode``."""
    import torch

    import hvdlite.torch as hvd

    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=1e-4)
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device, (hvd.size(),))
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=1e-4)
    if mode in ("fully", "fully_nopf", "hybrid"):
        sets = host_sets() if mode == "hybrid" else {}
        for block in model:
            hvd.fully_shard(block, **sets)
        hvd.fully_shard(model, **sets)
        if mode == "fully_nopf":
            for block in model:
                block.set_modules_to_forward_prefetch([])
                block.set_modules_to_backward_prefetch([])
        return model, torch.optim.Adam(model.parameters(), lr=1e-4)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                         named_parameters=model.named_parameters(),
                                         shard_optimizer_state=mode == "zero")
    return model, optimizer


def link_bytes(interface: str) -> int:
    """Bytes this host has sent through ``interface`` (0 without one): the traffic between hosts."""
    if not interface:
        return 0
    with open(f"/sys/class/net/{interface}/statistics/tx_bytes") as counter:
        return int(counter.read())


def host_sets() -> dict[str, Any]:
    """Hybrid sharding's two sets for this rank: its host's ranks (shard), and the ranks with its
    local rank on every host (replicate). Registered on every rank in one order."""
    import hvdlite.torch as hvd

    places = hvd.allgather_object((hvd.cross_rank(), hvd.local_rank()))
    hosts = sorted({host for host, _ in places})
    locals_ = sorted({local for _, local in places})
    by_host = {h: hvd.add_process_set([r for r, (host, _) in enumerate(places) if host == h]) for h in hosts}
    by_local = {i: hvd.add_process_set([r for r, (_, local) in enumerate(places) if local == i]) for i in locals_}
    return {"process_set": by_host[hvd.cross_rank()], "replicate_process_set": by_local[hvd.local_rank()]}


def local_tensor(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def state_bytes(model: Any, optimizer: Any) -> int:
    """Parameters, gradients and optimizer state this rank holds (DTensors: their local shards)."""
    import torch

    tensors = {}
    for param in model.parameters():
        tensors[id(param)] = local_tensor(param)
        if param.grad is not None:
            tensors[id(param.grad)] = local_tensor(param.grad)
    holder = getattr(optimizer, "optim", optimizer)
    for state in holder.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[id(value)] = local_tensor(value)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def make_step(mode: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    model = build_model(args.blocks, args.width, args.device)
    forward, optimizer = wrap(mode, model, args.device)
    data = torch.randn(BATCH, args.width, generator=torch.Generator().manual_seed(1)).to(args.device)

    def step() -> None:
        optimizer.zero_grad()
        forward(data).square().mean().backward()
        optimizer.step()
        if args.device == "cuda":
            torch.cuda.synchronize()  # the step's GPU work, not just its launch

    return step, model, optimizer


def run_worker(args: argparse.Namespace) -> None:
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic" if "hybrid" in args.modes else None)
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    comm = MPI.COMM_WORLD
    if {"ddp", "fsdp2"} & set(args.modes):
        init_gloo()
    steps = {mode: make_step(mode, args) for mode in args.modes}
    for step, _, _ in steps.values():
        time_steps(step, args.warmup)
    per_rep: dict[str, list[float]] = {mode: [] for mode in args.modes}
    link: dict[str, list[float]] = {mode: [] for mode in args.modes}
    for _ in range(args.reps):
        for mode, (step, _, _) in steps.items():
            comm.Barrier()
            sent = link_bytes(args.count_link)
            per_rep[mode].append(max(comm.allgather(statistics.fmean(time_steps(step, args.steps)))))
            sent = link_bytes(args.count_link) - sent
            # Every rank of a host reads its one interface: count each host once (its local rank 0).
            link[mode].append(sum(comm.allgather(sent if hvd.local_rank() == 0 else 0)) / args.steps)
    state = {mode: max(comm.allgather(state_bytes(model, optimizer))) for mode, (_, model, optimizer) in steps.items()}
    peak = max(comm.allgather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    gpu_peak = max(comm.allgather(torch.cuda.max_memory_allocated() if args.device == "cuda" else 0))
    if comm.Get_rank() == 0:
        print(TAG + json.dumps({"rep_s": per_rep, "state": state, "peak_rss": peak, "gpu_peak": gpu_peak,
                                "link_bytes": link}), flush=True)


def launch(args: argparse.Namespace, modes: tuple[str, ...] | list[str], reps: int) -> dict[str, Any]:
    return launch_worker(__file__, args.np, ["--modes", ",".join(modes), "--reps", str(reps), "--steps", str(args.steps),
                          "--warmup", str(args.warmup), "--blocks", str(args.blocks), "--width", str(args.width),
                          "--device", args.device], TAG, RANK_ENV)


def launch_or_skip(args: argparse.Namespace, modes: list[str], reps: int) -> dict[str, Any] | None:
    """``launch``; on a GPU, a job with torch's modes that fails is run again without them (None if
    nothing is left), so one baseline that cannot run costs no figures of the others."""
    try:
        return launch(args, modes, reps)
    except SystemExit as failure:
        left = [mode for mode in modes if mode not in TORCH_MODES]
        if args.device != "cuda" or left == modes:
            raise
        print(f"{','.join(modes)}: {failure}; again without {sorted(set(modes) - set(left))}", flush=True)
        return launch(args, left, reps) if left else None


def report(args: argparse.Namespace, timing: dict[str, Any], alone: dict[str, dict[str, Any]]) -> list[str]:
    params = args.blocks * (args.width * args.width + args.width)
    unsharded_state = params * 4 * 4  # parameters, gradients, Adam's two moments (fp32)
    gpu = args.device == "cuda"
    lines = [f"Adam, {args.blocks} x residual Linear({args.width}) ({params / 1e6:.1f} M parameters), batch {BATCH} "
             f"per rank, np={args.np}, {os.cpu_count()} cores, {args.device}; {args.reps} reps x {args.steps} steps, "
             "median [min-max] of per-rep means; step ratios against the mode of the same job (fsdp2 or ddp)", "",
             "| mode | step s | step / baseline | model state MB per rank | state / (unsharded / N) | peak RSS MB |"
             + (" peak GPU MB |" if gpu else ""), "|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for mode in (mode for mode in MODES if mode in timing and mode in alone):
        values, baseline = timing[mode], timing.get("fsdp2" if mode in SHARDED else "ddp")
        ratio = f"{statistics.median(values) / statistics.median(baseline):.2f}" if baseline else "-"
        state = alone[mode]["state"][mode]
        lines.append(f"| {mode} | {statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}] | {ratio} | "
                     f"{state / 1e6:.0f} | {state / (unsharded_state / args.np):.3f} | "
                     f"{alone[mode]['peak_rss'] / 1e6:.0f} |" + (f" {alone[mode]['gpu_peak'] / 1e6:.0f} |" if gpu else ""))
    print("\n" + "\n".join(lines))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count-link", default="", help=argparse.SUPPRESS)  # the worker: an interface to count
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    if args.worker:
        run_worker(args)
        return
    timing: dict[str, list[float]] = {}
    for group in (SHARDED, REPLICATED):
        chosen = [mode for mode in group if mode in args.modes]
        result = launch_or_skip(args, chosen, args.reps) if chosen else None
        timing.update(result["rep_s"] if result else {})
    alone = {mode: result for mode in timing if (result := launch_or_skip(args, [mode], 1))}
    lines = report(args, timing, alone)
    if args.update_readme:
        from readme import replace_block

        replace_block(f"fully_sharded {'cuda ' if args.device == 'cuda' else ''}np={args.np}", "\n".join(lines))


if __name__ == "__main__":
    main()

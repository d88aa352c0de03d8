"""Sharded optimizer state: memory and step time of Adam, unsharded vs sharded vs torch's ZeRO.

Run:  python bench/sharded_optimizer.py [--np 2] [--reps 5] [--update-readme]

Modes, on ``torch_training_step.py``'s model (50 x Linear(704, 704), 24.8 M parameters, batch 32
per rank, one thread per rank) with ``torch.optim.Adam``:

- ``unsharded``  hvdlite ``DistributedOptimizer`` (gradients allreduced, full Adam state per rank);
- ``sharded``    the same with ``shard_optimizer_state=True``;
- ``zero``       torch's ``ZeroRedundancyOptimizer(Adam)`` over ``DistributedDataParallel`` (gloo).

Step times come from one job that runs the three modes interleaved, rep by rep (each rep: the
slowest rank's mean step time), so the ratios compare modes under the same load. Memory comes from
one job per mode (peak RSS is per process): the optimizer-state bytes each rank holds after a few
steps, and the peak resident set size of each rank (the largest is reported).
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
from torch_training_step import NUM_CLASSES, RANK_ENV, WIDTH, build_model, init_gloo, time_steps  # noqa: E402

MODES = ("unsharded", "sharded", "zero")
TAG = "SHARDED_RESULT "


def make_step(mode: str) -> tuple[Any, Any]:
    """(step function, the object holding this rank's optimizer state) for one mode."""
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.manual_seed(0)
    model = build_model()
    data, target = torch.randn(32, WIDTH), torch.randint(0, NUM_CLASSES, (32,))
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        forward, holder = DistributedDataParallel(model), optimizer.optim
    else:
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                             named_parameters=model.named_parameters(),
                                             shard_optimizer_state=mode == "sharded")
        forward, holder = model, optimizer

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(forward(data)[:, :NUM_CLASSES], target).backward()
        optimizer.step()

    return step, holder


def state_bytes(holder: Any) -> int:
    import torch

    return sum(v.numel() * v.element_size() for state in holder.state.values() for v in state.values()
               if torch.is_tensor(v))


def run_worker(args: argparse.Namespace) -> None:
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    if "zero" in args.modes:
        init_gloo()
    steps = {mode: make_step(mode) for mode in args.modes}
    for step, _ in steps.values():
        time_steps(step, args.warmup)
    per_rep: dict[str, list[float]] = {mode: [] for mode in args.modes}
    for _ in range(args.reps):
        for mode, (step, _) in steps.items():
            comm.Barrier()
            per_rep[mode].append(max(comm.allgather(statistics.fmean(time_steps(step, args.steps)))))
    memory = {mode: comm.allgather(state_bytes(holder)) for mode, (_, holder) in steps.items()}
    peak = max(comm.allgather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    if comm.Get_rank() == 0:
        print(TAG + json.dumps({"rep_s": per_rep, "state": memory, "peak_rss": peak}), flush=True)


def launch(args: argparse.Namespace, modes: list[str], reps: int) -> dict[str, Any]:
    return launch_worker(__file__, args.np, ["--modes", ",".join(modes), "--reps", str(reps), "--steps", str(args.steps),
                          "--warmup", str(args.warmup)], TAG, RANK_ENV)


def report(args: argparse.Namespace, timing: dict[str, Any], alone: dict[str, dict[str, Any]]) -> list[str]:
    base_time = statistics.median(timing["rep_s"]["unsharded"])
    base_state = max(alone["unsharded"]["state"]["unsharded"])
    lines = [f"Adam, 50 x Linear({WIDTH}, {WIDTH}) (24.8 M parameters), batch 32 per rank, np={args.np}, "
             f"{os.cpu_count()} cores; {args.reps} reps x {args.steps} steps, median [min-max] of per-rep means", "",
             "| mode | step ms | step / unsharded | state MB per rank (max) | state / unsharded | peak RSS MB per rank |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        values = timing["rep_s"][mode]
        state = max(alone[mode]["state"][mode])
        lines.append(f"| {mode} | {statistics.median(values) * 1e3:.1f} [{min(values) * 1e3:.1f}-"
                     f"{max(values) * 1e3:.1f}] | {statistics.median(values) / base_time:.2f} | {state / 1e6:.1f} | "
                     f"{state / base_state:.3f} | {alone[mode]['peak_rss'] / 1e6:.0f} |")
    print("\n" + "\n".join(lines))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    if args.worker:
        run_worker(args)
        return
    timing = launch(args, list(MODES), args.reps)
    alone = {mode: launch(args, [mode], 1) for mode in MODES}
    lines = report(args, timing, alone)
    if args.update_readme:
        from readme import replace_block

        replace_block(f"sharded_optimizer np={args.np}", "\n".join(lines))


if __name__ == "__main__":
    main()

"""torch.distributed's "hvdlite" backend against gloo, in one job, interleaved rep by rep.

Run:  python bench/torch_backend.py [--np 2] [--reps 7] [--calls 1000] [--steps 10]   (launches its own hvdliterun job)
      python bench/torch_backend.py --np 2 --reps 5 --calls 300 --steps 4   (quick: about 30 s at np=2, 2 cores)
      hvdliterun -np 2 python bench/torch_backend.py --worker [...]   (the job itself; rank 0 prints the table)

Every rank calls ``hvd.init()``, ``dist.init_process_group("hvdlite")`` (the default group) and
``dist.new_group(backend="gloo")`` over the same ranks, so both backends run in the same processes
and, alternating rep by rep, see the same machine load. Measured, each against gloo in the same run:

1. ``dist.all_reduce`` (blocking, Sum) of a 4 B (1 float32) and a 1 MB (262,144 float32) tensor:
   microseconds per call; ``group=None`` (hvdlite, the default group) against ``group=gloo``, and
   against ``hvd.allreduce`` and ``hvd.allreduce_`` of the same tensor, named (hvdlite's own blocking
   calls, through the core's small-op path when small: what the backend's per-call Python adds).
2. A training step of torch's ``DistributedDataParallel`` (``process_group=`` the default group or
   gloo): an MLP of 4 x ``Linear(1024, 1024)`` with ReLU between, batch 32 per rank, SGD.
3. A training step of torch's FSDP2: ``fully_shard`` on each ``Linear``, then on the model, on a
   ``DeviceMesh.from_group(group, "cpu")`` of either group; the same MLP, data and optimizer.

A rep's value is the slowest rank's mean (per call, or per step); reported are the median over
``--reps`` reps, the min-max of the per-rep values, and hvdlite / gloo (medians). One thread per rank
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``). Warm-up calls and steps come first.

Checks (cheap, from what the timing ran): one ``all_reduce`` of rank-dependent values per size
through each group gives the same result; the DDP and FSDP2 models of the two backends start from the
same weights and take the same steps on the same data, so their parameters (FSDP2: each rank's
shards) must agree afterwards on every rank: ``equal`` is ``torch.allclose`` (rtol 1e-5, atol 1e-7),
and the largest difference is printed too (0 where the reductions add in the same order).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jobs import launch_worker, timed  # noqa: E402

TAG = "TORCH_BACKEND_RESULT "
SECTIONS = ("allreduce", "ddp", "fsdp2")
SIZES = (4, 1 << 20)
WIDTH, DEPTH, BATCH = 1024, 4, 32
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
OWN = ("hvd.allreduce", "hvd.allreduce_")  # hvdlite's own blocking calls, timed beside the backend


def label(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes} B"


def build_model() -> Any:
    import torch

    torch.manual_seed(0)  # the same weights in every model and on every rank
    layers: list[Any] = []
    for i in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH)] + ([torch.nn.ReLU()] if i < DEPTH - 1 else [])
    return torch.nn.Sequential(*layers)


def make_step(kind: str, group: Any, rank: int) -> tuple[Callable[[], None], Any]:
    """(one training step, the model) of ``kind`` (ddp or fsdp2) on ``group``."""
    import torch

    model = build_model()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        forward = DistributedDataParallel(model, process_group=group)
    else:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        forward = fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own batch, the same for both backends
    data, target = torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, WIDTH, generator=generator)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(forward(data), target).backward()
        optimizer.step()

    return step, model


def max_difference(a: Any, b: Any) -> tuple[bool, float]:
    """(allclose, largest absolute difference) over the two models' parameters (local shards)."""
    import torch

    close, worst = True, 0.0
    with torch.no_grad():
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            p, q = (t.to_local() if hasattr(t, "to_local") else t for t in (p, q))
            close = close and torch.allclose(p, q, rtol=1e-5, atol=1e-7)
            worst = max(worst, (p - q).abs().max().item())
    return close, worst


def allreduce_section(groups: dict[str, Any], args: argparse.Namespace, comm: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import hvdlite.torch as hvd

    out: dict[str, Any] = {}
    for nbytes in SIZES:
        calls = args.calls if nbytes <= 4 else max(3, args.calls // 20)
        tensor = torch.zeros(nbytes // 4)  # zeros: a sum of many calls stays finite
        fns = {name: (lambda g=g, t=tensor: dist.all_reduce(t, group=g)) for name, g in groups.items()}
        # hvdlite's own blocking calls on the same tensor, named as a training loop's metrics are (the
        # response cache answers; a small one takes the core's small-op path): a new tensor, and in place
        fns["hvd.allreduce"] = lambda t=tensor, n=f"bench.{nbytes}": hvd.allreduce(t, name=n, op=hvd.Sum)
        fns["hvd.allreduce_"] = lambda t=tensor, n=f"bench_.{nbytes}": hvd.allreduce_(t, name=n, op=hvd.Sum)
        for fn in fns.values():
            timed(fn, max(3, calls // 10), comm)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                times[name].append(timed(fn, calls, comm))
        results = {}
        for name, g in groups.items():  # the check: rank-dependent values, one call each
            values = torch.arange(nbytes // 4, dtype=torch.float32) * 0.5 + comm.Get_rank()
            dist.all_reduce(values, group=g)
            results[name] = values
        close = torch.allclose(results["hvdlite"], results["gloo"], rtol=1e-6, atol=0)
        worst = (results["hvdlite"] - results["gloo"]).abs().max().item()
        out[f"all_reduce {label(nbytes)}"] = {"unit": "us", "scale": 1e6, "times": times, "calls": calls,
                                              "equal": all(comm.allgather(close)),
                                              "diff": max(comm.allgather(worst))}
    return out


def training_section(kind: str, groups: dict[str, Any], args: argparse.Namespace, comm: Any) -> dict[str, Any]:
    steps = {name: make_step(kind, g, comm.Get_rank()) for name, g in groups.items()}
    for step, _ in steps.values():
        timed(step, args.warmup, comm)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.reps):
        for name, (step, _) in steps.items():
            times[name].append(timed(step, args.steps, comm))
    close, worst = max_difference(steps["hvdlite"][1], steps["gloo"][1])
    return {"unit": "ms", "scale": 1e3, "times": times, "calls": args.steps, "equal": all(comm.allgather(close)),
            "diff": max(comm.allgather(worst)), "steps": args.warmup + args.reps * args.steps}


def table(results: dict[str, Any], args: argparse.Namespace, size: int) -> list[str]:
    def spread(values: list[float], scale: float) -> str:
        return f"{statistics.median(values) * scale:,.1f} [{min(values) * scale:,.1f}-{max(values) * scale:,.1f}]"

    model = f"{DEPTH} x Linear({WIDTH}, {WIDTH}), batch {BATCH} per rank, SGD"
    lines = [f"torch.distributed, backend 'hvdlite' (the default group) vs a gloo group of the same ranks, np={size}, "
             f"{os.cpu_count()} cores, 1 thread per rank; {args.reps} reps, median [min-max] of per-rep values "
             "(each the slowest rank's mean), interleaved", "",
             "| measurement | per rep | hvdlite | gloo | hvdlite / gloo | equal (max abs diff) |",
             "|---|---|---|---|---|---|"]
    for name, row in results.items():
        hv, gl = row["times"]["hvdlite"], row["times"]["gloo"]
        what = f"{name}, {row['unit']} a {'call' if name.startswith('all_reduce') else 'step'}"
        per = f"{row['calls']} {'calls' if name.startswith('all_reduce') else 'steps'}"
        lines.append(f"| {what} | {per} | {spread(hv, row['scale'])} | {spread(gl, row['scale'])} | "
                     f"{statistics.median(hv) / statistics.median(gl):.2f} | {row['equal']} ({row['diff']:.3g}) |")
    own = [name for name, row in results.items() if OWN[0] in row["times"]]
    if own:
        lines += ["", "The backend's per-call cost over hvdlite's own blocking calls on the same tensor, in the same "
                  "reps:", "", "| measurement | dist.all_reduce (hvdlite) | " + " | ".join(OWN) + " | backend / "
                  + " | backend / ".join(OWN) + " |", "|---|---|" + "---|" * (2 * len(OWN))]
        for name in own:
            row = results[name]
            backend = statistics.median(row["times"]["hvdlite"])
            lines.append(f"| {name}, {row['unit']} a call | {spread(row['times']['hvdlite'], row['scale'])} | "
                         + " | ".join(spread(row["times"][o], row["scale"]) for o in OWN) + " | "
                         + " | ".join(f"{backend / statistics.median(row['times'][o]):.2f}" for o in OWN) + " |")
    lines.append("")
    lines.append(f"DDP and FSDP2: {model}; the two backends' models start from the same weights and take the same "
                 "steps on the same data.")
    for name in ("DDP", "FSDP2"):
        if name in results:
            row = results[name]
            lines.append(f"{name} parameters after {row['steps']} steps, hvdlite vs gloo: equal: {row['equal']} "
                         f"(max abs diff {row['diff']:.3g})")
    return lines


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("hvdlite")
    groups = {"hvdlite": None, "gloo": dist.new_group(backend="gloo")}
    comm = MPI.COMM_WORLD
    results: dict[str, Any] = {}
    if "allreduce" in args.sections:
        results.update(allreduce_section(groups, args, comm))
    world = {"hvdlite": dist.group.WORLD, "gloo": groups["gloo"]}
    if "ddp" in args.sections:
        results["DDP"] = training_section("ddp", world, args, comm)
    if "fsdp2" in args.sections:
        results["FSDP2"] = training_section("fsdp2", world, args, comm)
    if comm.Get_rank() == 0:
        lines = table(results, args, comm.Get_size())
        print("\n".join(lines), flush=True)
        print(TAG + json.dumps({"lines": lines}), flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000, help="4 B all_reduce calls per rep (1 MB: a twentieth)")
    parser.add_argument("--steps", type=int, default=10, help="DDP / FSDP2 steps per rep")
    parser.add_argument("--warmup", type=int, default=3, help="DDP / FSDP2 steps before the reps")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sections = args.sections.split(",")
    if set(args.sections) - set(SECTIONS):
        parser.error(f"unknown section(s) {sorted(set(args.sections) - set(SECTIONS))}; choose from {SECTIONS}")
    if args.worker:
        run_worker(args)
        return
    result = launch_worker(__file__, args.np, ["--reps", str(args.reps), "--calls", str(args.calls), "--steps",
                                               str(args.steps), "--warmup", str(args.warmup),
                                               "--sections", ",".join(args.sections)], TAG, RANK_ENV)
    print("\n" + "\n".join(result["lines"]))


if __name__ == "__main__":
    main()

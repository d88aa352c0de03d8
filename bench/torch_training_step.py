"""One data-parallel training step in PyTorch: hvdlite vs DDP (gloo) vs raw mpi4py vs no communication.

Run:  python bench/torch_training_step.py            (it launches its own hvdliterun jobs)
      python bench/torch_training_step.py --plot docs/assets/bench/training_step.png   (also draws the step times)

The driver starts two jobs of this script in worker mode: ``hvdliterun -np 1`` for the ``single``
baseline, then ``hvdliterun -np N`` (``--np``, default 2) for the multi-rank modes:

- ``single``   one rank, no communication: the baseline. Measured twice: in the ``-np 1`` job, and
               inside the ``-np N`` job (rank 0 steps alone while the other ranks sleep), interleaved
               with the other modes. Efficiencies use the interleaved one: on a shared machine the
               load drifts between jobs by more than the effects measured here.
- ``nocomm``   N ranks, each trains alone: the cost of sharing the machine (cores, memory bandwidth).
- ``mpi4py``   N ranks; after backward, one ``Allreduce(IN_PLACE)`` per gradient, divided by N.
- ``ddp``      N ranks; torch ``DistributedDataParallel`` over gloo (TCP on 127.0.0.1).
- ``hvdlite``  N ranks; ``hvdlite.torch.DistributedOptimizer`` with ``named_parameters``.
- ``sharded``  as ``hvdlite``, with ``shard_optimizer_state=True`` (gradients reduce-scattered,
               parameters all-gathered).
- ``local8``   as ``hvdlite``, with ``local_sgd_period=8`` (no warm-up): parameters averaged every 8th step.
- ``local8o``  as ``local8``, with ``local_sgd_overlap=True``: each average runs during the next 8 steps.
- ``powersgd`` as ``hvdlite``, with ``compression=Compression.powersgd(rank=4, start_step=0)``.
- ``horovod``  N ranks; ``horovod.torch.DistributedOptimizer``, only where ``horovod.torch`` imports
               (Horovod 0.28.1 does not build against torch 2.13; the mode is reported as skipped).

Model: 50 x ``nn.Linear(704, 704)`` with ReLU between (24.8 M parameters, 100 tensors), SGD, batch 32
per rank, one thread per rank. All multi-rank modes run in the same job, interleaved rep by rep, so
drifting machine load affects them alike; DDP (gloo over TCP) and hvdlite (MPI) coexist in one process.
Each mode gets its own model so hvdlite's gradient hooks never fire in another mode's steps. When
``hvdlite`` is among the modes, hvdlite's engine thread lives for the whole job (idle between its
reps, it wakes about once a second).

Per rep, each rank takes the mean of its step times (the modes that communicate every 8th step
need the mean; use a multiple of 8 steps); the rep's value is the slowest rank's mean
(a synchronous job runs at its slowest rank's pace). Reported: the median over all reps, the spread
(min-max of the per-rep values), the scaling efficiency (single step time / mode step time; the
per-rank batch is fixed, so 1.0 is perfect weak scaling) and the throughput relative to DDP.
``--plot PATH`` draws the multi-rank modes' step times from the same run as a bar chart (needs
matplotlib: ``pip install hvdlite[bench]``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALL_MODES = ("single", "nocomm", "mpi4py", "ddp", "hvdlite", "sharded", "local8", "local8o", "powersgd", "horovod")
# hvdlite's DistributedOptimizer options per hvdlite mode (see the docstring)
HVDLITE_OPTIONS: dict[str, dict[str, Any]] = {
    "hvdlite": {}, "sharded": {"shard_optimizer_state": True}, "local8": {"local_sgd_period": 8},
    "local8o": {"local_sgd_period": 8, "local_sgd_overlap": True},
    "powersgd": {"compression": "powersgd"},
}
RESULT_TAG = "TRAINSTEP_RESULT "
SKIP_TAG = "TRAINSTEP_SKIP "
WIDTH, DEPTH, NUM_CLASSES = 704, 50, 10
RANK_ENV = {
    # Set before the ranks start, so torch's and the BLAS's thread pools are sized 1 from the outset.
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # glibc hands the freed 2 MB gradients (zero_grad sets them to None) back to the kernel, and every
    # step then faults ~100 MB in again: measured +60 ms/step in a process that holds one model, but
    # not in one holding several, whose fragmented heap is never trimmed. Keeping freed memory in the
    # heap removes that allocator artifact, so modes and jobs differ only in what they communicate.
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode per rep")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode before the first rep")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    parser.add_argument("--modes", default=",".join(ALL_MODES), help=f"comma-separated subset of {ALL_MODES}")
    parser.add_argument("--np", type=int, default=2, help="ranks in the multi-rank job")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
    parser.add_argument("--wrap", default="", help="command prefix the jobs' hvdliterun runs under (bench/two_hosts.py)")
    parser.add_argument("--hvdliterun-args", default="", help="extra hvdliterun arguments, e.g. '-H a:1,b:1'")
    parser.add_argument("--update-readme", action="store_true", help="write the table into bench/README.md")
    parser.add_argument("--plot", metavar="PNG", help="draw the multi-rank modes' step times into this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by the driver
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in ALL_MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(ALL_MODES)}")
    launched_by = [k for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK") if k in os.environ]
    if not args.worker and launched_by:
        # Under a launcher every rank would start its own jobs: twice the ranks on the cores, and a
        # table measured under that load (it happened once, and wrote a wrong README row).
        parser.error(f"this driver starts its own hvdliterun jobs; run it with plain python, not under an MPI "
                     f"launcher ({launched_by[0]} is set)")
    return args


# ---------------------------------------------------------------- worker: runs inside hvdliterun


def build_model() -> Any:
    import torch

    layers: list[torch.nn.Module] = []
    for index in range(DEPTH):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if index < DEPTH - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def plain_step(model: Any, optimizer: Any, data: Any, target: Any) -> None:
    import torch.nn.functional as F

    optimizer.zero_grad()
    # The last layer's first NUM_CLASSES outputs act as logits, so every layer is the same shape.
    F.cross_entropy(model(data)[:, :NUM_CLASSES], target).backward()
    optimizer.step()


def mpi4py_step(model: Any, optimizer: Any, data: Any, target: Any) -> None:
    import torch.nn.functional as F
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    optimizer.zero_grad()
    F.cross_entropy(model(data)[:, :NUM_CLASSES], target).backward()
    # The naive loop a user writes first: one blocking allreduce per tensor, after the whole backward.
    for param in model.parameters():
        comm.Allreduce(MPI.IN_PLACE, param.grad.numpy())
        param.grad.div_(comm.Get_size())
    optimizer.step()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo() -> None:
    """Start torch.distributed on gloo with mpi4py's rank and size; rank 0 picks the port."""
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())


@dataclass
class Mode:
    name: str
    step: Callable[[], None]
    # Untimed, around each rep's timed steps: local8o's averages must neither spill into the next
    # mode's rep nor be counted short (see overlapped_edges).
    before: Callable[[], None] = lambda: None
    after: Callable[[], None] = lambda: None


def make_mode(name: str, batch: int) -> Mode:
    """Build one mode's own model, optimizer and fixed batch (each mode differs only in how it reduces)."""
    import torch

    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(batch, WIDTH)
    target = torch.randint(0, NUM_CLASSES, (batch,))
    if name == "mpi4py":
        return Mode(name, lambda: mpi4py_step(model, optimizer, data, target))
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(model)
        return Mode(name, lambda: plain_step(ddp_model, optimizer, data, target))
    if name in HVDLITE_OPTIONS or name == "horovod":
        import importlib

        hvd = importlib.import_module("horovod.torch" if name == "horovod" else "hvdlite.torch")
        options = dict(HVDLITE_OPTIONS.get(name, {}))
        if options.get("compression") == "powersgd":
            options["compression"] = hvd.Compression.powersgd(rank=4, start_step=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **options)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    step = lambda: plain_step(model, optimizer, data, target)  # noqa: E731
    if name == "local8o":
        return Mode(name, step, *overlapped_edges(optimizer, step))
    return Mode(name, step)


def overlapped_edges(optimizer: Any, step: Callable[[], None]) -> tuple[Callable[[], None], Callable[[], None]]:
    """(before, after) a rep of overlapped local SGD, so that the rep is in the steady state.

    Before: untimed steps up to an averaging step, so an average is in flight when timing starts
    and every average landing in the rep overlapped a full period. After: land the one in flight,
    untimed, so its traffic does not slow the next mode's rep.
    """
    local = optimizer._hvdlite_reducer.local_sgd

    def before() -> None:
        step()
        while local.steps % local.schedule.period:
            step()

    return before, local.finish


def unavailable(package: str) -> str | None:
    """Why ``package.torch`` (hvdlite or horovod) cannot be used here, or None. Every rank gets the same answer."""
    import importlib

    try:
        importlib.import_module(f"{package}.torch")
    except Exception as exc:  # noqa: BLE001 - a broken Horovod build fails with all kinds of errors
        return f"{package}.torch does not import: {exc}"
    return None


def setup_modes(names: list[str], batch: int, rank: int) -> list[Mode]:
    for package in ("hvdlite", "horovod"):
        if package not in names and (package == "horovod" or not set(names) & set(HVDLITE_OPTIONS)):
            continue
        reason = unavailable(package)
        if reason is not None:
            names = [n for n in names if n != package and not (package == "hvdlite" and n in HVDLITE_OPTIONS)]
            if rank == 0:
                print(SKIP_TAG + json.dumps({"mode": package, "reason": reason}), flush=True)
        else:
            import importlib

            importlib.import_module(f"{package}.torch").init()
    if "ddp" in names:
        init_gloo()
    return [make_mode(name, batch) for name in names]


def idle_until_all_arrive(comm: Any) -> None:
    """Wait for every rank without spinning a core (a blocking MPICH barrier busy-polls)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def time_steps(step: Callable[[], None], steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def link_bytes_sent() -> int:
    """Bytes this host's network interfaces (not loopback) have sent: /proc/net/dev of this network
    namespace, so on bench/two_hosts.py's namespace hosts it counts what crossed the shaped link."""
    with open("/proc/net/dev") as stats:
        rows = [line.split(":", 1) for line in stats.read().splitlines()[2:]]
    return sum(int(fields.split()[8]) for name, fields in rows if name.strip() != "lo")


def run_mode(mode: Mode, steps: int, comm: Any) -> tuple[float, float]:
    """This rank's mean step time and link bytes sent per step; in ``single`` only rank 0 steps
    (0.0 elsewhere) while the others sleep."""
    comm.Barrier()
    if mode.name == "single" and comm.Get_rank() != 0:
        idle_until_all_arrive(comm)
        return 0.0, 0.0
    mode.before()
    sent = link_bytes_sent()
    mean = statistics.fmean(time_steps(mode.step, steps)) if steps else 0.0
    sent = (link_bytes_sent() - sent) / max(steps, 1)
    mode.after()
    if mode.name == "single":
        idle_until_all_arrive(comm)
    return mean, sent


def run_worker(args: argparse.Namespace) -> None:
    import torch
    from mpi4py import MPI

    torch.set_num_threads(1)  # one core per rank: 2 ranks on 2 cores must not oversubscribe
    comm = MPI.COMM_WORLD
    modes = setup_modes(args.modes, args.batch_size, comm.Get_rank())
    for mode in modes:
        run_mode(mode, args.warmup, comm)
    per_rep: dict[str, list[float]] = {m.name: [] for m in modes}
    sent: dict[str, list[float]] = {m.name: [] for m in modes}
    for _ in range(args.reps):
        for mode in modes:  # interleaved, so drifting load affects every mode alike
            mean, bytes_per_step = run_mode(mode, args.steps, comm)
            per_rep[mode.name].append(max(comm.allgather(mean)))  # the slowest rank sets the pace
            sent[mode.name].append(bytes_per_step)
    if comm.Get_rank() == 0:
        for name, values in per_rep.items():
            print(RESULT_TAG + json.dumps({"mode": name, "np": comm.Get_size(), "rep_s": values,
                                           "sent": statistics.median(sent[name])}), flush=True)
    comm.Barrier()


# ---------------------------------------------------------------- driver: launches the jobs, reports


Results = dict[tuple[str, int], list[float]]  # (mode, np) -> per-rep step seconds
Sent = dict[tuple[str, int], float]  # (mode, np) -> link bytes rank 0's host sent per step (median of reps)


def launch(np_: int, modes: list[str], args: argparse.Namespace) -> tuple[Results, dict[str, str], Sent]:
    """Run one hvdliterun job of this script in worker mode; return its results and skipped modes."""
    beside = os.path.join(os.path.dirname(sys.executable), "hvdliterun")  # works without an activated venv
    command = [*shlex.split(args.wrap), beside if os.path.exists(beside) else "hvdliterun", "-np", str(np_),
               *shlex.split(args.hvdliterun_args), sys.executable, os.path.abspath(__file__), "--worker",
               "--modes", ",".join(modes), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--reps", str(args.reps), "--batch-size", str(args.batch_size)]
    env = {**os.environ, **RANK_ENV}
    print("$ " + " ".join(command), flush=True)
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"job failed with exit code {proc.returncode}: {' '.join(command)}")
    results: Results = {}
    skipped: dict[str, str] = {}
    sent: Sent = {}
    for line in proc.stdout.splitlines():
        # hvdliterun tags lines "[rank]: "; the payload follows our marker.
        match = re.search(f"({RESULT_TAG}|{SKIP_TAG})(.*)$", line)
        if not match:
            continue
        payload = json.loads(match.group(2))
        if match.group(1) == RESULT_TAG:
            results[(payload["mode"], payload["np"])] = payload["rep_s"]
            sent[(payload["mode"], payload["np"])] = payload["sent"]
        else:
            skipped[payload["mode"]] = payload["reason"]
    return results, skipped, sent


def baseline(results: Results) -> float | None:
    """The single-rank step time to compare with: the interleaved one when it was measured."""
    runs = sorted((key for key in results if key[0] == "single"), key=lambda key: -key[1])
    return statistics.median(results[runs[0]]) if runs else None


def format_row(key: tuple[str, int], values: list[float], single: float | None, ddp_rate: float | None) -> str:
    name, np_ = key
    median = statistics.median(values)
    step = f"{median * 1e3:7.1f} [{min(values) * 1e3:.1f}-{max(values) * 1e3:.1f}]"
    # A single-rank step in an N-rank job is one rank's work, whatever N is.
    ranks = 1 if name == "single" else np_
    efficiency = f"{single / median:10.2f}" if single and name != "single" else f"{'-':>10}"
    versus = f"{ranks / median / ddp_rate:17.2f}" if ddp_rate else f"{'-':>17}"
    where = "np=1 job" if np_ == 1 else (f"np={np_} job, rank 0 alone" if name == "single" else f"np={np_}")
    return f"{name:>8} | {where:<22} | {step:>22} | {efficiency} | {versus}"


def report(results: Results, skipped: dict[str, str], args: argparse.Namespace, sent: Sent) -> list[str]:
    """The result table's lines (also printed)."""
    lines = [f"Training step: {DEPTH} x Linear({WIDTH}, {WIDTH}), batch {args.batch_size} per rank, SGD, "
             f"1 thread per rank, {os.cpu_count()} cores; {args.reps} reps x {args.steps} steps "
             "(median [min-max] of per-rep mean step times)", ""]
    single = baseline(results)
    ddp = [(np_, values) for (name, np_), values in results.items() if name == "ddp"]
    ddp_rate = ddp[0][0] / statistics.median(ddp[0][1]) if ddp else None
    on_link = any(sent.values())  # only where ranks talk over a network interface (bench/two_hosts.py)
    extra = f" {'link MB sent/step':>17} |" if on_link else ""
    lines.append(f"| {'mode':>8} | {'ranks':<22} | {'step ms':>22} | {'efficiency':>10} | {'throughput vs ddp':>17} |"
                 + extra)
    lines.append("|---|---|---|---|---|" + ("---|" if on_link else ""))
    order = {name: index for index, name in enumerate(ALL_MODES)}
    for key in sorted(results, key=lambda key: (order[key[0]], key[1])):
        column = f" {sent.get(key, 0.0) / 1e6:17.2f} |" if on_link else ""
        lines.append(f"| {format_row(key, results[key], single, ddp_rate)} |" + column)
    hvdlite = [values for (name, _), values in results.items() if name == "hvdlite"]
    loop = [values for (name, _), values in results.items() if name == "mpi4py"]
    if hvdlite and loop:
        ratio = statistics.median(loop[0]) / statistics.median(hvdlite[0])
        verdict = f"target >= 1.00: {'met' if ratio >= 1.0 else 'NOT met'}" if args.np == 2 else "no target at this size"
        lines += ["", f"hvdlite throughput / plain mpi4py loop: {ratio:.2f} ({verdict})"]
    for name, reason in skipped.items():
        lines.append(f"{name:>8} skipped: {reason}")
    print("\n" + "\n".join(lines))
    return lines


PLOT_LABELS = {"nocomm": "no\ncommunication", "mpi4py": "mpi4py loop", "ddp": "DDP (gloo)", "hvdlite": "hvdlite",
               "sharded": "hvdlite\nsharded state", "local8": "hvdlite\nlocal SGD (8)",
               "local8o": "hvdlite\nlocal SGD (8),\noverlapped", "powersgd": "hvdlite\nPowerSGD (4)",
               "horovod": "Horovod"}


def plot_steps(results: Results, args: argparse.Namespace) -> None:
    """Draw the step time of each multi-rank mode this run measured (bench/plots.py)."""
    import plots

    modes = {PLOT_LABELS[name]: results[name, np_] for name in ALL_MODES for (mode, np_) in results
             if mode == name and name != "single"}
    single = results.get(("single", args.np))
    plots.training_step(
        modes, single,
        title=f"PyTorch training step, np={args.np}: {DEPTH} x Linear({WIDTH}, {WIDTH}), batch {args.batch_size} "
              "per rank, SGD, 1 thread per rank",
        note=f"Median of {args.reps} interleaved reps x {args.steps} steps (each rep the slowest rank's mean "
             "step), bars min-max, dots reps.",
        out=args.plot)


def run_driver(args: argparse.Namespace) -> None:
    results: Results = {}
    skipped: dict[str, str] = {}
    sent: Sent = {}
    if "single" in args.modes:
        found, _, _ = launch(1, ["single"], args)
        results.update(found)
    multi = [m for m in args.modes if m != "single"]
    if multi:
        # single again inside the N-rank job, interleaved with the other modes (see the docstring).
        found, skipped, sent = launch(args.np, (["single"] if "single" in args.modes else []) + multi, args)
        results.update(found)
    lines = report(results, skipped, args, sent)
    if args.update_readme:
        from readme import replace_block

        replace_block(f"torch_training_step np={args.np}", "\n".join(lines))
    if args.plot:
        plot_steps(results, args)


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
    else:
        run_driver(args)


if __name__ == "__main__":
    main()

"""Every torch training mode on GPU tensors against the same training on CPU tensors, in one job.

Usage: ``hvdliterun -np N python tests/gpu/scripts/torch_modes.py [--device cuda|cpu] [--modes a,b]``.

For each mode (see MODES) every rank builds one model from a fixed seed on the CPU and a copy of
it on ``--device``, wraps each in its own ``hvd.DistributedOptimizer`` (the mode's options, the
parameters named ``<mode>.<cpu|device>.<name>``) and trains both STEPS steps on the same per-rank
data: the CPU copy through hvdlite on CPU tensors is the reference. Then it compares the two
copies' parameters and buffers (a tolerance per mode: loose for fp16/bf16 compression), checks
that training moved them and that the device copy is bit-identical on every rank that averaged it.
A mode's failure does not stop the job: every rank reports its own problems at a common point, the
next mode runs, and the job exits 1 at the end. Each rank prints ``ok torch <mode>`` per passing
mode, else ``FAILED torch <mode>: ...``. With ``--device cpu`` both copies are on the CPU: that
checks this script's logic on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import torch
import verdict

import hvdlite.torch as hvd

FEATURES, HIDDEN, CLASSES, PER_RANK, STEPS = 12, 16, 3, 4, 5
LOCAL_SGD = {"local_sgd_period": 2, "local_sgd_warmup_steps": 1}


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # DistributedOptimizer's keyword arguments
    optimizer: str = "sgd"  # sgd (momentum) or adam
    passes: int = 1  # backward passes per step
    tolerance: float = 1e-4  # rtol and atol of device against CPU
    batch_norm: bool = False  # the model has an hvd.SyncBatchNorm layer
    subset: bool = False  # averaged over the process set of the even ranks only

    @property
    def local_sgd(self) -> bool:
        return "local_sgd_period" in self.options


MODES = [
    Mode("plain"),
    Mode("backward_passes_per_step", {"backward_passes_per_step": 2}, passes=2),
    Mode("shard_optimizer_state", {"shard_optimizer_state": True}, optimizer="adam"),
    Mode("local_sgd", {**LOCAL_SGD, "local_sgd_average_state": True}),
    Mode("local_sgd_adam", {**LOCAL_SGD, "local_sgd_average_state": True}, optimizer="adam"),
    Mode("local_sgd_overlap", {**LOCAL_SGD, "local_sgd_overlap": True}),
    # The 16x12 first weight is compressed at rank 2 ((16 + 12) * 2 * 2 < 192); the 3x16 one is not.
    Mode("powersgd", {"compression": hvd.Compression.powersgd(rank=2, start_step=1)}),
    # Rounded to 16 bits on the way: a gradient rounds to the other neighbour when CPU and GPU differ in its last bits.
    Mode("fp16", {"compression": hvd.Compression.fp16}, tolerance=2e-3),
    Mode("bf16", {"compression": hvd.Compression.bf16}, tolerance=1e-2),
    Mode("process_set", subset=True),
    Mode("sync_batch_norm", batch_norm=True),
]


def build(mode: Mode) -> torch.nn.Module:
    """The model, on the CPU, from seed 0."""
    torch.manual_seed(0)
    norm = [hvd.SyncBatchNorm(HIDDEN)] if mode.batch_norm else []
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), *norm, torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, CLASSES))


def batch(step: int, micro: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data for one backward pass, made on the CPU and moved to ``device``."""
    generator = torch.Generator().manual_seed(10_000 * step + 100 * micro + rank)
    x = torch.randn(PER_RANK, FEATURES, generator=generator) * (rank + 1)
    y = torch.randint(0, CLASSES, (PER_RANK,), generator=generator)
    return x.to(device), y.to(device)


def train(mode: Mode, model: torch.nn.Module, side: str, process_set: hvd.ProcessSet) -> None:
    """STEPS steps of ``model`` (wherever it lives) through its own DistributedOptimizer."""
    device = next(model.parameters()).device
    if mode.optimizer == "adam":
        # eps well above float32 noise: Adam's first steps are about sign(gradient), and a gradient
        # element near zero could take another sign on the GPU (1e-7 seen here) and move by 2 * lr.
        base = torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-4)
    else:
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    named = [(f"{mode.name}.{side}.{name}", param) for name, param in model.named_parameters()]
    optimizer = hvd.DistributedOptimizer(base, named_parameters=named, process_set=process_set, **mode.options)
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(mode.passes):
            x, y = batch(step, micro, hvd.rank(), device)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if mode.local_sgd and process_set.included():
        optimizer.average_parameters()  # lands an overlapped average in flight; every rank ends equal


def differences(mode: Mode, reference: torch.nn.Module, model: torch.nn.Module, initial: torch.nn.Module,
                device: torch.device) -> list[str]:
    """What differs between the CPU reference and the device copy (nothing raised: every rank goes on)."""
    problems = []
    wanted, got, before = reference.state_dict(), model.state_dict(), initial.state_dict()
    for name, want in wanted.items():
        if got[name].device.type != device.type:
            problems.append(f"{name} moved to {got[name].device}")
        try:
            tol = mode.tolerance if want.is_floating_point() else 0.0
            torch.testing.assert_close(got[name].cpu(), want, rtol=tol, atol=tol)
        except AssertionError as error:
            problems.append(f"{name} on {device.type} != on cpu: {error}".replace("\n", " "))
    moved = max((wanted[n] - before[n]).abs().max().item() for n, _ in reference.named_parameters())
    if moved < 1e-3:
        problems.append(f"training did not move the parameters (max change {moved:.1e})")
    return problems


def spread(mode: Mode, model: torch.nn.Module, process_set: hvd.ProcessSet) -> list[str]:
    """The device copy must be bit-identical on every rank of the set (this is a collective of the set)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name=f"{mode.name}.same", process_set=process_set)
    off = (every - flat).abs().max().item()
    return [] if off == 0.0 else [f"the {flat.device.type} parameters differ across ranks by up to {off:.2e}"]


def run_mode(mode: Mode, device: torch.device, sets: dict[str, hvd.ProcessSet]) -> bool:
    """Train ``mode`` on both copies, compare, and print this rank's verdict; True if every rank passed."""
    process_set = sets["even"] if mode.subset else hvd.global_process_set
    problems: list[str] = []
    try:
        # Three builds of one seed (a deep copy would do too, since a copied process set is now the set itself).
        reference, initial, model = build(mode), build(mode), build(mode).to(device)
        train(mode, reference, "cpu", process_set)
        train(mode, model, "device", process_set)
        problems = differences(mode, reference, model, initial, device)
        if process_set.included():
            problems += spread(mode, model, process_set)
    except Exception as error:  # noqa: BLE001 - reported with the others below; hvdlite raises on every rank
        problems.append(f"{type(error).__name__}: {error}")
    return verdict.report("torch", mode.name, problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--modes", default=",".join(m.name for m in MODES), help="comma-separated; default: all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products in float32, as on the CPU (torch's default)
    hvd.init(process_sets="dynamic")
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    even = list(range(0, hvd.size(), 2))
    # At np=1 the even ranks are the whole job: the global set is that set (registering it twice is refused).
    sets = {"even": hvd.add_process_set(even) if len(even) < hvd.size() else hvd.global_process_set}
    chosen = {m.name: m for m in MODES}
    results = [run_mode(chosen[name], device, sets) for name in args.modes.split(",")]
    hvd.shutdown()
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()

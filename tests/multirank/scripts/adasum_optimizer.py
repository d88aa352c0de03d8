"""torch DistributedOptimizer(op=Adasum) on real ranks against a replay in one process.

Usage: adasum_optimizer.py (under hvdliterun, any -np). The replay keeps one optimizer per rank (its
state stays that rank's own, as in Horovod): at each step every replayed rank steps from the shared
parameters on its own data, and the parameters move by hvdlite.core.transport.adasum_math.reference of those changes,
parameter by parameter. Cases: SGD with momentum, Adam, backward_passes_per_step=2, and a process
set of the even ranks (ranks outside it step alone). Prints "ok adasum optimizer <case>".
"""

from __future__ import annotations

import numpy as np
import torch

import hvdlite.torch as hvd
from hvdlite.core.transport import adasum_math as adasum

STEPS, FEATURES = 4, 5


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def optimizer_for(kind: str, net: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(net.parameters(), lr=0.05)
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def data(rank: int, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(3, FEATURES, generator=generator), torch.randn(3, 1, generator=generator)


def local_gradients(net: torch.nn.Module, rank: int, step: int, passes: int) -> None:
    for micro in range(passes):
        x, y = data(rank, step, micro)
        torch.nn.functional.mse_loss(net(x), y).backward()


def replay(kind: str, ranks: list[int], passes: int) -> list[torch.Tensor]:
    """The parameters the ranks of ``ranks`` should end with (every one the same)."""
    shared = model()
    copies = [model() for _ in ranks]
    optimizers = [optimizer_for(kind, c) for c in copies]
    for step in range(STEPS):
        changes = []
        for rank, net, opt in zip(ranks, copies, optimizers, strict=True):
            net.load_state_dict(shared.state_dict())
            opt.zero_grad()
            local_gradients(net, rank, step, passes)
            opt.step()
            changes.append([(p - s).detach().double().numpy() for p, s in zip(net.parameters(), shared.parameters(),
                                                                                strict=True)])
        with torch.no_grad():
            for index, param in enumerate(shared.parameters()):
                param += torch.from_numpy(adasum.reference([c[index] for c in changes])).float()
    return [p.detach() for p in shared.parameters()]


def run_case(kind: str, passes: int, process_set: hvd.ProcessSet, rank: int) -> None:
    net = model()
    opt = hvd.DistributedOptimizer(optimizer_for(kind, net), named_parameters=net.named_parameters(), op=hvd.Adasum,
                                   backward_passes_per_step=passes, process_set=process_set)
    for step in range(STEPS):
        opt.zero_grad()
        local_gradients(net, rank, step, passes)
        opt.step()
    ranks = process_set.ranks if process_set.included() else [rank]
    for got, want in zip(net.parameters(), replay(kind, ranks, passes), strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)


def main() -> None:
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    evens = hvd.add_process_set(list(range(0, size, 2))) if size > 2 else hvd.global_process_set
    for case, (kind, passes, process_set) in {"sgd": ("sgd", 1, hvd.global_process_set),
                                              "adam": ("adam", 1, hvd.global_process_set),
                                              "backward_passes_per_step": ("sgd", 2, hvd.global_process_set),
                                              "process set": ("sgd", 1, evens)}.items():
        run_case(kind, passes, process_set, rank)
        print(f"ok adasum optimizer {case}", flush=True)
    np.testing.assert_raises(ValueError, hvd.DistributedOptimizer, optimizer_for("sgd", model()), op=hvd.Adasum,
                             compression=hvd.Compression.fp16)
    hvd.shutdown()


if __name__ == "__main__":
    main()

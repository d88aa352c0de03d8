"""Local SGD with real ranks: each rank's parameters against a replay of every rank in one process.

Usage: torch_local_sgd.py KIND[:MODE],... (KIND sgd|adam, MODE overlap|sets), each run in turn. Rank r trains a Linear(4, 1) on its own data (x = r + 1)
for STEPS steps with ``local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP``; the replay steps a copy
per rank (gradients averaged during the warm-up, local afterwards, parameters, and with Adam its
state, averaged every PERIOD local steps; with ``overlap`` (SGD only), each average is taken of the
parameters at one averaging step and lands at the next as ``params += mean - anchor``). With
``sets``, the even and the odd ranks are two process sets, each averaging only inside itself, and
every step takes two backward passes (``backward_passes_per_step=2``, on data x = r + 1 and r + 2).
Prints 'ok local sgd <kind> <mode or plain> <rank>' for each run.
"""

import copy
import sys

import torch

import hvdlite.torch as hvd

STEPS, PERIOD, WARMUP = 9, 3, 2


def make(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.05)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def loss_of(model: torch.nn.Module, rank: int, backward_pass: int = 0) -> torch.Tensor:
    x = torch.full((2, 4), float(rank + 1 + backward_pass))
    return ((model(x) - rank) ** 2).mean()


def sets_for(size: int, split: bool) -> list[list[int]]:
    """The process sets averaging happens in: the even and the odd ranks, or everyone."""
    return [list(range(0, size, 2)), list(range(1, size, 2))] if split else [list(range(size))]


def replay(kind: str, size: int, overlap: bool = False, split: bool = False) -> list[list[float]]:
    """Every rank's parameters after each step, simulated in this process."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 1) for _ in range(size)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    optimizers = [make(kind, m) for m in models]
    history, anchors = [], None
    for step in range(STEPS):
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            optimizer.zero_grad()
            for backward_pass in range(2 if split else 1):  # the passes' gradients add up
                loss_of(model, rank, backward_pass).backward()
        for ranks in sets_for(size, split):
            step_set(kind, step, [models[r] for r in ranks], [optimizers[r] for r in ranks], overlap)
        if overlap:
            local = step + 1 - WARMUP
            anchors = land_and_anchor(models, anchors) if local > 0 and local % PERIOD == 0 else anchors
        history.append([torch.cat([p.detach().flatten() for p in m.parameters()]).tolist() for m in models])
    return history


def step_set(kind: str, step: int, models: list, optimizers: list, overlap: bool = False, period: int = PERIOD,
             warmup: int = WARMUP) -> None:
    """One step of the ranks of one set (gradients computed): averaged gradients in the warm-up,
    then local steps with the parameters (and Adam's state) averaged every ``period`` steps."""
    if step < warmup:  # synchronous: every rank steps on the averaged gradient
        for params in zip(*(m.parameters() for m in models), strict=True):
            mean = torch.stack([p.grad for p in params]).mean(0)
            for p in params:
                p.grad = mean.clone()
    for optimizer in optimizers:
        optimizer.step()
    local = step + 1 - warmup
    if local > 0 and local % period == 0 and not overlap:
        _average([list(m.parameters()) for m in models])
        if kind == "adam":
            _average([[v for p in o.param_groups[0]["params"] for _, v in sorted(o.state[p].items())]
                      for o in optimizers])


def land_and_anchor(models: list[torch.nn.Module], anchors: list[list[torch.Tensor]] | None) -> list:
    """Overlapped averaging: the previous anchors' mean lands (params += mean - anchor), new anchors are taken."""
    with torch.no_grad():
        if anchors is not None:
            for index, params in enumerate(zip(*(m.parameters() for m in models), strict=True)):
                mean = torch.stack([a[index] for a in anchors]).mean(0)
                for param, own in zip(params, anchors, strict=True):
                    param.add_(mean - own[index])
        return [[p.detach().clone() for p in m.parameters()] for m in models]


def _average(per_rank: list[list[torch.Tensor]]) -> None:
    with torch.no_grad():
        for tensors in zip(*per_rank, strict=True):
            mean = torch.stack([t.float() for t in tensors]).mean(0)
            for t in tensors:
                t.copy_(mean.to(t.dtype))


def check(kind: str, mode: str, sets: list[hvd.ProcessSet], rank: int, size: int) -> None:
    """One run: ``kind`` (sgd|adam) with ``mode`` ("", overlap or sets) against its replay."""
    overlap, split = mode == "overlap", mode == "sets"
    mine = next(s for s in sets if s.included()) if split else hvd.global_process_set
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    base = make(kind, model)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), local_sgd_period=PERIOD,
                                         local_sgd_warmup_steps=WARMUP, local_sgd_average_state=kind == "adam",
                                         local_sgd_overlap=overlap, process_set=mine,
                                         backward_passes_per_step=2 if split else 1)
    expected = replay(kind, size, overlap, split)
    for step in range(STEPS):
        optimizer.zero_grad()
        for backward_pass in range(2 if split else 1):
            loss_of(model, rank, backward_pass).backward()
        optimizer.step()
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        want = torch.tensor(expected[step][rank])
        assert torch.allclose(params, want, atol=1e-6), (rank, step, params, want)
        every = hvd.allgather_object(params.tolist(), process_set=mine)
        in_step = all(e == every[0] for e in every)
        local = step + 1 - WARMUP
        # Equal in the set during the warm-up and right after an average (never, when averages land late).
        assert in_step == (local <= 0 or (local % PERIOD == 0 and not overlap) or mine.size() == 1), (rank, step, every)
    landed = (STEPS - WARMUP) // PERIOD - (1 if overlap else 0)  # the last overlapped average is in flight
    assert optimizer._hvdlite_reducer.local_sgd.averages == landed
    copy.deepcopy(optimizer.state_dict())  # the optimizer is still a plain torch optimizer
    print(f"ok local sgd {kind} {mode or 'plain'} {rank}", flush=True)


def main() -> None:
    torch.set_num_threads(1)
    from mpi4py import MPI

    sets = [hvd.ProcessSet(ranks) for ranks in sets_for(MPI.COMM_WORLD.Get_size(), True)]
    hvd.init(process_sets=sets)
    for spec in sys.argv[1].split(","):  # one job for several runs, one after the other
        kind, _, mode = spec.partition(":")
        check(kind, mode, sets, hvd.rank(), hvd.size())
    hvd.shutdown()


if __name__ == "__main__":
    main()

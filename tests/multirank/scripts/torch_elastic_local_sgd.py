"""Local SGD in an elastic job: rank 2 of 3 is SIGKILLed as the first average is due; the survivors
notice when that average fails, restore their last commit, take rank 0's model (``TorchState.sync``)
and start the schedule over in the new world: WARMUP synchronous steps, then averages every PERIOD local steps
among the survivors only. Each survivor checks its parameters at the end against a replay, in this
process, of the new world from the parameters it resumed with. With ``overlap``
(``local_sgd_overlap=True``) that average is in flight on its helper thread, with a dead peer,
when the world changes: it is dropped, and the new world's averages land one period late.

Run with ``hvdliterun -np 3 --min-np 2 ... [overlap]``. Prints 'resumed at <step>' and 'ok elastic local sgd'.
"""

import os
import signal
import sys

import torch
from torch_local_sgd import land_and_anchor, loss_of, step_set

import hvdlite.torch as hvd

STEPS, KILL_AT, VICTIM = 12, 3, 2
PERIOD, WARMUP, LR = 3, 1, 0.05


def replay(start: list[torch.Tensor], size: int, steps: int, overlap: bool) -> list[list[torch.Tensor]]:
    """Every rank's parameters after ``steps`` steps of a new world that starts from ``start``."""
    models = [torch.nn.Linear(4, 1) for _ in range(size)]
    with torch.no_grad():
        for model in models:
            for param, value in zip(model.parameters(), start, strict=True):
                param.copy_(value)
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    anchors = None  # nothing in flight: what was, belonged to the old world
    for step in range(steps):  # the warm-up and the period count start over
        for rank, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            optimizer.zero_grad()
            loss_of(model, rank).backward()
        step_set("sgd", step, models, optimizers, overlap, period=PERIOD, warmup=WARMUP)
        local = step + 1 - WARMUP
        if overlap and local > 0 and local % PERIOD == 0:
            anchors = land_and_anchor(models, anchors)
    return [[p.detach() for p in m.parameters()] for m in models]


def main() -> None:
    overlap = sys.argv[1:] == ["overlap"]
    torch.set_num_threads(1)
    hvd.init()
    world_rank, pid, first_size = hvd.rank(), os.getpid(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters(),
                                         local_sgd_period=PERIOD, local_sgd_warmup_steps=WARMUP,
                                         local_sgd_overlap=overlap)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    resumed: dict = {}

    @hvd.elastic.run
    def train(state):
        if hvd.size() < first_size and not resumed:  # entered again, in the new world, after the sync
            resumed.update(step=state.step, params=[p.detach().clone() for p in model.parameters()])
        for step in range(state.step, STEPS):
            if world_rank == VICTIM and step == KILL_AT:
                os.kill(pid, signal.SIGKILL)
            optimizer.zero_grad()
            loss_of(model, hvd.rank()).backward()
            optimizer.step()
            state.step = step + 1
            state.commit()

    train(state)
    assert hvd.size() == first_size - 1 and resumed, (hvd.size(), resumed)
    starts = hvd.allgather_object([p.tolist() for p in resumed["params"]])
    assert all(s == starts[0] for s in starts), starts  # every survivor resumed with rank 0's model
    assert resumed["step"] >= KILL_AT, resumed  # local steps after the kill need no peer
    steps = STEPS - resumed["step"]
    expected = replay(resumed["params"], hvd.size(), steps, overlap)[hvd.rank()]
    for param, want in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(param, want, atol=1e-6), (hvd.rank(), param, want)
    averages = max(0, steps - WARMUP) // PERIOD
    averages -= 1 if overlap and averages else 0  # the last overlapped average is still in flight
    assert optimizer._hvdlite_reducer.local_sgd.averages == averages, (optimizer._hvdlite_reducer.local_sgd.averages,
                                                                       averages)
    print(f"resumed at {resumed['step']}", flush=True)
    hvd.shutdown()
    print("ok elastic local sgd", flush=True)


if __name__ == "__main__":
    main()

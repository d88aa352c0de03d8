"""A DiLoCo checkpoint saved at one number of ranks resumes at another.

Usage: torch_diloco_resize.py save|load PATH. ``save`` (np=4, two groups of two, a DistributedOptimizer
inside each): SAVED_AT steps, so that the outer optimizer has stepped and holds momentum, then rank 0
saves the model, the inner optimizer and DiLoCo's state. ``load`` (np=2, groups of one, DiLoCo over the
whole job): every rank loads that file, checks that DiLoCo holds the saved global parameters, outer
state and step count, trains to step STEPS (one more sync) and checks its parameters against a replay
in one process that starts both groups from the file. Prints 'ok diloco resize MODE RANK'.
"""

import copy
import sys

import torch
from diloco_common import make_sets
from torch_diloco import SYNC_EVERY, inner_of, inner_step, loss_of, make_model, outer_of, outer_step

import hvdlite.torch as hvd

SAVED_AT, STEPS = 6, 12


def save(path: str) -> None:
    sets = make_sets(hvd, 4, 2)  # run at np=4
    model = make_model()
    inner = hvd.DistributedOptimizer(inner_of(model.parameters()), named_parameters=model.named_parameters(),
                                     process_set=sets["group"][hvd.rank() // 2])
    diloco = hvd.DiLoCo(model, inner, outer_of(model.parameters()), sync_every=SYNC_EVERY,
                        process_set=sets["cross"][hvd.rank() % 2])
    for step in range(SAVED_AT):
        diloco.zero_grad()
        loss_of(model, hvd.rank(), step).backward()
        diloco.step()
    checkpoint = {"model": model.state_dict(), "inner": inner.state_dict(), "diloco": diloco.state_dict()}
    if hvd.rank() == 0:
        torch.save(checkpoint, path)


def replay(checkpoint: dict, size: int) -> list[torch.nn.Module]:
    """Every group of one's model at STEPS, all starting from ``checkpoint``."""
    models, inners = [], []
    for _ in range(size):
        models.append(make_model())
        models[-1].load_state_dict(checkpoint["model"])
        inners.append(inner_of(models[-1].parameters()))
        inners[-1].load_state_dict(copy.deepcopy(checkpoint["inner"]))
    global_model = make_model()
    global_model.load_state_dict(checkpoint["diloco"]["global"])
    outer = outer_of(global_model.parameters())
    outer.load_state_dict(copy.deepcopy(checkpoint["diloco"]["outer_optimizer"]))
    for step in range(SAVED_AT, STEPS):
        for rank, (model, optimizer) in enumerate(zip(models, inners, strict=True)):
            inner_step(model, optimizer, range(rank, rank + 1), step)
        if (step + 1) % SYNC_EVERY == 0:
            outer_step(global_model, outer, models)
    return models


def load(path: str) -> None:
    hvd.init()
    checkpoint = torch.load(path)
    model = make_model()
    inner = inner_of(model.parameters())
    diloco = hvd.DiLoCo(model, inner, outer_of(model.parameters()), sync_every=SYNC_EVERY)
    loaded = copy.deepcopy(checkpoint)  # torch's optimizers keep the loaded tensors and change them in place
    model.load_state_dict(loaded["model"])
    inner.load_state_dict(loaded["inner"])
    diloco.load_state_dict(loaded["diloco"])
    saved = checkpoint["diloco"]
    assert diloco.inner_steps == SAVED_AT and diloco.syncs == SAVED_AT // SYNC_EVERY, (diloco.inner_steps, diloco.syncs)
    for name, value in zip(diloco.names, diloco.global_params, strict=True):
        assert torch.equal(value, saved["global"][name]), name
    momentum = [state["momentum_buffer"] for state in diloco.outer_optimizer.state_dict()["state"].values()]
    assert momentum and all(m.abs().sum() > 0 for m in momentum), momentum  # the saved outer step's momentum
    for step in range(SAVED_AT, STEPS):
        diloco.zero_grad()
        loss_of(model, hvd.rank(), step).backward()
        diloco.step()
    expected = replay(checkpoint, hvd.size())[hvd.rank()]
    for (name, param), want in zip(model.named_parameters(), expected.parameters(), strict=True):
        assert torch.allclose(param, want, atol=1e-5), (hvd.rank(), name, param, want)


def main() -> None:
    torch.set_num_threads(1)
    mode, path = sys.argv[1:3]
    save(path) if mode == "save" else load(path)
    print(f"ok diloco resize {mode} {hvd.rank()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

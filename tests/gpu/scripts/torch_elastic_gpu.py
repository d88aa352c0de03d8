"""Elastic training on GPU tensors: launch rank 2 of 3 SIGKILLs itself mid-training; the survivors
re-form the job inside ``@hvd.elastic.run``, restore the last commit on the GPU and finish at size 2.

Usage: ``hvdliterun -np 3 --min-np 2 python tests/gpu/scripts/torch_elastic_gpu.py [--device cuda|cpu]``
(``--device cpu`` checks the script on a machine without a GPU). The model is a Linear(4, 1) and
SGD with momentum on the device; after the job re-forms, the parameters, the momentum buffers and
the state's step must still be on the device, every survivor's weights must be bit-identical, and
they must equal a replay of the whole run in one process (the gradients averaged over 3 ranks up to
the kill, over the 2 survivors afterwards; nothing lost or applied twice). Each survivor prints
``new rank <r> size 2`` and ``ok torch elastic gpu``.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch

import hvdlite.torch as hvd

STEPS, KILL_AT, VICTIM, LR, MOMENTUM = 8, 3, 2, 0.05, 0.5


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def loss_of(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s loss at ``step`` (its rank in the world of that step)."""
    device = next(model.parameters()).device
    x = (torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8 + rank + 0.1 * step).to(device)
    return ((model(x) - rank) ** 2).mean()


def replay(first_size: int, final_size: int) -> torch.Tensor:
    """The weights one process gets by averaging every rank's gradients itself, step by step."""
    model, optimizer = make()
    for step in range(STEPS):
        size = first_size if step < KILL_AT else final_size
        optimizer.zero_grad()
        grads = []
        for rank in range(size):
            model.zero_grad()
            loss_of(model, rank, step).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for param, *each in zip(model.parameters(), *grads, strict=True):
            param.grad = sum(each) / size
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    device_kind = parser.parse_args().device
    torch.set_num_threads(1)
    hvd.init()
    launch_rank, first_size = hvd.rank(), hvd.size()
    if device_kind == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device(device_kind, torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    model, optimizer = make()
    model.to(device)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for step in range(state.step, STEPS):
            if launch_rank == VICTIM and step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            loss_of(model, hvd.rank(), step).backward()
            optimizer.step()
            state.step = step + 1
            state.commit()

    train(state)
    assert hvd.size() == first_size - 1 and state.step == STEPS, (hvd.size(), state.step)
    momenta = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    for tensor in [*model.parameters(), *momenta]:
        assert tensor.device == device, f"after the reset a tensor is on {tensor.device}, not {device}"
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name="elastic.gpu.same")
    assert every.device == device and torch.equal(every, flat.expand_as(every)), every
    want = replay(first_size, first_size - 1)
    torch.testing.assert_close(flat.cpu(), want, rtol=1e-4, atol=1e-5)
    print(f"new rank {hvd.rank()} size {hvd.size()}", flush=True)
    hvd.shutdown()
    print("ok torch elastic gpu", flush=True)


if __name__ == "__main__":
    main()

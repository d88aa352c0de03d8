"""A Hugging Face Accelerate training script. Usage: accelerate_train.py SETUP OUT

SETUP picks how the script starts Accelerate:
- ``plain``: ``Accelerator()``, no hvdlite line (run under ``hvdliterun --torch-backend hvdlite``);
- ``cpu``: ``Accelerator(cpu=True)``, no hvdlite line (the reference under torchrun, on gloo);
- ``named``: ``import hvdlite.torch`` and ``PartialState(backend="hvdlite")``, then ``Accelerator()``:
  before hvdlite corrected Accelerate's choice, each rank trained alone here, silently;
- ``initialized``: ``hvd.init()`` only, then ``Accelerator()`` (no backend named, no torchrun mode);
- ``single``: one process on the whole batch.

Trains a small model for a few steps with Accelerate's ``prepare``, ``backward``, ``clip_grad_norm_``
and ``gather``, saves and loads its state, and on the main process saves the parameters to OUT.
"""

import sys

import torch

GLOBAL_BATCH, STEPS = 12, 4


def start(setup):
    if setup == "named":
        from accelerate import PartialState

        import hvdlite.torch  # noqa: F401  (registers the backend; hvdlite starts when Accelerate asks)
        PartialState(backend="hvdlite")
    if setup == "initialized":
        import hvdlite.torch as hvd
        hvd.init()
    from accelerate import Accelerator
    return Accelerator(cpu=setup in ("cpu", "single"))


def loader(world):
    generator = torch.Generator().manual_seed(7)
    data = torch.randn(GLOBAL_BATCH * STEPS, 6, generator=generator)
    target = torch.randn(GLOBAL_BATCH * STEPS, 3, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target), batch_size=GLOBAL_BATCH // world)


def train(accelerator):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, batches = accelerator.prepare(model, optimizer, loader(accelerator.num_processes))
    losses = []
    for data, target in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        losses.append(loss.detach())
    return model, optimizer, accelerator.gather(torch.stack(losses))


def save_and_load(accelerator, model, folder):
    """save_state, spoil the parameters, load_state: each rank must get the saved ones back."""
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()  # the main process writes the files every rank loads
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(folder)
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True)), "load_state did not restore"


def main(setup, out):
    torch.set_num_threads(1)
    accelerator = start(setup)
    model, _, losses = train(accelerator)
    world = accelerator.num_processes
    assert losses.shape == (STEPS * world,), losses.shape  # every rank's losses, from every rank
    save_and_load(accelerator, model, out + ".state")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), out)
    print(f"accelerate ok {accelerator.state.distributed_type.name} {accelerator.state.backend} "
          f"rank {accelerator.process_index} of {world}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

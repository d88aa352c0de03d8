"""What the fully_shard scripts share: the model, the data, this rank's slice of it, and the check
against the one-process reference. FULLY_SHARDED_DEVICE=cuda puts models and data on the GPU."""

import os

import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
STEPS, BATCH = 4, 6
DEVICE = os.environ.get("FULLY_SHARDED_DEVICE", "cpu")  # tests/gpu runs the cases with "cuda"
TOLERANCE_BF16 = 1e-5


def build(seed: int = 0, width: int = 7, blocks: int = 3, device: str | None = None) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
              for _ in range(blocks)]
    with torch.device(device or DEVICE):
        return torch.nn.Sequential(*layers, torch.nn.LayerNorm(width), torch.nn.Linear(width, 3))


def shard(model: torch.nn.Module, **options) -> torch.nn.Module:
    for block in list(model)[:-2]:
        hvd.fully_shard(block, **options)
    return hvd.fully_shard(model, **options)


def batches(width: int = 7):
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(BATCH * hvd.size(), width, generator=generator)
        yield x.to(DEVICE), torch.randn(BATCH * hvd.size(), 3, generator=generator).to(DEVICE)


def mine(tensor: torch.Tensor) -> torch.Tensor:
    return tensor[hvd.rank() * BATCH:(hvd.rank() + 1) * BATCH]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x).float(), y)  # .float(): mixed precision's bf16 outputs


def assert_matches(sharded: torch.nn.Module, reference: torch.nn.Module, case: str, tolerance: float = 1e-5) -> None:
    full = hvd.full_state_dict(sharded, rank0_only=False)
    expected = reference.state_dict()
    assert list(full) == list(expected), (case, list(full), list(expected))
    for key, value in expected.items():
        error = (full[key] - value.cpu()).abs().max().item()
        assert error <= tolerance, f"{case}: {key} differs from the one-process reference by {error}"


def mine_of(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    return tensor[rank * BATCH:(rank + 1) * BATCH]


def step_both(reference: torch.nn.Module, model: torch.nn.Module, optimizers: tuple, x: torch.Tensor,
              y: torch.Tensor) -> None:
    """One step of each: the reference on the whole batch, the sharded model on this rank's slice."""
    for optimizer in optimizers:
        optimizer.zero_grad()
    loss_of(reference, x, y).backward()
    loss_of(model, mine(x), mine(y)).backward()
    for optimizer in optimizers:
        optimizer.step()

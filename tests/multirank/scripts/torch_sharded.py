"""Sharded optimizer state with real ranks, against an unsharded DistributedOptimizer in the same job.

Usage: torch_sharded.py sgd|adam. Two identical models train on rank-dependent data for STEPS
steps, one with ``shard_optimizer_state=True`` and one without; run with a tiny
HVDLITE_BUCKET_BYTES so the parameters span several buckets whose lengths do not divide by the
number of ranks. Checks, every step: equal parameters; each rank's optimizer state holds about 1/N
of the elements; the model's full gradients were freed. Then: the consolidated state dict equals
the unsharded one, it loads into a fresh sharded optimizer that steps like the unsharded one, and
LBFGS is refused. Prints 'ok torch sharded <rank>'.
"""

import copy
import sys

import torch

import hvdlite.torch as hvd

STEPS = 5


def make(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5, weight_decay=0.01)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    optimizer.zero_grad()
    x = torch.linspace(-1, 1, 14).reshape(2, 7) * (rank + 1) + step
    ((model(x) - rank) ** 2).mean().backward()
    optimizer.step()


def state_elements(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0)


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{what}: {a} != {b}"


def check_checkpoint(kind: str, sharded: torch.optim.Optimizer, plain: torch.optim.Optimizer,
                     model: torch.nn.Module, reference: torch.nn.Module) -> None:
    sharded.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        full, expected = sharded.state_dict(), plain.state_dict()
        assert full["param_groups"] == expected["param_groups"], (full["param_groups"], expected["param_groups"])
        assert full["state"].keys() == expected["state"].keys()
        for index, entry in expected["state"].items():
            for key, value in entry.items():
                assert_close(torch.as_tensor(full["state"][index][key]), torch.as_tensor(value), f"state {index} {key}")
    else:
        try:
            sharded.state_dict()
            raise AssertionError("state_dict() without consolidation on this rank should raise")
        except RuntimeError as exc:
            assert "consolidate_state_dict" in str(exc), exc
    # A full checkpoint loads into a fresh sharded optimizer, which then steps like the unsharded one.
    restored_model = copy.deepcopy(model)
    restored = hvd.DistributedOptimizer(make(kind, restored_model), named_parameters=restored_model.named_parameters(),
                                        shard_optimizer_state=True)
    restored.load_state_dict(plain.state_dict())
    train_step(restored_model, restored, hvd.rank(), STEPS)
    train_step(reference, plain, hvd.rank(), STEPS)
    for a, b in zip(restored_model.parameters(), reference.parameters(), strict=True):
        assert_close(a, b, "after loading a full checkpoint")


def main() -> None:
    kind = sys.argv[1]
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    reference = copy.deepcopy(model)
    sharded = hvd.DistributedOptimizer(make(kind, model), named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True)
    plain = hvd.DistributedOptimizer(make(kind, reference), named_parameters=reference.named_parameters())
    total = sum(p.numel() for p in model.parameters())
    buckets = len(sharded._hvdlite_reducer.all_buckets)
    assert buckets > 1, f"the test needs several buckets, got {buckets}"
    for step in range(STEPS):
        train_step(model, sharded, rank, step)
        train_step(reference, plain, rank, step)
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert_close(a, b, f"step {step}")
        assert all(p.grad is None for p in model.parameters()), "full gradients outlived their bucket"
        per_rank, full = state_elements(sharded), state_elements(plain)
        # the bound: 1/N of the unsharded state plus, per bucket and per state entry, under N elements of padding
        entries = full // total
        assert per_rank <= full / size + entries * buckets * size, (per_rank, full, size)
        assert per_rank < full or size == 1, (per_rank, full)
    check_checkpoint(kind, sharded, plain, model, reference)
    try:
        hvd.DistributedOptimizer(torch.optim.LBFGS(copy.deepcopy(model).parameters()), shard_optimizer_state=True)
        raise AssertionError("LBFGS should be refused")
    except ValueError as exc:
        assert "elementwise" in str(exc) and "LBFGS" in str(exc), exc
    print(f"ok torch sharded {rank}", flush=True)


if __name__ == "__main__":
    main()

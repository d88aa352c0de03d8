"""Convergence on real data: the UCI handwritten digits (data/digits.csv.gz), one MLP trained per mode, all in one job.

Usage: torch_digits.py. Each rank trains on its own stride of the training split (70% of the 1797
8x8 digits; the split is the same on every rank); every mode starts from the same weights and
sees the same samples in the same order for EPOCHS epochs: synchronous DistributedOptimizer,
sharded optimizer state, local SGD (K=4, 8, and 8 with overlapped averages) and PowerSGD (rank 2, 4). Rank 0 prints each mode's
test accuracy ('accuracy <mode> <percent>'); every rank prints 'ok digits <rank>'.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

import hvdlite.torch as hvd

# 10 epochs (390 steps at np=2, 260 at np=3; warm-ups end at step 20): sync reaches 96.67 / 95.74, far over
# the test's 90, and every mode is within 0.37 / 0.55 points of it at np=2 / 3 (measured 2026-11-29; at
# 15 epochs within 0.4, at 25 within 0.8). Seeded and one thread per rank: the same figures every run.
EPOCHS, BATCH, WARMUP = 10, 16, 20
DIGITS = Path(__file__).parent / "data" / "digits.csv.gz"

MODES = {
    "sync": {},
    "sharded": {"shard_optimizer_state": True},
    "local4": {"local_sgd_period": 4, "local_sgd_warmup_steps": WARMUP},
    "local8": {"local_sgd_period": 8, "local_sgd_warmup_steps": WARMUP},
    "local8overlap": {"local_sgd_period": 8, "local_sgd_warmup_steps": WARMUP, "local_sgd_overlap": True},
    "powersgd2": {"compression": ("powersgd", 2)},
    "powersgd4": {"compression": ("powersgd", 4)},
}


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # 64 pixels (0..16) and the label per row: the file scikit-learn's load_digits reads, copied here so
    # the tests need no scikit-learn (Keras imports it whenever it is installed: 0.6 s per TF rank).
    table = np.loadtxt(DIGITS, delimiter=",", dtype=np.float32)
    x = torch.from_numpy(table[:, :-1]) / 16.0
    y = torch.from_numpy(table[:, -1].astype(np.int64))
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    cut = int(0.7 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def fit(train_x: torch.Tensor, train_y: torch.Tensor, epochs: int, lr: float,
        **options: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The MLP trained on this rank's stride with ``DistributedOptimizer(SGD(lr), **options)``."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                         named_parameters=model.named_parameters(), **options)
    run_epochs(model, optimizer, train_x, train_y, epochs)
    return model, optimizer


def run_epochs(model: torch.nn.Module, optimizer: Any, train_x: torch.Tensor, train_y: torch.Tensor,
               epochs: int) -> None:
    """Train on this rank's stride, the same number of batches on every rank, in a seeded order."""
    mine_x, mine_y = train_x[hvd.rank()::hvd.size()], train_y[hvd.rank()::hvd.size()]
    steps = len(mine_x) // BATCH  # the same on every rank: the stride leaves at most one sample more
    steps = min(hvd.allgather_object(steps))
    for epoch in range(epochs):
        order = torch.randperm(len(mine_x), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            batch = order[step * BATCH:(step + 1) * BATCH]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(mine_x[batch]), mine_y[batch]).backward()
            optimizer.step()


def report(mode: str, model: torch.nn.Module, test_x: torch.Tensor, test_y: torch.Tensor) -> None:
    """Check every rank's model scores the same; rank 0 prints 'accuracy <mode> <percent>'."""
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item() * 100
    same = hvd.allgather_object(accuracy)
    assert len(set(same)) == 1, f"{mode}: the ranks' models differ: accuracies {same}"
    if hvd.rank() == 0:
        print(f"accuracy {mode} {accuracy:.2f}", flush=True)


def train(mode: str, train_x: torch.Tensor, train_y: torch.Tensor) -> torch.nn.Module:
    options = dict(MODES[mode])
    if "compression" in options:
        options["compression"] = hvd.Compression.powersgd(rank=options["compression"][1], start_step=WARMUP)
    model, optimizer = fit(train_x, train_y, EPOCHS, 0.05, **options)
    if mode.startswith("local"):  # end on an average, as a local-SGD run would before evaluating
        optimizer.average_parameters()
    return model


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    train_x, train_y, test_x, test_y = data()
    for mode in MODES:
        report(mode, train(mode, train_x, train_y), test_x, test_y)
    print(f"ok digits {hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()

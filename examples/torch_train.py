"""A complete data-parallel PyTorch training script with hvdlite.torch, ready to copy.

Run:  hvdliterun -np 2 python examples/torch_train.py [--epochs 5] [--checkpoint-dir ckpt]

It shows the pieces a real job needs: each rank reads its own shard of the data
(``DistributedSampler``), the learning rate is scaled by the number of ranks and warmed up
linearly, gradients are averaged by ``hvd.DistributedOptimizer``, every rank starts from rank 0's
weights and optimizer state, rank 0 writes checkpoints and a restarted job resumes from the
latest one, and metrics are averaged across ranks before rank 0 prints them.

The data is synthetic and deterministic: points labelled by a fixed random linear "teacher", so
the model can reach high accuracy and the script needs no download.
"""

from __future__ import annotations

import argparse
import os
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvdlite.torch as hvd

FEATURES, CLASSES = 20, 4
CHECKPOINT = re.compile(r"checkpoint-(\d+)\.pt$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5, help="total epochs (a resumed job stops here too)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--warmup-epochs", type=float, default=1.0, help="epochs to ramp the learning rate up")
    parser.add_argument("--checkpoint-dir", default=None, help="write checkpoints here and resume from them")
    parser.add_argument("--train-size", type=int, default=8192, help="synthetic training examples")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def synthetic_dataset(size: int, seed: int) -> TensorDataset:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    inputs = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(inputs, (inputs @ teacher).argmax(dim=1))


def loader(dataset: TensorDataset, batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    # Each rank sees a disjoint 1/size() of the data; the sampler pads so every rank gets as many batches.
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def adjust_learning_rate(optimizer: torch.optim.Optimizer, args: argparse.Namespace, epoch: float) -> float:
    """Ramp linearly from ``lr`` to ``lr * size()`` over the warmup epochs, then hold.

    size() ranks average gradients over a size()-times larger batch, which takes a size()-times
    larger learning rate; jumping there at step 0 tends to diverge, so it is reached gradually.
    """
    if args.warmup_epochs > 0 and epoch < args.warmup_epochs:
        scale = 1 + epoch * (hvd.size() - 1) / args.warmup_epochs
    else:
        scale = hvd.size()
    lr = args.lr * scale
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def latest_checkpoint(directory: str | None) -> int:
    """The highest epoch with a checkpoint in ``directory`` (0 if none). Only rank 0 looks."""
    if not directory or not os.path.isdir(directory):
        return 0
    epochs = [int(m.group(1)) for m in map(CHECKPOINT.match, os.listdir(directory)) if m]
    return max(epochs, default=0)


def checkpoint_path(directory: str, epoch: int) -> str:
    return os.path.join(directory, f"checkpoint-{epoch}.pt")


def save_checkpoint(directory: str, epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    os.makedirs(directory, exist_ok=True)
    path = checkpoint_path(directory, epoch)
    # Write then rename: a job killed mid-write must not leave a truncated file that resume would pick.
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def restore(args: argparse.Namespace, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the latest checkpoint on rank 0 and give every rank its state; returns the epoch to start at."""
    # Only rank 0 reads the directory (it need not be on a shared file system); the others learn
    # the epoch from it, so every rank runs the same number of epochs.
    found = latest_checkpoint(args.checkpoint_dir) if hvd.rank() == 0 else 0
    start_epoch = hvd.broadcast_object(found, root_rank=0, name="resume_from_epoch")
    if start_epoch > 0 and hvd.rank() == 0:
        state = torch.load(checkpoint_path(args.checkpoint_dir, start_epoch))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    # Fresh or resumed, every rank now starts from rank 0's weights and momentum buffers.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return start_epoch


def averaged(value: float, name: str) -> float:
    """``value`` averaged over ranks (each rank's number covers an equal share of the data)."""
    return hvd.allreduce(torch.tensor(value), name=name, op=hvd.Average).item()


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, data: DataLoader, epoch: int,
                args: argparse.Namespace) -> tuple[float, float, float]:
    """One epoch on this rank's shard; returns (loss, accuracy) averaged over ranks, and the last lr."""
    model.train()
    data.sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
    total_loss, correct, seen, lr = 0.0, 0, 0, args.lr
    for batch, (inputs, labels) in enumerate(data):
        lr = adjust_learning_rate(optimizer, args, epoch + batch / len(data))
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()  # waits for the gradient averages started during backward
        total_loss += loss.item() * len(labels)
        correct += (logits.argmax(dim=1) == labels).sum().item()
        seen += len(labels)
    return averaged(total_loss / seen, "train.loss"), averaged(correct / seen, "train.accuracy"), lr


@torch.no_grad()
def evaluate(model: nn.Module, data: DataLoader) -> tuple[float, float]:
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    for inputs, labels in data:
        logits = model(inputs)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
        seen += len(labels)
    return averaged(total_loss / seen, "val.loss"), averaged(correct / seen, "val.accuracy")


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # ranks share the machine's cores; more threads per rank oversubscribe them
    torch.manual_seed(args.seed)  # rank 0's initial weights are broadcast, so this only makes runs repeatable
    train_data = loader(synthetic_dataset(args.train_size, args.seed), args.batch_size, True, args.seed)
    val_data = loader(synthetic_dataset(args.train_size // 4, args.seed + 1), args.batch_size, False, args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    start_epoch = restore(args, model, optimizer)
    if hvd.rank() == 0:
        resumed = f", resumed from epoch {start_epoch}" if start_epoch else ""
        print(f"{hvd.size()} ranks, {len(train_data)} batches of {args.batch_size} per rank per epoch{resumed}")
    for epoch in range(start_epoch, args.epochs):
        loss, accuracy, lr = train_epoch(model, optimizer, train_data, epoch, args)
        val_loss, val_accuracy = evaluate(model, val_data)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: lr {lr:.3f} train loss {loss:.4f} acc {accuracy:.3f} "
                  f"| val loss {val_loss:.4f} acc {val_accuracy:.3f}", flush=True)
            if args.checkpoint_dir:
                save_checkpoint(args.checkpoint_dir, epoch + 1, model, optimizer)


if __name__ == "__main__":
    main()

"""Elastic data-parallel PyTorch training with hvdlite.torch: survives ranks dying, hosts coming and going.

Run (one host; the job goes on while at least 2 of the 3 ranks are alive):

    hvdliterun -np 3 --min-np 2 python examples/elastic/torch_elastic.py [--epochs 3] [--batches-per-commit 10]

Run on whatever hosts a discovery script lists (``host:slots`` lines, re-read every second; the job
grows into new slots and lets go of ranks whose host left the list, at its next commit):

    hvdliterun --min-np 2 --max-np 4 --host-discovery-script ./examples/elastic/hosts.sh \\
        python examples/elastic/torch_elastic.py

What survives a failure: ``hvd.elastic.TorchState`` commits the model, the optimizer (momentum
included), the ``ElasticSampler`` (how far into the epoch the job got) and the epoch and batch
counters every ``--batches-per-commit`` batches and at each epoch's end. When a rank dies, the
survivors restore the last commit, re-form the job without it, rescale the learning rate to the new
size (the reset callback), take rank 0's state and go on from that commit: the samples the epoch
has not processed yet are re-sharded over the ranks left, none skipped or seen twice. The batches
since the last commit are lost and trained again.

The data is synthetic and deterministic (points labelled by a fixed random linear "teacher").
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdlite.torch as hvd

FEATURES, CLASSES = 20, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="epochs to train, across failures")
    parser.add_argument("--batches-per-commit", type=int, default=10, help="commit the state every N batches")
    parser.add_argument("--batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate of one rank; scaled by the rank count")
    parser.add_argument("--train-size", type=int, default=4096, help="synthetic training examples")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def synthetic_dataset(size: int, seed: int) -> TensorDataset:
    """Gaussian points labelled by the argmax of a fixed linear teacher: the same on every rank."""
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    inputs = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(inputs, (inputs @ teacher).argmax(dim=1))


def train_epoch(state: hvd.elastic.TorchState, data: DataLoader, batches_per_commit: int) -> float:
    """The rest of the current epoch on this rank's shard; returns the loss averaged over ranks."""
    state.model.train()
    total, seen = 0.0, 0
    for inputs, labels in data:  # the sampler yields only what the epoch has not processed yet
        state.optimizer.zero_grad()
        loss = F.cross_entropy(state.model(inputs), labels)
        loss.backward()
        state.optimizer.step()
        state.sampler.record_batch(state.batch, len(labels))
        state.batch += 1
        total, seen = total + loss.item() * len(labels), seen + len(labels)
        if state.batch % batches_per_commit == 0:
            state.commit()  # a failure from here on resumes at this batch
    return hvd.allreduce(torch.tensor(total / max(seen, 1)), name="train.loss", op=hvd.Average).item()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)  # ranks share the machine's cores; more threads per rank oversubscribe them
    torch.manual_seed(args.seed)  # rank 0's initial weights reach every rank at the first sync
    dataset = synthetic_dataset(args.train_size, args.seed)
    sampler = hvd.elastic.ElasticSampler(dataset, seed=args.seed)
    data = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    def on_reset() -> None:
        """The world changed size: keep the learning rate proportional to the global batch."""
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"reset: the job goes on with {hvd.size()} ranks", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            loss = train_epoch(state, data, args.batches_per_commit)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}/{args.epochs}: {hvd.size()} ranks, train loss {loss:.4f}", flush=True)
            state.epoch, state.batch = state.epoch + 1, 0
            state.sampler.set_epoch(state.epoch)  # the next epoch starts at its first sample
            state.commit()

    train(state)
    with torch.no_grad():  # every rank holds the same weights: the same loss everywhere
        inputs, labels = dataset.tensors
        loss = F.cross_entropy(model(inputs), labels).item()
    print(f"rank {hvd.rank()} of {hvd.size()}: done, loss {loss:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""Data-parallel PyTorch training inside Spark with ``hvdlite.spark.run``, ready to copy.

Run:  pip install -e ".[torch,spark]"  (and a Java runtime, 17 or newer)
      python examples/spark_train.py [--master local-cluster[2,1,1024]] [--num-proc 2]

The driver starts (or joins) a Spark session; ``hvdlite.spark.run`` runs ``train`` as one MPI rank
per Spark task (barrier mode), and returns each rank's result to the driver, in rank order. Inside
``train`` the code is the usual hvdlite script: init, shard the data by rank, DistributedOptimizer,
broadcast the starting weights. A rank that raises makes ``run`` raise on the driver with that
rank's traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

FEATURES, CLASSES = 20, 4


def train(epochs: int, lr: float) -> dict:
    """One rank's training: runs inside a Spark task, as rank hvd.rank() of hvd.size()."""
    import torch
    from torch import nn

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    inputs = torch.randn(4096, FEATURES, generator=torch.Generator().manual_seed(1))
    labels = (inputs @ teacher).argmax(dim=1)
    mine = slice(hvd.rank(), None, hvd.size())  # this rank's shard
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for _ in range(epochs):
        for batch in torch.split(torch.arange(len(inputs))[mine], 32):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), labels[batch]).backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(inputs).argmax(dim=1) == labels).float().mean()
    return {"rank": hvd.rank(), "size": hvd.size(), "accuracy": hvd.allreduce(accuracy, name="accuracy").item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master URL")
    parser.add_argument("--num-proc", type=int, default=2, help="ranks: at most the cluster's task slots")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank; scaled by the rank count")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors run this Python
    from pyspark.sql import SparkSession

    import hvdlite.spark

    spark = SparkSession.builder.master(args.master).appName("hvdlite-spark-train").getOrCreate()
    try:
        results = hvdlite.spark.run(train, args=(args.epochs, args.lr), num_proc=args.num_proc)
    finally:
        spark.stop()
    for result in results:
        print(f"rank {result['rank']} of {result['size']}: accuracy {result['accuracy']:.3f}")


if __name__ == "__main__":
    main()

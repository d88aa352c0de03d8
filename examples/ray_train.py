"""Data-parallel PyTorch training on Ray actors with ``hvdlite.ray.RayExecutor``, ready to copy.

Run:  pip install -e ".[torch,ray]"
      python examples/ray_train.py [--address auto] [--num-workers 2]

The driver connects to Ray (or starts a local one), reserves one placement group of
``--num-workers`` actors spread over the nodes, runs ``train`` on them as one MPI job (one rank per
actor), and gets each rank's result back in rank order. ``train`` is the same function as in
``spark_train.py``: the usual hvdlite script.
"""

from __future__ import annotations

import argparse

import cloudpickle
import spark_train
from spark_train import train

# train lives in a module of this directory, which the ranks cannot import: send it by value
# (functions of __main__ go by value anyway; those of installed packages by name).
cloudpickle.register_pickle_by_value(spark_train)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    parser.add_argument("--num-workers", type=int, default=2, help="ranks, one Ray actor each")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank; scaled by the rank count")
    args = parser.parse_args()
    import ray

    from hvdlite.ray import RayExecutor

    ray.init(address=args.address)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.num_workers,
                           cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(train, kwargs={"epochs": args.epochs, "lr": args.lr})
    finally:
        executor.shutdown()
        ray.shutdown()
    for result in results:
        print(f"rank {result['rank']} of {result['size']}: accuracy {result['accuracy']:.3f}")


if __name__ == "__main__":
    main()

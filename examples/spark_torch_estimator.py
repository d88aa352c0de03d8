"""Horovod's ``TorchEstimator`` on hvdlite: fit a PyTorch model on a Spark DataFrame, predict with it.

Run:  pip install -e ".[torch,spark]"  (and a Java runtime, 17 or newer)
      python examples/spark_torch_estimator.py [--master local-cluster[2,1,1024]] [--num-proc 2] [--store DIR]

A Spark ML ``Pipeline`` assembles two columns into a feature vector and fits a linear model on
``y = 2 x1 - 3 x2 + 0.5`` with ``TorchEstimator``: the DataFrame is written into the store as
Parquet, ``num_proc`` hvdlite ranks in Spark tasks each read their share with pyarrow and train
(gradients averaged every step), and the fitted ``TorchModel`` appends a ``y__output`` column to
any DataFrame. Fitting again with the same ``run_id`` resumes from the run's last epoch.
(The suite runs ``fit_and_predict`` in tests/multirank/test_spark_estimators.py.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import numpy as np

WEIGHTS, BIAS = (2.0, -3.0), 0.5


def linear_rows(count: int, seed: int = 0) -> list[tuple[float, float, float, bool]]:
    """Rows ``(x1, x2, y, is_val)`` of ``y = 2 x1 - 3 x2 + 0.5``; every fifth row is for validation."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(count, 2))
    y = x @ np.array(WEIGHTS) + BIAS
    return [(float(a), float(b), float(t), index % 5 == 0) for index, ((a, b), t) in enumerate(zip(x, y, strict=True))]


def pipeline(store_path: str, run_id: str, num_proc: int = 2, epochs: int = 3, **overrides: Any) -> Any:
    """VectorAssembler, then TorchEstimator (Horovod's parameters; ``overrides`` replace them)."""
    import torch
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from hvdlite.spark import Store
    from hvdlite.spark.torch import TorchEstimator

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    options = dict(num_proc=num_proc, store=Store.create(store_path), model=model,
                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=torch.nn.functional.mse_loss,
                   feature_cols=["features"], label_cols=["y"], validation="is_val", batch_size=8, epochs=epochs,
                   random_seed=1, run_id=run_id, verbose=0, partitions_per_process=2)
    estimator = TorchEstimator(**{**options, **overrides})
    return Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"), estimator])


def fit_and_predict(spark: Any, store_path: str, run_id: str = "linear", **options: Any) -> tuple[Any, Any]:
    """The fitted pipeline and its predictions on the training rows."""
    frame = spark.createDataFrame(linear_rows(320), ["x1", "x2", "y", "is_val"])
    fitted = pipeline(store_path, run_id, **options).fit(frame)
    return fitted, fitted.transform(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local-cluster[2,1,1024]", help="Spark master URL")
    parser.add_argument("--num-proc", type=int, default=2, help="ranks: at most the cluster's task slots")
    parser.add_argument("--store", default=None, help="the store's prefix (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors run this Python
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(args.master).appName("hvdlite-torch-estimator").getOrCreate()
    with tempfile.TemporaryDirectory() as scratch:
        try:
            fitted, predictions = fit_and_predict(spark, args.store or scratch, num_proc=args.num_proc)
            rows = predictions.select("y", "y__output").toPandas()
        finally:
            spark.stop()
    print("history:", fitted.stages[-1].getHistory())
    print(f"rmse of y__output: {float(np.sqrt(((rows['y'] - rows['y__output']) ** 2).mean())):.4f}")


if __name__ == "__main__":
    main()

"""Horovod's ``KerasEstimator`` on hvdlite: fit a Keras 3 classifier on a Spark DataFrame, predict with it.

Run:  pip install -e ".[tensorflow,spark]"  (and a Java runtime, 17 or newer)
      python examples/spark_keras_estimator.py [--master local-cluster[2,1,1024]] [--num-proc 2] [--store DIR]

The rows have two scalar columns, an array column and a string label (one of three colours, by
which side of two lines the point lies). A Spark ML ``Pipeline`` indexes the label
(``StringIndexer``), assembles the scalars into a vector (``VectorAssembler``) and fits a
two-input Keras model with ``KerasEstimator``: ``num_proc`` hvdlite ranks in Spark tasks read their
shares of the rows from the store with pyarrow and train with Keras's ``fit``. The fitted
``KerasModel`` appends a ``label__output`` column (the three logits) to any DataFrame, and
``getHistory()`` is Keras's history. Fitting again with the same ``run_id`` resumes.
(The suite runs ``fit_and_predict`` in tests/multirank/test_spark_estimators.py.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

import numpy as np

COLOURS = ("red", "green", "blue")
COLUMNS = ["x1", "x2", "extra", "colour", "is_val"]


def colour_rows(count: int, seed: int = 0) -> list[tuple[float, float, list[float], str, bool]]:
    """Rows ``(x1, x2, [x3, x4], colour, is_val)``: the colour is the argmax of three fixed linear
    scores of the four values; every fifth row is for validation."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(count, 4))
    scores = x @ np.array([[2.0, -1.0, 0.0], [0.0, 2.0, -1.0], [1.0, 0.0, -2.0], [-1.0, 1.0, 1.0]])
    return [(float(a), float(b), [float(c), float(d)], COLOURS[int(k)], index % 5 == 0)
            for index, ((a, b, c, d), k) in enumerate(zip(x, scores.argmax(axis=1), strict=True))]


def two_input_model() -> Any:
    """Logits of the three colours from the assembled vector and the array column."""
    import keras

    first, second = keras.Input((2,), name="features"), keras.Input((2,), name="extra")
    joined = keras.layers.Concatenate()([first, second])
    return keras.Model([first, second], keras.layers.Dense(3)(keras.layers.Dense(16, activation="tanh")(joined)))


def pipeline(store_path: str, run_id: str, num_proc: int = 2, epochs: int = 4, **overrides: Any) -> Any:
    """StringIndexer, VectorAssembler, then KerasEstimator (``overrides`` replace its parameters)."""
    import keras
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    from hvdlite.spark import Store
    from hvdlite.spark.keras import KerasEstimator

    keras.utils.set_random_seed(0)
    options = dict(num_proc=num_proc, store=Store.create(store_path), model=two_input_model(),
                   optimizer=keras.optimizers.Adam(0.02), metrics=["accuracy"],
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   feature_cols=["features", "extra"], label_cols=["label"], validation="is_val", batch_size=16,
                   epochs=epochs, random_seed=1, run_id=run_id, verbose=0, partitions_per_process=2)
    return Pipeline(stages=[StringIndexer(inputCol="colour", outputCol="label"),
                            VectorAssembler(inputCols=["x1", "x2"], outputCol="features"),
                            KerasEstimator(**{**options, **overrides})])


def fit_and_predict(spark: Any, store_path: str, run_id: str = "colours", rows: int = 640,
                    **options: Any) -> tuple[Any, Any]:
    """The fitted pipeline and its predictions on the training rows."""
    frame = spark.createDataFrame(colour_rows(rows), COLUMNS)
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

    spark = SparkSession.builder.master(args.master).appName("hvdlite-keras-estimator").getOrCreate()
    with tempfile.TemporaryDirectory() as scratch:
        try:
            fitted, predictions = fit_and_predict(spark, args.store or scratch, num_proc=args.num_proc)
            rows = predictions.select("label", "label__output").toPandas()
        finally:
            spark.stop()
    print("history:", fitted.stages[-1].getHistory())
    accuracy = (np.stack(rows["label__output"].to_numpy()).argmax(axis=1) == rows["label"]).mean()
    print(f"accuracy of label__output: {accuracy:.3f}")


if __name__ == "__main__":
    main()

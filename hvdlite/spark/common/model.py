"""What every framework's fitted model does: predict into new columns, save and load.

``transform(df)`` appends one column per label, ``LABEL__output`` unless ``output_cols`` says
otherwise: a double where the output is one value per row, else an array of doubles (the row's output
flattened). The model runs in a pandas UDF on the executors, in batches of Arrow rows; vector
feature columns are converted to arrays first, as for training.

Saving (``model.write().save(path)``, ``Model.load(path)``) writes the parameters as JSON and the
framework's payload (the model itself) with cloudpickle, into the folder ``path`` through fsspec.
"""

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark.ml.util import MLReader, MLWriter

from .params import values

PredictFn = Callable[[list[np.ndarray]], list[np.ndarray]]


def transform_with(df: Any, feature_cols: list[str], output_cols: list[str], output_shapes: list[list[int]],
                   predict: PredictFn) -> Any:
    """``df`` with ``output_cols`` appended: ``predict`` applied to its ``feature_cols`` (a double
    column for an output of one value per row, else an array)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    scalar_outputs = [math.prod(shape) == 1 for shape in output_shapes]
    schema = StructType([StructField(name, DoubleType() if scalar else ArrayType(DoubleType()))
                         for name, scalar in zip(output_cols, scalar_outputs, strict=True)])

    import pandas as pd

    # Not postponed (no __future__ annotations here): Spark reads the UDF's kind from these hints.
    def predict_pandas(*columns: pd.Series) -> pd.DataFrame:
        inputs = [np.stack(column.to_numpy()) if column.dtype == object else column.to_numpy() for column in columns]
        outputs = predict(inputs)
        rows = len(columns[0])
        data = {name: (np.asarray(out, dtype=np.float64).reshape(rows) if scalar
                       else list(np.asarray(out, dtype=np.float64).reshape(rows, -1)))
                for name, scalar, out in zip(output_cols, scalar_outputs, outputs, strict=True)}
        return pd.DataFrame(data)

    udf = pandas_udf(predict_pandas, returnType=schema)
    types = {field.name: field.dataType for field in df.schema.fields}
    features = [vector_to_array(df[name]) if isinstance(types[name], VectorUDT) else df[name] for name in feature_cols]
    hidden = "__hvdlite_predictions"
    predicted = df.withColumn(hidden, udf(*features))
    return predicted.select("*", *[predicted[hidden][name].alias(name) for name in output_cols]).drop(hidden)


class ParamsWriter(MLWriter):
    """``model.write()``: saves the model's parameters, those named in ``payload`` with cloudpickle."""

    def __init__(self, instance: Any, payload: tuple[str, ...]) -> None:
        super().__init__()
        self._instance, self._payload = instance, payload

    def saveImpl(self, path: str) -> None:  # noqa: N802 - Spark ML's name
        params = values(self._instance)
        save(path, {k: v for k, v in params.items() if k not in self._payload},
             self.pack({k: params[k] for k in self._payload}))

    def pack(self, payload: dict[str, Any]) -> Any:
        """What is pickled of the ``payload`` parameters (a framework may wrap them)."""
        return payload


class ParamsReader(MLReader):
    """``Model.read()``: loads what :class:`ParamsWriter` saved, as a ``kind``."""

    def __init__(self, kind: type) -> None:
        super().__init__()
        self._kind = kind

    def load(self, path: str) -> Any:
        params, payload = load(path)
        return self._kind(**params, **self.unpack(payload))

    def unpack(self, payload: Any) -> dict[str, Any]:
        """The ``payload`` parameters back from what :meth:`ParamsWriter.pack` pickled."""
        return payload


def save(path: str, params: dict[str, Any], payload: Any) -> None:
    """Write ``params`` (JSON) and ``payload`` (cloudpickle) into the folder ``path``."""
    import cloudpickle
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root}/params.json", "w") as file:
        json.dump(params, file)
    with fs.open(f"{root}/payload.pkl", "wb") as file:
        file.write(cloudpickle.dumps(payload))


def load(path: str) -> tuple[dict[str, Any], Any]:
    """What :func:`save` wrote into ``path``."""
    import cloudpickle
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    with fs.open(f"{root}/params.json", "r") as file:
        params = json.load(file)
    with fs.open(f"{root}/payload.pkl", "rb") as file:
        return params, cloudpickle.loads(file.read())


__all__ = ["ParamsReader", "ParamsWriter", "transform_with", "save", "load"]

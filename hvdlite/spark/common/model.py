"""What every framework's fitted model does: predict into new columns, save and load.

``transform(df)`` appends one column per label, ``LABEL__output`` unless ``output_cols`` says
otherwise, typed as Horovod's: where the output is one value per row, the label column's type (a
prediction for an integer label rounded to it), or a double where ``df`` has no such label; else a
Spark ML ``DenseVector`` (``VectorUDT``) of the row's output flattened. The model runs in a pandas
UDF on the executors, in batches of Arrow rows; vector feature columns are converted to arrays
first, as for training.

Saving (``model.write().save(path)``, ``Model.load(path)``) writes the parameters as JSON and the
framework's payload (the model itself) with cloudpickle, into the folder ``path`` through fsspec,
beside Spark ML's ``metadata`` (class and uid), so that a fitted ``PipelineModel`` holding the model
saves and loads with Spark's own ``write()`` / ``PipelineModel.load``.
"""

import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark.ml.util import MLReader, MLWriter

from .params import ParamsError, values

PredictFn = Callable[[list[np.ndarray]], list[np.ndarray]]


def transform_with(df: Any, feature_cols: list[str], output_cols: list[str] | None,
                   output_shapes: list[list[int]] | None, predict: PredictFn, label_cols: list[str] | None = None) -> Any:
    """``df`` with ``output_cols`` appended: ``predict`` applied to its ``feature_cols`` (typed as the
    module's docstring says, after ``label_cols`` where ``df`` has them). A model built by hand may
    leave out ``output_cols`` (then ``LABEL__output``) and ``output_shapes`` (then found by
    predicting ``df``'s first row here)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

    types = {field.name: field.dataType for field in df.schema.fields}
    features = [vector_to_array(df[name]) if isinstance(types[name], VectorUDT) else df[name] for name in feature_cols]
    output_cols = output_cols or default_output_cols(label_cols)
    output_shapes = output_shapes or _first_row_shapes(df.select(*features), predict)
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
    hidden = "__hvdlite_predictions"
    predicted = df.withColumn(hidden, udf(*features))
    labels = [types.get(name) for name in label_cols or []] + [None] * len(output_cols)
    columns = [_typed(predicted[hidden][name], scalar, label).alias(name)
               for name, scalar, label in zip(output_cols, scalar_outputs, labels, strict=False)]
    return predicted.select("*", *columns).drop(hidden)


def default_output_cols(label_cols: list[str] | None) -> list[str]:
    """Horovod's prediction columns: ``LABEL__output`` for each label."""
    if not label_cols:
        raise ParamsError("the model has neither output_cols nor label_columns: give label_columns=[...], the "
                          "columns whose predictions transform appends (as LABEL__output)")
    return [f"{name}__output" for name in label_cols]


def _first_row_shapes(features: Any, predict: PredictFn) -> list[list[int]]:
    """The per-row shape of each output, from the model's prediction for the first row of ``features``."""
    first = features.limit(1).toPandas()
    if first.empty:
        raise ParamsError("the model has no output_shapes, and the DataFrame to transform has no row to find them")
    inputs = [np.stack(column.to_numpy()) if column.dtype == object else column.to_numpy()
              for _, column in first.items()]
    return [list(np.shape(output)[1:]) for output in predict(inputs)]


def _typed(column: Any, scalar: bool, label_type: Any) -> Any:
    """A prediction column as Horovod types it: a vector, or a value of the label's numeric type."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.functions import array
    from pyspark.sql.functions import round as round_column
    from pyspark.sql.types import FractionalType, IntegralType

    if not scalar:
        return array_to_vector(column)
    if isinstance(label_type, VectorUDT):
        return array_to_vector(array(column))
    if isinstance(label_type, IntegralType):
        return round_column(column).cast(label_type)
    return column.cast(label_type) if isinstance(label_type, FractionalType) else column


class ParamsWriter(MLWriter):
    """``write()`` of a model or an estimator: saves its parameters, those named in ``payload`` with
    cloudpickle (all together, so that an optimizer still refers to its model's parameters)."""

    def __init__(self, instance: Any, payload: tuple[str, ...]) -> None:
        super().__init__()
        self._instance, self._payload = instance, payload

    def saveImpl(self, path: str) -> None:  # noqa: N802 - Spark ML's name
        params = values(self._instance)
        kept = {k: v for k, v in params.items() if k not in self._payload}
        save(path, kept, self.pack({k: params[k] for k in self._payload}), spark_metadata(self._instance, kept))

    def pack(self, payload: dict[str, Any]) -> Any:
        """What is pickled of the ``payload`` parameters (a framework may wrap them)."""
        return payload


class ParamsReader(MLReader):
    """``Model.read()``: loads what :class:`ParamsWriter` saved, as a ``kind``."""

    def __init__(self, kind: type) -> None:
        super().__init__()
        self._kind = kind

    def load(self, path: str) -> Any:
        params, payload, uid = load(path)
        instance = self._kind(**{**params, **self.unpack(payload)})
        return instance if uid is None else instance._resetUid(uid)  # the uid it was saved with, as Spark's models

    def unpack(self, payload: Any) -> dict[str, Any]:
        """The ``payload`` parameters back from what :meth:`ParamsWriter.pack` pickled."""
        return payload


def opaque(params: dict[str, Any]) -> tuple[str, ...]:
    """The names of the parameters whose values JSON cannot hold (models, optimizers, functions,
    the store): what a writer pickles."""
    def json_able(value: Any) -> bool:
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return False
        return True
    return tuple(name for name, value in params.items() if not json_able(value))


def spark_metadata(instance: Any, params: dict[str, Any]) -> str:
    """Spark ML's ``metadata`` line (``DefaultParamsWriter``'s fields): ``PipelineModel.load`` reads
    a stage's class from it, then that class loads the stage."""
    import pyspark

    kind = type(instance)
    return json.dumps({"class": f"{kind.__module__}.{kind.__name__}", "timestamp": int(time.time() * 1000),
                       "sparkVersion": pyspark.__version__, "uid": instance.uid, "paramMap": params,
                       "defaultParamMap": {}})


def save(path: str, params: dict[str, Any], payload: Any, metadata: str) -> None:
    """Write ``params`` (JSON), ``payload`` (cloudpickle) and Spark's ``metadata`` into the folder ``path``."""
    import cloudpickle
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root}/params.json", "w") as file:
        json.dump(params, file)
    with fs.open(f"{root}/payload.pkl", "wb") as file:
        file.write(cloudpickle.dumps(payload))
    with fs.open(f"{root}/metadata", "w") as file:  # one line, a file: Spark's text reader takes either
        file.write(metadata + "\n")


def load(path: str) -> tuple[dict[str, Any], Any, str | None]:
    """What :func:`save` wrote into ``path``: the parameters, the payload and the saved uid (None
    for a model saved before the metadata was)."""
    import cloudpickle
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    with fs.open(f"{root}/params.json", "r") as file:
        params = json.load(file)
    with fs.open(f"{root}/payload.pkl", "rb") as file:
        payload = cloudpickle.loads(file.read())
    if not fs.exists(f"{root}/metadata"):
        return params, payload, None
    with fs.open(f"{root}/metadata", "r") as file:
        return params, payload, json.loads(file.readline())["uid"]


__all__ = ["ParamsReader", "ParamsWriter", "transform_with", "opaque", "spark_metadata", "save", "load"]

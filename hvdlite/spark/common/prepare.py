"""The DataFrame an estimator fits on, checked and written into the store as Parquet (driver side).

Spark writes the rows (Spark ML vectors as arrays of doubles: Parquet and pyarrow know no vector
type) and the driver then reads the written dataset's metadata back with pyarrow: row counts and
each column's per-row shape, which the ranks and the model checks use.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .data import to_numpy
from .params import ParamsError
from .store import Store


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What was written: where, how many rows, and each column's per-row shape."""

    train_path: str
    val_path: str | None
    train_rows: int
    val_rows: int
    shapes: dict[str, tuple[int, ...]]


def check_columns(df: Any, needed: list[str], what: str = "the training DataFrame") -> None:
    """A ParamsError naming the columns of ``needed`` that ``df`` lacks, and those it has."""
    missing = [name for name in needed if name not in df.columns]
    if missing:
        raise ParamsError(f"column(s) {missing} not found in {what}; it has {df.columns}")


def as_arrays(df: Any, columns: list[str]) -> Any:
    """``df``'s ``columns`` with Spark ML vectors as arrays of doubles, and a clear error for strings
    (index them first: ``StringIndexer``)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import StringType

    types = {field.name: field.dataType for field in df.schema.fields}
    selected = []
    for name in columns:
        if isinstance(types[name], StringType):
            raise ParamsError(f"column {name!r} holds strings; index it first (pyspark.ml.feature.StringIndexer)")
        selected.append(vector_to_array(df[name]).alias(name) if isinstance(types[name], VectorUDT) else df[name])
    return df.select(*selected)


def split(df: Any, validation: float | str | None, seed: int | None) -> tuple[Any, Any | None]:
    """``(train, validation)`` rows of ``df``: a random fraction, a column's truthy rows, or none."""
    if validation is None or validation == 0:
        return df, None
    if isinstance(validation, str):
        check_columns(df, [validation], "the training DataFrame (validation column)")
        flag = df[validation].cast("boolean")
        return df.filter(~flag).drop(validation), df.filter(flag).drop(validation)
    if isinstance(validation, bool) or not isinstance(validation, (int, float)) or not 0 <= validation < 1:
        raise ParamsError(f"validation must be a fraction in [0, 1) or a column name, got {validation!r}")
    train, held_out = df.randomSplit([1 - validation, validation], seed=seed)
    return train, held_out


def prepare(store: Store, df: Any, columns: list[str], validation: float | str | None, partitions: int,
            seed: int | None) -> Prepared:
    """Check ``df`` has ``columns``, write them (train and validation rows) into ``store``, and
    describe what was written."""
    check_columns(df, columns)
    store.check_writable()
    extra = [validation] if isinstance(validation, str) and validation in df.columns else []
    train, held_out = split(as_arrays(df, columns + extra), validation, seed)
    train_path, val_path = store.get_train_data_path(), store.get_val_data_path()
    _write(store, train, train_path, partitions)
    if held_out is not None:
        _write(store, held_out, val_path, partitions)
    else:
        store.delete(val_path)
    train_set = store.get_parquet_dataset(train_path)
    train_rows = train_set.count_rows()
    if train_rows == 0:
        raise ParamsError("the training DataFrame has no rows to train on (after the validation split)")
    val_rows = store.get_parquet_dataset(val_path).count_rows() if held_out is not None else 0
    return Prepared(train_path, val_path if val_rows else None, train_rows, val_rows, column_shapes(train_set, columns))


def _write(store: Store, df: Any, path: str, partitions: int) -> None:
    df.repartition(partitions).write.mode("overwrite").parquet(store.spark_path(path))


def column_shapes(dataset: Any, columns: list[str]) -> dict[str, tuple[int, ...]]:
    """Each column's per-row shape, from the first row written."""
    first = dataset.head(1, columns=columns)
    return {name: tuple(to_numpy(first, name).shape[1:]) for name in columns}


__all__ = ["Prepared", "check_columns", "as_arrays", "split", "prepare", "column_shapes"]

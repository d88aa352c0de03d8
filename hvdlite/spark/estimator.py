"""What every framework's estimator does on the driver: check, write the data, train, build the model.

A framework's estimator subclasses :class:`HorovodEstimator` and supplies ``_check_model`` (the
model against the data's shapes, on the driver, before anything is launched), ``_trainer`` (the
function every rank runs) and ``_model`` (the Spark ML model built from what rank 0 returned).
"""

from __future__ import annotations

import uuid
from typing import Any

from .common.params import ParamsError, values
from .common.prepare import Prepared, column_shapes, prepare


class HorovodEstimator:
    """Mixed into a ``pyspark.ml.Estimator`` that declares :data:`hvdlite.spark.common.params.COMMON`."""

    def _fit(self, df: Any) -> Any:
        params = self._checked_params()
        num_proc = self._num_proc(params)
        prepared = prepare(params["store"], df, data_columns(params), params["validation"],
                           num_proc * params["partitions_per_process"], params["random_seed"])
        return self._fit_prepared(params, prepared, num_proc)

    def fit_on_parquet(self, train_data_path: str | None = None, val_data_path: str | None = None) -> Any:
        """Train on Parquet data already in the store (by default where :meth:`fit` writes it)."""
        params = self._checked_params()
        store = params["store"]
        train_path = train_data_path or store.get_train_data_path()
        val_path = val_data_path or store.get_val_data_path()
        if not store.is_parquet_dataset(train_path):
            raise ParamsError(f"no Parquet data at {train_path!r} in the store")
        columns = data_columns(params)
        train_set = store.get_parquet_dataset(train_path)
        missing = [name for name in columns if name not in train_set.schema.names]
        if missing:
            raise ParamsError(f"column(s) {missing} not found in the Parquet data at {train_path!r}; "
                              f"it has {train_set.schema.names}")
        has_val = store.is_parquet_dataset(val_path)
        prepared = Prepared(train_path, val_path if has_val else None, train_set.count_rows(),
                            store.get_parquet_dataset(val_path).count_rows() if has_val else 0,
                            column_shapes(train_set, columns))
        return self._fit_prepared(params, prepared, self._num_proc(params))

    def _fit_prepared(self, params: dict[str, Any], prepared: Prepared, num_proc: int) -> Any:
        from .job import run

        self._check_model(params, prepared)
        run_id = params["run_id"] or f"run_{uuid.uuid4().hex[:12]}"
        results = run(self._trainer(params, prepared, run_id, num_proc), num_proc=num_proc)
        return self._model(params, prepared, run_id, results[0])

    def _checked_params(self) -> dict[str, Any]:
        params = values(self)
        for name in ("store", "model", "feature_cols", "label_cols"):
            if not params[name]:
                raise ParamsError(f"{type(self).__name__} needs {name}=...")
        params["feature_cols"], params["label_cols"] = list(params["feature_cols"]), list(params["label_cols"])
        weights = params["loss_weights"]
        if weights is not None and len(weights) != len(params["label_cols"]):
            raise ParamsError(f"loss_weights has {len(weights)} weights for {len(params['label_cols'])} label columns")
        return params

    @staticmethod
    def _num_proc(params: dict[str, Any]) -> int:
        from .job import _checked_num_proc, _running_context

        return _checked_num_proc(_running_context(), params["num_proc"])

    def _check_model(self, params: dict[str, Any], prepared: Prepared) -> None:
        raise NotImplementedError

    def _trainer(self, params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int) -> Any:
        raise NotImplementedError

    def _model(self, params: dict[str, Any], prepared: Prepared, run_id: str, result: Any) -> Any:
        raise NotImplementedError


def data_columns(params: dict[str, Any]) -> list[str]:
    """The columns training reads: features, labels and the sample weights, each once."""
    weights = [params["sample_weight_col"]] if params["sample_weight_col"] else []
    return list(dict.fromkeys(params["feature_cols"] + params["label_cols"] + weights))


def steps(rows: int, num_proc: int, batch_size: int, given: int | None) -> int:
    """Steps per epoch: ``given``, or every rank's share once (at least one step)."""
    return given if given else max(1, (rows // num_proc) // batch_size)


__all__ = ["HorovodEstimator", "data_columns", "steps"]

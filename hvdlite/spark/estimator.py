"""What every framework's estimator does on the driver: check, write the data, train, build the model.

A framework's estimator subclasses :class:`HorovodEstimator` and supplies ``_output_shapes`` (the
model run on the driver on a little of the data's shape, which must fit the labels before anything
is launched), ``_trainer`` (the function every rank runs) and ``_model`` (the Spark ML model built
from what rank 0 returned).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np

from .common.backend import SparkBackend
from .common.params import ParamsError, values
from .common.prepare import Prepared, column_shapes, prepare
from .common.shapes import batched
from .common.spec import DataSpec


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
        outputs = self._output_shapes(params, prepared)
        check_outputs(outputs, prepared, params["label_cols"])
        check_label_shapes(params["label_shapes"], outputs, prepared, params["label_cols"])
        run_id = params["run_id"] or f"run_{uuid.uuid4().hex[:12]}"
        backend = params["backend"] or SparkBackend(num_proc)  # hvdlite.spark.run, as Horovod's default
        results = backend.run(self._trainer(params, prepared, run_id, num_proc, outputs),
                              env=dict(params["backend_env"] or {}))
        return self._model(params, prepared, run_id, results[0], outputs)

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
        """The ranks to train on: the backend's, when given (it must agree with num_proc), else num_proc."""
        from .job import checked_num_proc, running_context

        backend = params["backend"]
        if backend is None:
            return checked_num_proc(running_context(), params["num_proc"])
        if not (callable(getattr(backend, "run", None)) and callable(getattr(backend, "num_processes", None))):
            raise ParamsError(f"backend must be a Backend (SparkBackend, or any object with run() and "
                              f"num_processes()), got {backend!r}")
        ranks = backend.num_processes()
        if params["num_proc"] is not None and params["num_proc"] != ranks:
            raise ParamsError(f"num_proc={params['num_proc']} but the backend runs {ranks} processes; give one of them")
        return ranks

    def _output_shapes(self, params: dict[str, Any], prepared: Prepared) -> list[tuple[int, ...]]:
        """The per-row shape of each of the model's outputs (a ParamsError if it cannot take the features)."""
        raise NotImplementedError

    def _trainer(self, params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int,
                 outputs: list[tuple[int, ...]]) -> Any:
        raise NotImplementedError

    def _model(self, params: dict[str, Any], prepared: Prepared, run_id: str, result: Any,
               outputs: list[tuple[int, ...]]) -> Any:
        raise NotImplementedError


def data_columns(params: dict[str, Any]) -> list[str]:
    """The columns training reads: features, labels and the sample weights, each once."""
    weights = [params["sample_weight_col"]] if params["sample_weight_col"] else []
    return list(dict.fromkeys(params["feature_cols"] + params["label_cols"] + weights))


def data_spec(params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int) -> DataSpec:
    """What the ranks read and where the run lives, from the estimator's parameters."""
    val_batch = params["val_batch_size"] or params["batch_size"]
    buffer = params["shuffle_buffer_size"]
    return DataSpec(
        store=params["store"], run_id=run_id, train_path=prepared.train_path, val_path=prepared.val_path,
        columns=data_columns(params), feature_cols=params["feature_cols"], label_cols=params["label_cols"],
        sample_weight_col=params["sample_weight_col"], batch_size=params["batch_size"], val_batch_size=val_batch,
        epochs=params["epochs"],
        steps=steps(prepared.train_rows, num_proc, params["batch_size"], params["train_steps_per_epoch"]),
        val_steps=steps(prepared.val_rows, num_proc, val_batch, params["validation_steps_per_epoch"]),
        shuffle_buffer_size=0 if not params["shuffle"] else
        min(prepared.train_rows // num_proc, 100_000) if buffer is None else buffer,
        seed=params["random_seed"], verbose=params["verbose"], transformation_fn=params["transformation_fn"],
        inmemory_cache_all=params["inmemory_cache_all"])


def check_outputs(output_shapes: list[tuple[int, ...]], prepared: Prepared, label_cols: list[str]) -> None:
    """A ParamsError unless the model has one output per label column, each holding as many values
    per row as the label, or the label one value per row (a class index, or a value the loss
    broadcasts); the ranks reshape a label to its output."""
    if len(output_shapes) != len(label_cols):
        raise ParamsError(f"the model has {len(output_shapes)} outputs for {len(label_cols)} label columns")
    for output, name in zip(output_shapes, label_cols, strict=True):
        message = label_mismatch(prepared.shapes[name], output, name)
        if message:
            raise ParamsError(message)


def check_label_shapes(label_shapes: list[list[int]] | None, output_shapes: list[tuple[int, ...]],
                       prepared: Prepared, label_cols: list[str]) -> None:
    """A ParamsError unless each of Horovod's ``label_shapes`` is the shape the ranks give that label
    (:func:`label_as_output`: the output's shape, or one class index per row): the loss would
    otherwise see other labels than the script asked for."""
    if label_shapes is None:
        return
    if len(label_shapes) != len(label_cols):
        raise ParamsError(f"label_shapes has {len(label_shapes)} shapes for {len(label_cols)} label columns")
    for shape, output, name in zip(batched(label_shapes), output_shapes, label_cols, strict=True):
        given = tuple(shape[1:])
        hvdlite_shape = tuple(output) if math.prod(prepared.shapes[name]) == math.prod(output) else ()
        if given != hvdlite_shape and not math.prod(given) == math.prod(hvdlite_shape) == 1:
            raise ParamsError(f"label_shapes gives label column {name!r} the per-row shape {given}, but hvdlite "
                              f"shapes it like the model's output for it, {hvdlite_shape or 'one value per row'}; "
                              "leave label_shapes out")


def label_mismatch(label: tuple[int, ...], output: tuple[int, ...], column: str) -> str | None:
    """Why a label of per-row shape ``label`` cannot go with an output of ``output``, or None."""
    if math.prod(label) in (1, math.prod(output)):
        return None
    return (f"label column {column!r} has shape {tuple(label)} per row but the model's output for it has "
            f"{tuple(output)}")


def label_as_output(label: np.ndarray, output_shape: tuple[int, ...]) -> np.ndarray:
    """A batch of labels in the shape of the model's output for them (rows first), or one value
    per row (a class index) where the output has more."""
    rows = len(label)
    if label.size == rows * math.prod(output_shape):
        return label.reshape(rows, *output_shape)
    return label.reshape(rows)


def steps(rows: int, num_proc: int, batch_size: int, given: int | None) -> int:
    """Steps per epoch: ``given``, or every rank's share once (at least one step)."""
    return given if given else max(1, (rows // num_proc) // batch_size)


__all__ = ["HorovodEstimator", "check_outputs", "data_columns", "data_spec", "label_as_output", "label_mismatch", "steps"]

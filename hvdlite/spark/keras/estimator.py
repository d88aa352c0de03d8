"""``hvdlite.spark.keras.KerasEstimator`` and ``KerasModel``: Horovod's Keras estimator, on Keras 3.

``KerasEstimator(...).fit(df)`` writes ``df`` into the store as Parquet, trains the model on
``num_proc`` ranks in Spark tasks (:mod:`hvdlite.spark.keras.remote`) and returns a
:class:`KerasModel`, a Spark ML ``Model`` whose ``transform`` appends the model's predictions and
whose ``getHistory()`` is Keras's history (``{"loss": [...], "val_loss": [...], ...}``).
"""

from __future__ import annotations

import functools
from typing import Any

import cloudpickle
import keras
import numpy as np
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from ..common.model import ParamsReader, ParamsWriter, opaque, transform_with
from ..common.params import COMMON, MODEL_COMMON, ParamsError, apply, check_known, declare, values
from ..common.prepare import Prepared
from ..common.shapes import keras_input_shapes, reshaped
from ..estimator import HorovodEstimator, data_spec
from .remote import KerasSpec, train

KERAS = {
    "custom_objects": ({}, "custom Keras objects (layers, losses, metrics) the model needs to load on the ranks"),
}
MODEL = {
    "history": ({}, "Keras's history: each metric's value per epoch"),
    "model": (None, "the trained keras.Model"),
    "custom_objects": ({}, "custom Keras objects the model needs"),
    "_floatx": (None, "Horovod's Keras float type at fit; accepted, unused: the model keeps its own dtypes"),
    **MODEL_COMMON,
}


class KerasEstimator(HorovodEstimator, Estimator, MLWritable, MLReadable):
    """Horovod's ``KerasEstimator``: fit a Keras 3 model on a DataFrame with hvdlite ranks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        apply(self, kwargs, "KerasEstimator")

    def setParams(self, **kwargs: Any) -> KerasEstimator:  # noqa: N802 - Spark ML's name
        """Set several parameters by keyword."""
        return self._set(**check_known(self, kwargs, "KerasEstimator"))

    def write(self) -> MLWriter:
        """As Horovod's: the estimator saves (the model scoped with its custom objects, the rest that
        JSON cannot hold pickled), and so does an unfitted ``Pipeline`` holding it."""
        return _ScopedWriter(self, opaque(values(self)))

    @classmethod
    def read(cls) -> MLReader:
        return _ScopedReader(cls)

    def _output_shapes(self, params: dict[str, Any], prepared: Prepared) -> list[tuple[int, ...]]:
        """Run the model on two rows of zeros, on the driver."""
        return _output_shapes(params["model"], params["feature_cols"], prepared)

    def _trainer(self, params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int,
                 outputs: list[tuple[int, ...]]) -> Any:
        if params["loss"] is None:
            raise ParamsError("KerasEstimator needs loss=...")
        spec = KerasSpec(
            data=data_spec(params, prepared, run_id, num_proc), model=cloudpickle.dumps(params["model"]),
            optimizer=keras.optimizers.serialize(_optimizer(params)), loss=params["loss"],
            loss_weights=params["loss_weights"], metrics=list(params["metrics"] or []),
            callbacks=list(params["callbacks"] or []), custom_objects=dict(params["custom_objects"] or {}),
            output_shapes=outputs, input_shapes=keras_input_shapes(params["model"], _row_shapes(params, prepared)),
            compression=params["gradient_compression"], backward_passes_per_step=params["backward_passes_per_step"],
            use_gpu=params["use_gpu"])
        return functools.partial(train, spec)

    def _model(self, params: dict[str, Any], prepared: Prepared, run_id: str, result: Any,
               outputs: list[tuple[int, ...]]) -> KerasModel:
        with keras.saving.custom_object_scope(params["custom_objects"] or {}):
            model = cloudpickle.loads(cloudpickle.dumps(params["model"]))  # a copy; the given model stays as it was
        model.set_weights(result["weights"])
        # As Horovod's: compiled with the optimizer as given (its learning rate not scaled), ready for more fitting.
        model.compile(optimizer=keras.optimizers.deserialize(keras.optimizers.serialize(_optimizer(params)),
                                                             custom_objects=params["custom_objects"] or None),
                      loss=params["loss"], loss_weights=params["loss_weights"], metrics=params["metrics"] or None)
        labels = params["label_cols"]
        return KerasModel(history=result["history"], model=model, custom_objects=params["custom_objects"],
                          feature_columns=params["feature_cols"], label_columns=labels,
                          output_cols=[f"{name}__output" for name in labels],
                          label_shapes=[list(prepared.shapes[name]) for name in labels],
                          output_shapes=[list(shape) for shape in outputs], run_id=run_id)


declare(KerasEstimator, {**COMMON, **KERAS})


def _row_shapes(params: dict[str, Any], prepared: Prepared) -> list[tuple[int, ...]]:
    return [prepared.shapes[name] for name in params["feature_cols"]]


def _optimizer(params: dict[str, Any]) -> Any:
    """The ``optimizer`` parameter, else the optimizer the model was compiled with (as Horovod's)."""
    optimizer = params["optimizer"] or getattr(params["model"], "optimizer", None)
    if optimizer is None:
        raise ParamsError("KerasEstimator needs optimizer=..., or a model compiled with one")
    return optimizer


def _output_shapes(model: Any, feature_cols: list[str], prepared: Prepared) -> list[tuple[int, ...]]:
    """The per-row shape of each of ``model``'s outputs on two rows of zeros of the feature columns."""
    inputs = [np.zeros((2, *prepared.shapes[name]), dtype=np.float32) for name in feature_cols]
    inputs = reshaped(inputs, keras_input_shapes(model, [prepared.shapes[name] for name in feature_cols]))
    try:
        outputs = model(inputs[0] if len(inputs) == 1 else inputs, training=False)
    except Exception as exc:
        raise ParamsError(f"the model cannot take the feature columns {feature_cols} "
                          f"(per-row shapes {[prepared.shapes[n] for n in feature_cols]}): {exc}") from exc
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return [tuple(output.shape[1:]) for output in outputs]


class KerasModel(Model, MLWritable, MLReadable):
    """A fitted ``KerasEstimator``: ``transform(df)`` appends one prediction column per label."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        apply(self, kwargs, "KerasModel")

    def _transform(self, df: Any) -> Any:
        shipped = ScopedModel(self.getModel(), self.getCustomObjects() or {})

        def predict(inputs: list[Any]) -> list[Any]:
            inputs = [value.astype(np.float32) if value.dtype == np.float64 else value for value in inputs]
            inputs = reshaped(inputs, keras_input_shapes(shipped.model, [value.shape[1:] for value in inputs]))
            outputs = shipped.model(inputs[0] if len(inputs) == 1 else inputs, training=False)
            outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
            return [keras.ops.convert_to_numpy(output) for output in outputs]

        return transform_with(df, self.getFeatureColumns(), self.getOutputCols(), self.getOutputShapes(), predict,
                              self.getLabelColumns())

    def write(self) -> MLWriter:
        return _ScopedWriter(self, ("model", "custom_objects"))

    @classmethod
    def read(cls) -> MLReader:
        return _ScopedReader(cls)


class ScopedModel:
    """A Keras model that pickles with its custom objects and unpickles inside their scope.

    Keras 3 pickles a model as its ``.keras`` file and rebuilds it from the class names in it, so a
    custom layer that is not registered (``keras.saving.register_keras_serializable``) is unknown
    where it is unpickled: on Spark's executors in ``transform``, or where a saved model is loaded.
    The custom objects travel by cloudpickle beside the model's bytes and scope its rebuilding.
    """

    def __init__(self, model: Any, custom_objects: dict[str, Any]) -> None:
        self.model, self.custom_objects = model, custom_objects

    def __getstate__(self) -> dict[str, bytes]:
        return {"custom_objects": cloudpickle.dumps(self.custom_objects), "model": cloudpickle.dumps(self.model)}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self.custom_objects = cloudpickle.loads(state["custom_objects"])
        with keras.saving.custom_object_scope(self.custom_objects):
            self.model = cloudpickle.loads(state["model"])


class _ScopedWriter(ParamsWriter):
    """Saves the model as a :class:`ScopedModel`, so that loading it needs no registered custom objects."""

    def pack(self, payload: dict[str, Any]) -> Any:
        if "model" not in payload:  # an estimator given no model yet
            return payload
        rest = {name: value for name, value in payload.items() if name not in ("model", "custom_objects")}
        return {**rest, "model": ScopedModel(payload["model"], self._instance.getCustomObjects() or {})}


class _ScopedReader(ParamsReader):
    def unpack(self, payload: Any) -> dict[str, Any]:
        shipped = payload.get("model")
        if isinstance(shipped, ScopedModel):
            return {**payload, "model": shipped.model, "custom_objects": shipped.custom_objects}
        return payload  # saved before models were scoped


declare(KerasModel, MODEL)

__all__ = ["KerasEstimator", "KerasModel"]

"""``hvdlite.spark.torch.TorchEstimator`` and ``TorchModel``: Horovod's PyTorch estimator on hvdlite.

``TorchEstimator(...).fit(df)`` writes ``df`` into the store as Parquet, trains the model on
``num_proc`` ranks in Spark tasks (:mod:`hvdlite.spark.torch.remote`) and returns a
:class:`TorchModel`, a Spark ML ``Model`` whose ``transform`` appends the model's predictions.
"""

from __future__ import annotations

import copy
from typing import Any

from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from ..common.model import ParamsReader, ParamsWriter, opaque, transform_with
from ..common.params import COMMON, MODEL_COMMON, ParamsError, apply, check_known, declare, values
from ..common.prepare import Prepared
from ..common.shapes import batched
from ..estimator import HorovodEstimator, data_spec
from .remote import TrainSpec, train

TORCH = {
    "input_shapes": (None, "the shape of each feature column's input to the model, e.g. [[-1, 2]], or of one row, "
                           "[[2]]"),
    "loss_constructors": (None, "functions that build the losses on each rank (instead of loss)"),
    "train_minibatch_fn": (None, "a custom step, Horovod's signature: fn(model, optimizer, transform_outputs, "
                                 "loss_fn, inputs, labels, sample_weights) -> (outputs, loss)"),
}
MODEL = {
    "history": ([], "one entry per epoch: {'epoch': N, 'train': {'loss': ...}, 'validation': {...}}"),
    "model": (None, "the trained torch.nn.Module"),
    "optimizer": (None, "the optimizer, in its trained state"),
    "input_shapes": (None, "the shape of each feature column's input to the model"),
    "loss": (None, "the loss(es) it was trained with (Horovod keeps them on the model)"),
    "loss_constructors": (None, "the functions that built its losses"),
    **MODEL_COMMON,
}


class TorchEstimator(HorovodEstimator, Estimator, MLWritable, MLReadable):
    """Horovod's ``TorchEstimator``: fit a ``torch.nn.Module`` on a DataFrame with hvdlite ranks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        if kwargs.get("loss") is not None and kwargs.get("loss_constructors") is not None:
            raise ParamsError("give TorchEstimator loss or loss_constructors, not both")
        apply(self, kwargs, "TorchEstimator")

    def setParams(self, **kwargs: Any) -> TorchEstimator:
        """Set several parameters by keyword."""
        return self._set(**check_known(self, kwargs, "TorchEstimator"))

    def write(self) -> MLWriter:
        """As Horovod's: the estimator saves (model, optimizer, functions and store pickled), and so
        does an unfitted ``Pipeline`` holding it."""
        return ParamsWriter(self, opaque(values(self)))

    @classmethod
    def read(cls) -> MLReader:
        return ParamsReader(cls)

    def _output_shapes(self, params: dict[str, Any], prepared: Prepared) -> list[tuple[int, ...]]:
        """Run a copy of the model on two rows of zeros, on the driver."""
        import torch

        model = copy.deepcopy(params["model"]).eval()
        inputs = [torch.zeros((2, *prepared.shapes[name])) for name in params["feature_cols"]]
        if params["input_shapes"]:
            inputs = [value.reshape(shape) for value, shape in zip(inputs, batched(params["input_shapes"]), strict=True)]
        with torch.no_grad():
            try:
                outputs = model(*inputs)
            except Exception as exc:
                raise ParamsError(f"the model cannot take the feature columns {params['feature_cols']} "
                                  f"(per-row shapes {[prepared.shapes[n] for n in params['feature_cols']]}): {exc}") from exc
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        return [tuple(output.shape[1:]) for output in outputs]

    def _trainer(self, params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int,
                 outputs: list[tuple[int, ...]]) -> Any:
        import functools

        import cloudpickle

        optimizer = params["optimizer"]
        if optimizer is None:
            raise ParamsError("TorchEstimator needs optimizer=... (a torch.optim.Optimizer over the model's parameters)")
        losses = params["loss"] if isinstance(params["loss"], (list, tuple)) else [params["loss"]]
        if params["loss_constructors"]:
            losses = [build() for build in params["loss_constructors"]]
        if losses == [None]:
            raise ParamsError("TorchEstimator needs loss=... or loss_constructors=...")
        labels = params["label_cols"]
        spec = TrainSpec(
            data=data_spec(params, prepared, run_id, num_proc), model=cloudpickle.dumps(params["model"]),
            optimizer_cls=type(optimizer), optimizer_state=optimizer.state_dict(), losses=list(losses),
            loss_weights=params["loss_weights"] or [1 / len(labels)] * len(labels),
            metrics=list(params["metrics"] or []), input_shapes=batched(params["input_shapes"]),
            compression=params["gradient_compression"], backward_passes_per_step=params["backward_passes_per_step"],
            train_minibatch_fn=params["train_minibatch_fn"], use_gpu=params["use_gpu"])
        return functools.partial(train, spec)

    def _model(self, params: dict[str, Any], prepared: Prepared, run_id: str, result: Any,
               outputs: list[tuple[int, ...]]) -> TorchModel:
        model = copy.deepcopy(params["model"])
        model.load_state_dict(result["model"])
        optimizer = type(params["optimizer"])(model.parameters(), lr=1.0)
        optimizer.load_state_dict(result["optimizer"])
        labels = params["label_cols"]
        return TorchModel(history=result["history"], model=model, optimizer=optimizer,
                          feature_columns=params["feature_cols"], label_columns=labels,
                          output_cols=[f"{name}__output" for name in labels], input_shapes=params["input_shapes"],
                          label_shapes=[list(prepared.shapes[name]) for name in labels],
                          output_shapes=[list(shape) for shape in outputs], run_id=run_id)


declare(TorchEstimator, {**COMMON, **TORCH})


class TorchModel(Model, MLWritable, MLReadable):
    """A fitted ``TorchEstimator``: ``transform(df)`` appends one prediction column per label."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        apply(self, kwargs, "TorchModel")

    def _transform(self, df: Any) -> Any:
        import torch

        model, shapes = self.getModel(), batched(self.getInputShapes())

        def predict(inputs: list[Any]) -> list[Any]:
            tensors = [torch.as_tensor(value).float() for value in inputs]
            if shapes:
                tensors = [value.reshape(shape) for value, shape in zip(tensors, shapes, strict=True)]
            with torch.no_grad():
                outputs = model.eval()(*tensors)
            return [output.numpy() for output in (outputs if isinstance(outputs, (tuple, list)) else [outputs])]

        return transform_with(df, self.getFeatureColumns(), self.getOutputCols(), self.getOutputShapes(), predict,
                              self.getLabelColumns())

    def write(self) -> MLWriter:
        return ParamsWriter(self, opaque(values(self)))

    @classmethod
    def read(cls) -> MLReader:
        return ParamsReader(cls)


declare(TorchModel, MODEL)


__all__ = ["TorchEstimator", "TorchModel"]

"""``hvdlite.spark.lightning.TorchEstimator`` and ``TorchModel``: Horovod's ``horovod.spark.lightning``.

``TorchEstimator(model=a LightningModule, ...).fit(df)`` writes ``df`` into the store as Parquet and
fits the module with a Lightning ``Trainer`` on ``num_proc`` ranks in Spark tasks
(:mod:`hvdlite.spark.lightning.remote`); the module's ``configure_optimizers`` and ``training_step``
train it, so ``optimizer``, ``loss`` and ``loss_weights`` are refused with it, as Horovod refuses them.
A plain ``torch.nn.Module`` with ``optimizer`` and ``loss`` (Horovod's "legacy" form) is fitted by
:class:`hvdlite.spark.torch.TorchEstimator`. The fitted :class:`TorchModel` appends the module's
predictions to a DataFrame.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..common.params import ParamsError, declare
from ..common.prepare import Prepared
from ..common.shapes import batched
from ..estimator import data_spec
from ..torch.estimator import TorchEstimator as PlainTorchEstimator
from ..torch.estimator import TorchModel as PlainTorchModel
from .remote import LightningSpec, train

LIGHTNING = {
    "trainer_args": (None, "keyword arguments for each rank's lightning.Trainer (added to, or replacing, the estimator's)"),
    "logger": (None, "a Lightning logger (each rank's Trainer gets it)"),
    "log_every_n_steps": (50, "Lightning's log_every_n_steps"),
    "terminate_on_nan": (False, "stop the fit on a NaN loss or gradient (Lightning's detect_anomaly)"),
    "profiler": (None, "a Lightning profiler, or its name"),
    "num_gpus": (None, "GPUs per rank: 0 trains on the CPU (as use_gpu=False); otherwise one, the local rank's"),
}
REFUSED_WITH_A_MODULE = ("optimizer", "loss", "loss_constructors", "loss_weights", "train_minibatch_fn")


class TorchEstimator(PlainTorchEstimator):
    """Horovod's Lightning ``TorchEstimator``: fit a ``LightningModule`` on a DataFrame with hvdlite ranks."""

    def _fit_prepared(self, params: dict[str, Any], prepared: Prepared, num_proc: int) -> Any:
        if not _is_lightning_module(params["model"]):  # Horovod's legacy form: a module, an optimizer, a loss
            plain = {name: value for name, value in params.items() if name not in LIGHTNING}
            return PlainTorchEstimator(**plain)._fit_prepared(plain, prepared, num_proc)
        given = [name for name in REFUSED_WITH_A_MODULE if params[name]]
        if given:
            raise ParamsError(f"TorchEstimator: {', '.join(given)} cannot be given with a LightningModule; its "
                              "configure_optimizers and training_step say how it trains")
        return super()._fit_prepared(params, prepared, num_proc)

    def _trainer(self, params: dict[str, Any], prepared: Prepared, run_id: str, num_proc: int,
                 outputs: list[tuple[int, ...]]) -> Any:
        import cloudpickle

        spec = LightningSpec(data=data_spec(params, prepared, run_id, num_proc),
                             model=cloudpickle.dumps(params["model"]), input_shapes=batched(params["input_shapes"]),
                             trainer_args=_trainer_args(params), use_gpu=params["use_gpu"] and params["num_gpus"] != 0)
        return functools.partial(train, spec)

    def _model(self, params: dict[str, Any], prepared: Prepared, run_id: str, result: Any,
               outputs: list[tuple[int, ...]]) -> TorchModel:
        model = copy.deepcopy(params["model"])
        model.load_state_dict(result["model"])
        labels = params["label_cols"]
        return TorchModel(history=result["history"], model=model.eval(), feature_columns=params["feature_cols"],
                          label_columns=labels, output_cols=[f"{name}__output" for name in labels],
                          input_shapes=params["input_shapes"], label_shapes=[list(prepared.shapes[n]) for n in labels],
                          output_shapes=[list(shape) for shape in outputs], run_id=run_id)


declare(TorchEstimator, LIGHTNING)
TorchEstimator.setNumGPUs, TorchEstimator.getNumGPUs = TorchEstimator.setNumGpus, TorchEstimator.getNumGpus  # Horovod's spelling


class TorchModel(PlainTorchModel):
    """A fitted Lightning ``TorchEstimator``: ``transform(df)`` appends one prediction column per label;
    ``getModel()`` is the trained ``LightningModule``; ``getHistory()`` one entry per epoch."""


def _is_lightning_module(model: Any) -> bool:
    import lightning

    modules = [lightning.LightningModule]
    try:
        import pytorch_lightning
        modules.append(pytorch_lightning.LightningModule)
    except ImportError:
        pass
    return isinstance(model, tuple(modules))


def _trainer_args(params: dict[str, Any]) -> dict[str, Any]:
    """What the estimator's Lightning parameters give each rank's Trainer, then ``trainer_args``."""
    args: dict[str, Any] = {"log_every_n_steps": params["log_every_n_steps"]}
    for name in ("logger", "profiler"):
        if params[name] is not None:
            args[name] = params[name]
    if params["terminate_on_nan"]:
        args["detect_anomaly"] = True
    return {**args, **(params["trainer_args"] or {})}


__all__ = ["TorchEstimator", "TorchModel"]

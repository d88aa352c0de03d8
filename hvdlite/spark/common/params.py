"""The estimators' Spark ML parameters, Horovod's names, declared from one table.

Each parameter is a ``pyspark.ml.param.Param`` on the class (so a ``Pipeline`` copies and
explains it) with Horovod's camel-case accessors (``setBatchSize``/``getBatchSize``), and a keyword
of the estimator's constructor. A keyword the estimator does not know is an error naming it.
"""

from __future__ import annotations

from typing import Any

from ...errors import HvdliteError
from .horovod_params import ignored_table, refusals, warn_if_ignored

# name: (default, description). Horovod's defaults, where the parameter means the same here.
COMMON = {
    "num_proc": (None, "number of ranks (default: every task slot of the cluster)"),
    "backend": (None, "where the training runs (Horovod's SparkBackend, or your own Backend): its run() trains "
                      "on its num_processes() ranks (default: hvdlite.spark.run on num_proc ranks)"),
    "backend_env": (None, "environment variables the ranks get besides the driver's"),
    "store": (None, "the Store that holds the intermediate data and the runs"),
    "model": (None, "the model to train (copied, never changed)"),
    "optimizer": (None, "the optimizer (Keras: by default the one the model was compiled with)"),
    "loss": (None, "the loss, or one per label column"),
    "metrics": ([], "metrics computed each epoch on the training and validation data"),
    "loss_weights": (None, "one weight per label column's loss"),
    "sample_weight_col": (None, "column of per-row weights for the loss"),
    "feature_cols": (None, "feature column names, in the model's input order"),
    "label_cols": (None, "label column names, in the model's output order"),
    "validation": (None, "fraction of rows held out for validation in [0, 1), or the name of a column "
                         "whose truthy rows are the validation rows"),
    "callbacks": ([], "callbacks"),
    "batch_size": (32, "rows per rank per step"),
    "val_batch_size": (None, "rows per rank per validation step (default: batch_size)"),
    "epochs": (1, "epochs"),
    "train_steps_per_epoch": (None, "steps per epoch (default: every rank's share of the rows once)"),
    "validation_steps_per_epoch": (None, "validation steps per epoch (default: the validation share once)"),
    "shuffle": (True, "shuffle each rank's rows every epoch (False: read them in order, as shuffle_buffer_size=0)"),
    "label_shapes": (None, "Horovod's shape of each label for the loss: accepted where it is the shape hvdlite "
                           "gives the label (the model's output for it, or one class index per row), else refused"),
    "shuffle_buffer_size": (None, "rows in each rank's shuffle buffer (default: its whole share, up to 100,000 "
                                  "rows; 0 reads in order)"),
    "random_seed": (None, "seed of the model's initial state and of the shuffling"),
    "verbose": (1, "0 silent, 1 or 2 one line per epoch (from rank 0)"),
    "run_id": (None, "the run's folder in the store; fitting again with the same run_id trains epochs more from its "
                     "last finished epoch (default: a new id)"),
    "gradient_compression": (None, "hvd.Compression of the gradients"),
    "backward_passes_per_step": (1, "backward passes whose gradients one optimizer step averages"),
    "transformation_fn": (None, "a function applied to every batch (a dict of column -> array) before the step"),
    "inmemory_cache_all": (False, "keep each rank's share in memory after the first epoch"),
    "partitions_per_process": (10, "Parquet partitions Spark writes per rank"),
    **ignored_table(),
    "use_gpu": (True, "train each rank on its local rank's GPU where every executor has GPUs (else on the CPU); "
                      "False trains on the CPU even where there are GPUs"),
}

# What every framework's fitted model declares besides its model and history.
MODEL_COMMON = {
    "feature_columns": (None, "feature column names"),
    "label_columns": (None, "label column names"),
    "output_cols": (None, "prediction column names (default: LABEL__output)"),
    "label_shapes": (None, "each label's per-row shape"),
    "output_shapes": (None, "each output's per-row shape"),
    "run_id": (None, "the run's folder in the store"),
    "_metadata": (None, "Horovod's column metadata; accepted, unused: transform reads the column types from the "
                        "DataFrame"),
}


class ParamsError(HvdliteError, ValueError):
    """An estimator parameter that is unknown or has a value the estimator cannot use."""


def camel(name: str) -> str:
    """``batch_size`` -> ``BatchSize``."""
    return "".join(part.capitalize() for part in name.split("_"))


def declare(cls: type, table: dict[str, tuple[Any, str]]) -> type:
    """Add a ``Param`` and Horovod's ``setX``/``getX`` to ``cls`` for each row of ``table``."""
    from pyspark.ml.param import Param, Params

    for name, (_, doc) in table.items():
        setattr(cls, name, Param(Params._dummy(), name, doc))
        setattr(cls, f"set{camel(name)}", _setter(name))
        setattr(cls, f"get{camel(name)}", _getter(name))
    cls._hvdlite_defaults = {**getattr(cls, "_hvdlite_defaults", {}), **{n: d for n, (d, _) in table.items()}}
    return cls


def _setter(name: str) -> Any:
    def set_value(self: Any, value: Any) -> Any:
        warn_if_ignored(name, value, type(self).__name__)
        return self._set(**{name: value})
    set_value.__doc__ = f"Set ``{name}``."
    return set_value


def _getter(name: str) -> Any:
    def get_value(self: Any) -> Any:
        return self.getOrDefault(getattr(self, name))
    get_value.__doc__ = f"``{name}``."
    return get_value


def check_known(instance: Any, kwargs: dict[str, Any], kind: str) -> dict[str, Any]:
    """``kwargs``, once checked: a ParamsError naming each keyword that ``instance`` does not declare,
    or that Horovod takes but hvdlite refuses, and why; a warning for each of Horovod's parameters
    that change nothing here (:mod:`.horovod_params`)."""
    problems = refusals(kwargs, kind)
    if problems:
        raise ParamsError("; ".join(problems))
    for name, value in kwargs.items():
        warn_if_ignored(name, value, kind)
    defaults = type(instance)._hvdlite_defaults
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise ParamsError(f"{kind} has no parameter {', '.join(map(repr, unknown))}; it takes: {', '.join(defaults)}")
    return kwargs


def apply(instance: Any, kwargs: dict[str, Any], kind: str) -> None:
    """Set the defaults of ``instance``'s declared parameters, then ``kwargs`` (see :func:`check_known`)."""
    kwargs = check_known(instance, kwargs, kind)
    instance._setDefault(**type(instance)._hvdlite_defaults)
    instance._set(**{name: value for name, value in kwargs.items() if value is not None})


def values(instance: Any) -> dict[str, Any]:
    """Every declared parameter of ``instance`` and its value."""
    return {name: instance.getOrDefault(getattr(instance, name)) for name in type(instance)._hvdlite_defaults}


__all__ = ["COMMON", "MODEL_COMMON", "ParamsError", "camel", "declare", "check_known", "apply", "values"]

"""Model state across ranks: broadcasting a model and its optimizer, and loading a saved model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from ...compression import Compressor, NoneCompressor
from ...process_sets import ProcessSet, global_process_set
from ..collectives.variables import broadcast_variables
from ..gradients.averaging import is_distributed
from ..optimizer import DistributedOptimizer


def broadcast_model(model: keras.Model, root_rank: int, process_set: ProcessSet = global_process_set,
                    local_variables: Sequence[Any] = ()) -> None:
    """Give every rank (of ``process_set``) ``root_rank``'s weights (trainable and not) and optimizer
    state, but for ``local_variables``.

    An optimizer that has not been built yet is built first, the way its first ``apply`` would,
    so that a state restored on the root (a checkpoint) reaches every rank before training.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.trainable_variables:
        with keras.name_scope(optimizer.name):
            optimizer.build(model.trainable_variables)
    optimizer_variables = list(optimizer.variables) if optimizer is not None else []
    local = {id(v) for v in local_variables}
    chosen = [v for v in list(model.weights) + optimizer_variables if id(v) not in local]
    broadcast_variables(chosen, root_rank, process_set)


def broadcast_global_variables(root_rank: int, model: keras.Model | None = None) -> None:
    """Broadcast ``model``'s weights and optimizer state from ``root_rank``.

    Keras 3 keeps no global variable collection, so the model must be named (Horovod's TF2 version
    refuses to run at all); the callback BroadcastGlobalVariablesCallback does this inside fit().
    """
    if model is None:
        raise RuntimeError(
            "Keras 3 keeps no global variable collection: call broadcast_global_variables(root_rank, model=model), "
            "or pass hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit")
    broadcast_model(model, root_rank)


def load_model(filepath: Any, custom_optimizers: Sequence[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: type[Compressor] = NoneCompressor) -> keras.Model:
    """Load a saved model and make its optimizer distributed again.

    A model saved with a DistributedOptimizer records the user's own optimizer class, so
    ``keras.models.load_model`` loads it in a process without hvdlite too (the optimizer is then
    the plain one); this function wraps it with :func:`DistributedOptimizer` after loading.
    """
    objects = {cls.__name__: cls for cls in custom_optimizers or []}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not is_distributed(optimizer):
        wrapped = DistributedOptimizer(optimizer, compression=compression)
        if wrapped is not optimizer:  # wrapped in a LossScaleOptimizer under mixed_float16
            model.optimizer = wrapped
    return model

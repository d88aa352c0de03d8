"""Broadcasting variables from one rank to all, so every replica starts from the same state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from ..process_sets import ProcessSet, global_process_set
from . import host_ops
from .tensors import as_tensor


def _label(variable: Any, index: int) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", None) or f"variable {index}"


def broadcast_variables(variables: Iterable[Any], root_rank: int, process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:
    """Assign ``root_rank``'s value to each of ``variables`` (tf.Variable or keras.Variable) on every rank.

    Eagerly the assignments happen now. In a graph the result is an op that performs them.
    ``inplace`` is accepted for Horovod compatibility; assignment is always used.
    """
    variables = list(variables)
    values = [as_tensor(v, f"broadcast of variable {_label(v, i)!r}") for i, v in enumerate(variables)]
    broadcast = host_ops.broadcast(values, root_rank, None, process_set=process_set) if values else []
    assigns = [variable.assign(value) for variable, value in zip(variables, broadcast, strict=True)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_(variables: Iterable[Any], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Overwrite ``variables`` with ``root_rank``'s values and return their new values."""
    variables = list(variables)
    broadcast_variables(variables, root_rank, process_set)
    return [tf.convert_to_tensor(v) for v in variables]


def broadcast_global_variables(root_rank: int, process_set: ProcessSet = global_process_set) -> Any:
    """Broadcast TF1's global variable collection. Eager TF2 has no such collection, as in Horovod."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not work with eager execution: TF2 keeps no global "
            "variable collection. Use hvd.broadcast_variables(model.variables, root_rank), or the Keras "
            "callback hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback(root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, process_set)

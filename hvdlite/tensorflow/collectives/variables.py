"""Broadcasting variables from one rank to all, so every replica starts from the same state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from ...process_sets import ProcessSet, global_process_set
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


def broadcast_(variables: Any, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite ``variables`` (a list, or one variable) with ``root_rank``'s values; returns their new values.

    The values are read after the assignments, also in a TF1 graph, where nothing else orders them.
    """
    single = isinstance(variables, tf.Variable) or hasattr(variables, "assign")
    variables = [variables] if single else list(variables)
    assigned = broadcast_variables(variables, root_rank, process_set)
    with tf.control_dependencies(None if assigned is None else [assigned]):
        values = [tf.identity(v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v))
                  for v in variables]
    return values[0] if single else values


def broadcast_global_variables(root_rank: int, process_set: ProcessSet = global_process_set) -> Any:
    """Broadcast TF1's global variable collection. Eager TF2 has no such collection, as in Horovod."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not work with eager execution: TF2 keeps no global "
            "variable collection. Use hvd.broadcast_variables(model.variables, root_rank), or the Keras "
            "callback hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback(root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, process_set)

"""Horovod's ``input_shapes``: how each feature column is shaped into the model's input."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def batched(shapes: Sequence[Sequence[int]] | None) -> list[list[int]] | None:
    """Each shape with a leading batch dimension (-1): ``[[-1, 2]]`` stays, ``[[2]]`` (one row's shape,
    as Horovod's tests write it) becomes ``[[-1, 2]]``; a batch then keeps its rows whatever its size.
    A shape that starts with a fixed batch size (Horovod took ``[[1, 2]]`` with ``batch_size=1``) is
    taken as one row's shape too; write -1 first where the model's input has a batch dimension."""
    if shapes is None:
        return None
    return [list(shape) if list(shape)[:1] == [-1] else [-1, *shape] for shape in shapes]


def reshaped(values: list[np.ndarray], shapes: Sequence[Sequence[int]] | None) -> list[np.ndarray]:
    """Each feature batch in its input's shape (with the batch dimension), where ``shapes`` gives one."""
    if not shapes:
        return values
    return [value.reshape(shape) for value, shape in zip(values, shapes, strict=True)]


def keras_input_shapes(model: Any, row_shapes: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """Horovod's reshaping of feature columns for a Keras model: each column to its ``model.inputs``
    shape (``[-1, *dims]``) where those dims are known and hold as many values as a row of the
    column, else as it is; None where no column needs it (or the model has no known inputs yet)."""
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, ValueError):  # a model not built yet has no inputs
        return None
    if len(inputs) != len(row_shapes):
        return None
    shapes = []
    for tensor, row in zip(inputs, row_shapes, strict=True):
        dims = [int(dim) if dim is not None else None for dim in tuple(tensor.shape)[1:]]
        fits = None not in dims and math.prod(dims) == math.prod(row) and list(row) != dims
        shapes.append([-1, *(dims if fits else row)])
    return shapes if any(shape[1:] != list(row) for shape, row in zip(shapes, row_shapes, strict=True)) else None

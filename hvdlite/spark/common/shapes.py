"""Horovod's ``input_shapes``: how each feature column is shaped into the model's input."""

from __future__ import annotations

from collections.abc import Sequence


def batched(shapes: Sequence[Sequence[int]] | None) -> list[list[int]] | None:
    """Each shape with a leading batch dimension (-1): ``[[-1, 2]]`` stays, ``[[2]]`` (one row's shape,
    as Horovod's tests write it) becomes ``[[-1, 2]]``; a batch then keeps its rows whatever its size.
    A shape that starts with a fixed batch size (Horovod took ``[[1, 2]]`` with ``batch_size=1``) is
    taken as one row's shape too; write -1 first where the model's input has a batch dimension."""
    if shapes is None:
        return None
    return [list(shape) if list(shape)[:1] == [-1] else [-1, *shape] for shape in shapes]

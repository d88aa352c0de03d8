"""Horovod's graph-time topology ops: the job's size and ranks as int32 scalar tensors."""

from __future__ import annotations

import tensorflow as tf

from ... import basics
from ...core.runtime import current
from ...errors import ProcessSetError


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The size of process set ``process_set_id`` (default: the job's) as a tensor.

    Fixed while the set is registered, so a constant is exact.
    """
    for process_set in current().communicators.sets:
        if process_set.process_set_id == process_set_id:
            return tf.constant(process_set.size(), dtype=tf.int32, name=name)
    raise ProcessSetError(f"size_op: no process set with id {process_set_id} is registered")


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank is in process set ``process_set_id``, else 0, as an int32 tensor (Horovod's op)."""
    for process_set in current().communicators.sets:
        if process_set.process_set_id == process_set_id:
            return tf.constant(int(bool(process_set.included())), dtype=tf.int32, name=name)
    raise ProcessSetError(f"process_set_included_op: no process set with id {process_set_id} is registered")


def rank_op(name: str | None = None) -> tf.Tensor:
    """``rank()`` as a tensor."""
    return tf.constant(basics.rank(), dtype=tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """``local_size()`` as a tensor."""
    return tf.constant(basics.local_size(), dtype=tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """``local_rank()`` as a tensor."""
    return tf.constant(basics.local_rank(), dtype=tf.int32, name=name)

"""Horovod's graph-time topology ops: the job's size and ranks as int32 scalar tensors."""

from __future__ import annotations

import tensorflow as tf

from .. import basics


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """``size()`` as a tensor (fixed for the job's lifetime, so a constant is exact)."""
    return tf.constant(basics.size(), dtype=tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    """``rank()`` as a tensor."""
    return tf.constant(basics.rank(), dtype=tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """``local_size()`` as a tensor."""
    return tf.constant(basics.local_size(), dtype=tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """``local_rank()`` as a tensor."""
    return tf.constant(basics.local_rank(), dtype=tf.int32, name=name)

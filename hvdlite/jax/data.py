"""Which examples each rank trains on: JAX has no ``DistributedSampler``, so here is its logic."""

from __future__ import annotations

import numpy as np

from .. import basics


def shard_indices(num_examples: int, epoch: int = 0, *, seed: int = 0, shuffle: bool = True,
                  drop_last: bool = False, rank: int | None = None, size: int | None = None) -> np.ndarray:
    """The indices of the examples this rank takes in ``epoch``.

    Every rank draws the same permutation (from ``seed`` and ``epoch``, so call it each epoch with
    the epoch number to reshuffle) and takes every ``size``-th index starting at its rank, so the
    shards are disjoint and, together, cover the data. As in PyTorch's ``DistributedSampler``,
    every rank gets the same count: without ``drop_last`` the permutation is padded by wrapping
    around (a few examples appear twice per epoch); with it the remainder is dropped.
    ``rank``/``size`` default to this process's.
    """
    rank = basics.rank() if rank is None else rank
    size = basics.size() if size is None else size
    if num_examples < 0 or not 0 <= rank < size:
        raise ValueError(f"shard_indices: need num_examples >= 0 and 0 <= rank < size, got "
                         f"num_examples={num_examples}, rank={rank}, size={size}")
    order = np.random.default_rng([seed, epoch]).permutation(num_examples) if shuffle else np.arange(num_examples)
    if drop_last:
        order = order[: num_examples // size * size]
    elif num_examples % size:
        if num_examples == 0:
            return order
        padding = size - num_examples % size
        order = np.concatenate([order, np.resize(order, padding)])
    return order[rank::size]

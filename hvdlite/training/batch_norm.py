"""Batch normalization over the whole batch of every rank (Horovod's ``SyncBatchNorm``), for any framework.

Each rank sends its shard's per-channel count, mean and sum of squared deviations (M2); combining
them (Chan et al.'s parallel variance) gives exactly the statistics of the whole batch, also when
ranks hold different numbers of samples, and without the cancellation of ``E[x^2] - E[x]^2``. The
backward pass needs two per-channel sums over the whole batch (of ``dy`` and of ``dy * x_hat``);
with them the input gradient is the one a single process on the whole batch computes:

    dx = weight * invstd / N * (N * dy - sum(dy) - x_hat * sum(dy * x_hat))

An adapter passes its tensors (shaped ``(ranks, channels)`` for the moments) and a sum over the
ranks' axis; the formulas are written only here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def combine_moments(counts: Any, means: Any, m2s: Any, total: Callable[[Any], Any]) -> tuple[Any, Any, Any]:
    """Every rank's (count, mean, M2) -> the whole batch's (count, mean, biased variance) per channel.

    ``counts`` is ``(ranks, 1)``, ``means`` and ``m2s`` are ``(ranks, channels)``; ``total`` sums over
    the first axis. The variance is biased (divided by the count), as normalization uses it.
    """
    count = total(counts)
    mean = total(counts * means) / count
    m2 = total(m2s) + total(counts * (means - mean) ** 2)
    return count, mean, m2 / count


def running_variance(variance: Any, count: float) -> Any:
    """The unbiased variance the running statistics track, from the biased one of ``count`` samples."""
    return variance * (count / max(count - 1.0, 1.0))


def input_gradient(dy: Any, x_hat: Any, scale: Any, count: float, sum_dy: Any, sum_dy_x_hat: Any) -> Any:
    """The gradient of the normalization's input; ``scale`` is ``weight * invstd`` shaped to broadcast
    against ``dy``, and the sums are over the whole batch (every rank), shaped likewise."""
    return scale / count * (count * dy - sum_dy - x_hat * sum_dy_x_hat)

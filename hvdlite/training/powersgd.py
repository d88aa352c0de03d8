"""PowerSGD gradient compression (Vogels et al., NeurIPS 2019): the configuration and its rules.

PowerSGD replaces the allreduce of a gradient matrix ``M`` (n x m) by the allreduce of two thin
factors: ``P = M Q`` (n x r) and, after orthogonalizing the averaged ``P``, ``Q = M^T P`` (m x r).
The averaged gradient is approximated by ``P Q^T``, which is the same on every rank because every
rank computes it from the same two averaged factors. What the approximation leaves out is kept
per rank (error feedback) and added to the next step's gradient, so nothing is lost for good.
``Q`` persists from step to step (warm start: one power iteration per step refines it).

This module is the framework-neutral part, used by the torch adapter
(:mod:`hvdlite.torch.slow_links.powersgd`) and the optax one (:mod:`hvdlite.jax.slow_links.powersgd`): the
:class:`PowerSGD` configuration that ``Compression.powersgd(...)`` returns, which tensors are
compressed and as what matrix, and the seeded initial ``Q``. As in torch's ``powerSGD_hook``,
the first ``start_step`` steps are plain averaging (early training is sensitive to the
approximation), and tensors with fewer than two dimensions, or too small for the factors to
save ``min_compression_rate`` times the bytes, are averaged uncompressed in one grouped request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedOperationError
from ..ops import ReduceOp
from .options import check_count

# Request names of the grouped allreduces of a PowerSGD step (adapters add a scope): every gradient
# before start_step, then the two factors' rounds and the uncompressed rest. Distinct names, so
# that each keeps one signature and stays in the core's response cache.
VANILLA_NAME, P_NAME, Q_NAME, UNCOMPRESSED_NAME = ("powersgd.vanilla", "powersgd.P", "powersgd.Q",
                                                   "powersgd.uncompressed")


@dataclasses.dataclass(frozen=True)
class PowerSGD:
    """PowerSGD's settings; pass as ``compression=`` to a torch or optax ``DistributedOptimizer``.

    ``rank``: columns of the factors (1 to 4 is typical; higher approximates better and costs
    more). ``start_step``: optimizer steps averaged uncompressed before compression starts.
    ``min_compression_rate``: a matrix is compressed only if its factors are this many times
    smaller than it. ``seed``: seeds the initial ``Q`` (the same on every rank).
    ``epsilon``: added to column norms when orthogonalizing, so a zero gradient divides by no zero.
    """

    rank: int = 1
    start_step: int = 10
    min_compression_rate: float = 2.0
    seed: int = 0
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        # object.__setattr__: the dataclass is frozen; the checked values are stored as plain ints.
        object.__setattr__(self, "rank", check_count(self.rank, "Compression.powersgd rank", minimum=1))
        object.__setattr__(self, "start_step", check_count(self.start_step, "Compression.powersgd start_step",
                                                           minimum=0))
        object.__setattr__(self, "seed", check_count(self.seed, "Compression.powersgd seed", minimum=0))
        for name in ("min_compression_rate", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Compression.powersgd {name} must be a finite number >= 0, got {value!r}")

    # A PowerSGD configuration is not a per-tensor compressor: refuse where one is expected.
    @staticmethod
    def compress(*_args: Any) -> tuple[Any, Any]:
        raise UnsupportedOperationError(
            "Compression.powersgd(...) works only as DistributedOptimizer(compression=...) of hvdlite.torch "
            "or hvdlite.jax; it cannot compress a single collective")

    decompress = compress

    def plan(self, shape: Sequence[int]) -> tuple[int, int, int] | None:
        """``(n, m, r)`` if a tensor of ``shape`` is compressed as an n x m matrix with rank-r factors, else None.

        The matrix is the tensor's first dimension by the product of the rest, as in the paper
        (a convolution kernel becomes output channels x everything else). ``r`` is at most
        ``min(n, m)``: a higher rank could not approximate better.
        """
        if len(shape) < 2:
            return None  # biases and scalars: small, and not matrices
        n, m = matrix_shape(shape)
        r = min(n, m, self.rank)
        if n * m <= (n + m) * r * self.min_compression_rate:
            return None  # the factors would not be small enough to be worth the extra round
        return n, m, r

    def initial_q(self, index: int, m: int, r: int) -> np.ndarray:
        """The starting ``Q`` (m x r, float64) of the ``index``-th tensor: standard normal, seeded by
        ``seed`` and ``index`` only, so every rank (and every framework) starts from the same one."""
        return np.random.default_rng([self.seed, index]).standard_normal((m, r))


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The (rows, columns) a tensor of ``shape`` (at least 2-D) is viewed as: first dim x the rest."""
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def check_powersgd_options(op: ReduceOp, gradient_predivide_factor: float, local_sgd_period: int | None) -> None:
    """Refuse the optimizer options PowerSGD is not built to combine with, naming each."""
    if op is not ReduceOp.AVERAGE:
        raise ValueError(f"Compression.powersgd averages gradients: it needs op=Average, got op={op.name}")
    if gradient_predivide_factor != 1.0:
        raise ValueError(f"Compression.powersgd cannot be combined with gradient_predivide_factor="
                         f"{gradient_predivide_factor} (not built)")
    if local_sgd_period is not None:
        raise ValueError(f"Compression.powersgd cannot be combined with local_sgd_period={local_sgd_period} "
                         "(not built)")


__all__ = ["P_NAME", "PowerSGD", "Q_NAME", "UNCOMPRESSED_NAME", "VANILLA_NAME", "check_powersgd_options",
           "matrix_shape"]

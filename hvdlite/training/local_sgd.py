"""Local SGD's schedule, written once for torch, Keras and JAX (see :mod:`hvdlite.torch.slow_links.local_sgd`).

Post-local SGD (Lin et al., 2020; torch's ``PostLocalSGDOptimizer``): updates ``0 .. W-1`` are
synchronous (gradients averaged), after them each rank updates alone and the parameters are
averaged after every ``period``-th local update. ``step`` is the 0-based index of the update being
made. The arithmetic uses only ``<``, ``+``, ``%`` and ``&``, so the same functions take a Python
int, a ``jax.numpy`` array or a TensorFlow tensor, traced or not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .options import check_count


@dataclasses.dataclass(frozen=True)
class LocalSGDSchedule:
    """When updates are synchronous and after which updates the parameters are averaged."""

    period: int
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", check_count(self.period, "local_sgd_period", minimum=1))
        object.__setattr__(self, "warmup_steps", check_count(self.warmup_steps, "local_sgd_warmup_steps", minimum=0))

    def synchronous(self, step: Any) -> Any:
        """True while gradients are still averaged (update ``step`` is in the warm-up)."""
        return step < self.warmup_steps

    def averages_after(self, step: Any) -> Any:
        """True if the parameters are averaged right after update ``step`` (every ``period`` local ones)."""
        local = step + 1 - self.warmup_steps
        return (local > 0) & (local % self.period == 0)


__all__ = ["LocalSGDSchedule"]

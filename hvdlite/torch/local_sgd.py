"""Local SGD for the torch ``DistributedOptimizer``: K steps on local gradients, then an average.

Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", 2020; torch's
``PostLocalSGDOptimizer``): the first ``warmup_steps`` optimizer steps are fully synchronous
(gradients averaged as usual, so every rank starts the local phase from the same parameters);
afterwards each rank steps on its own gradients, with no communication, and after every
``period`` such steps the parameters are averaged over the process set in one grouped, fused
allreduce through the core. With ``average_state`` the optimizer's floating-point state (Adam's
moments, momentum buffers) is averaged with them. Every rank takes the same number of steps, so
every rank averages at the same step without negotiating when.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import Average
from ..process_sets import ProcessSet
from ..training.local_sgd import LocalSGDSchedule


class LocalSGD:
    """The step counter and the averaging of one wrapped optimizer (see the module's doc)."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], period: int,
                 warmup_steps: int, average_state: bool, process_set: ProcessSet) -> None:
        self.schedule = LocalSGDSchedule(period, warmup_steps)
        self._optimizer, self._names = optimizer, names
        self._average_state, self._process_set = average_state, process_set
        self.steps = 0  # optimizer steps since the optimizer was made (or the world last changed)
        self.averages = 0

    @property
    def synchronous(self) -> bool:
        """True while gradients are still averaged every step (the warm-up)."""
        return bool(self.schedule.synchronous(self.steps))

    def after_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        """Optimizer step post-hook: count the step; average every ``period`` local steps."""
        averages = self.schedule.averages_after(self.steps)
        self.steps += 1
        if averages:
            self.average()

    def average(self) -> None:
        """Average the parameters (and with ``average_state`` the optimizer state) across the set, now."""
        from .async_ops import grouped_allreduce_

        tensors = [param.data for param in self._names]
        if self._average_state:
            tensors += [value for param in self._names for _, value in sorted(self._optimizer.state[param].items())
                        if torch.is_tensor(value) and value.is_floating_point()]
        if tensors:
            grouped_allreduce_(tensors, op=Average, name="local_sgd", process_set=self._process_set)
        self.averages += 1

    def restart(self) -> None:
        """Elastic: a new world starts counting (and warming up) again, the same on every rank."""
        self.steps = 0
        self.averages = 0


__all__ = ["LocalSGD"]

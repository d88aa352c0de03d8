"""``DistributedOptimizer(op=Adasum)``: each rank steps on its own gradients, and the parameter
*deltas* are combined with Adasum, as Horovod's ``_DistributedAdasumOptimizer`` does.

``step()`` remembers the parameters, runs the wrapped optimizer on this rank's gradients (its state
stays this rank's own, as in Horovod), takes each parameter's change, combines the changes across
the ranks with ``op=Adasum`` (one request per parameter: each change is weighed by its own dot
products) and sets every parameter to where it started plus the combined change. With
``backward_passes_per_step=N`` the gradients of N backward passes accumulate before the caller's
``step()``, as without Adasum. Unlike Horovod, the changes are reduced after the local step rather
than parameter by parameter during backward: the same result, without overlap, and what the caller
does between ``backward()`` and ``step()`` (clipping, ``GradScaler.unscale_``) still acts on the
gradients the step uses (Horovod's per-parameter step in the gradient hook runs before those).
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import Adasum
from ...process_sets import ProcessSet
from ...training.options import check_passes
from ..collectives import async_ops
from .step_control import TOO_MANY_PASSES, SkippableSynchronize


class AdasumDeltaReducer(SkippableSynchronize):
    """Hooks on one optimizer: the parameters before its step, their combined change after it."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], passes: int,
                 process_set: ProcessSet) -> None:
        self._names = names
        self._process_set = process_set
        self.backward_passes_per_step = passes
        self._passes_seen = dict.fromkeys(names, 0)
        self._start: list[torch.Tensor] | None = None
        self._original_zero_grad = optimizer.zero_grad
        self._hooks = [optimizer.register_step_pre_hook(self._before_step),
                       optimizer.register_step_post_hook(self._after_step)]
        self._hooks += [p.register_post_accumulate_grad_hook(self._on_gradient) for p in names]

    def _on_gradient(self, param: torch.Tensor) -> None:
        self._passes_seen[param] += 1
        if self._passes_seen[param] > self.backward_passes_per_step:
            raise AssertionError(TOO_MANY_PASSES)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._start = [param.detach().clone() for param in self._names]

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        start, self._start = self._start, None
        for param in self._passes_seen:
            self._passes_seen[param] = 0
        if start is None:
            return
        with torch.no_grad():
            handles = [async_ops.allreduce_async_(param.detach() - before, op=Adasum, name=f"adasum.delta.{name}",
                                                  process_set=self._process_set)
                       for (param, name), before in zip(self._names.items(), start, strict=True)]
            for param, before, handle in zip(self._names, start, handles, strict=True):
                param.copy_(before.add_(async_ops.synchronize(handle)))

    # ---- methods bound onto the optimizer ----------------------------------------------------
    def synchronize(self) -> None:
        """Nothing to wait for: the changes are combined inside ``step()``."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._original_zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = check_passes(passes)

    def world_changed(self) -> None:
        """Elastic: the job re-formed; nothing of the old world is in flight between steps."""
        self._start = None
        for param in self._passes_seen:
            self._passes_seen[param] = 0


"""The distributed half of a torch ``DistributedOptimizer`` that averages gradients: a
post-accumulate-grad hook per parameter starts that gradient's allreduce as soon as backward has
produced it (:mod:`.grad_sync`), and an optimizer step pre-hook waits for all of them.

Local SGD and PowerSGD (:mod:`hvdlite.torch.slow_links`) plug into it; it names what it uses of
them as Protocols, so this room does not import the one above it.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch

from ... import errors
from ...process_sets import ProcessSet
from ...training.options import check_passes
from .grad_sync import GradientSubmitter
from .step_control import TOO_MANY_PASSES, ZERO_GRAD_RACE, SkippableSynchronize


class LocalSchedule(Protocol):
    """Local SGD's schedule, as the reducer uses it (:class:`hvdlite.torch.slow_links.local_sgd.LocalSGD`)."""

    @property
    def synchronous(self) -> bool: ...

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None: ...

    def restart(self) -> None: ...


class WholeStepReduction(Protocol):
    """A reduction of the whole step's gradients in ``synchronize()``
    (:class:`hvdlite.torch.slow_links.powersgd.PowerSGDReducer`)."""

    def reduce(self) -> None: ...

    def restart(self) -> None: ...


class GradientReducer(SkippableSynchronize):
    """The distributed half of a wrapped optimizer: hooks, in-flight reductions, synchronization."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
                 submitter: GradientSubmitter, backward_passes_per_step: int,
                 local_sgd: LocalSchedule | None = None, powersgd: WholeStepReduction | None = None) -> None:
        self._optimizer = optimizer
        self.local_sgd = local_sgd
        self.powersgd = powersgd  # PowerSGD reduces the whole step in synchronize(), not in the hooks
        self._submitter = submitter
        self._names = names
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for p in names}
        self._synchronized = False
        self._should_synchronize = True
        self._original_zero_grad = optimizer.zero_grad
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in names]
        self._hooks.append(optimizer.register_step_pre_hook(self._before_step))
        if local_sgd is not None and names:
            self._hooks.append(optimizer.register_step_post_hook(local_sgd.after_step))

    @property
    def process_set(self) -> ProcessSet:
        """The ranks whose gradients are averaged (which therefore hold the same parameters)."""
        return self._submitter.process_set

    @property
    def communicating(self) -> bool:
        """False in local SGD's local phase: gradients stay on their rank, parameters are averaged."""
        return self.local_sgd is None or self.local_sgd.synchronous

    # ---- hooks -------------------------------------------------------------------------------
    def _on_gradient(self, param: torch.Tensor) -> None:
        if self._delay[param] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        self._delay[param] -= 1
        self._synchronized = False
        if self._delay[param] == 0 and self.communicating and self.powersgd is None:
            self._submitter.submit(param)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code.",
                    stacklevel=3)
            self.synchronize()
        self._synchronized = False

    # ---- methods bound onto the optimizer ----------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every gradient's allreduce; gradients that never arrived are reduced as zeros."""
        if self._synchronized and not self._submitter.in_flight:
            return  # already done since the last backward: reducing again would only cost time
        if not self.communicating:  # local SGD: this step's gradients are this rank's own
            self._reset_delays()
            self._synchronized = True
            return
        try:
            if self.powersgd is not None:
                self.powersgd.reduce()
            else:
                self._submitter.submit_missing([p for p in self._names if self._delay[p] > 0])
                self._submitter.wait_all()
        except errors.HvdliteShutdownError:  # a peer died (elastic: the step is redone in a new world)
            self._submitter.abandon()
            raise
        finally:
            self._reset_delays()
        self._synchronized = True

    def _reset_delays(self) -> None:
        for param in self._delay:
            self._delay[param] = self.backward_passes_per_step

    def world_changed(self, process_set: ProcessSet | None = None) -> None:
        """Elastic: the job re-formed; requests start as in a new optimizer, the same on every rank.
        ``process_set``: the new world's set to average over (the old world's sets are gone)."""
        if process_set is not None and (self.local_sgd is not None or self.powersgd is not None):
            raise ValueError("a DistributedOptimizer with local SGD or PowerSGD cannot move to another process set; "
                             "build a new one over it")
        self._submitter.restart(process_set)
        self._reset_delays()
        self._synchronized = False
        if self.local_sgd is not None:
            self.local_sgd.restart()
        if self.powersgd is not None:
            self.powersgd.restart()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._submitter.in_flight:
            raise AssertionError(ZERO_GRAD_RACE)
        self._original_zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        passes = check_passes(passes)
        self.backward_passes_per_step = passes
        for param in self._delay:
            self._delay[param] = passes

"""Local SGD for the torch ``DistributedOptimizer``: K steps on local gradients, then an average.

Post-local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", 2020; torch's
``PostLocalSGDOptimizer``): the first ``warmup_steps`` optimizer steps are fully synchronous
(gradients averaged as usual, so every rank starts the local phase from the same parameters);
afterwards each rank steps on its own gradients, with no communication, and after every
``period`` such steps the parameters are averaged over the process set in one grouped, fused
allreduce through the core. With ``average_state`` the optimizer's floating-point state (Adam's
moments, momentum buffers) is averaged with them. Every rank takes the same number of steps, so
every rank averages at the same step without negotiating when.

With ``overlap`` the average runs while the next period's local steps compute: at an averaging
step each rank keeps a copy of its parameters (the anchor) and starts averaging another copy,
and at the next averaging step it adds ``average - anchor`` to its parameters (its own progress
since the anchor is kept) before starting the next average. Every average thus lands one period
late, and the link is busy while the processor is: on a slow link the step costs
``max(compute, communication / period)`` instead of their sum. It costs two copies of the
parameters and is not combined with ``average_state``. The average in flight is a blocking
allreduce on a helper thread, which runs the engine's cycles itself at the training thread's
priority: left to the engine thread, which runs at low priority (``HVDLITE_ENGINE_NICE``), it made
almost no progress while every core computed, until the next averaging step waited for it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from ...ops import Average
from ...process_sets import ProcessSet
from ...training.local_sgd import LocalSGDSchedule


class _BackgroundAverage(threading.Thread):
    """Averages ``tensors`` in place with a blocking allreduce on its own thread, which thereby runs
    the engine's cycles itself (see :meth:`hvdlite.core.engine.Engine.drive`), at its creator's priority."""

    def __init__(self, tensors: list[torch.Tensor], name: str, process_set: ProcessSet) -> None:
        super().__init__(name="hvdlite-local-sgd-average", daemon=True)
        self._tensors, self._request, self._process_set = tensors, name, process_set
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        from ..collectives.async_ops import grouped_allreduce_

        try:
            grouped_allreduce_(self._tensors, op=Average, name=self._request, process_set=self._process_set)
        except BaseException as error:  # noqa: BLE001 - raised again on the training thread, in wait()
            self._error = error

    def wait(self) -> None:
        """Block until the average is done; raise what it raised."""
        self.join()
        if self._error is not None:
            raise self._error


@dataclasses.dataclass
class _InFlight:
    """An overlapped average: the parameters, their values when it started, and its allreduce."""

    params: list[torch.Tensor]
    anchors: list[torch.Tensor]
    sent: list[torch.Tensor]  # copies of the anchors, averaged in place
    average: _BackgroundAverage


class LocalSGD:
    """The step counter and the averaging of one wrapped optimizer (see the module's doc)."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], period: int,
                 warmup_steps: int, average_state: bool, process_set: ProcessSet, overlap: bool = False) -> None:
        self.schedule = LocalSGDSchedule(period, warmup_steps)
        if overlap and average_state:
            raise ValueError("local_sgd_overlap=True cannot be combined with local_sgd_average_state=True (not built)")
        self._optimizer, self._names = optimizer, names
        self._average_state, self._process_set, self.overlap = average_state, process_set, overlap
        self.steps = 0  # optimizer steps since the optimizer was made (or the world last changed)
        self.averages = 0  # averages applied to the parameters
        self._in_flight: _InFlight | None = None

    @property
    def synchronous(self) -> bool:
        """True while gradients are still averaged every step (the warm-up)."""
        return bool(self.schedule.synchronous(self.steps))

    def after_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        """Optimizer step post-hook: count the step; average every ``period`` local steps."""
        averages = self.schedule.averages_after(self.steps)
        self.steps += 1
        if averages and self.overlap:
            self._start_overlapped()
        elif averages:
            self.average()

    def _start_overlapped(self) -> None:
        self.finish()  # the previous period's average lands first
        params = [param.data for param in self._names]
        anchors = [param.clone() for param in params]
        sent = [anchor.clone() for anchor in anchors]
        self._in_flight = _InFlight(params, anchors, sent,
                                    _BackgroundAverage(sent, "local_sgd.overlap", self._process_set))

    def finish(self) -> None:
        """Apply the overlapped average in flight, if any: ``params += average - anchor``."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        flight.average.wait()
        with torch.no_grad():
            for param, anchor, mean in zip(flight.params, flight.anchors, flight.sent, strict=True):
                param.add_(mean.sub_(anchor))
        self.averages += 1

    def average(self) -> None:
        """Average the parameters (and with ``average_state`` the optimizer state) across the set, now
        (after landing an overlapped average in flight): call it at the end of training to leave every
        rank with the same model."""
        from ..collectives.async_ops import grouped_allreduce_

        self.finish()
        tensors = [param.data for param in self._names]
        if self._average_state:
            # Only state beside its parameter: Adam's "step" is a float32 scalar on the CPU even for
            # CUDA parameters (the same on every rank), and a group cannot mix devices.
            tensors += [value for param in self._names for _, value in sorted(self._optimizer.state[param].items())
                        if torch.is_tensor(value) and value.is_floating_point() and value.device == param.device]
        if tensors:
            grouped_allreduce_(tensors, op=Average, name="local_sgd", process_set=self._process_set)
        self.averages += 1

    def restart(self) -> None:
        """Elastic: a new world starts counting (and warming up) again, the same on every rank."""
        self.steps = 0
        self.averages = 0
        self._in_flight = None  # its allreduce ended with the old world


__all__ = ["LocalSGD"]

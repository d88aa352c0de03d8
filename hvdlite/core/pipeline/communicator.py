"""One communicator's pipeline: its queue, negotiator, executor and fusion settings, and the cycle
that runs them in order (queue -> negotiate -> fuse -> execute -> complete).

Everything a cycle touches is here, so a process set (its own communicator) or a world rebuilt
after a failure gets its own :class:`Pipeline` without sharing caches or names with another.
"""

from __future__ import annotations

import logging
import time

from ...ops import Collective
from ...settings.config import Config
from ..planes.base import Outcome
from ..transport.base import ControlChannel
from ..work.item import WorkItem
from ..work.item import describe as describe_item
from ..work.params import Params
from ..work.response import Response
from ..work.scope import JOB, Scope
from . import fuse
from .autotune import Autotuner
from .complete import complete
from .execute import Executor
from .lone import LonePath
from .negotiate import Agreement, Negotiator
from .queue import RequestQueue
from .timeline import Timeline, row_name

log = logging.getLogger("hvdlite")


class Pipeline:
    """The stages of one communicator. Only the thread holding the engine's cycle lock calls :meth:`cycle`."""

    def __init__(self, config: Config, control: ControlChannel, executor: Executor, scope: Scope = JOB) -> None:
        self.rank, self.size = control.rank, control.size
        self.queue = RequestQueue(self.rank)
        self.negotiator = Negotiator(config, control, scope)
        self.executor = executor
        self.fusion_threshold = config.fusion_threshold  # autotune moves it, on every rank at once
        self._tuner = Autotuner.from_config(config, self.params) if config.autotune and self.rank == 0 else None
        self._reduced_bytes = 0  # rank 0 with autotune: allreduce bytes executed in this cycle
        self._reduced_names: list[str] = []  # ... and the names of those tensors
        # Items started and not yet finished, oldest first: a timed-out wait is on the oldest (none: negotiating).
        self.unfinished: list[WorkItem] = []
        self.settling = False  # waiting, after this cycle's transfers, until peers finished theirs
        # Set and cleared from the user's thread (start_timeline / stop_timeline); read once per cycle.
        self.timeline: Timeline | None = None
        self.lone = LonePath(self, control)  # the small-op path: blocking lone allreduces run by their callers

    @property
    def params(self) -> Params:
        """The fusion threshold and chunk size in use (moved by autotune)."""
        return Params(self.fusion_threshold, self.executor.transport.chunk_bytes)

    @property
    def tuner(self) -> Autotuner | None:
        return self._tuner

    def cycle(self) -> tuple[bool, bool]:
        """One cycle through every stage. Returns (made progress, every rank shut down)."""
        queue, timeline = self.queue, self.timeline
        arrived = queue.take_arrived()
        if timeline is None and self._tuner is None and len(queue.pending) == 1 and not (queue.closed or queue.joins):
            return self._cycle_lone(arrived)
        if timeline is not None:
            for request in arrived:
                timeline.begin(row_name(request.meta), "NEGOTIATE_" + request.meta.collective.name,
                               request.submitted_at)
        agreement = self.negotiator.agree(queue.pending, flush=queue.closed or queue.joins > 0, shutdown=queue.closed)
        if agreement.params is not None:
            self._apply(agreement.params)
        if timeline is not None:
            decided = [r.meta for r in agreement.responses if r.meta.name in queue.pending]
            ready = self.negotiator.decided_ready
            timeline.negotiated([row_name(m) for m in decided],
                                {row_name(m): ready[m.name] for m in decided if m.name in ready}, time.monotonic())
        self._execute(agreement, timeline)
        if self._tuner is not None and self._reduced_bytes:
            proposal = self._tuner.record(self._reduced_bytes, time.monotonic(), self._reduced_names)
            self._reduced_bytes, self._reduced_names = 0, []
            if proposal is not None:
                self.negotiator.publish(proposal)
        if timeline is not None:
            if timeline.mark_cycles and (agreement.responses or arrived):
                timeline.cycle(time.monotonic())
            timeline.flush()
        return bool(agreement.responses or arrived), agreement.shutdown

    def _cycle_lone(self, arrived: list) -> tuple[bool, bool]:
        """The cycle of one pending request (a blocking call's, in steady state), in fewer steps.

        The same stages and the same collectives as :meth:`cycle`, so ranks taking either path
        stay in step; what is skipped is bookkeeping that one request does not need: the vector
        is built once per cache bit, and one response runs at once, with no fusion plan.
        """
        pending = self.queue.pending
        (request,) = pending.values()
        negotiator = self.negotiator
        payload = self.executor.host.carriable(request)
        if payload is not None and not negotiator.carries(len(payload)):
            payload = None
        vector = negotiator.lone_vector(request, len(payload) if payload is not None else 0)
        if vector is None:
            agreement, payloads = negotiator.agree(pending, flush=False, shutdown=False), None
        else:
            agreement, payloads = negotiator.agree_lone(vector, pending, payload)
        if payloads is not None:  # every rank carried its tensor: each reduces it, no transfer
            (response,) = agreement.responses
            complete(self.queue, [(response, self.executor.host.reduce_carried(response, request, payloads), None)],
                     None)
        else:
            self.run_agreed(agreement)
        return bool(agreement.responses or arrived), agreement.shutdown

    def run_agreed(self, agreement: Agreement) -> None:
        """Apply and run what a lone request's cycle agreed (its own response, or whatever a peer's
        vector brought: another request, a round, a flush)."""
        if agreement.params is not None:
            self._apply(agreement.params)
        responses = agreement.responses
        if len(responses) == 1:
            self._execute_one(responses[0])
        elif responses:
            self._execute(agreement, None)

    def _execute_one(self, response: Response) -> None:
        """Run a cycle's only response to completion (nothing to fuse with or to overlap)."""
        item = WorkItem((response,))
        self.unfinished.append(item)
        outcome = self.executor.run(item, self.queue.pending)
        self.settling = True
        self.executor.finish()
        self.settling = False
        self.unfinished.clear()
        complete(self.queue, outcome, None)

    def _apply(self, params: Params) -> None:
        """Switch to autotuned settings; every rank does it after the same negotiation round."""
        if params != self.params:
            log.info("autotune: switching to %s", params.describe())
        self.fusion_threshold = params.fusion_threshold
        self.executor.transport.chunk_bytes = params.chunk_bytes

    def _execute(self, agreement: Agreement, timeline: Timeline | None) -> None:
        """Fuse the agreed responses and run them; a host allreduce may finish after the next item started."""
        for item in fuse.plan(agreement.responses, self.fusion_threshold):
            self.unfinished.append(item)
            if self._tuner is not None:
                self._count_reduced(item.responses)
            if timeline is not None:
                self._begin_items(item, timeline)
            self.executor.start(item, self.queue.pending,
                                lambda outcome, item=item: self._finished(item, outcome, timeline))
        self.settling = True
        self.executor.finish()
        self.settling = False

    def _count_reduced(self, responses: tuple[Response, ...]) -> None:
        reduced = [r for r in responses if r.meta.collective is Collective.ALLREDUCE and not r.error]
        self._reduced_bytes += sum(r.wire_nbytes for r in reduced)
        self._reduced_names += [r.meta.name for r in reduced]

    def _begin_items(self, item: WorkItem, timeline: Timeline) -> None:
        start = time.monotonic()
        for response in item.responses:
            if response.meta.name in self.queue.pending:
                args = {"bytes": response.wire_nbytes, "fused_with": len(item.responses) - 1}
                timeline.begin(row_name(response.meta), response.meta.collective.name, start, args)

    def _finished(self, item: WorkItem, outcome: Outcome, timeline: Timeline | None) -> None:
        # By identity, from the front: items finish in the order they started, except an error
        # response, which is delivered at once.
        for index, started in enumerate(self.unfinished):
            if started is item:
                del self.unfinished[index]
                break
        complete(self.queue, outcome, timeline)

    def describe_wait(self) -> str:
        """What this rank was waiting on, for a timeout's message."""
        if self.unfinished:
            return describe_item(self.unfinished[0])
        return "waiting for peers to finish this cycle's transfers" if self.settling else "negotiation"

    def close(self) -> None:
        """Release the executor's and the negotiator's resources (collective: every rank agreed to stop)."""
        self.lone.close()
        self.executor.close()
        self.negotiator.close()

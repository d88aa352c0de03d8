"""The engine: sequences the pipeline's cycles on one background thread per process.

A *cycle* runs every stage of :mod:`hvdlite.core.pipeline` once, in order (see
:meth:`hvdlite.core.pipeline.communicator.Pipeline.cycle`). This module decides only *when* and *on
which thread* cycles run, and what happens when one fails.

The thread sleeps while this rank has nothing pending (waking every ``idle_cycle_seconds`` to
take part in peers' cycles, so a stall can be diagnosed). While requests are pending it cycles,
backing off up to the poll time when a cycle makes no progress, so a rank waiting on slower peers
costs a few percent of a core, not a spinning one.

The thread runs at a low priority (``HVDLITE_ENGINE_NICE``; see :mod:`hvdlite.utils.priority`). A
caller waiting on a blocking collective runs the cycles itself while the engine thread sleeps
(:meth:`Engine.drive`, the one entry point for that).
"""

from __future__ import annotations

import logging
import threading
import time
from _thread import get_ident
from collections.abc import Callable

from .. import errors
from ..settings.config import Config
from ..utils import interrupts, priority
from ..utils.polling import WaitTimeout
from .pipeline.communicator import Pipeline
from .pipeline.execute import Executor
from .pipeline.lone import EngineParts
from .pipeline.timeline import Timeline
from .transport.base import ControlChannel
from .work.params import Params
from .work.request import Handle, Request
from .work.scope import JOB, Scope

log = logging.getLogger("hvdlite")

_DOZE_SECONDS = 0.001  # while dozing, how often the engine thread looks for work
# How long after the last work it dozes, before it sleeps until woken. Measured on the torch training
# step (np=2): with 0.2 s, 88.2 ms against 86.5-86.8 before dozing (about 90 wake-ups a step, each
# taking the GIL from the training thread); with 10 ms, 83.7-86.6 against 86.5-87.3.
_DOZE_FOR = 0.01


class Engine:
    """Runs the cycles of one communicator's :class:`Pipeline`. Start with :meth:`start`."""

    def __init__(self, config: Config, control: ControlChannel, executor: Executor,
                 abort: Callable[[int], None], scope: Scope = JOB) -> None:
        """``abort(code)`` ends the whole job; used only if the engine itself fails (a bug)."""
        self._config = config
        self._abort = abort
        self._pipeline = Pipeline(config, control, executor, scope)
        self._queue = self._pipeline.queue
        self.rank, self.size = control.rank, control.size
        # Held for each cycle by whichever thread runs it: the engine thread, or a caller waiting
        # on a handle while the engine thread sleeps (see drive()). Cycles are collectives, so a
        # rank runs them one at a time and in order, whichever thread runs each.
        self._driving = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvdlite-engine", daemon=True)
        self._drive = self.drive  # one bound method for every handle
        self._sigint = interrupts.SigintGuard()  # holds Ctrl-C back while a caller's thread runs a cycle
        self._drivers: set[int] = set()  # threads running cycles in drive() now
        self._dozing = False  # the engine thread looks for work every _DOZE_SECONDS: submit need not wake it
        self._active_at = 0.0  # monotonic time this rank last had work (the thread dozes a while after)
        # One pass through the pipeline's stages: (made progress, every rank shut down). Bound once:
        # it runs on every blocking call.
        self._cycle = self._pipeline.cycle
        self._pipeline.lone.lend(EngineParts(self._driving, self._drivers, self._sigint, self._fail, self._drive))
        # The small-op path (hvdlite.core.pipeline.lone): a blocking small allreduce run at once on the
        # caller's thread, or None when it must take the regular path.
        self.lone_allreduce = self._pipeline.lone.allreduce

    # ---- user-thread side -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, requests: list[Request], wake: bool = True) -> None:
        """Queue ``requests`` atomically (a group is negotiated together). Raises on bad names.

        ``wake=False`` leaves the engine thread asleep: for a caller that waits on the handles at
        once, whose wait then runs the cycle itself (:meth:`drive`). Not here: submitting never
        blocks, and only a driving caller keeps the engine thread from taking its cycles over.
        """
        self._queue.put(requests)
        for request in requests:
            request.handle.driver = self._drive
        # Not while the thread dozes (it looks for work every _DOZE_SECONDS by itself): a wake-up
        # costs the caller a GIL hand-off, and a caller that waits at once runs the cycle anyway.
        if wake and not self._dozing and not self._wake.is_set():
            self._wake.set()

    def drive(self, handle: Handle) -> None:
        """Run cycles on the caller's thread until ``handle`` is done, while the engine thread sleeps.

        Called by a handle's wait before it blocks, so a blocking collective costs no thread
        hand-off (waking the engine thread, then the waiter). Backs off between cycles while peers
        are not ready, as the engine thread would; the engine thread starts no cycle meanwhile (an
        idle wake-up would otherwise take the next cycles over, at its low priority). Stops once the
        engine thread is cycling or the engine stopped, and wakes the engine thread to finish.
        Ctrl-C is held back while a cycle runs (:class:`hvdlite.utils.interrupts.SigintGuard`).
        """
        idle_streak = 0
        me = get_ident()
        drivers, queue, driving = self._drivers, self._queue, self._driving
        drivers.add(me)  # the engine thread starts no cycle while a caller drives
        try:
            while not handle.delivered and not queue.closed:
                if idle_streak:
                    time.sleep(self._backoff(idle_streak))  # Ctrl-C here leaves with the work handed over
                if not driving.acquire(False):  # positional: cheaper, and this runs per call
                    break
                try:
                    progressed = self._sigint.run(self._turn)
                finally:
                    driving.release()
                if progressed is None:
                    break
                idle_streak = 0 if progressed else idle_streak + 1
        finally:
            drivers.discard(me)  # before the wake-up, so the engine thread sees it gone
            if not handle.delivered or queue.has_work:
                self._wake.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask every rank's engine to stop; returns when this one has (all ranks must call it)."""
        self._queue.close()
        self._wake.set()
        self._thread.join(timeout)
        self._sigint.uninstall()

    def abandon(self, error: errors.HvdliteError, timeout: float = 5.0) -> None:
        """Stop without a word to the peers (some died): fail what is queued with ``error``.

        Its MPI resources stay as they are (freeing them is collective, and a dead peer never
        joins); the thread ends at its next wait's probe or its next turn.
        """
        if self._queue.fatal is None:
            self._queue.fail_all(error)
        self._wake.set()
        self._thread.join(timeout)
        self._sigint.uninstall()

    @property
    def fatal(self) -> errors.HvdliteError | None:
        """The error that stopped the engine, if one did."""
        return self._queue.fatal

    @property
    def pipeline(self) -> Pipeline:
        return self._pipeline

    @property
    def timeline(self) -> Timeline | None:
        return self._pipeline.timeline

    def use_timeline(self, timeline: Timeline | None) -> Timeline | None:
        """Record cycles into ``timeline`` from the next cycle on (None stops); returns the one replaced."""
        previous, self._pipeline.timeline = self._pipeline.timeline, timeline
        return previous

    @property
    def params(self) -> Params:
        """The fusion threshold and chunk size in use (moved by autotune)."""
        return self._pipeline.params

    def publish_params(self, params: Params) -> None:
        """On rank 0: switch every rank to ``params`` at the next negotiation round.

        What autotune does with its proposals; benchmarks use it to compare hand-picked settings
        within one job. Every rank switches between the same two cycles.
        """
        if self.rank != 0:
            raise errors.HvdliteError(f"publish_params runs on rank 0 (called on rank {self.rank})")
        self._pipeline.negotiator.publish(params)
        self._wake.set()

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        priority.lower_this_thread(self._config.engine_nice)
        idle_streak = 0
        while True:
            self._sleep_until_work(idle_streak)
            if self._drivers and not self._queue.closed:
                continue  # a caller is running the cycles; it wakes this thread when it stops
            with self._driving:
                progressed = self._turn()
            if progressed is None:
                return
            if progressed:
                self._active_at = time.monotonic()
            idle_streak = 0 if progressed else idle_streak + 1

    def _turn(self) -> bool | None:
        """One cycle, on the thread holding ``_driving``: whether it made progress, or None once
        the engine has stopped (every rank shut down, or a failure ended it)."""
        if self._queue.fatal is not None:
            return None
        try:
            progressed, finished = self._cycle()
            if finished:
                self._queue.fail_all(errors.HvdliteShutdownError("hvdlite was shut down"))
                self._pipeline.close()  # every rank is here: collective teardown cannot hang
                return None
            return progressed
        except BaseException as exc:
            self._fail(exc)
        return None

    def _fail(self, exc: BaseException) -> None:
        """A cycle failed with ``exc``: fail every queued request with what it means, or end the job."""
        if isinstance(exc, errors.DeviceError):  # this rank's GPU plane failed: peers cannot go on, end the job
            log.error("hvdlite GPU data plane failed on rank %d: %s", self.rank, exc)
            self._queue.fail_all(exc)
            self._abort(1)
        elif isinstance(exc, errors.HvdliteError):  # fatal, and already agreed by every rank
            log.error("%s", exc)
            self._queue.fail_all(exc)
        elif isinstance(exc, WaitTimeout):  # a peer behind a dead link, or one that stopped: say which
            error = self._timeout_error(exc)
            log.error("%s", error)
            self._queue.fail_all(error)
        else:  # a bug: peers would wait forever for this rank, so end the job
            log.error("hvdlite engine failed on rank %d; aborting the job", self.rank, exc_info=exc)
            self._queue.fail_all(errors.HvdliteShutdownError(f"hvdlite engine failed on rank {self.rank}: {exc!r}"))
            self._abort(1)

    def _timeout_error(self, exc: WaitTimeout) -> errors.CommTimeoutError:
        """Probe every peer, then describe the timeout with the ranks that did not answer."""
        window = self._config.probe_window_seconds
        return errors.comm_timeout(self.rank, self.size, self._pipeline.describe_wait(), exc.seconds,
                                   self._pipeline.negotiator.reachable_peers(window), window,
                                   self._config.comm_timeout_seconds, exc.peer)

    def _sleep_until_work(self, idle_streak: int) -> None:
        """Sleep while nothing is pending; back off while pending work makes no progress."""
        if self._queue.closed:
            return
        if self._drivers or not self._queue.has_work:
            slept = self._doze()
            if (self._drivers or not self._queue.has_work) and self._wake.wait(
                    max(0.0, self._config.idle_cycle_seconds - slept)):
                self._active_at = time.monotonic()  # woken: work is coming, doze after the next cycle
        elif idle_streak:
            self._wake.wait(self._backoff(idle_streak))
        elif self._config.cycle_time_ms:
            time.sleep(self._config.cycle_time_ms / 1000)  # let more requests join this cycle
        self._wake.clear()

    def _doze(self) -> float:
        """For ``_DOZE_FOR`` seconds after this rank was last active, look for work every
        ``_DOZE_SECONDS`` instead of waiting to be woken; returns the seconds spent.

        An ``_async`` call then costs its caller no wake-up of this thread, which would take the
        GIL from the caller and a core from the peers (measured: 4 B ``allreduce_async`` +
        ``synchronize`` 34.8 us against 19.3 us blocking at np=2); a caller that synchronizes at
        once runs the cycle itself, and otherwise the request starts within ``_DOZE_SECONDS``.
        """
        start = now = time.monotonic()
        until = min(self._active_at + _DOZE_FOR, start + self._config.idle_cycle_seconds)
        queue = self._queue
        self._dozing = True
        try:
            # Work younger than a doze is left to its caller a little longer: one that waits at
            # once is about to run the cycle itself, and taking it over would cost a hand-off.
            while now < until and not queue.closed and (
                    self._drivers or not queue.has_work or queue.arrived_since(now - _DOZE_SECONDS)):
                self._wake.wait(_DOZE_SECONDS)
                now = time.monotonic()
        finally:
            # Cleared before the caller reads has_work again: a request put after that read finds
            # _dozing false and wakes the thread (all under the GIL, in this order).
            self._dozing = False
        return now - start

    def _backoff(self, idle_streak: int) -> float:
        """Seconds to wait before the next cycle after ``idle_streak`` cycles without progress."""
        return min(20e-6 * 2 ** min(idle_streak, 16), self._config.poll_time_ms / 1000)

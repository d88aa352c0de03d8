"""The background engine: one thread per process that owns all communication.

Each *cycle*: move newly submitted requests into the pending table; agree with every rank, in
one bitwise-AND all-reduce, on which cached requests are pending everywhere; if any rank has
requests the cache cannot answer (or asked to bypass it), run a coordinator round; then execute
the agreed responses, fused, in the same order on every rank.

The thread sleeps while this rank has nothing pending (waking every ``idle_cycle_seconds`` to
take part in peers' cycles, so a stall can be diagnosed). While requests are pending it cycles,
backing off up to the poll time when a cycle makes no progress, so a rank waiting on slower peers
costs a few percent of a core, not a spinning one.

The thread runs at a low priority (``HVDLITE_ENGINE_NICE``; see :mod:`hvdlite.priority`). A
caller waiting on a blocking collective runs the cycles itself while the engine thread sleeps
(:meth:`Engine.drive`).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import threading
import time
from collections.abc import Callable

from . import errors, fusion, interrupts, priority
from .autotune import Autotuner, Params
from .backend.base import ControlChannel
from .config import Config
from .executor import Executor, Outcome
from .naming import clashing_names
from .negotiation import Coordinator
from .ops import Collective
from .polling import WaitTimeout
from .request import Handle, Request
from .response import RankMessage, Response, RoundResult
from .response_cache import FLUSH, HAS_NEW, ROUND_DUE, SHUTDOWN, TUNE, CycleState, Lookup, ResponseCache, decode, encode
from .timeline import Timeline

log = logging.getLogger("hvdlite")


class Engine:
    """Queue, negotiation and execution for one process. Start with :meth:`start`."""

    def __init__(self, config: Config, control: ControlChannel, executor: Executor,
                 abort: Callable[[int], None]) -> None:
        """``abort(code)`` ends the whole job; used only if the engine itself fails (a bug)."""
        self._config = config
        self._abort = abort
        self._control = control
        self._executor = executor
        self.rank, self.size = control.rank, control.size
        self._cache = ResponseCache(config.cache_capacity)
        stall = config.stall_check
        self._coordinator = (
            Coordinator(self.size, config.stall_check_seconds if stall else None,
                        config.stall_shutdown_seconds if stall else None)
            if self.rank == 0 else None
        )
        self._lock = threading.Lock()
        # Held for each cycle by whichever thread runs it: the engine thread, or a caller waiting
        # on a handle while the engine thread sleeps (see drive()). Cycles are collectives, so a
        # rank runs them one at a time and in order, whichever thread runs each.
        self._driving = threading.Lock()
        self._wake = threading.Event()
        self._incoming: list[Request] = []
        self._in_flight: set[str] = set()
        self._pending: dict[str, Request] = {}
        self._shutdown_requested = False
        self._last_round = time.monotonic()
        self._fatal: errors.HvdliteError | None = None
        # Items started and not yet finished, oldest first: a timed-out wait is on the oldest (none: negotiating).
        self._unfinished: list[fusion.WorkItem] = []
        self._settling = False  # waiting, after this cycle's transfers, until peers finished theirs
        self._fusion_threshold = config.fusion_threshold  # autotune moves it, on every rank at once
        self._tuner = Autotuner.from_config(config, self.params) if config.autotune and self.rank == 0 else None
        self._to_publish: Params | None = None  # rank 0: settings the next round tells every rank
        self._reduced_bytes = 0  # rank 0 with autotune: allreduce bytes executed in this cycle
        self._reduced_names: list[str] = []  # ... and the names of those tensors
        # Set and cleared from the user's thread (start_timeline / stop_timeline); read once per cycle.
        self.timeline: Timeline | None = None
        self._thread = threading.Thread(target=self._run, name="hvdlite-engine", daemon=True)
        self._drive = self.drive  # one bound method for every handle
        self._drivers: set[int] = set()  # threads running cycles in drive() now
        self._joins = 0  # pending JOIN requests: while any, every cycle bypasses the cache
        self._next_stall_check = 0.0  # monotonic time of the next look for requests stalled behind the cache

    # ---- user-thread side -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, requests: list[Request], wake: bool = True) -> None:
        """Queue ``requests`` atomically (a group is negotiated together). Raises on bad names.

        ``wake=False`` leaves the engine thread asleep: for a caller that waits on the handles at
        once, whose wait then runs the cycle itself (:meth:`drive`).
        """
        with self._lock:
            if self._fatal is not None:
                raise type(self._fatal)(str(self._fatal))
            if self._shutdown_requested:
                raise errors.HvdliteShutdownError("hvdlite is shutting down; no new operations are accepted")
            names = [r.meta.name for r in requests]
            clash = (len(names) != 1 or names[0] in self._in_flight) and clashing_names(names, self._in_flight)
            if clash:
                raise errors.DuplicateNameError(
                    f"tensor name(s) {clash} already in flight on rank {self.rank}; wait for the earlier "
                    "operation or give each operation a unique name")
            self._in_flight.update(names)
            self._incoming.extend(requests)
        for request in requests:
            request.handle.driver = self._drive
        if wake and not self._wake.is_set():  # set and not yet cleared: the thread will see these requests
            self._wake.set()

    def drive(self, handle: Handle) -> None:
        """Run cycles on the caller's thread until ``handle`` is done, while the engine thread sleeps.

        Called by a handle's wait before it blocks, so a blocking collective costs no thread
        hand-off (waking the engine thread, then the waiter). Backs off between cycles while peers
        are not ready, as the engine thread would; the engine thread starts no cycle meanwhile (an
        idle wake-up would otherwise take the next cycles over, at its low priority). Stops once the
        engine thread is cycling or the engine stopped, and wakes the engine thread to finish.
        Ctrl-C is held back while a cycle runs (:func:`hvdlite.interrupts.run_deferring_sigint`).
        """
        idle_streak = 0
        me = threading.get_ident()
        self._drivers.add(me)  # the engine thread starts no cycle while a caller drives
        try:
            while not handle.done() and not self._shutdown_requested:
                if idle_streak:
                    time.sleep(self._backoff(idle_streak))  # Ctrl-C here leaves with the work handed over
                if not self._driving.acquire(blocking=False):
                    break
                try:
                    progressed = interrupts.run_deferring_sigint(self._turn)
                finally:
                    self._driving.release()
                if progressed is None:
                    break
                idle_streak = 0 if progressed else idle_streak + 1
        finally:
            self._drivers.discard(me)  # before the wake-up, so the engine thread sees it gone
            if not handle.done() or self._pending or self._incoming:
                self._wake.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask every rank's engine to stop; returns when this one has (all ranks must call it)."""
        with self._lock:
            self._shutdown_requested = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def fatal(self) -> errors.HvdliteError | None:
        """The error that stopped the engine, if one did."""
        return self._fatal

    @property
    def params(self) -> Params:
        """The fusion threshold and chunk size in use (moved by autotune)."""
        return Params(self._fusion_threshold, self._executor.backend.chunk_bytes)

    def publish_params(self, params: Params) -> None:
        """On rank 0: switch every rank to ``params`` at the next negotiation round.

        What autotune does with its proposals; benchmarks use it to compare hand-picked settings
        within one job. Every rank switches between the same two cycles.
        """
        if self.rank != 0:
            raise errors.HvdliteError(f"publish_params runs on rank 0 (called on rank {self.rank})")
        self._to_publish = params
        self._wake.set()

    def _apply(self, params: Params) -> None:
        """Switch to autotuned settings; every rank does it after the same negotiation round."""
        if params != self.params:
            log.info("autotune: switching to %s", params.describe())
        self._fusion_threshold = params.fusion_threshold
        self._executor.backend.chunk_bytes = params.chunk_bytes

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        priority.lower_this_thread(self._config.engine_nice)
        idle_streak = 0
        while True:
            self._sleep_until_work(idle_streak)
            if self._drivers and not self._shutdown_requested:
                continue  # a caller is running the cycles; it wakes this thread when it stops
            with self._driving:
                progressed = self._turn()
            if progressed is None:
                return
            idle_streak = 0 if progressed else idle_streak + 1

    def _turn(self) -> bool | None:
        """One cycle, on the thread holding ``_driving``: whether it made progress, or None once
        the engine has stopped (every rank shut down, or a failure ended it)."""
        if self._fatal is not None:
            return None
        try:
            progressed, finished = self._cycle()
            if finished:
                self._fail_all(errors.HvdliteShutdownError("hvdlite was shut down"))
                self._executor.close()  # every rank is here: collective teardown cannot hang
                self._control.close()
                return None
            return progressed
        except errors.DeviceError as exc:  # this rank's GPU plane failed: peers cannot go on, end the job
            log.error("hvdlite GPU data plane failed on rank %d: %s", self.rank, exc)
            self._fail_all(exc)
            self._abort(1)
        except errors.HvdliteError as exc:  # fatal, and already agreed by every rank
            log.error("%s", exc)
            self._fail_all(exc)
        except WaitTimeout as exc:  # a peer behind a dead link, or one that stopped: say which
            error = self._timeout_error(exc)
            log.error("%s", error)
            self._fail_all(error)
        except BaseException as exc:  # a bug: peers would wait forever for this rank, so end the job
            log.exception("hvdlite engine failed on rank %d; aborting the job", self.rank)
            self._fail_all(errors.HvdliteShutdownError(f"hvdlite engine failed on rank {self.rank}: {exc!r}"))
            self._abort(1)
        return None

    def _timeout_error(self, exc: WaitTimeout) -> errors.CommTimeoutError:
        """Probe every peer, then describe the timeout with the ranks that did not answer."""
        doing = (fusion.describe(self._unfinished[0]) if self._unfinished else
                 "waiting for peers to finish this cycle's transfers" if self._settling else "negotiation")
        window = self._config.probe_window_seconds
        return errors.comm_timeout(self.rank, self.size, doing, exc.seconds, self._control.reachable_peers(window),
                                   window, self._config.comm_timeout_seconds)

    def _sleep_until_work(self, idle_streak: int) -> None:
        """Sleep while nothing is pending; back off while pending work makes no progress."""
        if self._shutdown_requested:
            return
        if self._drivers or (not self._pending and not self._incoming):
            self._wake.wait(self._config.idle_cycle_seconds)
        elif idle_streak:
            self._wake.wait(self._backoff(idle_streak))
        elif self._config.cycle_time_ms:
            time.sleep(self._config.cycle_time_ms / 1000)  # let more requests join this cycle
        self._wake.clear()

    def _backoff(self, idle_streak: int) -> float:
        """Seconds to wait before the next cycle after ``idle_streak`` cycles without progress."""
        return min(20e-6 * 2 ** min(idle_streak, 16), self._config.poll_time_ms / 1000)

    def _cycle(self) -> tuple[bool, bool]:
        """One negotiation + execution cycle. Returns (made progress, every rank shut down)."""
        with self._lock:
            arrived = self._incoming
            self._incoming = []
        timeline = self.timeline
        for request in arrived:
            self._pending[request.meta.name] = request
            self._joins += request.meta.collective is Collective.JOIN
            if timeline is not None:
                timeline.begin(request.meta.name, "NEGOTIATE_" + request.meta.collective.name, request.submitted_at)
        flush = self._shutdown_requested or self._joins > 0 or self._stalled_locally()
        state = self._local_state(flush)
        verdict = decode(self._control.band(encode(state, self._cache.words)), self._cache.words)
        responses: list[Response] = []
        if verdict.or_flags & FLUSH:
            self._cache = ResponseCache(self._cache.capacity)  # identical on every rank
        else:
            for bit in sorted(verdict.invalid):
                self._cache.evict(bit)
            responses.extend(self._cache.get(bit) for bit in sorted(verdict.hits))
        if verdict.or_flags & (HAS_NEW | FLUSH | ROUND_DUE | TUNE):
            responses.extend(self._negotiate(bool(verdict.or_flags & FLUSH)))
        if timeline is not None:
            ready = self._coordinator.decided_ready if self._coordinator is not None else {}
            timeline.negotiated([r.meta.name for r in responses if r.meta.name in self._pending], ready,
                                time.monotonic())
        self._execute(responses, timeline)
        if self._tuner is not None and self._reduced_bytes:
            proposal = self._tuner.record(self._reduced_bytes, time.monotonic(), self._reduced_names)
            self._reduced_bytes, self._reduced_names = 0, []
            if proposal is not None:
                self._to_publish = proposal
        if timeline is not None:
            if timeline.mark_cycles and (responses or arrived):
                timeline.cycle(time.monotonic())
            timeline.flush()
        return bool(responses or arrived), bool(verdict.and_flags & SHUTDOWN)

    def _stalled_locally(self) -> bool:
        """A request hidden behind the cache for too long goes to the coordinator's stall inspector."""
        if not self._config.stall_check or (now := time.monotonic()) < self._next_stall_check:
            return False
        self._next_stall_check = now + min(1.0, self._config.stall_check_seconds / 10)  # a scan per cycle costs
        limit = now - self._config.stall_check_seconds
        return any(not r.sent_to_coordinator and r.submitted_at < limit for r in self._pending.values())

    def _local_state(self, flush: bool) -> CycleState:
        or_flags = (FLUSH if flush else 0) | self._round_due() | (TUNE if self._to_publish is not None else 0)
        return self._cache.cycle_state(self._pending.values(), flush, or_flags,
                                       SHUTDOWN if self._shutdown_requested else 0)

    def _round_due(self) -> int:
        """On the coordinator: ask for a round now and then while names wait, so stalls are seen."""
        if self._coordinator is None or not self._coordinator.has_pending:
            return 0
        return ROUND_DUE if time.monotonic() - self._last_round > self._config.idle_cycle_seconds else 0

    def _negotiate(self, flush: bool) -> list[Response]:
        """A coordinator round: send what the cache cannot answer, receive the job's verdict."""
        now = self._last_round = time.monotonic()
        outgoing = [
            r for r in self._pending.values()
            if not r.sent_to_coordinator and (flush or self._cache.lookup(r.meta)[0] is not Lookup.HIT)
        ]
        for request in outgoing:
            request.sent_to_coordinator = True
        message = RankMessage(
            self.rank, tuple(r.meta for r in outgoing), tuple(now - r.submitted_at for r in outgoing),
            shutdown=self._shutdown_requested,
        )
        gathered = self._control.gather_to_root(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        payload = None
        if self._coordinator is not None:
            result = self._coordinator.round(pickle.loads(m) for m in gathered)
            if self._to_publish is not None:
                result = dataclasses.replace(result, params=self._to_publish)
                self._to_publish = None
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        result: RoundResult = pickle.loads(self._control.broadcast_from_root(payload))
        for warning in result.warnings:
            log.warning("%s", warning)
        if result.fatal:
            raise errors.StallError(result.fatal)
        if result.params is not None:
            self._apply(result.params)
        for response in result.responses:
            self._cache.put(response)
        return list(result.responses)

    def _execute(self, responses: list[Response], timeline: Timeline | None = None) -> None:
        """Run the planned work items; a host allreduce may finish after the next item started."""
        for item in fusion.plan(responses, self._fusion_threshold):
            self._unfinished.append(item)
            if self._tuner is not None:
                reduced = [r for r in item.responses if r.meta.collective is Collective.ALLREDUCE and not r.error]
                self._reduced_bytes += sum(r.wire_nbytes for r in reduced)
                self._reduced_names += [r.meta.name for r in reduced]
            if timeline is not None:
                start = time.monotonic()
                for response in item.responses:
                    if response.meta.name in self._pending:
                        args = {"bytes": response.wire_nbytes, "fused_with": len(item.responses) - 1}
                        timeline.begin(response.meta.name, response.meta.collective.name, start, args)
            self._executor.start(item, self._pending,
                                 lambda outcome, item=item: self._finished(item, outcome, timeline))
        self._settling = True
        self._executor.finish()
        self._settling = False

    def _finished(self, item: fusion.WorkItem, outcome: Outcome, timeline: Timeline | None) -> None:
        # By identity, from the front: items finish in the order they started, except an error
        # response, which is delivered at once.
        for index, started in enumerate(self._unfinished):
            if started is item:
                del self._unfinished[index]
                break
        # Names are released *before* waking the waiters, so a waiter can resubmit its name at once.
        done = []
        for response, result, error in outcome:
            request = self._pending.pop(response.meta.name, None)
            if request is not None:  # else a name this rank never submitted (it joined, or a peer's error)
                done.append((request, result, error))
        with self._lock:
            for request, _, _ in done:
                self._in_flight.discard(request.meta.name)
        for request, result, error in done:
            self._joins -= request.meta.collective is Collective.JOIN
            if timeline is not None:
                timeline.end(request.meta.name, time.monotonic(), {"error": str(error)} if error else None)
            if error is not None:
                request.handle.set_error(error)
            else:
                request.handle.set_result(result)

    def _fail_all(self, error: errors.HvdliteError) -> None:
        with self._lock:
            self._fatal = error
            requests = list(self._pending.values()) + self._incoming
            self._pending.clear()
            self._joins = 0
            self._incoming = []
            self._in_flight.clear()
        for request in requests:
            request.handle.set_error(error)

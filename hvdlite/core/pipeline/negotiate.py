"""Stage 3, negotiate: agree with every rank on which pending requests run now, and in what order.

Each cycle is one bitwise-AND all-reduce of a small bit vector (:mod:`.cache`): requests the
response cache answers are agreed there. Only when some rank has a request the cache cannot answer
(a new name, a changed shape), or asked to bypass the cache, does a coordinator round follow:
every rank sends rank 0 what it has, rank 0 (:mod:`.coordinator`) decides and broadcasts the
responses. The negotiator returns an :class:`Agreement`; it never executes anything itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pickle
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from ... import errors
from ...settings.config import Config
from ..transport.base import Carrier, ControlChannel
from ..work.params import Params
from ..work.request import Request, RequestMeta
from ..work.response import RankMessage, Response, RoundResult
from ..work.scope import JOB, Scope
from .cache import CARRIED, FLUSH, HAS_NEW, ROUND_DUE, SHUTDOWN, TUNE, CycleState, Lookup, ResponseCache, decode, encode
from .coordinator import Coordinator

log = logging.getLogger("hvdlite")

CALL_DIVERGENCE_SECONDS = 5.0  # how long a cached process-group call waits before the coordinator looks


class SteadyCall(Protocol):
    """A small-op call's fixed parts, as :meth:`Negotiator.steady_exchange` reads them (see :mod:`.lone`)."""

    meta: RequestMeta
    carrier: Carrier  # exchanges the vector, with the tensor beside it where it can ride along
    carried: bool  # whether the vector says the tensor rides along (it must say what the carrier does)
    vectors: dict[int, bytes]  # cache bit -> this call's vector, filled by the negotiator


class Agreement(NamedTuple):  # a NamedTuple: one is made every cycle, and a frozen dataclass costs ~1 us more
    """What every rank agreed in one cycle (the same on every rank)."""

    responses: list[Response]  # to execute now, in this order
    params: Params | None  # settings every rank switches to now (autotune), or None
    shutdown: bool  # every rank asked to shut down


class Negotiator:
    """Owns the response cache, the coordinator (on rank 0) and the control channel of one communicator."""

    def __init__(self, config: Config, control: ControlChannel, scope: Scope = JOB) -> None:
        self._config = config
        self._control = control
        self.rank, self.size = control.rank, control.size
        self._cache = ResponseCache(config.cache_capacity)
        stall = config.stall_check
        self._coordinator = (
            Coordinator(self.size, config.stall_check_seconds if stall else None,
                        config.stall_shutdown_seconds if stall else None, scope=scope)
            if self.rank == 0 else None
        )
        self._last_round = time.monotonic()
        self._next_stall_check = 0.0  # monotonic time of the next look for requests stalled behind the cache
        # How long a cached process-group call waits before it goes to the coordinator: there it is
        # seen diverged, or past its group's timeout (set: bound_calls, on every rank).
        self._calls_wait = CALL_DIVERGENCE_SECONDS
        self._calls_bounded = False
        self._to_publish: Params | None = None  # rank 0: settings the next round tells every rank
        # The lone-request vector of each cache bit, and back: it depends only on the bit and the
        # cache's width, which never changes, so entries outlive evictions and flushes.
        self._lone_vectors: dict[tuple[int, bool], bytes] = {}  # (bit, carried) -> vector
        self._lone_bits: dict[bytes, int] = {}
        self._carries: dict[int, bool] = {}  # payload length -> whether the control channel carries it
        # Rank 0: the names waiting at the coordinator for other ranks (elsewhere, never any).
        self._waiting_names = self._coordinator.waiting if self._coordinator is not None else {}

    def bound_calls(self, seconds: float | None) -> None:
        """Fail a torch group's call (naming.CallNames) that waits for ranks longer than ``seconds``
        (the group's timeout), naming them. Set on every rank; the coordinator's (rank 0's) acts.
        Groups over the same ranks share their calls' names: the shortest timeout holds for all."""
        if seconds:  # at the coordinator by half the timeout, so that it can act at the deadline
            self._calls_wait, self._calls_bounded = min(self._calls_wait, seconds / 2), True
        if self._coordinator is not None and seconds:
            current = self._coordinator.call_deadline
            self._coordinator.call_deadline = seconds if current is None else min(current, seconds)

    def publish(self, params: Params) -> None:
        """On rank 0: every rank switches to ``params`` after the next round (autotune, benchmarks)."""
        self._to_publish = params

    @property
    def decided_ready(self) -> dict[str, dict[int, float]]:
        """On rank 0: when each rank was ready for the names decided in the last round (for the timeline)."""
        return self._coordinator.decided_ready if self._coordinator is not None else {}

    def agree(self, pending: Mapping[str, Request], flush: bool, shutdown: bool) -> Agreement:
        """One cycle's agreement on ``pending``; ``flush`` bypasses the cache (joins, shutdown)."""
        flush = flush or self._stalled_locally(pending)
        or_flags = (FLUSH if flush else 0) | self._round_due() | (TUNE if self._to_publish is not None else 0)
        state = self._cache.cycle_state(pending.values(), flush, or_flags, SHUTDOWN if shutdown else 0)
        return self._settle(self._control.band(encode(state, self._cache.words)), pending, shutdown)

    def lone_vector(self, request: Request, carried: int = 0) -> bytes | None:
        """This rank's cycle vector when ``request``, its only pending request, is answered by the
        cache and nothing else needs saying (no flag, no invalid entry); None otherwise.

        The steady state of a blocking call. The vector depends only on the cache bit, so it is
        built once per bit; :meth:`agree_lone` then needs no encoding or decoding when every rank
        sent the same vector (they all want exactly this request, and nothing else). ``carried``:
        the length of the tensor bytes this rank sends with the vector, if the channel
        :meth:`carries` them.
        """
        if (request.sent_to_coordinator or self._to_publish is not None or self._round_due()
                or (self._config.stall_check and time.monotonic() >= self._next_stall_check)):
            return None
        found, bit = self._cache.lookup(request.meta)
        if found is not Lookup.HIT:
            return None
        return self._vector_of(bit, carried > 0)

    def steady_exchange(self, entry: SteadyCall, tensor: object) -> tuple[bytes, Sequence | None] | None:
        """The cycle of the small-op path (:mod:`.lone`): :meth:`lone_vector`'s vector for
        ``entry.meta`` (carried if ``entry.carried``), exchanged with ``tensor`` by ``entry.carrier``.

        Returns the reduced vector and, when every rank sent this very vector, what the carrier
        hands back (every rank's tensor, or nothing for a device tensor): the request ran, and the
        cache's recency is updated as :meth:`agree_lone` does. None, having sent nothing, unless
        the cache answers the meta and nothing else could need saying: no settings to publish, no
        name waiting at the coordinator.
        """
        # No stall scan here (lone_vector's): it looks at pending requests, and this call is not one yet.
        if self._to_publish is not None or self._waiting_names:
            return None
        meta = entry.meta
        by_name = self._cache.by_name
        cached = by_name.get(meta.name)
        if cached is None or cached[1] != meta:  # a miss, or another signature: the regular path
            return None
        vector = entry.vectors.get(cached[0]) or self._steady_vector(entry, cached[0])
        exchanged = entry.carrier.exchange(vector, tensor)
        if exchanged[1] is not None:
            by_name.move_to_end(meta.name)  # most recently used, as ResponseCache.get marks it
        return exchanged

    def carries(self, nbytes: int) -> bool:
        """True if a lone request's ``nbytes`` of tensor can ride with the cycle's vector."""
        answer = self._carries.get(nbytes)
        if answer is None:  # fixed for the channel's life: asked once per size
            answer = self._carries[nbytes] = self._control.carries(self.vector_bytes, nbytes)
        return answer

    def agree_lone(self, vector: bytes, pending: Mapping[str, Request],
                   payload: memoryview | None = None) -> tuple[Agreement, list[memoryview] | None]:
        """The cycle's agreement when this rank contributes ``vector`` from :meth:`lone_vector`.

        With ``payload`` (the tensor's bytes; the vector then says so), also every rank's
        payload in rank order, if every rank sent the very same vector: each rank can then reduce
        the tensor itself, with no data transfer. Otherwise None, and the agreed responses run as
        in any cycle.
        """
        if payload is None:
            reduced, payloads = self._control.band(vector), None
        else:
            reduced, payloads = self._control.band_carrying(vector, payload)
        if reduced == vector:  # every rank sent this very vector: the one cached request, no flags
            return Agreement([self._cache.get(self._lone_bits[vector])], None, False), payloads
        return self._settle(reduced, pending, shutdown=False), None

    def settle_lone(self, reduced: bytes | bytearray, pending: Mapping[str, Request]) -> Agreement:
        """The agreement when a :meth:`steady_exchange` reduced to ``reduced``, another vector."""
        return self._settle(reduced, pending, shutdown=False)

    @property
    def vector_bytes(self) -> int:
        """The length of every cycle's vector (fixed for the negotiator's life)."""
        return 16 + 16 * self._cache.words

    def _vector_of(self, bit: int, carried: bool) -> bytes:
        key = (bit, carried)
        vector = self._lone_vectors.get(key)
        if vector is None:
            state = CycleState(and_flags=CARRIED if carried else 0, hits=frozenset((bit,)))
            vector = self._lone_vectors[key] = encode(state, self._cache.words)
            self._lone_bits[vector] = bit
        return vector

    def _steady_vector(self, entry: SteadyCall, bit: int) -> bytes:
        vector = entry.vectors[bit] = self._vector_of(bit, entry.carried)
        return vector

    def _settle(self, reduced: bytes | bytearray, pending: Mapping[str, Request], shutdown: bool) -> Agreement:
        """Read the reduced vector: the cache's hits, then a coordinator round if any rank asked for one."""
        verdict = decode(reduced, self._cache.words)
        responses: list[Response] = []
        if verdict.or_flags & FLUSH:
            self._cache = ResponseCache(self._cache.capacity)  # identical on every rank
        else:
            for bit in sorted(verdict.invalid):
                self._cache.evict(bit)
            responses.extend(self._cache.get(bit) for bit in sorted(verdict.hits))
        params = None
        if verdict.or_flags & (HAS_NEW | FLUSH | ROUND_DUE | TUNE):
            decided, params = self._round(pending, bool(verdict.or_flags & FLUSH), shutdown)
            responses.extend(decided)
        return Agreement(responses, params, bool(verdict.and_flags & SHUTDOWN))

    def _stalled_locally(self, pending: Mapping[str, Request]) -> bool:
        """A request hidden behind the cache for too long goes to the coordinator's stall inspector."""
        checking = self._config.stall_check
        if not (checking or self._calls_bounded) or (now := time.monotonic()) < self._next_stall_check:
            return False
        # A scan per cycle costs; a group's timeout is seen within a quarter of it past the deadline.
        self._next_stall_check = now + min(1.0, self._config.stall_check_seconds / 10, self._calls_wait / 2)
        limit = now - self._config.stall_check_seconds if checking else -math.inf
        # Unnamed calls of a process group (naming.CallNames) that diverged, or wait past their group's
        # timeout, wait on cached names, which no round would show: they go to the coordinator sooner.
        calls_limit = now - (min(self._config.stall_check_seconds, self._calls_wait) if checking else self._calls_wait)
        return any(not r.sent_to_coordinator and r.submitted_at < (calls_limit if r.meta.name.startswith("call.")
                                                                    else limit) for r in pending.values())

    def _round_due(self) -> int:
        """On the coordinator: ask for a round now and then while names wait, so stalls are seen."""
        if self._coordinator is None or not self._coordinator.has_pending:
            return 0
        return ROUND_DUE if time.monotonic() - self._last_round > self._config.idle_cycle_seconds else 0

    def _round(self, pending: Mapping[str, Request], flush: bool,
               shutdown: bool) -> tuple[list[Response], Params | None]:
        """A coordinator round: send what the cache cannot answer, receive the job's verdict."""
        now = self._last_round = time.monotonic()
        outgoing = [
            r for r in pending.values()
            if not r.sent_to_coordinator and (flush or self._cache.lookup(r.meta)[0] is not Lookup.HIT)
        ]
        for request in outgoing:
            request.sent_to_coordinator = True
        message = RankMessage(self.rank, tuple(r.meta for r in outgoing),
                              tuple(now - r.submitted_at for r in outgoing), shutdown=shutdown)
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
        for response in result.responses:
            own = pending.get(response.meta.name)
            self._cache.put(response, own.meta if own is not None else None)
        return list(result.responses), result.params

    def reachable_peers(self, window: float) -> set[int]:
        """After a timed-out wait: the ranks that answer within ``window`` seconds."""
        return self._control.reachable_peers(window)

    def close(self) -> None:
        """Release the control channel's resources (collective: every rank agreed to stop)."""
        self._control.close()

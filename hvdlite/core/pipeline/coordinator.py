"""The coordinator: decides which named requests are ready on every rank, and checks they agree.

Pure logic, run on rank 0's engine thread and driven in unit tests by in-process fake ranks. It
keeps a table ``name -> {rank: RequestMeta}``; a name becomes a :class:`Response` once every
rank submitted it (ranks that called ``join()`` count as present for allreduce), or an error
response when the ranks disagree, a peer has shut down, or the join rules are broken. It also
runs the stall inspector: names waiting too long are reported with the ranks that are missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ...ops import Collective
from ..work.naming import call_kind, diverged_call_names, diverged_generated_names, diverged_object_names
from ..work.request import RequestMeta
from ..work.response import RankMessage, Response, RoundResult
from ..work.scope import JOB, Scope

_REMEMBERED_DIVERGED = 1024  # generated names kept after a divergence failed them (they never repeat)

# Fields that must be equal on every rank, per collective ("shape[1:]" compares trailing dims).
_AGREED_FIELDS: dict[Collective, tuple[str, ...]] = {
    Collective.ALLREDUCE: ("device", "dtype", "shape", "op", "prescale", "postscale"),
    Collective.REDUCESCATTER: ("device", "dtype", "shape", "op", "prescale", "postscale"),
    Collective.ALLGATHER: ("device", "dtype", "shape[1:]"),
    Collective.BROADCAST: ("device", "dtype", "shape", "root_rank"),
    Collective.ALLTOALL: ("device", "dtype", "shape[1:]"),
    Collective.BARRIER: (),
    Collective.JOIN: (),
}


def _field(meta: RequestMeta, field: str) -> object:
    if field == "shape[1:]":
        return (len(meta.shape), meta.shape[1:])
    value = getattr(meta, field)
    return value.name if hasattr(value, "name") else value


def find_mismatch(name: str, by_rank: dict[int, RequestMeta]) -> str:
    """An error message naming ``name`` and each rank's value if the ranks disagree, else ''."""
    fields = ("collective",) + _AGREED_FIELDS[next(iter(by_rank.values())).collective]
    for field in fields:
        values = {rank: _field(meta, field) for rank, meta in sorted(by_rank.items())}
        if len(set(values.values())) > 1:
            label = "number of dimensions and trailing shape" if field == "shape[1:]" else field
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in values.items())
            kind = by_rank[min(by_rank)].collective.name.lower()
            return f"Mismatched {label} for {kind} of tensor {name!r}: {per_rank}"
    return ""


class Coordinator:
    """Negotiation state of the whole job. ``round()`` consumes every rank's message."""

    def __init__(
        self,
        size: int,
        stall_warning_seconds: float | None,
        stall_shutdown_seconds: float | None,
        clock: Callable[[], float] = time.monotonic,
        scope: Scope = JOB,
    ) -> None:
        self.size = size
        self._scope = scope  # messages name job ranks, and the process set
        self._warn_after = stall_warning_seconds
        self._fail_after = stall_shutdown_seconds
        self._clock = clock
        self._table: dict[str, dict[int, RequestMeta]] = {}
        # The same dict, never replaced: read on every small-op call (Negotiator.steady_exchange).
        self.waiting: dict[str, dict[int, RequestMeta]] = self._table
        self._first_seen: dict[str, float] = {}
        self._ready_at: dict[str, dict[int, float]] = {}  # name -> rank -> when that rank submitted it
        # For the timeline: when each rank became ready, for the names decided in the last round.
        self.decided_ready: dict[str, dict[int, float]] = {}
        self._warned: set[str] = set()
        self._joined: dict[int, int] = {}  # rank -> arrival order
        self._shut_down: set[int] = set()
        # Generated names failed because ranks' sequences diverged, with their error: a rank that submits
        # one only afterwards (it was slower) gets the same error at once, not a stall.
        self._diverged: dict[str, Response] = {}
        # The last divergence of calls (naming.CallNames): the error, and the ranks that had not made
        # their call yet (they get the error for it).
        self._late_calls: tuple[str, set[int]] | None = None
        # Calls (naming.CallNames) that waited past ``call_deadline``: their error, and the ranks that had
        # not made them (they get the error when they do).
        self.call_deadline: float | None = None  # a torch group's timeout, in seconds (None: no deadline)
        self._timed_out: dict[str, tuple[str, set[int]]] = {}

    @property
    def pending_names(self) -> list[str]:
        return list(self._table)

    @property
    def has_pending(self) -> bool:
        """True while some name waits for ranks (checked every cycle, so no list is built)."""
        return bool(self._table)

    def round(self, messages: Iterable[RankMessage]) -> RoundResult:
        """Fold in one message per rank and return what every rank must do now."""
        now = self._clock()
        responses: list[Response] = []
        self.decided_ready = {}
        for message in messages:
            self._fold_in(message, now, responses)
        for name in list(self._table):
            response = self._decide(name)
            if response is not None:
                responses.append(response)
                self._forget(name)
        pending = self._job_ranked(self._table)
        generated, calls = diverged_generated_names(pending), diverged_call_names(pending)
        calls_ranks = {name: set(self._table[name]) for names, _ in calls for name in names}  # before _forget
        for names, message in generated + diverged_object_names(pending) + calls:
            for name in names:
                error = _error(self._table[name][min(self._table[name])], message + self._scope.label,
                               "TensorMismatchError")
                responses.append(error)
                if any(name in failed for failed, _ in generated):  # object names repeat: never remembered
                    self._remember_diverged(name, error)
                self._forget(name)
        for names, message in calls:  # call names repeat: what is remembered is the ranks still to call
            waiting = set().union(*(calls_ranks[name] for name in names))
            self._late_calls = (message + self._scope.label, set(range(self.size)) - waiting)
        if len(self._joined) == self.size:
            last = max(self._joined, key=lambda rank: (self._joined[rank], rank))
            responses.append(Response(RequestMeta("join", Collective.JOIN), last_joined=last))
            self._joined.clear()
        responses.extend(self._expire_calls(now))
        warnings, fatal = self._inspect_stalls(now)
        return RoundResult(tuple(responses), tuple(warnings), fatal)

    def _fold_in(self, message: RankMessage, now: float, responses: list[Response]) -> None:
        """Add one rank's new requests to the table (errors for duplicates and late diverged names)."""
        if message.shutdown:
            self._shut_down.add(message.rank)
        for meta, age in zip(message.requests, message.ages, strict=True):
            if meta.collective is Collective.JOIN:
                self._joined[message.rank] = len(self._joined)
                continue
            late = (self._diverged.get(meta.name) or self._late_call(meta, message.rank)
                    or self._timed_out_call(meta, message.rank))
            if late is not None:
                responses.append(late)
                continue
            by_rank = self._table.setdefault(meta.name, {})
            if message.rank in by_rank:
                responses.append(_error(meta, f"rank {self._scope.job_rank(message.rank)} submitted {meta.name!r} "
                                              f"twice{self._scope.label}", "DuplicateNameError"))
                continue
            by_rank[message.rank] = meta
            self._first_seen[meta.name] = min(self._first_seen.get(meta.name, now), now - age)
            self._ready_at.setdefault(meta.name, {})[message.rank] = now - age

    def _late_call(self, meta: RequestMeta, rank: int) -> Response | None:
        """The error of diverged calls (naming.CallNames) for a rank that had not made its call when
        they failed: its next call, of whatever kind, is that call. Once per such rank."""
        if self._late_calls is None or rank not in self._late_calls[1] or call_kind(meta.name) is None:
            return None
        message, late = self._late_calls
        late.discard(rank)
        if not late:
            self._late_calls = None
        return _error(meta, message, "TensorMismatchError")

    def _expire_calls(self, now: float) -> list[Response]:
        """Calls waiting past :attr:`call_deadline`: an error for the ranks that made them, naming the
        ranks that did not (remembered: each gets the error when it makes the call)."""
        if self.call_deadline is None:
            return []
        expired = []
        for name, by_rank in list(self._table.items()):
            waited = now - self._first_seen[name]
            if call_kind(name) is None or waited < self.call_deadline:
                continue
            missing = [r for r in range(self.size) if r not in by_rank]
            job = self._scope.job_ranks
            message = (f"{call_kind(name)} call {name!r}{self._scope.label} waited {waited:.1f} s, past its group's "
                       f"timeout of {self.call_deadline:g} s (the timeout= of init_process_group or new_group): made "
                       f"by rank(s) {job(sorted(by_rank))}, not by rank(s) {job(missing)}")
            expired.append(_error(by_rank[min(by_rank)], message, "StallError"))
            self._timed_out[name] = (message, set(missing))
            if len(self._timed_out) > _REMEMBERED_DIVERGED:  # ranks that never came (they died): forget the oldest
                del self._timed_out[next(iter(self._timed_out))]
            self._forget(name)
        return expired

    def _timed_out_call(self, meta: RequestMeta, rank: int) -> Response | None:
        """The error of a call that timed out for a rank that makes it only now; once per such rank."""
        entry = self._timed_out.get(meta.name)
        if entry is None or rank not in entry[1]:
            return None
        entry[1].discard(rank)
        if not entry[1]:
            del self._timed_out[meta.name]
        return _error(meta, entry[0], "StallError")

    def _remember_diverged(self, name: str, error: Response) -> None:
        self._diverged[name] = error
        if len(self._diverged) > _REMEMBERED_DIVERGED:
            del self._diverged[next(iter(self._diverged))]

    def _decide(self, name: str) -> Response | None:
        by_rank = self._table[name]
        first = by_rank[min(by_rank)]
        joined = tuple(r for r in sorted(self._joined) if r not in by_rank)
        missing = [r for r in range(self.size) if r not in by_rank and r not in joined]
        gone = [r for r in missing if r in self._shut_down]
        job, label = self._scope.job_ranks, self._scope.label
        if gone:
            return _error(first, f"tensor {name!r}{label} can never complete: rank(s) {job(gone)} called shutdown() "
                          f"without submitting it", "HvdliteShutdownError")
        if missing:
            return None
        if joined and first.collective is not Collective.ALLREDUCE:
            return _error(first, f"{first.collective.name.lower()} of tensor {name!r}{label} cannot run while "
                          f"rank(s) {job(joined)} have called join(); only allreduce can", "UnsupportedOperationError")
        mismatch = find_mismatch(name, self._job_ranked({name: by_rank})[name])
        if mismatch:
            return _error(first, mismatch + label, "TensorMismatchError")
        return Response(first, per_rank=_per_rank(first.collective, by_rank, self.size), joined=joined)

    def _job_ranked(self, table: dict[str, dict[int, RequestMeta]]) -> dict[str, dict[int, RequestMeta]]:
        """``table`` keyed by job ranks, for messages (the same table for the whole job)."""
        if self._scope.members is None:
            return table
        return {name: {self._scope.job_rank(r): meta for r, meta in by_rank.items()} for name, by_rank in table.items()}

    def _forget(self, name: str) -> None:
        del self._table[name]
        self._first_seen.pop(name, None)
        self.decided_ready[name] = self._ready_at.pop(name, {})
        self._warned.discard(name)

    def _inspect_stalls(self, now: float) -> tuple[list[str], str]:
        warnings: list[str] = []
        stalled: list[str] = []
        for name, by_rank in self._table.items():
            waited = now - self._first_seen[name]
            missing = [r for r in range(self.size) if r not in by_rank and r not in self._joined]
            job = self._scope.job_ranks
            line = (f"tensor {name!r} ({by_rank[min(by_rank)].collective.name.lower()}){self._scope.label} waited "
                    f"{waited:.1f} s: submitted by rank(s) {job(sorted(by_rank))}, missing on rank(s) {job(missing)}")
            # A slow round can jump straight past the warning time; the warning is still given first,
            # so every stall that ends a job was announced with its tensor and missing ranks.
            if self._warn_after is not None and waited >= self._warn_after and name not in self._warned:
                self._warned.add(name)
                warnings.append("Stall: " + line)
            if self._fail_after is not None and waited >= self._fail_after:
                stalled.append(line)
        fatal = ""
        if stalled:
            fatal = (f"Stalled for more than {self._fail_after:g} s (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS); "
                     "shutting down. " + "; ".join(stalled) +
                     ". Every rank must submit the same tensors; a rank may have stopped early or skipped a step.")
        return warnings, fatal


def _error(meta: RequestMeta, message: str, error_type: str) -> Response:
    return Response(meta, error=message, error_type=error_type)


def _per_rank(collective: Collective, by_rank: dict[int, RequestMeta], size: int) -> tuple:
    if collective is Collective.ALLGATHER:
        return tuple(by_rank[r].shape[0] for r in range(size))
    if collective is Collective.ALLTOALL:
        return tuple(by_rank[r].splits for r in range(size))
    return ()

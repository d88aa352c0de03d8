"""DiLoCo's schedule and fragments, written once for torch, Keras and JAX (see :mod:`hvdlite.torch.slow_links.diloco`).

DiLoCo (Douillard et al., 2023): each group of ranks trains on its own for ``sync_every`` (H) inner
steps; then every rank's pseudo-gradient ``global - local`` is averaged over the DiLoCo process set
and an outer optimizer applies it to the global parameters, which every rank then trains from.

Streaming DiLoCo (Douillard et al., 2025) splits the parameters into ``fragments`` (F) and syncs
fragment ``p`` after inner steps ``(p + 1) * H / F + k * H`` (counting from 1), so that only 1/F of
the model crosses the link at a time; with ``delay`` (tau) each fragment's exchange runs while the
next tau inner steps compute and lands after them. As in torchft, H must be a multiple of F and
tau smaller than H / F, so at most one exchange is in flight.

Counts here are the number of inner steps taken so far (1 after the first), the same on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..core.runtime import current
from ..objects import allgather_object, broadcast_object
from ..process_sets import ProcessSet
from .options import check_count

FORMAT = "hvdlite.diloco/1"  # the checkpoint layout every adapter's state_dict() writes


@dataclasses.dataclass(frozen=True)
class DiLoCoSchedule:
    """After which inner steps each fragment is sent and lands."""

    sync_every: int
    fragments: int = 1
    delay: int = 0

    def __post_init__(self) -> None:
        sync_every = check_count(self.sync_every, "sync_every", minimum=1)
        fragments = check_count(self.fragments, "fragments", minimum=1)
        delay = check_count(self.delay, "delay", minimum=0)
        if sync_every % fragments:
            raise ValueError(f"sync_every={sync_every} must be a multiple of fragments={fragments}: "
                             "fragment p syncs after (p + 1) * sync_every / fragments + k * sync_every inner steps")
        if delay >= sync_every // fragments:
            raise ValueError(f"delay={delay} must be smaller than sync_every / fragments = {sync_every // fragments}: "
                             "a fragment's exchange must land before the next fragment is sent")
        object.__setattr__(self, "sync_every", sync_every)
        object.__setattr__(self, "fragments", fragments)
        object.__setattr__(self, "delay", delay)

    @property
    def stride(self) -> int:
        """Inner steps between two consecutive fragments' sends (H / F)."""
        return self.sync_every // self.fragments

    def sent_after(self, count: int) -> int | None:
        """The fragment sent right after inner step ``count``, or None."""
        if count < 1 or count % self.stride:
            return None
        return (count // self.stride - 1) % self.fragments

    def lands_after(self, count: int) -> int | None:
        """The fragment whose exchange lands right after inner step ``count`` (``delay`` steps after
        it was sent), or None."""
        return self.sent_after(count - self.delay)

    def in_flight_after(self, count: int) -> tuple[int, int] | None:
        """``(fragment, sent at)`` of the exchange still in flight after inner step ``count`` (sent, not
        landed), or None: with ``delay`` 0 an exchange lands when it is sent."""
        for sent_at in range(count, count - self.delay, -1):
            fragment = self.sent_after(sent_at)
            if fragment is not None:
                return fragment, sent_at
        return None


class ScheduledExchanges:
    """The part of a DiLoCo object every adapter shares: when to send and land, counted in inner steps.

    The adapter sets ``schedule``, ``fragments``, ``inner_steps`` (0), ``syncs`` (0) and
    ``_in_flight`` (None), and defines ``_send(fragment, background=None)`` (start an exchange,
    leaving it in ``_in_flight``) and ``_land()`` (apply ``_in_flight``'s and clear it)."""

    schedule: DiLoCoSchedule
    fragments: list[list[int]]
    inner_steps: int
    _in_flight: object

    def _send(self, fragment: int, background: bool | None = None) -> None:
        raise NotImplementedError

    def _land(self) -> None:
        raise NotImplementedError

    def after_inner_step(self) -> None:
        """Count an inner step; on the schedule, land the exchange in flight and send the next fragment
        (landing it at once without a delay)."""
        self.inner_steps += 1
        if self.schedule.delay and self.schedule.lands_after(self.inner_steps) is not None:
            self._land()
        fragment = self.schedule.sent_after(self.inner_steps)
        if fragment is not None:
            self._send(fragment)
            if not self.schedule.delay:
                self._land()

    def sync(self) -> None:
        """Land the exchange in flight, then sync every fragment now (an outer step each), as the
        schedule would at its next syncs: call it at the end of training, so that every group holds
        the same model. The step count is not advanced."""
        if self._in_flight is not None:
            self._land()
        for fragment in range(len(self.fragments)):
            self._send(fragment, background=False)
            self._land()


def split_fragments(sizes: Sequence[int], fragments: int, names: Sequence[str] | None = None) -> list[list[int]]:
    """Split parameters (in model order, ``sizes`` elements each) into ``fragments`` runs of
    consecutive parameters with about equal element counts; every run holds at least one.

    Consecutive runs are whole layers, as in the Streaming DiLoCo paper (which fragments by blocks
    of layers); cutting where the running total passes ``k / F`` of the whole balances the bytes
    each sync sends."""
    count = check_count(fragments, "fragments", minimum=1)
    if len(sizes) < count:
        listed = f" ({', '.join(names)})" if names else ""
        raise ValueError(f"fragments={count} needs at least {count} parameters, the model has {len(sizes)}{listed}")
    total, cuts, running = sum(sizes), [], 0
    for index, size in enumerate(sizes):
        running += size
        left_after = len(sizes) - index - 1
        still_needed = count - 1 - len(cuts)
        if still_needed and (running * count >= total * (len(cuts) + 1) or left_after == still_needed):
            cuts.append(index + 1)
    bounds = [0, *cuts, len(sizes)]
    return [list(range(start, end)) for start, end in zip(bounds, bounds[1:], strict=False)]


def describe_mismatch(what: str, per_rank: Sequence[object], ranks: Sequence[int]) -> str | None:
    """A message naming the ranks whose ``what`` differs from the first rank's, or None if all agree."""
    differing = [rank for rank, value in zip(ranks, per_rank, strict=True) if value != per_rank[0]]
    if not differing:
        return None
    return (f"DiLoCo: {what} differs across the process set {list(ranks)}: rank {ranks[0]} has {per_rank[0]!r}, "
            + ", ".join(f"rank {rank} has {per_rank[ranks.index(rank)]!r}" for rank in differing))


def check_member(process_set: ProcessSet) -> None:
    """Refuse (ValueError) a process set this rank is not in, or one not registered."""
    from ..core.runtime import current

    current()  # NotInitializedError before hvd.init()
    if process_set.included() is None:
        raise ValueError(f"DiLoCo's process_set {process_set.ranks} is not registered: pass it to "
                         "hvd.init(process_sets=...) or hvd.add_process_set() first (an elastic job that re-formed: "
                         "register the new world's sets and call regroup() from a reset callback)")
    if not process_set.included():
        raise ValueError(f"this rank is not in DiLoCo's process_set {process_set.ranks}: every rank averages its "
                         "pseudo-gradients with the ranks of one set")


def check_agreement(mine: dict[str, object], process_set: ProcessSet, extra: object = None) -> list[object]:
    """Refuse, on every rank of the set, a value of ``mine`` (what must agree: schedule, compression,
    parameters) that differs between its ranks, naming ranks and values; return every rank's ``extra``."""
    every = allgather_object((mine, extra), name="diloco.check", process_set=process_set)
    ranks = process_set.ranks or list(range(len(every)))
    for what in mine:
        message = describe_mismatch(what, [theirs[what] for theirs, _ in every], ranks)
        if message:
            raise ValueError(message)
    return [theirs for _, theirs in every]


def check_loadable(schedule: DiLoCoSchedule, names: Sequence[str], state: object) -> None:
    """Refuse a checkpoint of another format, schedule or model, naming what differs."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a DiLoCo checkpoint ({FORMAT}): format is {found!r}")
    mine = {"sync_every": schedule.sync_every, "fragments": schedule.fragments, "delay": schedule.delay}
    differing = {key: (state[key], value) for key, value in mine.items() if state[key] != value}
    if differing:
        raise ValueError("DiLoCo checkpoint was saved with another schedule: "
                         + ", ".join(f"{key}={saved} there, {now} here" for key, (saved, now) in differing.items()))
    missing = [name for name in names if name not in state["global"]]
    extra = [name for name in state["global"] if name not in names]
    if missing or extra:
        raise ValueError(f"DiLoCo checkpoint does not match the model: missing {missing}, unexpected {extra}")


def root_outer_state(diloco: object) -> dict:
    """Rank 0's checkpoint of ``diloco`` (any framework's DiLoCo object), on every rank, for an elastic
    sync: without int8's residuals, which are each rank's own (error feedback starts again from zero)."""
    outer = diloco.state_dict() if current().topology.rank == 0 else None
    outer = broadcast_object(outer, 0, name="hvdlite.diloco.state")
    outer.update(residuals={}, residuals_world_size=None)
    return outer


__all__ = ["FORMAT", "root_outer_state", "DiLoCoSchedule", "ScheduledExchanges", "split_fragments", "describe_mismatch", "check_member", "check_agreement",
           "check_loadable"]

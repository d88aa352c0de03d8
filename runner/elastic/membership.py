"""One agreed world per change: hvdliterun decides which members of a failed world go on.

After a death each survivor of the old world proposes what it sees: the members it knows exited
(MPI's list of the dead, the status files) and those its deadline probe could not reach. The
launcher, which also hears every rank's exit from the rank's wrapper, decides once, when each
member of the old world has either proposed or is named dead (by a proposal or by its exit): the
decision is everything all of them saw. Every survivor gets that same decision, however late its
proposal comes, so the survivors form one world whatever the order in which the deaths became
visible to each of them, with no time window. A member that is neither heard from nor named dead
is waited for; the ranks bound that wait by their communication deadline (see
``hvdlite/elastic/agreement.py``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from hvdlite.elastic.agreement import Agreed

_RECHECK_SECONDS = 0.005  # exits arrive as status files: how often a waiting proposal looks again


@dataclasses.dataclass
class _Change:
    members: tuple[str, ...]
    proposed: set[str] = dataclasses.field(default_factory=set)
    exited: set[str] = dataclasses.field(default_factory=set)
    unreachable: set[str] = dataclasses.field(default_factory=set)
    decision: Agreed | None = None

    def waiting_for(self, known_exited: set[str]) -> list[str]:
        named = self.proposed | self.exited | self.unreachable | known_exited
        return [member for member in self.members if member not in named]


class Memberships:
    """The launcher's decisions, one per change (named by the ranks, with the old world's members).

    ``known_exited(members)``: the members whose exit the launcher has heard of.
    """

    def __init__(self, known_exited: Callable[[Sequence[str]], set[str]]) -> None:
        self._known_exited = known_exited
        self._changes: dict[tuple[str, ...], _Change] = {}  # (change, *members) -> its state
        self._lock = threading.Lock()

    def propose(self, change: str, members: Sequence[str], proposer: str, exited: Sequence[str],
                unreachable: Sequence[str], wait_seconds: float) -> tuple[Agreed | None, list[str]]:
        """Record ``proposer``'s view and wait up to ``wait_seconds`` for the decision.

        Returns (the decision or None, the members still waited for). Raises ``ValueError`` for a
        proposer or a named member that is not in ``members``.
        """
        key = (change, *members)
        strangers = sorted({proposer, *exited, *unreachable} - set(members))
        if strangers:
            raise ValueError(f"process id(s) {strangers} are not members of the world {list(members)}")
        deadline = time.monotonic() + wait_seconds
        with self._lock:
            change = self._changes.setdefault(key, _Change(tuple(members)))
            if change.decision is None:
                change.proposed.add(proposer)
                change.exited.update(exited)
                change.unreachable.update(unreachable)
        while True:
            with self._lock:
                waiting = self._decide(change)
                if change.decision is not None or time.monotonic() >= deadline:
                    return change.decision, waiting
            time.sleep(_RECHECK_SECONDS)

    def _decide(self, change: _Change) -> list[str]:
        """Decide ``change`` once nobody is waited for; returns who still is."""
        if change.decision is not None:
            return []
        known = self._known_exited(change.members) & set(change.members)
        waiting = change.waiting_for(known)
        if not waiting:
            exited = change.exited | known
            dead = exited | change.unreachable
            change.decision = Agreed(tuple(m for m in change.members if m in dead),
                                       tuple(m for m in change.members if m in exited))
        return waiting

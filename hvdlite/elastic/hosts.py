"""The elastic job's host bookkeeping: which hosts offer slots, which are blacklisted, what to change.

Horovod keeps this in a driver process; hvdlite keeps it in the ranks. Every rank holds the same
:class:`HostBook` (failures are recorded alike on every survivor; a spawned rank receives rank 0's
copy when it joins) and rank 0's :meth:`HostBook.plan` decides, so a new rank 0 after a failure
knows what the old one knew. Pure logic: no MPI, no files but :func:`read_hosts_file`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from collections.abc import Mapping

HOSTS_FILE = "elastic.hosts"  # in the launcher's run directory: {"hosts": {host: slots}, "discovery": bool}
# No rank is spawned this soon after a rank died: MPICH's spawn right after a death hung (1 in ~7
# jobs that refilled two slots within milliseconds of their ranks' deaths, 2026-12-02), none with a
# second between them.
SPAWN_AFTER_DEATH_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """A change of the world: new ranks per host, the current ranks (comm ranks) that leave, and the
    warm spares rank 0 admits; ``warm``: hosts where rank 0 starts a spare now (not a change), of
    which ``deferred`` serve new ranks the host list asks for (admitted at a later commit)."""

    spawn: tuple[tuple[str, int], ...] = ()
    remove: tuple[int, ...] = ()
    admit: int = 0
    warm: tuple[str, ...] = ()
    deferred: int = 0

    def __bool__(self) -> bool:
        return bool(self.spawn or self.remove or self.admit)

    @property
    def new_ranks(self) -> int:
        return sum(count for _, count in self.spawn) + self.admit


@dataclasses.dataclass
class HostBook:
    """Slots per host (the launcher's list), failures and blacklist, shared by every rank.

    ``cooldown``: (low, high) seconds a host whose rank failed gets no new rank, doubled for each
    further failure; ``(0, 0)`` blacklists it for the rest of the job, as Horovod does without
    ``--blacklist-cooldown-range``. Unlike Horovod, ranks still alive on a blacklisted host keep
    running: only new ranks go elsewhere.
    """

    max_np: int = 0
    cooldown: tuple[float, float] = (0.0, 0.0)
    hosts: dict[str, int] = dataclasses.field(default_factory=dict)
    discovery: bool = False  # the host list can still change (a discovery script is polled)
    failures: dict[str, int] = dataclasses.field(default_factory=dict)
    blacklisted_until: dict[str, float] = dataclasses.field(default_factory=dict)
    generation: int = 0  # spawns so far: names the spawned ranks' status files
    resets: int = 0  # world changes so far (failures and host updates)
    ask_launcher_after: float = 0.0  # hvdliterun did not answer: rank 0 asks again only after this time
    last_failure: float = -math.inf

    def record_failure(self, host: str, now: float) -> None:
        """A rank on ``host`` died: the host gets no new rank until its cooldown ends (or ever)."""
        count = self.failures[host] = self.failures.get(host, 0) + 1
        self.last_failure = max(self.last_failure, now)
        low, high = self.cooldown
        if high <= 0:
            self.blacklisted_until[host] = math.inf
            return
        # Seeded by host and count: every rank draws the same delay without communicating.
        delay = random.Random(f"{host}:{count}").uniform(low, high) * 2 ** (count - 1)
        self.blacklisted_until[host] = now + delay

    def usable(self, host: str, now: float) -> bool:
        return self.blacklisted_until.get(host, -math.inf) <= now

    def plan(self, member_hosts: list[str], now: float) -> Plan:
        """What to change for the world whose rank r runs on ``member_hosts[r]``.

        Ranks on a host the list no longer has, or beyond its slots, leave (highest ranks first); free
        slots on usable hosts get new ranks, in the list's order, up to ``max_np``.
        """
        if not self.hosts:
            return Plan()
        remove: list[int] = []
        kept: dict[str, int] = {}
        for rank, host in enumerate(member_hosts):
            if kept.get(host, 0) < self.hosts.get(host, 0):
                kept[host] = kept.get(host, 0) + 1
            else:
                remove.append(rank)
        room = math.inf if self.max_np <= 0 else self.max_np - sum(kept.values())
        if now < self.last_failure + SPAWN_AFTER_DEATH_SECONDS:
            room = 0
        spawn = []
        for host, slots in self.hosts.items():
            free = min(slots - kept.get(host, 0), room) if self.usable(host, now) else 0
            if free > 0:
                spawn.append((host, int(free)))
                room -= free
        return Plan(tuple(spawn), tuple(remove))

    def hosts_for_spares(self, missing: int, spares_on: Mapping[str, int], now: float) -> tuple[str, ...]:
        """Where to start ``missing`` more warm spares: usable hosts of the list, each time the one with
        the fewest spares (the list's order among equals); none within SPAWN_AFTER_DEATH_SECONDS of a
        death, as for any spawn."""
        usable = [host for host in self.hosts if self.usable(host, now)]
        if missing <= 0 or not usable or now < self.last_failure + SPAWN_AFTER_DEATH_SECONDS:
            return ()
        counts = {host: spares_on.get(host, 0) for host in usable}
        chosen = []
        for _ in range(missing):
            host = min(usable, key=lambda name: counts[name])
            counts[host] += 1
            chosen.append(host)
        return tuple(chosen)


    def can_grow_later(self, now: float) -> bool:
        """Could a later plan add ranks without a new host list? (a cooldown ends, or discovery runs)"""
        return (self.discovery or now < self.last_failure + SPAWN_AFTER_DEATH_SECONDS
                or any(now < until < math.inf for until in self.blacklisted_until.values()))


def served_by_spares(plan: Plan, ready: Mapping[str, int], starting: Mapping[str, int]) -> tuple[Plan, dict[str, int]]:
    """``plan`` with its new ranks taken from warm spares, and how many to admit per host.

    Ready spares on a host where the plan starts ranks are admitted instead; the plan's other new
    ranks wait for a later commit (one change either admits or spawns, which keeps both simple).
    While a spare is still starting, nothing is spawned: on its host it will be ready sooner than a
    new process, and elsewhere two spawns would run at once, which MPICH was not measured to survive.
    """
    admit = {host: min(count, ready.get(host, 0)) for host, count in plan.spawn if ready.get(host, 0)}
    if admit:
        return Plan(remove=plan.remove, admit=sum(admit.values())), admit
    if plan.spawn and any(starting.values()):
        return Plan(remove=plan.remove), {}
    return plan, {}


def as_spares(plan: Plan) -> Plan:
    """``plan`` with its new ranks started as spares instead (one a slot, on its host): the world trains
    on unchanged and admits them at a later commit, once they are ready (:func:`served_by_spares`)."""
    return Plan(remove=plan.remove, warm=tuple(host for host, count in plan.spawn for _ in range(count)),
                deferred=plan.new_ranks)


def read_hosts_file(path: str) -> tuple[dict[str, int], bool] | None:
    """The launcher's host list and whether it is discovered, or None while there is none."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return {str(host): int(slots) for host, slots in data["hosts"].items()}, bool(data.get("discovery"))


def write_hosts_file(path: str, hosts: dict[str, int], discovery: bool) -> None:
    """Replace the host list atomically (ranks read it at any time)."""
    with open(path + ".tmp", "w") as handle:
        json.dump({"hosts": hosts, "discovery": discovery}, handle)
    os.replace(path + ".tmp", path)

"""Elastic world changes on MPI itself: shrink without the dead, remove ranks, spawn new ones.

Every change is collective over the processes that stay, and ends with hvdlite started again on the
new communicator (:func:`hvdlite.core.runtime.start`): ranks, sizes, topology, engines, shared memory,
response caches, fusion buffers and autotune are the new world's; process sets are not carried
over. What MPICH 5 + Hydra can do, measured: ``docs/design/elastic-mpi.md``.

- :func:`shrink`: a member died. The survivors agree on the dead from what every one of them sees
  alike (MPI's list of dead processes, and the status file each rank's wrapper writes), abandon the
  old engines without communicating, and build their communicator with ``MPI_Comm_create_group``.
- :func:`apply`: a :class:`~hvdlite.elastic.hosts.Plan` decided at a commit (hosts added or
  removed, a blacklisted host's cooldown over): the old world shuts down normally, leaving ranks
  exit, and ``MPI_Comm_spawn_multiple`` starts new ranks (``host`` info key) that the stayers
  ``MPI_Intercomm_merge`` with (:mod:`hvdlite.elastic.joining`); a death meanwhile leaves the
  others to re-form without the dead and the newcomers.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..core import runtime
from ..errors import CommTimeoutError, HvdliteError, PeerFailedError
from ..utils.failed_peers import dead_members
from . import joining
from .agreement import Agreed, agree
from .channel import ChannelError, request
from .forming import create_group, watched, watched_start
from .hosts import HOSTS_FILE, HostBook, Plan, as_spares, read_hosts_file, served_by_spares
from .spares import exited, mark, mine

log = logging.getLogger("hvdlite")

_LAUNCHER_RETRY_SECONDS = 30.0  # after hvdliterun did not answer rank 0's request for the host list
_CREATE_TAG = 7_301  # MPI_Comm_create_group's tag when the world is re-formed
_REMOVED_FILE = "elastic.removed"
# Without hvdliterun to agree through, survivors read the list of the dead until it has not grown for
# this long (at most _SETTLE_LIMIT s).
_SETTLE_QUIET, _SETTLE_LIMIT = 0.5, 5.0


def shrink() -> list[str]:
    """Re-form the job without the members that died, keeping this process; returns their process ids.

    Collective over the survivors (``hvd.elastic.run`` calls it on ``HorovodInternalError``). The
    survivors agree on the new world through hvdliterun (one decision per change, see
    :mod:`hvdlite.elastic.agreement`); a member that dies while the world forms is left out in a
    next round. If fewer than ``--min-np`` remain, waits up to ``--elastic-timeout`` for slots.
    """
    world = runtime.current()
    config, book, rank = world.config, _book(world), world.topology.rank
    ids = list(world.process_ids)
    read_dead = _dead_reader(config)

    # A silent host (its link down) is in no list of the dead: the ranks the deadline's probe did not reach.
    timed_out = world.engine.fatal
    unreachable = [ids[r] for r in (timed_out.unreachable if isinstance(timed_out, CommTimeoutError) else [])]
    dynamic = world.communicators.dynamic
    runtime.stop_without_communicating(world, PeerFailedError(read_dead(ids) or unreachable))
    comm, dead = _form(config, world.comm, ids, rank, book, read_dead, unreachable)
    now = time.time()
    for member, process_id in enumerate(ids):
        if process_id in dead:
            book.record_failure(world.slot_hosts[member], now)
    _count_reset(book, config.elastic_reset_limit, f"rank(s) [{', '.join(dead)}] died")
    survivors = [process_id for process_id in ids if process_id not in dead]
    with watched_start(survivors, read_dead):
        _restart(comm, book, dynamic)
    _record_removed(dead)
    if len(survivors) < config.elastic_min_np:
        _grow_to_min_np(dead)
    return dead


def _form(config: Any, base: Any, ids: list[str], rank: int, book: HostBook,
          read_dead: Callable[[list[str]], list[str]], unreachable: list[str]) -> tuple[Any, list[str]]:
    """The survivors' communicator and the dead, agreed in rounds: a member that dies while a round's
    group forms is left out by the next round (each round: one decision, its own tag)."""
    members, exited, dead = ids, set(), set()
    for attempt in range(len(ids)):  # each failed round has one more dead member
        decided = _decide(config, f"{book.resets}.{attempt}", members, ids[rank], read_dead, unreachable)
        exited |= set(decided.exited)
        dead |= set(decided.dead)
        names = [process_id for process_id in ids if process_id in dead]
        if ids[rank] in dead:
            raise HvdliteError(f"the other ranks could not reach rank {rank} (process id {ids[rank]}) and re-formed "
                               "the job without it; this rank ends")
        survivors = [r for r, process_id in enumerate(ids) if process_id not in dead]
        check_quorum(survivors, [r for r, process_id in enumerate(ids) if process_id not in exited], rank, names)
        members = [ids[r] for r in survivors]
        comm = create_group(base, survivors, members, read_dead, _CREATE_TAG + attempt, config.comm_timeout)
        if comm is not None:
            return comm, names
        log.warning("a member of the new world %s died while it formed: the survivors agree again", members)
        unreachable = []
    raise HvdliteError(f"every member of the job died while the survivors re-formed it ({ids})")


def _decide(config: Any, label: str, members: list[str], me: str, read_dead: Callable[[list[str]], list[str]],
            unreachable: list[str]) -> Agreed:
    """hvdliterun's one decision for this change; without hvdliterun (or when it cannot be reached),
    this rank's own view once the list of the dead has stopped growing."""
    if config.elastic_service:
        agreed = agree(config.elastic_service, config.elastic_token, label, members, me,
                       lambda: read_dead(members), unreachable, config.comm_timeout)
        if agreed is not None:
            return agreed
    exited = set(_settled(lambda: read_dead(members)))
    return Agreed(tuple(m for m in members if m in exited or m in unreachable), tuple(m for m in members if m in exited))


def _settled(read_dead: Callable[[], list[str]]) -> list[str]:
    """``read_dead()`` once it has not grown for _SETTLE_QUIET seconds (waiting at most _SETTLE_LIMIT).

    Only without hvdliterun's decision: a host's ranks die together but are seen dead one by one,
    milliseconds apart, and survivors that each took the list at another moment would form different
    worlds. A time window, not an agreement: hvdliterun's decision is the rule."""
    dead, start = read_dead(), time.monotonic()
    quiet_since = start
    while time.monotonic() - quiet_since < _SETTLE_QUIET and time.monotonic() - start < _SETTLE_LIMIT:
        time.sleep(0.02)
        now_dead = read_dead()
        if len(now_dead) != len(dead):
            dead, quiet_since = now_dead, time.monotonic()
    return dead


def check_quorum(survivors: list[int], not_exited: list[int], rank: int, dead: list[str]) -> None:
    """Only one side of a split job goes on: more than half of the old world's ranks not known to have
    exited (``not_exited``), or half with the lowest of them.

    Both sides of a cut link see the other as dead; without this rule each would train on alone. A
    rank whose process is known to have exited (in MPI's list of the dead, or its status file) is on
    no side, so it does not count: a rank that raised leaves the one other rank of a job of two
    going on, whichever rank raised. Both sides count every live rank, so they cannot both win.
    """
    if 2 * len(survivors) > len(not_exited) or (2 * len(survivors) == len(not_exited) and min(not_exited) in survivors):
        return
    raise HvdliteError(f"rank {rank} can reach only rank(s) {survivors} of the {len(not_exited)} not known to have "
                       f"exited (rank(s) [{', '.join(dead)}] are dead or unreachable): the job goes on on the other "
                       "side of the split, without this rank")


def elastic_mode() -> bool:
    """Whether hvdlite runs an elastic job (``hvdliterun --min-np N``): a death re-forms the world."""
    return runtime.is_initialized() and bool(runtime.current().config.elastic_min_np)


def propose(warm: bool = True) -> Plan:
    """Rank 0's plan for the current world (empty outside elastic mode); other ranks get it by broadcast.

    Ready spares replace the plan's new ranks. With ``warm`` (a commit's plan), new ranks without a
    ready spare are started as spares, admitted at a later commit (unless ``--cold-joins``), and a plan
    that changes nothing names the hosts to start missing ``--warm-spares`` on (:func:`start_spares`
    starts them); without it (below ``--min-np``, nothing to train meanwhile) they are spawned now."""
    world = runtime.current()
    if not world.config.elastic_min_np or world.topology.rank != 0:
        return Plan()
    book = _book(world)
    now = time.time()
    if now >= book.ask_launcher_after:
        try:
            found = _launcher_hosts(world.config)
        except ChannelError as exc:  # unreachable: commits must not wait for it every time
            log.warning("rank 0 could not get the host list from hvdliterun, so the hosts stay as they are "
                        "(asking again in %g s): %s", _LAUNCHER_RETRY_SECONDS, exc)
            book.ask_launcher_after, found = now + _LAUNCHER_RETRY_SECONDS, None
        if found is not None:
            book.hosts, book.discovery = found
    plan = book.plan(list(world.slot_hosts), now)
    config = world.config
    if config.elastic_warm_spares or (warm and not config.elastic_cold_joins):
        return _with_spares(world, plan, now, warm)
    return plan


def _with_spares(world: runtime.Runtime, plan: Plan, now: float, warm: bool) -> Plan:
    """``plan`` served by rank 0's ready spares, or with the hosts for missing ones (see :func:`propose`)."""
    config, spares = world.config, mine()
    spares.exited = lambda ids: exited(config.run_dir, config.elastic_service, config.elastic_token, ids)
    spares.abandon = lambda process_id: mark(config.run_dir, config.elastic_service, config.elastic_token, process_id,
                                             abandoned=True)
    if spares.deferred_starting():  # new ranks are on their way: a dead one is seen at the next look
        spares.forget_gone()
        return Plan(remove=plan.remove)
    spares.forget_gone(now=bool(plan.spawn))
    ready, starting = spares.count(ready=True), spares.count(ready=False)
    if 0 not in plan.remove:  # rank 0 leaving takes its spares with it: cold spawns as before
        plan, per_host = served_by_spares(plan, ready, starting)
        spares.choose(per_host)
        if plan.spawn and warm and not config.elastic_cold_joins and not spares.given_up:
            # New ranks start as spares while the world trains, and join once ready (a later commit):
            # no one waits in MPI's spawn for their imports, nor hangs there on a death elsewhere.
            return as_spares(plan)
    if plan or not warm:
        return plan
    on_hosts = {host: ready.get(host, 0) + starting.get(host, 0) for host in _book(world).hosts}
    missing = 0 if spares.given_up else config.elastic_warm_spares - len(spares.waiting)
    return dataclasses.replace(plan, warm=_book(world).hosts_for_spares(missing, on_hosts, now))


def start_spares(plan: Plan) -> None:
    """Every rank, after a commit's plan: count the spares the plan starts (their ids are numbered like
    spawned ranks', so every rank's book must count them); rank 0 starts them."""
    world = runtime.current()
    book = _book(world)
    for index, host in enumerate(plan.warm):
        book.generation += 1
        if world.topology.rank == 0:
            config = world.config
            mark(config.run_dir, config.elastic_service, config.elastic_token, f"g{book.generation}.0")
            mine().start(host, f"g{book.generation}.", joining.spare_command(world.process_ids[0]),
                         deferred=index < plan.deferred)
    if plan.deferred and world.topology.rank == 0:
        per_host = collections.Counter(plan.warm[:plan.deferred])
        log.warning("starting %d new rank(s) on %s; the job trains on and admits them once they are ready",
                    plan.deferred, ", ".join(f"{host}:{count}" for host, count in per_host.items()))


def apply(plan: Plan) -> None:
    """Carry out ``plan`` (every rank of the job calls it with the same plan): see the module's doc."""
    world = runtime.current()
    book, base, rank, config = _book(world), world.comm, world.topology.rank, world.config
    stay = [r for r in range(world.topology.size) if r not in plan.remove]
    _count_reset(book, config.elastic_reset_limit, "the hosts changed")
    leaving = [world.process_ids[r] for r in plan.remove]
    stayers = {world.process_ids[r]: world.slot_hosts[r] for r in stay}
    dynamic = world.communicators.dynamic
    runtime.shutdown()  # collective: every member is healthy
    if rank in plan.remove:
        log.warning("this rank's host left the job's host list: it leaves the job")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # MPI_Finalize would wait for the ranks that go on
    comm = base.Create_group(base.Get_group().Incl(stay), tag=_CREATE_TAG) if plan.remove else base
    members, dead = list(stayers), []
    if plan.admit or plan.spawn:
        comm, members, dead = _grow(config, comm, plan, book, stayers)
    with watched_start(members, _dead_reader(config)):
        _restart(comm, book, dynamic)
    _record_removed(leaving + dead)
    if dead and runtime.current().topology.size < config.elastic_min_np:
        _grow_to_min_np(dead)


def _grow(config: Any, comm: Any, plan: Plan, book: HostBook,
          stayers: dict[str, str]) -> tuple[Any, list[str], list[str]]:
    """``comm`` (the ranks that stay: process id -> host) with the plan's spares admitted and new ranks
    spawned, and no one dead. When a member or newcomer dies meanwhile (MPICH's spawn and merge would
    wait for it for ever), the stayers left re-form without the dead as after a failure, give the
    newcomers up (they end themselves) and leave the plan's slots to the next commit. Returns the
    communicator, its members' process ids, and those the job goes on without."""
    chosen = mine().take_admitting() if comm.Get_rank() == 0 and plan.admit else None
    newcomers = comm.bcast([spare.process_id for spare in chosen or []], root=0) if plan.admit else []
    prefix = ""
    if plan.spawn:
        book.generation += 1
        prefix = f"g{book.generation}."
    newcomers += [f"{prefix}{index}" for index in range(sum(count for _, count in plan.spawn))]

    def grow() -> Any:
        grown = joining.admit_spares(comm, plan.admit, book, chosen) if plan.admit else comm
        return joining.spawn_ranks(grown, plan.spawn, book, prefix) if plan.spawn else grown

    ids = list(stayers)
    give_up = functools.partial(mark, config.run_dir, config.elastic_service, config.elastic_token, abandoned=True)
    read_joining = joining.late_as_dead(joining.dead_reader_beside_a_spawn(config), newcomers, config.join_deadline,
                                        give_up)
    grown = watched(grow, ids + newcomers, read_joining, None, "the grown world")
    read_dead = _dead_reader(config)
    if grown is not None:
        return grown, ids + newcomers, []
    log.warning("rank(s) [%s] died or did not join while the job grew: the others go on without them and "
                "without the new rank(s) [%s]", ", ".join(read_joining(ids + newcomers)), ", ".join(newcomers))
    comm, dead = _form(config, comm, ids, comm.Get_rank(), book, read_dead, [])
    now = time.time()
    for process_id in dead:
        book.record_failure(stayers[process_id], now)
    _count_reset(book, config.elastic_reset_limit, f"rank(s) [{', '.join(dead)}] died while the job grew")
    if comm.Get_rank() == 0:
        for process_id in newcomers:  # their spawn or admission will not finish: they end themselves
            give_up(process_id)
    return comm, [process_id for process_id in ids if process_id not in dead], dead + newcomers


def _restart(comm: Any, book: HostBook, dynamic: bool) -> None:
    """hvdlite on the new world; ``dynamic``: the old one allowed ``add_process_set`` (``init(process_sets=
    "dynamic")``), so the new one does too, for the reset callbacks that register its sets again."""
    runtime.start(comm, "dynamic" if dynamic else None, book=book)


def _grow_to_min_np(dead: list[str]) -> None:
    """Fewer than --min-np ranks: wait (--elastic-timeout) for slots that bring the job back to it."""
    world = runtime.current()
    config = world.config
    deadline = time.monotonic() + config.elastic_timeout_seconds
    while True:
        plan, can_wait = world.comm.bcast((propose(warm=False), _book(world).can_grow_later(time.time())), root=0)
        if world.topology.size + plan.new_ranks >= config.elastic_min_np:
            apply(plan)
            return
        if not can_wait or time.monotonic() > deadline:
            raise HvdliteError(
                f"only {world.topology.size} rank(s) remain after rank(s) [{', '.join(dead)}] died, fewer than "
                f"--min-np {config.elastic_min_np}, and no free slot "
                + ("appeared" if can_wait else "can appear (the failed hosts are blacklisted; see "
                   "--blacklist-cooldown-range)") + "; the job cannot go on")
        time.sleep(0.5)


def _count_reset(book: HostBook, limit: int, why: str) -> None:
    book.resets += 1
    if limit and book.resets > limit:
        raise HvdliteError(f"{why}, but the job has re-formed {limit} time(s) already: --reset-limit {limit} "
                           "reached; the job ends")


def _book(world: runtime.Runtime) -> HostBook:
    if world.book is None:
        world.book = HostBook(world.config.elastic_max_np, world.config.elastic_cooldown)
    return world.book


def _launcher_hosts(config: Any) -> tuple[dict[str, int], bool] | None:
    """hvdliterun's current host list (through its control channel, or its run directory without one);
    None while it has published none. Raises ``ChannelError`` when hvdliterun cannot be reached."""
    if not config.elastic_service:
        return read_hosts_file(os.path.join(config.run_dir, HOSTS_FILE)) if config.run_dir else None
    reply = request(config.elastic_service, config.elastic_token, {"op": "hosts"})
    hosts = reply.get("hosts")
    if hosts is None:  # not published yet
        return None
    return {str(h): int(n) for h, n in hosts.items()}, bool(reply.get("discovery"))


def _dead_reader(config: Any) -> Callable[[list[str]], list[str]]:
    """Which of the given members died: MPI's list of dead processes and the ranks' status files."""
    from mpi4py import MPI

    return lambda members: dead_members(MPI.COMM_WORLD, config.elastic_spawn_prefix, members, config.run_dir)


def _record_removed(process_ids: list[str]) -> None:
    """Tell hvdliterun which ranks the job went on without: their exit does not fail the job."""
    world = runtime.current()
    config = world.config
    if not process_ids or world.topology.rank != 0:
        return
    if config.elastic_service:
        try:
            request(config.elastic_service, config.elastic_token, {"op": "removed", "ids": process_ids})
        except ChannelError as exc:
            log.warning("could not tell hvdliterun that the job went on without rank(s) %s: %s", process_ids, exc)
    elif config.run_dir:
        with open(os.path.join(config.run_dir, _REMOVED_FILE), "a") as handle:
            handle.write("".join(f"{process_id}\n" for process_id in process_ids))

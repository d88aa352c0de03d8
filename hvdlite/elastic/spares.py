"""Spares: processes an elastic job starts outside the world and admits at a commit once they are ready:
every new rank (started when its slot opens, unless ``--cold-joins``) and the warm spares kept
ahead (``--warm-spares N``).

A cold join waits for a new process to start and import its framework (seconds for torch) while
the whole world stands in ``MPI_Comm_spawn``. A spare is started instead, by rank 0
alone (``MPI_Comm_spawn`` over ``COMM_SELF``, on a helper thread, so training goes on): it runs the
training script up to ``hvd.init()``, tells rank 0 it is ready, and waits outside the world, polling
every few milliseconds (no busy MPI wait, so it holds memory but hardly any CPU). When rank 0's
plan at a commit starts ranks on a host where a spare is ready, the world admits the spare
instead: ``MPI_Intercomm_create`` between the world and the spare (bridged by rank 0 and the spare
merged into one communicator) and ``MPI_Intercomm_merge``, milliseconds. Until then both sides use
only non-blocking calls on their link, so that neither waits for ever on the other's death.

A spare belongs to the process that started it. If that process dies, the spare sees its status
(the run directory, or hvdliterun's channel) and exits; the next rank 0 starts new ones. At the end
of the job rank 0 dismisses its spares (they exit 0). Rank 0 marks each spare for hvdliterun
(``rank.ID.spare``), so that a spare's exit fails nothing until it is admitted. A spare that dies
while it waits is replaced; one that dies before it reached ``hvd.init()`` (the script failed to
start) makes rank 0 stop starting spares, so that a broken start is not retried at every commit.
``MPI_Comm_spawn`` itself failed now and then under load ("PMI_Spawn_multiple returned -1", 2 of 8
jobs while the test suite ran, none of 20 on a quiet machine) and still started the process. The
likely cause, found later: the engine read MPI's list of the dead through MPICH's PMI client while
the spawn used it (it no longer does during a spawn: :func:`hvdlite.utils.failed_peers.spawning`).
Should a spawn fail still, rank 0 marks that process abandoned (``rank.ID.abandoned``; it ends
itself at its next look) and tries again, up to SPAWN_FAILURES_ALLOWED times in the job.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..utils.failed_peers import spawning
from .channel import ChannelError, request
from .join_watch import abandoned_marker
from .join_watch import gone as exited

log = logging.getLogger("hvdlite")

READY_TAG, ORDER_TAG, ADMIT_TAG = 7_311, 7_312, 7_313
POLL_SECONDS = 0.005  # a waiting spare looks for rank 0's word this often
SPAWNER_LOOK_SECONDS = 0.5  # and whether rank 0 still runs this often
DISMISS_WAIT_SECONDS = 60.0  # at the end, how long rank 0 waits for a spare still starting
SPAWN_FAILURES_ALLOWED = 3
# A plan may start several spares at once; MPICH was not measured to survive concurrent spawns.
_ONE_SPAWN_AT_A_TIME = threading.Lock()


@dataclasses.dataclass
class Spare:
    """A spare rank 0 started: its host, its process id once admitted, and its communicators."""

    host: str
    process_id: str
    thread: threading.Thread | None = None
    inter: Any = None  # rank 0 <-> spare, from MPI_Comm_spawn (merged only at admission: a blocking call)
    ready: bool = False
    failed: BaseException | None = None
    deferred: bool = False  # started for a slot the host list asks for now, not kept ahead

    @property
    def started(self) -> bool:
        """Its process runs MPI (the spawn returned), whether or not its script reached ``hvd.init()``."""
        return self.inter is not None

    def look_ready(self) -> bool:
        """Whether it has said it is ready (reached ``hvd.init()``); non-blocking."""
        if not self.ready and self.started and self.inter.Iprobe(source=0, tag=READY_TAG):
            self.inter.recv(source=0, tag=READY_TAG)
            self.ready = True
        return self.ready


class Spares:
    """The spares this process (rank 0) started and has not admitted yet."""

    def __init__(self) -> None:
        self.waiting: list[Spare] = []
        self.admitting: list[Spare] = []  # chosen by the last plan, admitted when the world applies it
        self.given_up = False  # a spare failed to start: no more are started
        self.spawn_failures = 0
        # Tells hvdliterun that a spare's process, if one started, is abandoned; rank 0 sets it with exited.
        self.abandon: Callable[[str], None] = lambda process_id: None
        # Which of a list of process ids have exited; rank 0 sets it (from its config) before each look.
        self.exited: Callable[[list[str]], set[str]] = lambda process_ids: set()
        self._next_look = 0.0
        self._dismiss_registered = False

    def start(self, host: str, prefix: str, command: Callable[[str], tuple[str, list[str]]],
              deferred: bool = False) -> None:
        """Start a spare on ``host`` (its ids ``prefix`` + rank) on a helper thread; ``command(prefix)``
        gives the program and arguments to spawn; ``deferred``: for a slot open now (see ``Spare``)."""
        spare = Spare(host, prefix + "0", deferred=deferred)
        spare.thread = threading.Thread(target=_spawn, args=(spare, *command(prefix)), name="hvdlite-spare",
                                        daemon=True)
        spare.thread.start()
        self.waiting.append(spare)
        if not self._dismiss_registered:
            atexit.register(self.dismiss_all)  # after hvdlite's shutdown, before MPI_Finalize (atexit is LIFO)
            self._dismiss_registered = True

    def forget_gone(self, now: bool = False) -> None:
        """Drop the spares whose process exited or whose start failed (see the module's doc): at most
        every SPAWNER_LOOK_SECONDS (asking hvdliterun at every commit would cost a round trip each),
        unless ``now`` (a spare is about to be admitted or dismissed: a dead one would hang that). Spares
        set aside by a plan that was never applied (a rank died first) wait again."""
        self.waiting += self.admitting
        self.admitting = []
        if not self.waiting or (not now and time.monotonic() < self._next_look):
            return
        self._next_look = time.monotonic() + SPAWNER_LOOK_SECONDS
        gone_ids = self.exited([spare.process_id for spare in self.waiting])
        for spare in [spare for spare in self.waiting if spare.process_id in gone_ids or spare.failed is not None]:
            self.waiting.remove(spare)
            if spare.failed is not None and self.spawn_failures < SPAWN_FAILURES_ALLOWED:
                self.spawn_failures += 1
                self.abandon(spare.process_id)
                log.warning("starting warm spare %s on %s failed (%s); another is started", spare.process_id,
                            spare.host, spare.failed)
                continue
            if spare.look_ready():
                log.warning("warm spare %s on %s exited while it waited; another is started", spare.process_id,
                            spare.host)
                continue
            self.given_up = True
            log.warning("warm spare %s on %s exited before it reached hvd.init() (%s): no more spares are started in "
                        "this job, new ranks start as new processes", spare.process_id, spare.host,
                        spare.failed or "see its output")

    def count(self, ready: bool) -> dict[str, int]:
        """Spares per host that are ready (``ready``) or still starting (not ``ready``)."""
        counts: dict[str, int] = {}
        for spare in self.waiting:
            if spare.look_ready() == ready:
                counts[spare.host] = counts.get(spare.host, 0) + 1
        return counts

    def deferred_starting(self) -> bool:
        """Whether a spare started for an open slot is still starting: the slots a plan asked for at
        once are filled at once (a DiLoCo group joins whole), when all of them are ready."""
        return any(spare.deferred and not spare.look_ready() for spare in self.waiting)

    def choose(self, per_host: dict[str, int]) -> None:
        """Set ``per_host[host]`` ready spares on each host aside for the plan's admission."""
        for host, count in per_host.items():
            self.admitting += [spare for spare in self.waiting if spare.host == host and spare.ready][:count]
        self.waiting = [spare for spare in self.waiting if spare not in self.admitting]

    def take_admitting(self) -> list[Spare]:
        chosen, self.admitting = self.admitting, []
        return chosen

    def dismiss_all(self) -> None:
        """End every waiting spare (the job is over); waits for those still starting."""
        for spare in self.waiting + self.admitting:
            if spare.thread is not None:
                spare.thread.join(DISMISS_WAIT_SECONDS)
        self.forget_gone(now=True)
        for spare in self.waiting:
            if spare.started:
                spare.inter.send(None, dest=0, tag=ORDER_TAG)
                spare.inter.Disconnect()  # MPI_Finalize would wait for connected processes
        self.waiting, self.admitting = [], []


_spares: Spares | None = None


def mine() -> Spares:
    """This process's spares (rank 0's; empty elsewhere)."""
    global _spares
    if _spares is None:
        _spares = Spares()
    return _spares


def _spawn(spare: Spare, program: str, args: list[str]) -> None:
    """Start ``spare``'s process on its host (on the helper thread: it returns once the spare's MPI
    runs, which ``spare_start.py`` makes its first act)."""
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("host", spare.host)
    info.Set("wdir", os.getcwd())
    try:
        with _ONE_SPAWN_AT_A_TIME, spawning():
            spare.inter = MPI.COMM_SELF.Spawn(program, args, 1, info, root=0)
    except Exception as error:  # noqa: BLE001 - reported by forget_gone on the training thread
        spare.failed = error
    finally:
        info.Free()


def admit(comm: Any, count: int, chosen: list[Spare] | None) -> Any:
    """The world ``comm`` with ``count`` spares admitted one after the other (every member calls it;
    ``chosen``: rank 0's spares, None elsewhere). A spare admitted earlier takes part in the later
    admissions as a member."""
    from mpi4py import MPI

    for index in range(count):
        pair = MPI.COMM_SELF
        if chosen:  # rank 0 and the spare, as one intracommunicator: the bridge MPI_Intercomm_create needs
            chosen[index].inter.send(count - index - 1, dest=0, tag=ORDER_TAG)
            pair = chosen[index].inter.Merge(high=False)
        comm = comm.Create_intercomm(0, pair, 1, ADMIT_TAG).Merge(high=False)
    return comm


_WHILE_WAITING: list[Callable[[], None]] = []


def before_ready(callback: Callable[[], None]) -> None:
    """Have a spare call ``callback`` before it says it is ready (an adapter's framework imports modules
    on first use, which a spare does ahead, not after it joined)."""
    _WHILE_WAITING.append(callback)


def wait_for_admission(parent: Any) -> Any:
    """In a spare: say it is ready, wait outside the world until rank 0 admits it, and return the
    world it joined (rank 0 dismissed it: the process ends here). The caller ends the process when
    rank 0 exits or gives the spare up (:func:`hvdlite.elastic.forming.ends_if`)."""
    from mpi4py import MPI

    for callback in _WHILE_WAITING:
        try:
            callback()
        except Exception as error:  # noqa: BLE001 - only a head start: the script will meet it itself
            log.warning("a warm spare's preparation failed: %s", error)
    # Only non-blocking calls until rank 0 gives its word: a blocking one would hold MPICH's lock.
    parent.send(None, dest=0, tag=READY_TAG)
    while not parent.Iprobe(source=0, tag=ORDER_TAG):
        time.sleep(POLL_SECONDS)
    after = parent.recv(source=0, tag=ORDER_TAG)
    if after is None:  # dismissed: the job is over
        parent.Disconnect()
        MPI.Finalize()
        _end_quietly()
    pair = parent.Merge(high=True)
    comm = MPI.COMM_SELF.Create_intercomm(0, pair, 0, ADMIT_TAG).Merge(high=True)
    return admit(comm, after, None)


def spare_argv() -> list[str] | None:
    """How a spare of this process runs, from ``python`` on: its Python options, then
    ``spare_start.py`` (MPI first, see there) with the script or module and its arguments; None when
    it cannot be told (``python -c``)."""
    options = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    if options and options[-1] == "-m":
        options = options[:-1]
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name:
        kind, target = "module", main_spec.name
    elif sys.argv and os.path.isfile(sys.argv[0]):
        kind, target = "path", os.path.abspath(sys.argv[0])
    else:
        return None
    return [*options, os.path.join(os.path.dirname(os.path.abspath(__file__)), "spare_start.py"), kind, target,
            *sys.argv[1:]]


def spare_marker(process_id: str) -> str:
    """The run directory's file that says ``process_id`` is a warm spare, no rank of the job until admitted."""
    return f"rank.{process_id}.spare"


def mark(run_dir: str, service: str, token: str, process_id: str, abandoned: bool = False) -> None:
    """Tell hvdliterun that ``process_id`` starts as a warm spare, or with ``abandoned`` that rank 0 gave
    it up (its channel, else its run directory)."""
    if service:
        try:
            request(service, token, {"op": "spare", "id": process_id, "abandoned": abandoned})
            return
        except ChannelError as exc:
            log.warning("could not tell hvdliterun about warm spare %s: %s", process_id, exc)
    if run_dir:
        with open(os.path.join(run_dir, (abandoned_marker if abandoned else spare_marker)(process_id)), "w"):
            pass


def _end_quietly() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = ["Spare", "Spares", "mine", "admit", "wait_for_admission", "before_ready", "exited", "mark", "spare_marker", "abandoned_marker", "spare_argv", "READY_TAG", "ORDER_TAG",
           "ADMIT_TAG"]

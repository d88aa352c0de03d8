"""Joining an elastic job: new ranks spawned at a commit, warm spares admitted, and the new process's side.

:func:`hvdlite.elastic.reform.apply` grows the world through :func:`admit_spares` and
:func:`spawn_ranks` (``MPI_Comm_spawn_multiple`` with the ``host`` info key, then
``MPI_Intercomm_merge``), watched for deaths meanwhile; the new ranks join from :func:`join_parent`
inside their ``init()``, which :func:`watched_join` wraps so that a process the job gave up ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..settings.config import load_config
from ..utils.failed_peers import failed_statuses, spawning
from . import join_watch
from .forming import ends_if
from .hosts import HostBook
from .spares import SPAWNER_LOOK_SECONDS, admit, exited, spare_argv, wait_for_admission
from .wrapper import wrapped

log = logging.getLogger("hvdlite")


def join_parent() -> tuple[Any, HostBook] | None:
    """In a rank the job spawned: the merged world and the job's host book; None in any other process.
    A warm spare waits here, outside the world, until rank 0 admits it (:mod:`hvdlite.elastic.spares`)."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    # After the ranks that spawned it, in their order.
    merged = wait_for_admission(parent) if load_config().elastic_spare_of else parent.Merge(high=True)
    return merged, merged.bcast(None, root=0)


@contextlib.contextmanager
def watched_join() -> Iterator[None]:
    """Around ``hvd.init()``: a process the elastic job spawned ends here when the job gives it up (a
    rank died while it joined: :func:`hvdlite.elastic.reform.apply`), or, for a warm spare, when the
    rank that started it exits. From before a new rank's ``MPI_Init``, which connects to the ranks
    that spawned it and would wait there for ever (:mod:`hvdlite.elastic.join_watch`)."""
    config = load_config()
    if not (config.elastic_min_np and config.elastic_spawn_prefix):
        yield
        return
    first = config.elastic_spawn_prefix + "0"  # a spawn's processes are given up together
    if config.elastic_spare_of:  # MPI runs already (spare_start.py): a thread can watch
        with ends_if(lambda: bool(exited(config.run_dir, config.elastic_service, config.elastic_token,
                                         [first, config.elastic_spare_of])),
                     "the rank that started this warm spare has exited, or gave it up", SPAWNER_LOOK_SECONDS):
            yield
        return
    watcher = subprocess.Popen([sys.executable, join_watch.__file__, str(os.getpid()), config.run_dir,
                                config.elastic_service, first], stdin=subprocess.PIPE, text=True)
    watcher.stdin.write(config.elastic_token + "\n")
    watcher.stdin.flush()
    try:
        yield
    finally:
        watcher.stdin.close()
        watcher.wait()


def admit_spares(comm: Any, count: int, book: HostBook, chosen: list[Any] | None) -> Any:
    """Admit ``count`` of rank 0's warm spares (``chosen``, on rank 0) into ``comm`` (every member calls
    it) and give them the book."""
    started = time.monotonic()
    merged = admit(comm, count, chosen)
    merged.bcast(book, root=0)
    if chosen is not None:
        log.warning("admitted %s on %s in %.3f s", admitted_kinds(chosen), ", ".join(spare.host for spare in chosen),
                    time.monotonic() - started)
    return merged


def admitted_kinds(chosen: list[Any]) -> str:
    """What an admission brought in, for the log: warm spares kept ahead (``--warm-spares``), new ranks
    started for open slots while the job trained (``Spare.deferred``), or both."""
    new = sum(1 for spare in chosen if spare.deferred)
    kinds = [f"{len(chosen) - new} warm spare(s)"] if len(chosen) > new else []
    kinds += [f"{new} new rank(s)"] if new else []
    return " and ".join(kinds)


def spare_command(spawner: str) -> Callable[[str], tuple[str, list[str]]]:
    """What a spare runs: this program through ``spare_start.py`` (MPI first), under the
    rank wrapper, told its ids' prefix and its spawner."""
    argv = spare_argv()
    if argv is None:
        log.warning("a warm spare of a `python -c` program starts MPI only in hvd.init(): rank 0 waits for it")
    return lambda prefix: spawn_command(prefix, argv, f"HVDLITE_ELASTIC_SPARE_OF={spawner}")


def spawn_command(prefix: str, argv: list[str] | None = None, *settings: str) -> tuple[str, list[str]]:
    """``env`` and its arguments: ``python ARGV`` (default: this program, with this interpreter and
    arguments) under the rank wrapper, with its status files' prefix and ``settings`` (``NAME=value``)."""
    command = shutil.which("env") or "/usr/bin/env"
    program = [sys.executable, *(sys.orig_argv[1:] if argv is None else argv)]
    return command, [f"HVDLITE_ELASTIC_SPAWN_PREFIX={prefix}", *settings, *wrapped(program)]


def spawn_ranks(comm: Any, spawn: tuple[tuple[str, int], ...], book: HostBook, prefix: str) -> Any:
    """Start the new ranks (this program, with this interpreter and arguments; process ids ``prefix``
    and their index) and merge with them."""
    from mpi4py import MPI

    command, args = spawn_command(prefix)
    infos = []
    for host, _ in spawn:
        info = MPI.Info.Create()
        info.Set("host", host)
        info.Set("wdir", os.getcwd())
        infos.append(info)
    started = time.monotonic()
    with spawning():
        inter = comm.Spawn_multiple([command] * len(spawn), [args] * len(spawn), [count for _, count in spawn],
                                    infos, root=0)
    merged = inter.Merge(high=False)
    merged.bcast(book, root=0)
    if comm.Get_rank() == 0:
        log.warning("started %d rank(s) on %s in %.2f s", sum(c for _, c in spawn),
                    ", ".join(f"{h}:{c}" for h, c in spawn), time.monotonic() - started)
    return merged


def dead_reader_beside_a_spawn(config: Any) -> Callable[[list[str]], list[str]]:
    """Which of the given members died while this process spawns: MPI's list of the dead is not read
    then (:func:`hvdlite.utils.failed_peers.spawning`), so the ranks' status files at every call, and
    hvdliterun's record every SPAWNER_LOOK_SECONDS (ranks on hosts that do not share its directory)."""
    next_ask = [0.0]

    def read_dead(members: list[str]) -> list[str]:
        dead = failed_statuses(config.run_dir, members)
        if not dead and config.elastic_service and time.monotonic() >= next_ask[0]:
            next_ask[0] = time.monotonic() + SPAWNER_LOOK_SECONDS
            dead = exited("", config.elastic_service, config.elastic_token, members)
        return [member for member in members if member in dead]
    return read_dead


def late_as_dead(read_dead: Callable[[list[str]], list[str]], newcomers: list[str], seconds: float,
                 give_up: Callable[[str], None]) -> Callable[[list[str]], list[str]]:
    """``read_dead``, and after ``seconds`` the ``newcomers`` too, each given up once (``give_up``): a
    new rank that neither joined nor died by then (stopped, or a host that does not answer) must not
    hold the job in MPICH's spawn for ever. Every member gives them up at its own deadline; the
    abandoned mark ends them (:mod:`hvdlite.elastic.join_watch`) and tells the others."""
    late_at = time.monotonic() + seconds
    given: list[str] = []

    def read(members: list[str]) -> list[str]:
        dead = read_dead(members)
        if dead or time.monotonic() <= late_at:
            return dead
        if not given:
            log.warning("new rank(s) [%s] did not join within %g s (--start-timeout and the communication "
                        "deadline): the job goes on without them", ", ".join(newcomers), seconds)
            given.extend(newcomers)
            for process_id in newcomers:
                give_up(process_id)
        return [member for member in members if member in newcomers]
    return read

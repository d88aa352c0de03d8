"""hvdliterun's watch over an elastic job: when it is over, and its exit code.

The ranks' wrappers (``hvdlite.elastic.wrapper``) write ``rank.ID.status`` into the run directory,
directly or through the control channel (:mod:`.service`); the new rank 0 lists the ranks the job
went on without in ``elastic.removed``; rank 0 marks the warm spares it starts (``rank.ID.spare``),
whose exit is no rank's until they are admitted. From those files the launcher decides when mpiexec only
waits for an unreachable host, when a rank died too early for recovery, and the job's exit code.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable

from hvdlite.elastic.join_watch import abandoned_marker

from ..cluster.pid_files import read_pid_files


class ElasticWatch:
    """Looks at an elastic job of ``num_proc`` launched ranks while mpiexec runs; ``kill`` ends mpiexec."""

    def __init__(self, run_dir: str, num_proc: int, grace_seconds: float, kill: Callable[[], None]) -> None:
        self._run_dir, self._num_proc, self._grace, self._kill = run_dir, num_proc, grace_seconds, kill
        self._finished_at: float | None = None  # when every rank the job went on with had exited

    def look(self, stopping: list[float]) -> None:
        """One look: end mpiexec when it only waits for an unreachable host, or when a rank died before
        every rank was up (then ``stopping`` records when, as a signal from the user would)."""
        if self._finished_at is None and elastic_job_finished(self._run_dir, self._num_proc):
            self._finished_at = time.monotonic()
        if self._finished_at is not None and time.monotonic() - self._finished_at > self._grace:
            # Every rank the job went on with has exited; mpiexec still waits for a host it cannot reach
            # (its link is down), which it would until TCP gives up.
            sys.stderr.write("hvdliterun: every remaining rank has exited; not waiting for unreachable hosts\n")
            self._kill()
            self._finished_at = math.inf
        if not stopping and (early := died_before_init(self._run_dir)):
            # The others wait for it inside MPI's start-up collectives, where nothing can see a death.
            sys.stderr.write(f"hvdliterun: rank {early} died before it finished hvd.init(); elastic "
                             "recovery starts once every rank is up, so the job ends\n")
            stopping.append(time.monotonic() - self._grace)
            self._kill()

    def exit_code(self, code: int) -> int:
        """The job's exit code once mpiexec ended with ``code`` (see :func:`elastic_exit_code`)."""
        return elastic_exit_code(self._run_dir, self._num_proc, code)


def elastic_exit_code(run_dir: str, num_proc: int, code: int) -> int:
    """An elastic job's exit code: 0 when every rank the job did not go on without exited 0.

    The ranks' wrappers write ``rank.ID.status`` (ID: the launch's rank, or ``gG.N`` for a rank the
    job spawned); the new rank 0 lists the ranks the job went on without in ``elastic.removed``.
    ``code`` (mpiexec's) counts if a launched rank's status is missing.
    """
    try:
        with open(os.path.join(run_dir, "elastic.removed")) as handle:
            removed = {line.strip() for line in handle if line.strip()}
    except OSError:
        removed = set()
    statuses = _rank_statuses(run_dir)
    for process_id in [str(rank) for rank in range(num_proc)] + sorted(set(statuses) - waiting_spares(run_dir)):
        if process_id in removed:
            continue
        if process_id not in statuses:
            return code
        if statuses[process_id] != 0:
            return statuses[process_id]
    if removed:
        sys.stderr.write(f"hvdliterun: the job went on without rank(s) [{', '.join(sorted(removed))}] and finished\n")
    return 0


def elastic_job_finished(run_dir: str, num_proc: int) -> bool:
    """Whether the job went on without some ranks and every other rank (launched or spawned) has exited."""
    removed_file = os.path.join(run_dir, "elastic.removed")
    if not os.path.exists(removed_file):
        return False
    with open(removed_file) as handle:
        removed = {line.strip() for line in handle if line.strip()}
    statuses = _rank_statuses(run_dir)
    started = {str(rank) for rank in range(num_proc)} | {str(rank) for rank in read_pid_files(run_dir)}
    return all(process_id in statuses for process_id in started - removed)


def died_before_init(run_dir: str) -> str | None:
    """An elastic rank that exited with an error before its ``hvd.init()`` wrote its pid file, if any."""
    spares = waiting_spares(run_dir)
    for process_id, status in _rank_statuses(run_dir).items():
        if (status != 0 and process_id not in spares and not os.path.exists(os.path.join(run_dir, f"rank.{process_id}.pid"))
                and not os.path.exists(os.path.join(run_dir, abandoned_marker(process_id)))):  # given up while it joined
            return process_id
    return None


def waiting_spares(run_dir: str) -> set[str]:
    """The warm spares never admitted (no pid file): their exit, whatever its status, is not a rank's."""
    names = set(os.listdir(run_dir))
    marked = {match.group(1) for name in names if (match := re.fullmatch(r"rank\.(g\d+\.\d+)\.spare", name))}
    return {process_id for process_id in marked if f"rank.{process_id}.pid" not in names}


def _rank_statuses(run_dir: str) -> dict[str, int]:
    statuses = {}
    for name in os.listdir(run_dir):
        match = re.fullmatch(r"rank\.((?:g\d+\.)?\d+)\.status", name)
        if match:
            try:
                with open(os.path.join(run_dir, name)) as handle:
                    statuses[match.group(1)] = int(handle.read().strip())
            except (OSError, ValueError):
                continue
    return statuses

"""Starting MPI: what MPICH must be told before ``MPI_Init``, decided from how this rank was started,
and waiting for this host's other ranks without spinning (:func:`wait_for_local_ranks`).

Under a plain ``srun --mpi=pmi2`` (no hvdliterun), MPICH talks PMI-1 to Slurm's pmi2 plugin, which
reads each request with a single 1024-byte ``read`` (``handle_pmi1_cmd`` in Slurm's
``src/plugins/mpi/pmi2/pmi1.c``). MPICH sends its business card in ``put`` lines of up to about
1076 bytes (511-byte segments, hex-encoded, plus the key). With UCX the card is padded to 4096
bytes with whatever memory follows UCX's address, so whether a line overflows depends on that
memory: usually not, but when it does Slurm takes the tail of the line for a new request ("request
not begin with 'cmd='"), the peer gets a truncated address, and the job hangs in ``MPI_Init``.
libfabric's cards are a few bytes and never padded, so under Slurm's PMI hvdlite asks MPICH for
the ``ofi`` netmod unless the user chose one (``MPIR_CVAR_CH4_NETMOD``). Hydra (hvdliterun, also
inside a Slurm allocation) reads whole lines and needs nothing.

MPICH's blocking calls wait by polling with ``sched_yield`` in between: a rank held in one
(``MPI_Comm_spawn`` while a new rank starts, the merges of an elastic recovery, a user's blocking
mpi4py call) keeps its core busy. Where a host has more ranks than cores, that is the core another
rank needs (three survivors of an np=4 job on 2 cores, held 20 s in a spawn: 47 CPU s, 16 with the
setting below). There, as Open MPI does when oversubscribed, each rank gets
``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` (:data:`QUIET_WAITS`): MPICH sleeps between polls instead. Not
everywhere: a blocking 4-byte allreduce then takes about 120 us instead of 1.4 (hvdlite's own waits
poll with ``MPI_Test`` and sleep, and take the same time either way). The user's own value wins.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import HvdliteError
from ..settings.config import set_environ
from .topology import usable_cores

NETMOD = "MPIR_CVAR_CH4_NETMOD"
QUIET_WAITS = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}  # where a host has more ranks than cores
SLURM_PMI_NETMOD = "ofi"
ARRIVAL_WAIT_SECONDS = 60.0  # how long a rank waits for its host's other ranks before MPI_Init anyway
ARRIVAL_POLL_SECONDS = 0.02


def started_by_slurm_pmi(env: Mapping[str, str]) -> bool:
    """True if Slurm's own PMI started this process (``srun --mpi=pmi2``), not Hydra's proxy.

    Slurm's pmi2 plugin gives every task ``PMI_FD`` and ``PMI_JOBID``; Hydra gives ``PMI_FD`` and
    ``MPI_LOCALNRANKS`` but no ``PMI_JOBID``. A Hydra rank inside an allocation can inherit
    Slurm's variables, so Hydra's own marker decides.
    """
    return ("PMI_FD" in env and "PMI_JOBID" in env and "SLURM_STEP_ID" in env
            and "MPI_LOCALNRANKS" not in env)


def oversubscribed(env: Mapping[str, str], cores: int) -> bool:
    """True if Hydra started more ranks on this host (``MPI_LOCALNRANKS``) than ``cores``."""
    local_ranks = env.get("MPI_LOCALNRANKS", "")
    return local_ranks.isdigit() and int(local_ranks) > cores


def variables_before_mpi(env: Mapping[str, str], cores: int) -> dict[str, str]:
    """The MPICH variables to add to ``env`` before ``MPI_Init`` (empty when none are needed), on a
    host where this process may use ``cores`` cores."""
    added = {}
    if oversubscribed(env, cores):
        added.update((name, value) for name, value in QUIET_WAITS.items() if name not in env)
    if started_by_slurm_pmi(env) and not env.get(NETMOD):
        added[NETMOD] = SLURM_PMI_NETMOD
    return added


def unconnected_step(env: Mapping[str, str], world_size: int) -> str | None:
    """Why this process must not go on, or ``None``: ``srun`` started several tasks without a PMI
    (``--mpi=none``, Slurm's usual default), so each ``MPI_Init`` made a world of its own and every
    task would train alone as rank 0. Hydra's ranks (hvdliterun) are not srun's tasks."""
    tasks = env.get("SLURM_STEP_NUM_TASKS", "")
    if world_size != 1 or not tasks.isdigit() or int(tasks) < 2 or "MPI_LOCALNRANKS" in env:
        return None
    step = f"{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
    return (f"srun started {tasks} tasks in Slurm step {step}, but MPI started task {env.get('SLURM_PROCID', '?')} "
            "alone (size 1): Slurm gave the tasks no PMI to find each other, so each would train alone. "
            "Run `srun --mpi=pmi2 ...`, or `hvdliterun python ...` inside the allocation")


def wait_for_local_ranks(env: Mapping[str, str], timeout: float = ARRIVAL_WAIT_SECONDS,
                         host: str | None = None) -> bool:
    """Before ``MPI_Init``, sleep until every rank hvdliterun started on this host got here too.

    MPICH's ``MPI_Init`` busy-waits for the job's other ranks, so a rank that imported its framework
    quickly burns a core while its neighbours are still importing theirs, and where a host has more
    ranks than cores that slows them down. Each rank leaves a mark in the launcher's run folder
    (``HVDLITE_RUN_DIR``) and sleeps until the marks of its host's ``MPI_LOCALNRANKS`` ranks (Hydra's
    count) are there. Only an optimisation: outside hvdliterun, where the run folder is not on this
    host, or after ``timeout`` (a rank that never comes), ``MPI_Init`` waits as before. Returns True
    if every local rank arrived.
    """
    run_dir, local_rank = env.get("HVDLITE_RUN_DIR"), env.get("MPI_LOCALRANKID")
    local_ranks = env.get("MPI_LOCALNRANKS")
    if not (run_dir and os.path.isdir(run_dir) and local_ranks and local_ranks.isdigit() and local_rank):
        return False
    arrivals = Path(run_dir) / "arrived"
    arrivals.mkdir(exist_ok=True)
    host = host or socket.gethostname()
    (arrivals / f"{host}.{local_rank}").touch()
    deadline = time.monotonic() + timeout
    while sum(name.startswith(f"{host}.") for name in os.listdir(arrivals)) < int(local_ranks):
        if time.monotonic() > deadline:
            return False
        time.sleep(ARRIVAL_POLL_SECONDS)
    return True


def start_mpi(env: Mapping[str, str]) -> tuple[Any, dict[str, str]]:
    """Import mpi4py's ``MPI`` (which initializes MPI) after adding :func:`variables_before_mpi`.

    Returns the module and the variables it set. If MPI was already started (the script imported
    mpi4py's ``MPI`` first), it is too late to set anything, and nothing is set. Raises
    :class:`~hvdlite.errors.HvdliteError` for :func:`unconnected_step`.
    """
    added = {} if "mpi4py.MPI" in sys.modules else variables_before_mpi(env, usable_cores())
    set_environ(added)
    if "mpi4py.MPI" not in sys.modules:
        wait_for_local_ranks(env)
    from mpi4py import MPI

    problem = unconnected_step(env, MPI.COMM_WORLD.Get_size())
    if problem:
        raise HvdliteError(problem)
    return MPI, added
